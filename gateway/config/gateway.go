package config

import (
	"fmt"
	"net"
	"strconv"
)

// Gateway configures the gateway's listeners.
type Gateway struct {
	SandboxSocket    string   `yaml:"sandbox_socket"`
	TrustedRelayUIDs []uint32 `yaml:"trusted_relay_uids"`
	HoldWait         Duration `yaml:"hold_wait"`
	// HoldTTL is how long a held call waits for a decision before it
	// expires (policies[].hold_ttl overrides it per rule).
	HoldTTL Duration `yaml:"hold_ttl"`
	// MaxPendingHolds caps one agent's pending holds; more asks are 429.
	MaxPendingHolds int `yaml:"max_pending_holds"`
	// MaxPendingHoldsPerSandbox caps one sandbox's share of its agent's
	// pending holds; more asks from it are 429 too_many_holds while the
	// agent's other sandboxes still hold theirs. 0: a quarter of
	// max_pending_holds (at least 1).
	MaxPendingHoldsPerSandbox int    `yaml:"max_pending_holds_per_sandbox"`
	AdminListen               string `yaml:"admin_listen"`
	// ReplicaID names this gateway among replicas sharing one store: it is
	// written into every audit record and keys this replica's audit head
	// in the store. Default: env POD_NAME, else HOSTNAME, else the host
	// name (ReplicaRE).
	ReplicaID string `yaml:"replica_id"`
	// HoldLease: how long an executing held call stays leased to the
	// replica sending it without a renewal (holdlease.go).
	HoldLease Duration `yaml:"hold_lease"`
	// MaxConnections caps the sandbox socket's open connections; more are
	// answered 503 gateway_busy at once (THREATS B10).
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerSandbox caps one sandbox's open connections; more
	// are answered 429 too_many_connections at once.
	MaxConnectionsPerSandbox int `yaml:"max_connections_per_sandbox"`
	// RequestBodyTimeout bounds a request body on the sandbox socket from
	// the end of its head, extended by a second for every
	// RequestBodyMinRate bytes that arrive; a body that stalls past it is
	// cut with 408 request_timeout.
	RequestBodyTimeout Duration `yaml:"request_body_timeout"`
	RequestBodyMinRate int64    `yaml:"request_body_min_rate"`
	// MaxResponseBytes caps an upstream body; larger replies are 502 upstream_error.
	MaxResponseBytes int64 `yaml:"max_response_bytes"`
	// UpstreamTimeout bounds one upstream exchange.
	UpstreamTimeout Duration `yaml:"upstream_timeout"`
	// SessionTokensSHA256 are hex SHA-256s of tokens that machine callers
	// (sandboxd) present to end sessions on the admin API.
	SessionTokensSHA256 []string `yaml:"session_tokens_sha256"`
	// RelayTLS is the listener for sandboxd relays on other hosts (mTLS);
	// off unless Listen is set.
	RelayTLS RelayTLS `yaml:"relay_tls"`
	// ExtAuthz serves Envoy's ext_authz (and xDS); off when nil (extauthz.go).
	ExtAuthz *ExtAuthz `yaml:"ext_authz"`
	// Hosted is the TLS listener of hosted sandboxes; off when nil (hosted.go).
	Hosted *Hosted `yaml:"hosted"`
	// MCP configures the Model Context Protocol door at /mcp.
	MCP MCP `yaml:"mcp"`
}

// MCP configures the Model Context Protocol door (streamable HTTP at /mcp
// on the sandbox socket).
type MCP struct {
	// ToolNames is what tools/list calls each tool: "names"
	// (<slug>.<operation>, the default) or "aliases" (the function-safe
	// aliases, for clients that hand MCP names straight to an LLM API that
	// forbids dots). A call accepts either.
	ToolNames string `yaml:"tool_names"`
	// MaxMessageBytes bounds one JSON-RPC message; larger ones are refused.
	MaxMessageBytes int64 `yaml:"max_message_bytes"`
}

// RelayTLS configures the mTLS listener remote sandboxd relays connect
// to. A relay is trusted when its client certificate verifies against
// ClientCAFile; the host field of each preamble must be one of the
// certificate's DNS names.
type RelayTLS struct {
	Listen       string `yaml:"listen"`
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// validateGateway checks the gateway.* keys but relay_tls's neighbours
// ext_authz (extauthz.go) and the policy life cycle (policylife.go).
func validateGateway(g Gateway, bad func(key, format string, args ...any)) {
	if g.ReplicaID != "" && !ReplicaRE.MatchString(g.ReplicaID) {
		bad("gateway.replica_id", "%q: want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit (the default is env POD_NAME, HOSTNAME or the host name: set it when that is not such a token)", g.ReplicaID)
	}
	g.validateHoldLease(bad) // holdlease.go
	if g.SandboxSocket == "" {
		bad("gateway.sandbox_socket", "must be set")
	}
	if len(g.TrustedRelayUIDs) == 0 {
		bad("gateway.trusted_relay_uids", "must list at least one uid (sandboxd's)")
	}
	if g.HoldWait < 0 {
		bad("gateway.hold_wait", "must not be negative")
	}
	if g.HoldTTL <= 0 {
		bad("gateway.hold_ttl", "must be positive")
	}
	if g.MaxPendingHolds <= 0 {
		bad("gateway.max_pending_holds", "must be positive")
	}
	if g.MaxConnections <= 0 {
		bad("gateway.max_connections", "must be positive")
	}
	if g.MaxConnectionsPerSandbox <= 0 || g.MaxConnectionsPerSandbox > g.MaxConnections {
		bad("gateway.max_connections_per_sandbox", "must be between 1 and gateway.max_connections (%d)", g.MaxConnections)
	}
	if g.RequestBodyTimeout <= 0 {
		bad("gateway.request_body_timeout", "must be positive")
	}
	if g.RequestBodyMinRate < 0 {
		bad("gateway.request_body_min_rate", "must not be negative (bytes per second; 0: no extension)")
	}
	if g.MaxPendingHoldsPerSandbox < 0 || g.MaxPendingHoldsPerSandbox > g.MaxPendingHolds {
		bad("gateway.max_pending_holds_per_sandbox", "must be between 1 and gateway.max_pending_holds (%d), or 0 for a quarter of it", g.MaxPendingHolds)
	}
	for i, h := range g.SessionTokensSHA256 {
		if !sha256RE.MatchString(h) {
			bad(fmt.Sprintf("gateway.session_tokens_sha256[%d]", i), "want 64 lowercase hex digits (sha256sum of the token)")
		}
	}
	if g.UpstreamTimeout <= 0 {
		bad("gateway.upstream_timeout", "must be positive")
	}
	if g.MCP.ToolNames != "names" && g.MCP.ToolNames != "aliases" {
		bad("gateway.mcp.tool_names", "want names or aliases, not %q", g.MCP.ToolNames)
	}
	if g.MCP.MaxMessageBytes < 1024 || g.MCP.MaxMessageBytes > 64<<20 {
		bad("gateway.mcp.max_message_bytes", "must be between 1024 and %d", 64<<20)
	}
	if g.MaxResponseBytes <= 0 {
		bad("gateway.max_response_bytes", "must be positive")
	}
	if g.AdminListen != "" {
		host, port, err := net.SplitHostPort(g.AdminListen)
		if err != nil {
			bad("gateway.admin_listen", "want host:port: %v", err)
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			bad("gateway.admin_listen", "bad port %q", port)
		} else if host == "" {
			bad("gateway.admin_listen", "host must be set (listening on every address is not a default; write 0.0.0.0 to mean it)")
		}
	}
	if rt := g.RelayTLS; rt.Listen != "" {
		if _, port, err := net.SplitHostPort(rt.Listen); err != nil {
			bad("gateway.relay_tls.listen", "want host:port: %v", err)
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			bad("gateway.relay_tls.listen", "bad port %q", port)
		}
		for _, kv := range [][2]string{{"cert_file", rt.CertFile}, {"key_file", rt.KeyFile}, {"client_ca_file", rt.ClientCAFile}} {
			if kv[1] == "" {
				bad("gateway.relay_tls."+kv[0], "must be set with gateway.relay_tls.listen")
			}
		}
	} else if rt.CertFile != "" || rt.KeyFile != "" || rt.ClientCAFile != "" {
		bad("gateway.relay_tls.listen", "must be set when the other gateway.relay_tls keys are")
	}
}
