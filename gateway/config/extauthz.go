package config

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ExtAuthz configures sluice as Envoy's external authorization service
// (envoy.service.auth.v3.Authorization/Check) and, optionally, as the xDS
// server of a sluice-managed Envoy, both on one gRPC listener.
//
// The listener is a Unix socket (only peers whose uid is in TrustedUIDs
// are served) or TCP with mutual TLS: a CheckRequest carries the
// identity Envoy vouches for (the source principal, context_extensions),
// so only a proxy the gateway trusts may send one.
type ExtAuthz struct {
	// Listen is "unix:/path", an absolute path (a Unix socket) or
	// host:port (TCP, mutual TLS required).
	Listen string `yaml:"listen"`
	// TrustedUIDs are the uids of the Envoy processes allowed on the Unix
	// socket.
	TrustedUIDs []uint32 `yaml:"trusted_uids"`
	// CertFile, KeyFile and ClientCAFile are the TCP listener's
	// certificate and the CA that Envoy's client certificates verify
	// against (required for TCP).
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
	// Principals map a request's mTLS source principal (a SPIFFE ID, as
	// Envoy reports the downstream peer) to an identity. A request whose
	// principal is listed gets that identity; otherwise the identity comes
	// from the context_extensions of Envoy's configuration; with neither
	// it is denied.
	Principals []ExtAuthzPrincipal `yaml:"principals"`
	// HoldWait bounds how long a held ("ask") request waits inline for a
	// decision before it is answered 202 with its hold id (default 10s);
	// the gRPC deadline Envoy sets bounds it too.
	HoldWait Duration `yaml:"hold_wait"`
	// XDS, when set, serves Envoy its configuration (ADS) on the same
	// listener.
	XDS *XDS `yaml:"xds"`
}

// ExtAuthzPrincipal is one SPIFFE ID and the identity it stands for.
type ExtAuthzPrincipal struct {
	Principal string `yaml:"principal"` // spiffe://trust-domain/path
	Sandbox   string `yaml:"sandbox"`
	Agent     string `yaml:"agent"`
	Session   string `yaml:"session"`
	User      string `yaml:"user"`
}

// XDS configures what the gateway serves a sluice-managed Envoy over ADS:
// one listener per sandbox (or per relay socket), each with the ext_authz
// filter pointing back at the gateway and carrying the listener's identity
// in context_extensions, routes to a dynamic forward proxy cluster.
type XDS struct {
	// NodeID is the Envoy node id the snapshot is served to (default "sluice-envoy").
	NodeID string `yaml:"node_id"`
	// Listeners are Envoy's listeners, one per sandbox.
	Listeners []EnvoyListener `yaml:"listeners"`
	// ClientCertFile, ClientKeyFile and ServerCAFile are the files, on
	// Envoy's host, that Envoy uses to reach a TCP ext_authz listener with
	// mutual TLS (required when listen is TCP).
	ClientCertFile string `yaml:"client_cert_file"`
	ClientKeyFile  string `yaml:"client_key_file"`
	ServerCAFile   string `yaml:"server_ca_file"`
	// AuthzTimeout is Envoy's deadline for one Check (default 15s; it
	// bounds the inline hold wait).
	AuthzTimeout Duration `yaml:"authz_timeout"`
}

// EnvoyListener is one Envoy listener in front of one sandbox: the address
// the sandbox's traffic arrives on and the identity it carries.
type EnvoyListener struct {
	Name    string `yaml:"name"`
	Address string `yaml:"address"` // host:port
	Sandbox string `yaml:"sandbox"`
	Agent   string `yaml:"agent"`
	Session string `yaml:"session"`
	User    string `yaml:"user"`
}

// DefaultExtAuthzHoldWait is gateway.ext_authz.hold_wait's default.
const DefaultExtAuthzHoldWait = 10 * time.Second

// DefaultXDSNodeID is gateway.ext_authz.xds.node_id's default.
const DefaultXDSNodeID = "sluice-envoy"

// DefaultAuthzTimeout is gateway.ext_authz.xds.authz_timeout's default.
const DefaultAuthzTimeout = 15 * time.Second

// UnixPath returns the socket path when Listen names a Unix socket.
func (e *ExtAuthz) UnixPath() (string, bool) {
	if p, ok := strings.CutPrefix(e.Listen, "unix:"); ok {
		return p, true
	}
	if strings.HasPrefix(e.Listen, "/") {
		return e.Listen, true
	}
	return "", false
}

func (c *Config) resolveExtAuthz() {
	e := c.Gateway.ExtAuthz
	if e == nil {
		return
	}
	if p, ok := e.UnixPath(); ok && p != "" {
		e.Listen = "unix:" + c.abs(p)
	}
	e.CertFile, e.KeyFile, e.ClientCAFile = c.abs(e.CertFile), c.abs(e.KeyFile), c.abs(e.ClientCAFile)
	if e.HoldWait == 0 {
		e.HoldWait = Duration(DefaultExtAuthzHoldWait)
	}
	if x := e.XDS; x != nil {
		if x.NodeID == "" {
			x.NodeID = DefaultXDSNodeID
		}
		if x.AuthzTimeout == 0 {
			x.AuthzTimeout = Duration(DefaultAuthzTimeout)
		}
	}
}

// validateExtAuthz checks gateway.ext_authz; bad reports a key and a problem.
func (c *Config) validateExtAuthz(bad func(key, format string, args ...any)) {
	e := c.Gateway.ExtAuthz
	if e == nil {
		return
	}
	const k = "gateway.ext_authz"
	tlsKeys := [][2]string{{"cert_file", e.CertFile}, {"key_file", e.KeyFile}, {"client_ca_file", e.ClientCAFile}}
	path, unix := e.UnixPath()
	switch {
	case e.Listen == "":
		bad(k+".listen", "must be set: unix:/path or host:port (mutual TLS)")
	case unix:
		if path == "" || !filepath.IsAbs(path) {
			bad(k+".listen", "want unix:/absolute/path, got %q", e.Listen)
		}
		if len(e.TrustedUIDs) == 0 {
			bad(k+".trusted_uids", "must list the uid of Envoy: a Unix socket serves only trusted peers")
		}
		for _, kv := range tlsKeys {
			if kv[1] != "" {
				bad(k+"."+kv[0], "is for a TCP listener; the Unix socket is trusted by peer uid (trusted_uids)")
			}
		}
	default:
		host, port, err := net.SplitHostPort(e.Listen)
		if err != nil {
			bad(k+".listen", "want unix:/path or host:port: %v", err)
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			bad(k+".listen", "bad port %q", port)
		} else if host == "" {
			bad(k+".listen", "host must be set (write 0.0.0.0 to listen on every address)")
		}
		for _, kv := range tlsKeys {
			if kv[1] == "" {
				bad(k+"."+kv[0], "must be set: a TCP listener requires mutual TLS")
			}
		}
		if len(e.TrustedUIDs) > 0 {
			bad(k+".trusted_uids", "is for a Unix socket; a TCP listener trusts client certificates")
		}
	}
	if e.HoldWait < 0 {
		bad(k+".hold_wait", "must not be negative")
	}
	seen := map[string]bool{}
	for i, p := range e.Principals {
		pk := fmt.Sprintf("%s.principals[%d]", k, i)
		if !strings.HasPrefix(p.Principal, "spiffe://") || len(p.Principal) <= len("spiffe://") || strings.ContainsAny(p.Principal, " \t\r\n") {
			bad(pk+".principal", "want a SPIFFE ID (spiffe://trust-domain/path), got %q", p.Principal)
		} else if seen[p.Principal] {
			bad(pk+".principal", "%q is listed twice", p.Principal)
		}
		seen[p.Principal] = true
		c.checkIdentity(bad, pk, p.Sandbox, p.Agent, p.Session, p.User)
	}
	x := e.XDS
	if x == nil {
		return
	}
	xk := k + ".xds"
	if !nameRE.MatchString(x.NodeID) {
		bad(xk+".node_id", "want letters, digits, _ . - (at most 128), got %q", x.NodeID)
	}
	if x.AuthzTimeout <= 0 {
		bad(xk+".authz_timeout", "must be positive")
	}
	if len(x.Listeners) == 0 {
		bad(xk+".listeners", "must list at least one listener (one per sandbox)")
	}
	names, addrs := map[string]bool{}, map[string]bool{}
	for i, l := range x.Listeners {
		lk := fmt.Sprintf("%s.listeners[%d]", xk, i)
		if !nameRE.MatchString(l.Name) {
			bad(lk+".name", "want letters, digits, _ . - (at most 128), got %q", l.Name)
		} else if names[l.Name] {
			bad(lk+".name", "%q is used twice", l.Name)
		}
		names[l.Name] = true
		if _, port, err := net.SplitHostPort(l.Address); err != nil {
			bad(lk+".address", "want host:port: %v", err)
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			bad(lk+".address", "bad port %q", port)
		} else if addrs[l.Address] {
			bad(lk+".address", "%q is used twice", l.Address)
		}
		addrs[l.Address] = true
		if l.Sandbox == "" {
			bad(lk+".sandbox", "must be set: each listener is one sandbox's identity")
		}
		c.checkIdentity(bad, lk, l.Sandbox, l.Agent, l.Session, l.User)
	}
	if !unix {
		for _, kv := range [][2]string{{"client_cert_file", x.ClientCertFile}, {"client_key_file", x.ClientKeyFile}, {"server_ca_file", x.ServerCAFile}} {
			if kv[1] == "" {
				bad(xk+"."+kv[0], "must be set: Envoy reaches a TCP ext_authz listener with mutual TLS")
			}
		}
	}
}

// checkIdentity checks an identity written in the config: a configured
// agent, and no value that could not have come from the identity preamble.
func (c *Config) checkIdentity(bad func(key, format string, args ...any), k, sandbox, agent, session, user string) {
	if agent == "" {
		bad(k+".agent", "must be set")
	} else if c.Agent(agent) == nil {
		bad(k+".agent", "%q is not in agents[]", agent)
	}
	for _, kv := range [][2]string{{"sandbox", sandbox}, {"agent", agent}, {"session", session}, {"user", user}} {
		if len(kv[1]) > 256 || strings.ContainsFunc(kv[1], func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			bad(k+"."+kv[0], "at most 256 characters, no control characters")
		}
	}
}
