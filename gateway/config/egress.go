package config

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Egress configures raw egress through the gateway's forward proxy
// (absolute-form HTTP and CONNECT). Which hosts an agent may reach is
// agents[].egress; this section holds the limits.
type Egress struct {
	// ConnectPorts are the ports CONNECT may reach besides 443.
	ConnectPorts []int `yaml:"connect_ports"`
	// MaxTunnelsPerCaller caps one sandbox's concurrent tunnels and
	// proxied requests; more are 429 rate_limited.
	MaxTunnelsPerCaller int `yaml:"max_tunnels_per_caller"`
	// IdleTimeout closes a tunnel with no traffic either way for this long.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// HandshakeTimeout bounds the wait for the client's TLS ClientHello
	// after CONNECT is answered.
	HandshakeTimeout Duration `yaml:"handshake_timeout"`
	// Intercept terminates TLS inside CONNECT tunnels to chosen hosts, so
	// each request in them is decided, and placeholders substituted, on
	// its own.
	Intercept Intercept `yaml:"intercept"`
	// Placeholders bind secrets to raw egress: the sandbox carries an
	// opaque placeholder that the gateway replaces with the secret only in
	// one header of intercepted requests to the bound hosts.
	Placeholders []Placeholder `yaml:"placeholders"`
}

// Intercept configures TLS interception of CONNECT tunnels.
type Intercept struct {
	// Hosts are intercepted: exact names or "*.domain" (like agents[].egress).
	Hosts []string `yaml:"hosts"`
	// CADir holds the interception CA (created at first start) and the
	// placeholder key; the gateway refuses keys readable by others.
	CADir string `yaml:"ca_dir"`
	// UpstreamCAFile, when set, is the PEM bundle upstream certificates
	// are verified with instead of the system roots (tests, private PKI).
	UpstreamCAFile string `yaml:"upstream_ca_file"`
}

// Placeholder binds the secret Secret to raw egress toward Hosts, in the
// request header Header, whose value must be Prefix followed by the
// placeholder.
type Placeholder struct {
	Secret string `yaml:"secret"`
	// Connection binds the calling person's OAuth access token for this
	// credential.oauth2 connector instead of a secret (oauthnames.go).
	Connection string   `yaml:"connection"`
	Hosts      []string `yaml:"hosts"`
	Header     string   `yaml:"header"`
	Prefix     string   `yaml:"prefix"`
}

// DNS configures the gateway's DNS policy answerer (POST /v1/dns).
type DNS struct {
	// Upstreams are the resolvers ("ip:port") allowed names are resolved
	// with, tried in order. Empty: the answerer refuses every question.
	Upstreams []string `yaml:"upstreams"`
	// CacheMax bounds the answer cache (entries).
	CacheMax int `yaml:"cache_max"`
	// Timeout bounds one upstream query.
	Timeout Duration `yaml:"timeout"`
	// SubdomainThreshold is the number of distinct names under one base
	// domain one caller may ask within SubdomainWindow before an
	// exfiltration signal is audited.
	SubdomainThreshold int      `yaml:"subdomain_threshold"`
	SubdomainWindow    Duration `yaml:"subdomain_window"`
}

// validateEgress checks egress.* (ports, tunnels, interception,
// placeholders) and dns.*.
func validateEgress(c *Config, bad func(key, format string, args ...any)) {
	for i, p := range c.Egress.ConnectPorts {
		if p < 1 || p > 65535 {
			bad(fmt.Sprintf("egress.connect_ports[%d]", i), "want a port 1-65535, got %d", p)
		}
	}
	if c.Egress.MaxTunnelsPerCaller < 1 {
		bad("egress.max_tunnels_per_caller", "must be at least 1")
	}
	if c.Egress.IdleTimeout <= 0 {
		bad("egress.idle_timeout", "must be positive")
	}
	if c.Egress.HandshakeTimeout <= 0 {
		bad("egress.handshake_timeout", "must be positive")
	}
	for i, h := range c.Egress.Intercept.Hosts {
		if !ValidEgress(h) {
			bad(fmt.Sprintf("egress.intercept.hosts[%d]", i), "want a lower-case host name or *.domain, got %q", h)
		}
	}
	if len(c.Egress.Intercept.Hosts) > 0 && c.Egress.Intercept.CADir == "" {
		bad("egress.intercept.ca_dir", "must be set when egress.intercept.hosts is")
	}
	phSeen := map[string]bool{}
	for i, p := range c.Egress.Placeholders {
		k := fmt.Sprintf("egress.placeholders[%d]", i)
		name, ok := validatePlaceholderBinding(k, p, c, bad) // oauthnames.go
		switch {
		case !ok:
		case !nameRE.MatchString(name) || strings.Contains(name, ":"):
			bad(k+".secret", "want a secret name, got %q", p.Secret)
		case phSeen[name]:
			bad(k+".secret", "%q is bound twice", name)
		}
		phSeen[name] = true
		if len(p.Hosts) == 0 {
			bad(k+".hosts", "name at least one host")
		}
		for j, h := range p.Hosts {
			if !ValidEgress(h) {
				bad(fmt.Sprintf("%s.hosts[%d]", k, j), "want a lower-case host name or *.domain, got %q", h)
			}
		}
		if !headerNameRE.MatchString(p.Header) {
			bad(k+".header", "want a header name, got %q", p.Header)
		}
		if strings.ContainsAny(p.Prefix, "\r\n\x00") {
			bad(k+".prefix", "must not contain control characters")
		}
	}
	for i, u := range c.DNS.Upstreams {
		if ap, err := netip.ParseAddrPort(u); err != nil || ap.Port() == 0 {
			bad(fmt.Sprintf("dns.upstreams[%d]", i), "want ip:port like 127.0.0.53:53, got %q", u)
		}
	}
	if c.DNS.CacheMax < 0 {
		bad("dns.cache_max", "must not be negative")
	}
	if c.DNS.Timeout <= 0 {
		bad("dns.timeout", "must be positive")
	}
	if c.DNS.SubdomainThreshold < 1 {
		bad("dns.subdomain_threshold", "must be at least 1")
	}
	if c.DNS.SubdomainWindow <= 0 {
		bad("dns.subdomain_window", "must be positive")
	}
}

// ValidEgress reports whether h is an agents[].egress entry: a lower-case
// DNS name ("pypi.org") or "*." followed by one ("*.pythonhosted.org", any
// name below it, at any depth, but not the domain itself). Labels are
// letters, digits, '-' and '_', 1-63 bytes; the name at most 253 bytes.
// It is the syntax of a sandbox's egress narrowing too (sandboxd/wire).
func ValidEgress(h string) bool { return wire.ValidEgressHost(h) }
