package config

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

// PolicySettings is sluice.yaml's policy: where policy comes from besides
// the rego paths.
type PolicySettings struct {
	// Bundle is an OPA bundle (.tar.gz with .manifest), from a file or
	// polled from an HTTP bundle server.
	Bundle *Bundle `yaml:"bundle"`
}

// Bundle is policy.bundle.
type Bundle struct {
	File string `yaml:"file"`
	URL  string `yaml:"url"`
	// Poll is how often URL is polled (If-None-Match; a 304 costs
	// nothing); 0 = 10s.
	Poll         Duration            `yaml:"poll"`
	Verification *BundleVerification `yaml:"verification"`
}

// BundleVerification is policy.bundle.verification: the key OPA's bundle
// signature (.signatures.json) must verify with. Set, it makes a
// signature required.
type BundleVerification struct {
	KeyFile   string `yaml:"key_file"`
	KeyID     string `yaml:"key_id"`
	Scope     string `yaml:"scope"`
	Algorithm string `yaml:"algorithm"` // RS256 (default), RS384, RS512, PS*, ES256, ES384, ES512, HS256…
}

// DecisionLogs is sluice.yaml's decision_logs: a copy of every decision in
// OPA's decision-log shape, to a file or POSTed in gzipped batches. The
// audit log stays the record of truth; the export never blocks a call.
type DecisionLogs struct {
	File string `yaml:"file"`
	URL  string `yaml:"url"`
	// Format is "opa" (default) or "ocsf" (OCSF API Activity events for a SIEM).
	Format string `yaml:"format"`
	// Mask lists JSON pointers erased from each event before it leaves
	// (OPA's erase semantics): /input/args/body/card_number.
	Mask   []string          `yaml:"mask"`
	Labels map[string]string `yaml:"labels"`
	// Buffer bounds the events waiting to be sent; when full the oldest
	// is dropped and counted. 0 = 10000.
	Buffer int `yaml:"buffer"`
	// Batch is the most events in one POST; 0 = 500.
	Batch int `yaml:"batch"`
	// Flush is the longest an event waits for its batch; 0 = 1s.
	Flush Duration `yaml:"flush"`
	// Timeout bounds one POST; 0 = 5s.
	Timeout Duration `yaml:"timeout"`
}

// Receipts is sluice.yaml's receipts: Ed25519-signed receipts for held
// calls that executed. On unless disabled.
type Receipts struct {
	Disabled bool `yaml:"disabled"`
	// Signer is where the key is: "local" (default: key_file) or
	// "vault-transit" (transit_key, an ed25519 key of the transit engine
	// of secrets.vault, which must be the backend).
	Signer string `yaml:"signer"`
	// KeyFile holds the signing key's seed (hex), made at first start;
	// default receipts.key beside the audit log. Local signer only.
	KeyFile string `yaml:"key_file"`
	// TransitKey names the transit key (vault-transit signer only), at
	// secrets.vault.transit_mount (default transit).
	TransitKey string `yaml:"transit_key"`
}

// Receipt signers (receipts.signer).
const (
	ReceiptsLocal        = "local"
	ReceiptsVaultTransit = "vault-transit"
)

// ReceiptsSigner is receipts.signer, local when unset.
func (c *Config) ReceiptsSigner() string {
	if c.Receipts.Signer == "" {
		return ReceiptsLocal
	}
	return c.Receipts.Signer
}

// signingAlgs are the JWS algorithms OPA verifies bundle signatures with.
var signingAlgs = map[string]bool{
	"RS256": true, "RS384": true, "RS512": true, "PS256": true, "PS384": true, "PS512": true,
	"ES256": true, "ES384": true, "ES512": true, "HS256": true, "HS384": true, "HS512": true, "EdDSA": true,
}

func (c *Config) resolvePolicyLife() {
	if b := c.Policy.Bundle; b != nil {
		b.File = c.abs(b.File)
		if v := b.Verification; v != nil {
			v.KeyFile = c.abs(v.KeyFile)
		}
	}
	if d := c.DecisionLogs; d != nil {
		d.File = c.abs(d.File)
	}
	c.Receipts.KeyFile = c.abs(c.Receipts.KeyFile)
}

// ReceiptsKeyFile is receipts.key_file, or receipts.key beside the audit log.
func (c *Config) ReceiptsKeyFile() string {
	if c.Receipts.KeyFile != "" {
		return c.Receipts.KeyFile
	}
	return filepath.Join(filepath.Dir(c.Audit.Path), "receipts.key")
}

func (c *Config) validatePolicyLife(bad func(key, format string, args ...any)) {
	if b := c.Policy.Bundle; b != nil {
		if (b.File == "") == (b.URL == "") {
			bad("policy.bundle", "want exactly one of file and url")
		}
		if b.URL != "" {
			if u, err := url.Parse(b.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				bad("policy.bundle.url", "want an http(s) URL, got %q", b.URL)
			}
		} else if b.Poll != 0 {
			bad("policy.bundle.poll", "only a url is polled (a file is watched)")
		}
		if b.Poll < 0 || (b.Poll > 0 && b.Poll.Std() < 100*time.Millisecond) {
			bad("policy.bundle.poll", "want at least 100ms")
		}
		if v := b.Verification; v != nil {
			if v.KeyFile == "" {
				bad("policy.bundle.verification.key_file", "must be set")
			}
			if v.Algorithm != "" && !signingAlgs[v.Algorithm] {
				bad("policy.bundle.verification.algorithm", "unknown JWS algorithm %q", v.Algorithm)
			}
		}
	}
	c.validateReceipts(bad)
	if d := c.DecisionLogs; d != nil {
		if (d.File == "") == (d.URL == "") {
			bad("decision_logs", "want exactly one of file and url")
		}
		if d.URL != "" {
			if u, err := url.Parse(d.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				bad("decision_logs.url", "want an http(s) URL, got %q", d.URL)
			}
		}
		switch d.Format {
		case "", "opa", "ocsf":
		default:
			bad("decision_logs.format", "want opa or ocsf, got %q", d.Format)
		}
		for i, m := range d.Mask {
			if !strings.HasPrefix(m, "/") || len(m) < 2 {
				bad(fmt.Sprintf("decision_logs.mask[%d]", i), "want a JSON pointer such as /input/args/body/card_number, got %q", m)
			}
		}
		if d.Buffer < 0 {
			bad("decision_logs.buffer", "must not be negative")
		}
		if d.Batch < 0 {
			bad("decision_logs.batch", "must not be negative")
		}
		if d.Flush < 0 {
			bad("decision_logs.flush", "must not be negative")
		}
		if d.Timeout < 0 {
			bad("decision_logs.timeout", "must not be negative")
		}
	}
}

func (c *Config) validateReceipts(bad func(key, format string, args ...any)) {
	r := c.Receipts
	switch c.ReceiptsSigner() {
	case ReceiptsLocal:
		if r.TransitKey != "" {
			bad("receipts.transit_key", "is for receipts.signer vault-transit (the signer is local)")
		}
	case ReceiptsVaultTransit:
		if r.TransitKey == "" {
			bad("receipts.transit_key", "must be set with receipts.signer vault-transit (an ed25519 key of the transit engine)")
		} else if !vaultPathOK(r.TransitKey) || strings.ContainsAny(r.TransitKey, "/{}") {
			bad("receipts.transit_key", "not a transit key name: %q", r.TransitKey)
		}
		if r.KeyFile != "" {
			bad("receipts.key_file", "is for receipts.signer local (the key %q is in Vault)", r.TransitKey)
		}
		if c.Secrets.Backend != "vault" {
			bad("receipts.signer", "vault-transit signs with secrets.vault: want secrets.backend vault, got %q", c.Secrets.Backend)
		}
	default:
		bad("receipts.signer", "want local or vault-transit, got %q", r.Signer)
	}
}
