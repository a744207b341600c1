package config

import (
	"net"
	"path/filepath"
	"strconv"
	"time"
)

// Hosted configures the listener of hosted sandboxes (E2B, Daytona,
// Modal: sandboxes on hosts without sandboxd). It speaks TLS; each
// connection names its identity with a per-run token minted by the admin
// API (POST /api/v1/sessions/{session}/tokens, `sluice sessions mint`) in
// Proxy-Authorization (Basic, the session as user, the token as
// password), and is then served by the sandbox socket's server: the same
// forward proxy, CONNECT, tool API and audit.
type Hosted struct {
	// Listen is host:port (TCP, TLS).
	Listen string `yaml:"listen"`
	// CertFile and KeyFile are the listener's certificate and key (PEM).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// TokenKeyFile holds the key tokens are MACed with (hex, 0600),
	// made at first start; default hosted-token.key beside audit.path.
	// Replicas that accept each other's tokens share this file.
	TokenKeyFile string `yaml:"token_key_file"`
	// MaxTokenTTL bounds a minted token's lifetime (default 24h).
	MaxTokenTTL Duration `yaml:"max_token_ttl"`
	// RefusalBudget refused attempts that name no token are audited one
	// by one per source address and RefusalWindow (defaults 20 and 1m);
	// past it they are counted in /metrics and audited once per address
	// and window as hosted_refusals_summarised.
	RefusalBudget int      `yaml:"refusal_budget"`
	RefusalWindow Duration `yaml:"refusal_window"`
}

// DefaultMaxTokenTTL is gateway.hosted.max_token_ttl's default.
const DefaultMaxTokenTTL = 24 * time.Hour

// MaxMaxTokenTTL is the longest gateway.hosted.max_token_ttl accepted.
const MaxMaxTokenTTL = 30 * 24 * time.Hour

func resolveHosted(c *Config) {
	h := c.Gateway.Hosted
	if h == nil {
		return
	}
	h.CertFile, h.KeyFile = c.abs(h.CertFile), c.abs(h.KeyFile)
	if h.TokenKeyFile == "" && c.Audit.Path != "" {
		h.TokenKeyFile = filepath.Join(filepath.Dir(c.abs(c.Audit.Path)), "hosted-token.key")
	}
	h.TokenKeyFile = c.abs(h.TokenKeyFile)
	if h.MaxTokenTTL == 0 {
		h.MaxTokenTTL = Duration(DefaultMaxTokenTTL)
	}
}

// validateHosted checks gateway.hosted; bad reports a key and a problem.
func validateHosted(c *Config, bad func(key, format string, args ...any)) {
	h := c.Gateway.Hosted
	if h == nil {
		return
	}
	const k = "gateway.hosted"
	if host, port, err := net.SplitHostPort(h.Listen); err != nil {
		bad(k+".listen", "want host:port: %v", err)
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		bad(k+".listen", "bad port %q", port)
	} else if host == "" {
		bad(k+".listen", "host must be set (write 0.0.0.0 to listen on every address)")
	}
	for _, kv := range [][2]string{{"cert_file", h.CertFile}, {"key_file", h.KeyFile}} {
		if kv[1] == "" {
			bad(k+"."+kv[0], "must be set: the hosted listener speaks TLS only (the token travels in it)")
		}
	}
	if h.TokenKeyFile == "" {
		bad(k+".token_key_file", "must be set (or audit.path, beside which it defaults)")
	}
	if h.RefusalBudget < 0 || h.RefusalWindow < 0 {
		bad(k+".refusal_budget", "refusal_budget and refusal_window must not be negative")
	}
	if h.MaxTokenTTL.Std() < time.Second || h.MaxTokenTTL.Std() > MaxMaxTokenTTL {
		bad(k+".max_token_ttl", "must be between 1s and %s", MaxMaxTokenTTL)
	}
}
