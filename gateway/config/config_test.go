package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const good = `
gateway:
  sandbox_socket: run/relay.sock
  trusted_relay_uids: [0, 998]
  hold_wait: 5s
  admin_listen: 127.0.0.1:0
store: sqlite:state/sluice.db
audit: { path: state/audit.log }
connectors:
  - slug: billing-api
    spec: specs/billing.yaml
    base_url: https://billing.example.com/v1
    allow_private: [10.0.0.0/8]
    credential: { secret: billing-api-key }
agents:
  - name: support-bot
    connectors: [billing-api]
policies:
  - { match: "billing-api.get_*", action: allow }
  - { match: "billing-api.create_refund", action: ask, approvers: [group:finance] }
  - { match: "*", action: block }
rego: [policies/]
`

func TestParseGood(t *testing.T) {
	c, err := Parse([]byte(good), "/etc/sluice")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Gateway.HoldWait.Std(); got != 5*time.Second {
		t.Errorf("hold_wait = %v", got)
	}
	if got := c.Connectors[0].Spec; got != "/etc/sluice/specs/billing.yaml" {
		t.Errorf("spec path = %q, want it resolved against the config's directory", got)
	}
	if c.Store != "sqlite:/etc/sluice/state/sluice.db" {
		t.Errorf("store = %q", c.Store)
	}
	if c.Gateway.MaxResponseBytes != 10<<20 {
		t.Errorf("default max_response_bytes lost: %d", c.Gateway.MaxResponseBytes)
	}
	if c.Agent("support-bot") == nil || c.Agent("nobody") != nil {
		t.Error("Agent lookup wrong")
	}
}

func TestEmptyFileGetsDefaults(t *testing.T) {
	c, err := Parse(nil, "/x")
	if err != nil {
		t.Fatal(err)
	}
	if c.Gateway.SandboxSocket != "/run/sluice/relay.sock" || c.Secrets.Backend != "local" {
		t.Errorf("defaults not applied: %+v", c.Gateway)
	}
}

func TestUnknownKeyNamesItsPath(t *testing.T) {
	cases := []struct{ name, yaml, path string }{
		{"top", "gatway: {}\n", "gatway"},
		{"nested", "gateway: { hold_wiat: 3s }\n", "gateway.hold_wiat"},
		{"in list", "connectors:\n  - slug: a\n    spec: a.yaml\n  - slug: b\n    spec: b.yaml\n    credentail: {secret: x}\n", "connectors[1].credentail"},
		{"deep", "connectors:\n  - slug: a\n    spec: a.yaml\n    credential: { secret: x, vault: { kvv: y } }\n", "connectors[0].credential.vault.kvv"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "/x")
			var uk *UnknownKeyError
			if !errors.As(err, &uk) || uk.Path != tc.path {
				t.Fatalf("err = %v, want unknown key %s", err, tc.path)
			}
		})
	}
}

func TestBadValuesNameTheirKey(t *testing.T) {
	cases := []struct{ name, yaml, key string }{
		{"duration", "gateway: { hold_wait: soon }\n", "not a duration"},
		{"uids", "gateway: { trusted_relay_uids: [] }\n", "gateway.trusted_relay_uids"},
		{"admin", "gateway: { admin_listen: ':8080' }\n", "gateway.admin_listen"},
		{"session token not hex", "gateway: { session_tokens_sha256: [not-a-hash] }\n", "gateway.session_tokens_sha256[0]"},
		{"session token upper case", "gateway: { session_tokens_sha256: ['" + strings.Repeat("A", 64) + "'] }\n", "gateway.session_tokens_sha256[0]"},
		{"relay tls listen", "gateway: { relay_tls: { listen: 'nohost', cert_file: c, key_file: k, client_ca_file: ca } }\n", "gateway.relay_tls.listen: want host:port"},
		{"relay tls without cert", "gateway: { relay_tls: { listen: ':7443', key_file: k, client_ca_file: ca } }\n", "gateway.relay_tls.cert_file: must be set"},
		{"relay tls without client ca", "gateway: { relay_tls: { listen: ':7443', cert_file: c, key_file: k } }\n", "gateway.relay_tls.client_ca_file: must be set"},
		{"relay tls files without listen", "gateway: { relay_tls: { cert_file: c } }\n", "gateway.relay_tls.listen: must be set"},
		{"rate limit zero", "agents: [{ name: bot, rate_limit: { per_second: 0 } }]\n", "agents[0].rate_limit.per_second"},
		{"rate limit NaN", "agents: [{ name: bot, rate_limit: { per_second: .nan } }]\n", "agents[0].rate_limit.per_second"},
		{"rate limit negative burst", "agents: [{ name: bot, rate_limit: { per_second: 5, burst: -1 } }]\n", "agents[0].rate_limit.burst"},
		{"store", "store: mysql://x\n", "store"},
		{"audit sync mode", "audit: { sync: sometimes }\n", "audit.sync: want always or interval"},
		{"audit sync empty", "audit: { sync: '' }\n", "audit.sync: want always or interval"},
		{"audit sync interval zero", "audit: { sync: interval, sync_interval: 0s }\n", "audit.sync_interval"},
		{"audit sync interval too long", "audit: { sync: interval, sync_interval: 2s }\n", "audit.sync_interval"},
		{"audit sync interval negative", "audit: { sync: interval, sync_interval: -10ms }\n", "audit.sync_interval"},
		{"audit checkpoint without path", "audit: { checkpoint: { interval: 1m } }\n", "audit.checkpoint.path: must be set"},
		{"audit checkpoint in the log", "audit: { path: /x/a.log, checkpoint: { path: /x/a.log } }\n", "audit.checkpoint.path: must not be audit.path"},
		{"audit checkpoint interval too short", "audit: { checkpoint: { path: cp.jsonl, interval: 100ms } }\n", "audit.checkpoint.interval"},
		{"slug", "connectors: [{ slug: Billing, spec: a.yaml }]\n", "connectors[0].slug"},
		{"dup slug", "connectors: [{ slug: a, spec: a.yaml }, { slug: a, spec: b.yaml }]\n", "connectors[1].slug"},
		{"http spec", "connectors: [{ slug: a, spec: 'http://x/spec.yaml' }]\n", "connectors[0].spec"},
		{"cidr", "connectors: [{ slug: a, spec: a.yaml, allow_private: [10.0.0.0/33] }]\n", "connectors[0].allow_private[0]"},
		{"base", "connectors: [{ slug: a, spec: a.yaml, base_url: 'https://u:p@x' }]\n", "connectors[0].base_url"},
		{"cred", "connectors: [{ slug: a, spec: a.yaml, credential: {} }]\n", "connectors[0].credential"},
		{"agent grant", "agents: [{ name: bot, connectors: [nope] }]\n", "agents[0].connectors[0]"},
		{"provider", "connectors: [{ slug: a, provider: graphql, spec: a.yaml }]\n", "connectors[0].provider: want openapi or mcp"},
		{"mcp without url", "connectors: [{ slug: a, provider: mcp }]\n", "connectors[0].url: is required with provider: mcp"},
		{"mcp by name over http", "connectors: [{ slug: a, provider: mcp, url: 'http://tools.example.com/mcp' }]\n", "connectors[0].url: a remote MCP server by name must be https"},
		{"mcp url scheme", "connectors: [{ slug: a, provider: mcp, url: 'ftp://x/mcp' }]\n", "connectors[0].url: want https"},
		{"mcp url user", "connectors: [{ slug: a, provider: mcp, url: 'https://u:p@x/mcp' }]\n", "connectors[0].url: want https://host"},
		{"mcp with spec", "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', spec: a.yaml }]\n", "connectors[0].spec: not with provider: mcp"},
		{"mcp with base_url", "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', base_url: 'https://x' }]\n", "connectors[0].base_url: not with provider: mcp"},
		{"mcp refresh too short", "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', refresh: 1s }]\n", "connectors[0].refresh: want between 10s and 24h"},
		{"mcp credential query", "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', credential: { secret: k, query: key } }]\n", "connectors[0].credential.query: not with provider: mcp"},
		{"mcp credential scheme", "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', credential: { secret: k, scheme: bearer } }]\n", "connectors[0].credential.scheme: not with provider: mcp"},
		{"mcp credential oauth2 without flow", "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', credential: { oauth2: {} } }]\n", "connectors[0].credential.oauth2.flow: must be set"},
		{"mcp credential oauth2 client credentials", "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', credential: { oauth2: { flow: client_credentials, client_id: c, client_secret: s } } }]\n", "connectors[0].credential.oauth2.flow: with provider: mcp only authorization_code"},
		{"mcp credential oauth2 token_url", "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', credential: { oauth2: { flow: authorization_code, token_url: 'https://as/token' } } }]\n", "connectors[0].credential.oauth2.token_url: not with provider: mcp: discovered"},
		{"url on openapi", "connectors: [{ slug: a, spec: a.yaml, url: 'https://x/mcp' }]\n", "connectors[0].url: only with provider: mcp"},
		{"refresh on openapi", "connectors: [{ slug: a, spec: a.yaml, refresh: 1m }]\n", "connectors[0].refresh: only with provider: mcp"},
		{"action", "policies: [{ match: '*', action: permit }]\n", "policies[0].action"},
		{"approvers on allow", "policies: [{ match: '*', action: allow, approvers: [bob] }]\n", "policies[0].approvers"},
		{"backend", "secrets: { backend: env }\n", "secrets.backend"},
		{"vault ref without vault backend", "connectors: [{ slug: a, spec: a.yaml, credential: { vault: { kv: secret/data/a } } }]\n", "connectors[0].credential.vault: needs secrets.backend: vault"},
		{"vault two kinds", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nconnectors: [{ slug: a, spec: a.yaml, credential: { vault: { kv: secret/data/a, dynamic: db/creds/x } } }]\n", "connectors[0].credential.vault: needs exactly one"},
		{"vault path traversal", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nconnectors: [{ slug: a, spec: a.yaml, credential: { vault: { kv: secret/data/../sys/x } } }]\n", "connectors[0].credential.vault.kv"},
		{"vault unknown placeholder", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nconnectors: [{ slug: a, spec: a.yaml, credential: { vault: { kv: 'secret/data/{agent}/x' } } }]\n", "connectors[0].credential.vault.kv"},
		{"vault leading slash", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nconnectors: [{ slug: a, spec: a.yaml, credential: { vault: { dynamic: /database/creds/x } } }]\n", "connectors[0].credential.vault.dynamic"},
		{"transit without audience", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nconnectors: [{ slug: a, spec: a.yaml, credential: { vault: { transit_key: k } } }]\n", "connectors[0].credential.vault.audience"},
		{"ttl without transit", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nconnectors: [{ slug: a, spec: a.yaml, credential: { vault: { kv: secret/data/a, ttl: 5m } } }]\n", "connectors[0].credential.vault.ttl"},
		{"transit ttl too long", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nconnectors: [{ slug: a, spec: a.yaml, credential: { vault: { transit_key: k, audience: x, ttl: 2h } } }]\n", "connectors[0].credential.vault.ttl"},
		{"field with transit", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nconnectors: [{ slug: a, spec: a.yaml, credential: { vault: { transit_key: k, audience: x, field: f } } }]\n", "connectors[0].credential.vault.field"},
		{"approle without files", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: approle } } }\n", "secrets.vault.auth.role_id_file"},
		{"receipts signer", "receipts: { signer: hsm }\n", "receipts.signer: want local or vault-transit, got \"hsm\""},
		{"receipts transit without key", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nreceipts: { signer: vault-transit }\n", "receipts.transit_key: must be set"},
		{"receipts transit key path", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nreceipts: { signer: vault-transit, transit_key: 'a/b' }\n", "receipts.transit_key: not a transit key name: \"a/b\""},
		{"receipts transit with key_file", "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\nreceipts: { signer: vault-transit, transit_key: rk, key_file: r.key }\n", "receipts.key_file: is for receipts.signer local (the key \"rk\" is in Vault)"},
		{"receipts transit without vault", "receipts: { signer: vault-transit, transit_key: rk }\n", "receipts.signer: vault-transit signs with secrets.vault"},
		{"receipts transit key on local", "receipts: { transit_key: rk }\n", "receipts.transit_key: is for receipts.signer vault-transit"},
		{"negative cache ttl", "secrets: { backend: vault, vault: { address: 'https://v:8200', cache_ttl: -1s, auth: { method: token, token_file: t } } }\n", "secrets.vault.cache_ttl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "/x")
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("err = %v, want it to name %s", err, tc.key)
			}
		})
	}
}

// TestMCPConnectorParses: a remote MCP server as a connector needs only
// its url; refresh and a header credential are optional.
func TestMCPConnectorParses(t *testing.T) {
	c, err := Parse([]byte("connectors:\n  - { slug: tools, provider: mcp, url: 'https://tools.example.com/mcp', refresh: 2m, credential: { secret: tools-key } }\n  - { slug: local, provider: mcp, url: 'http://10.1.2.3:8080/mcp', allow_private: [10.1.2.3/32] }\nagents: [{ name: bot, connectors: [tools, local] }]\n"), "/x")
	if err != nil {
		t.Fatal(err)
	}
	if cn := c.Connectors[0]; cn.Provider != "mcp" || cn.URL != "https://tools.example.com/mcp" || cn.Refresh.Std() != 2*time.Minute || cn.Spec != "" {
		t.Fatalf("connector %+v", cn)
	}
}

func TestAuditSyncKeys(t *testing.T) {
	cases := []struct {
		name, yaml string
		sync       string
		interval   time.Duration
	}{
		{"default is always", "", AuditSyncAlways, 10 * time.Millisecond},
		{"interval with its default", "audit: { sync: interval }\n", AuditSyncInterval, 10 * time.Millisecond},
		{"interval set", "audit: { sync: interval, sync_interval: 250ms }\n", AuditSyncInterval, 250 * time.Millisecond},
		{"interval at the bound", "audit: { sync: interval, sync_interval: 1s }\n", AuditSyncInterval, time.Second},
		{"always ignores the interval", "audit: { sync: always, sync_interval: 0s }\n", AuditSyncAlways, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml), "/x")
			if err != nil {
				t.Fatal(err)
			}
			if c.Audit.Sync != tc.sync || c.Audit.SyncInterval.Std() != tc.interval {
				t.Fatalf("audit = %+v, want sync %s interval %s", c.Audit, tc.sync, tc.interval)
			}
		})
	}
}

// TestAllowPrivateMetadata: an allow_private entry overlapping a cloud
// metadata range (THREATS C1: the instance services there hand out
// credentials) is an error naming the entry and the key that acknowledges
// it, in every spelling of the range; narrower private ranges are not.
func TestAllowPrivateMetadata(t *testing.T) {
	conn := func(allow string, ack bool) string {
		return fmt.Sprintf("connectors: [{ slug: a, spec: a.yaml, allow_private: [%q], allow_private_covers_metadata: %v }]\n", allow, ack)
	}
	cases := []struct {
		name, allow string
		ack         bool
		want        string // "" = accepted
	}{
		{"link-local /16", "169.254.0.0/16", false, "169.254.0.0/16 overlaps the cloud metadata range 169.254.0.0/16"},
		{"part of link-local (ECS, EKS)", "169.254.170.0/24", false, "overlaps the cloud metadata range 169.254.0.0/16"},
		{"everything v4", "0.0.0.0/0", false, "overlaps the cloud metadata range"},
		{"everything v6", "::/0", false, "overlaps the cloud metadata range fd00:ec2::/32"},
		{"AWS IMDS IPv6", "fd00:ec2::/32", false, "overlaps the cloud metadata range fd00:ec2::/32"},
		{"CGNAT holds Alibaba's 100.100.100.200", "100.64.0.0/10", false, "overlaps the cloud metadata range 100.100.100.200/32"},
		{"IPv4-mapped link-local (RFC 4291)", "::ffff:169.254.0.0/112", false, "overlaps the cloud metadata range ::ffff:169.254.0.0/112"},
		{"NAT64 of the IMDS (RFC 6052)", "64:ff9b::/96", false, "overlaps the cloud metadata range 64:ff9b::a9fe:0/112"},
		{"acknowledged", "169.254.0.0/16", true, ""},
		{"RFC 1918 is not metadata", "10.0.0.0/8", false, ""},
		{"loopback is not metadata", "127.0.0.1/32", false, ""},
		{"acknowledging nothing", "10.0.0.0/8", true, "connectors[0].allow_private_covers_metadata: no allow_private entry overlaps a metadata range"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(conn(tc.allow, tc.ack)), "/x")
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			case tc.want != "" && !tc.ack && (!strings.Contains(err.Error(), "connectors[0].allow_private[0]") || !strings.Contains(err.Error(), "allow_private_covers_metadata: true")):
				t.Fatalf("err = %v does not name the entry and the acknowledging key", err)
			}
		})
	}
}

// TestAuditCheckpointDefaults: the interval defaults to 1m and the key
// file sits beside the audit log; relative paths resolve against the
// config's directory.
func TestAuditCheckpointDefaults(t *testing.T) {
	c, err := Parse([]byte("audit: { path: logs/audit.log, checkpoint: { path: cp.jsonl } }\n"), "/etc/sluice")
	if err != nil {
		t.Fatal(err)
	}
	cp := c.Audit.Checkpoint
	if cp.Path != "/etc/sluice/cp.jsonl" || cp.KeyFile != "/etc/sluice/logs/audit-checkpoint.key" || cp.Interval.Std() != time.Minute {
		t.Fatalf("checkpoint = %+v", *cp)
	}
}

func TestOAuth2KeysNameTheirKey(t *testing.T) {
	const conn = "connectors: [{ slug: a, spec: a.yaml, credential: { oauth2: %s } }]\n"
	const pub = "approvals: { public_url: 'https://sluice.example' }\n"
	cases := []struct{ name, yaml, key string }{
		{"no flow", fmt.Sprintf(conn, "{ client_id: c }"), "connectors[0].credential.oauth2.flow: must be set"},
		{"unknown flow", fmt.Sprintf(conn, "{ flow: implicit, client_id: c }"), "connectors[0].credential.oauth2.flow: want authorization_code or client_credentials"},
		{"no client id", pub + fmt.Sprintf(conn, "{ flow: authorization_code }"), "connectors[0].credential.oauth2.client_id: must be set"},
		{"client credentials without secret", fmt.Sprintf(conn, "{ flow: client_credentials, client_id: c }"), "connectors[0].credential.oauth2.client_secret: is required"},
		{"secret value instead of a name", fmt.Sprintf(conn, "{ flow: client_credentials, client_id: c, client_secret: 'sk live/123' }"), "connectors[0].credential.oauth2.client_secret: not a secret name"},
		{"authorization code without public url", fmt.Sprintf(conn, "{ flow: authorization_code, client_id: c }"), "approvals.public_url: must be set with connectors[0].credential.oauth2.flow"},
		{"token url", fmt.Sprintf(conn, "{ flow: client_credentials, client_id: c, client_secret: s, token_url: 'ftp://x/t' }"), "connectors[0].credential.oauth2.token_url"},
		{"revocation url with user", pub + fmt.Sprintf(conn, "{ flow: authorization_code, client_id: c, revocation_url: 'https://u:p@x/r' }"), "connectors[0].credential.oauth2.revocation_url"},
		{"scope with a space", fmt.Sprintf(conn, "{ flow: client_credentials, client_id: c, client_secret: s, scopes: ['a b'] }"), "connectors[0].credential.oauth2.scopes[0]"},
		{"with secret", "connectors: [{ slug: a, spec: a.yaml, credential: { secret: k, oauth2: { flow: client_credentials, client_id: c, client_secret: s } } }]\n", "connectors[0].credential.oauth2: is exclusive"},
		{"on_missing unknown", pub + fmt.Sprintf(conn, "{ flow: authorization_code, client_id: c, on_missing: wait }"), "connectors[0].credential.oauth2.on_missing: want refuse or hold"},
		{"hold with client credentials", fmt.Sprintf(conn, "{ flow: client_credentials, client_id: c, client_secret: s, on_missing: hold }"), "connectors[0].credential.oauth2.on_missing: hold is for flow: authorization_code"},
		{"authorization url with client credentials", fmt.Sprintf(conn, "{ flow: client_credentials, client_id: c, client_secret: s, authorization_url: 'https://x/a' }"), "connectors[0].credential.oauth2.authorization_url: is not used"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "/x")
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("err = %v, want it to name %s", err, tc.key)
			}
		})
	}
	// Tokens kept in Vault KV: authorization_code with the vault backend
	// is a valid configuration.
	if _, err := Parse([]byte(pub+"secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\n"+fmt.Sprintf(conn, "{ flow: authorization_code, client_id: c }")), "/x"); err != nil {
		t.Fatalf("authorization_code with secrets.backend vault: %v", err)
	}
	ok := pub + fmt.Sprintf(conn, "{ flow: authorization_code, client_id: c, client_secret: s, scopes: [repo, 'read:user'] }")
	if _, err := Parse([]byte(ok), "/x"); err != nil {
		t.Fatalf("a valid oauth2 credential: %v", err)
	}
}

// TestOAuthTokenNamesReserved: no secret reference may name a person's
// OAuth tokens (oauth2.SLUG), and an egress placeholder bound to a
// connection names a credential.oauth2 connector, never also a secret.
func TestOAuthTokenNamesReserved(t *testing.T) {
	const svc = "connectors: [{ slug: svc, spec: a.yaml, credential: { oauth2: { flow: client_credentials, client_id: c, client_secret: s } } }]\n"
	const ph = "egress: { intercept: { hosts: [api.test], ca_dir: /x/ca }, placeholders: [%s] }\n"
	for _, tc := range []struct{ name, yaml, key string }{
		{"credential.secret", "connectors: [{ slug: a, spec: a.yaml, credential: { secret: oauth2.docs } }]\n", "connectors[0].credential.secret: \"oauth2.docs\""},
		{"client_secret", "connectors: [{ slug: a, spec: a.yaml, credential: { oauth2: { flow: client_credentials, client_id: c, client_secret: OAuth2.a } } }]\n", "connectors[0].credential.oauth2.client_secret"},
		{"placeholder secret", fmt.Sprintf(ph, "{ secret: oauth2.svc, hosts: [api.test], header: Authorization }"), "egress.placeholders[0].secret"},
		{"placeholder connection and secret", svc + fmt.Sprintf(ph, "{ secret: k, connection: svc, hosts: [api.test], header: Authorization }"), "egress.placeholders[0].connection: secret and connection are exclusive"},
		{"placeholder connection not OAuth", svc + fmt.Sprintf(ph, "{ connection: nope, hosts: [api.test], header: Authorization }"), "egress.placeholders[0].connection: \"nope\" is not a connector with credential.oauth2"},
		{"placeholder connection bound twice", svc + fmt.Sprintf(ph, "{ connection: svc, hosts: [api.test], header: Authorization }, { connection: svc, hosts: [b.test], header: Authorization }"), "egress.placeholders[1].secret: \"oauth2.svc\" is bound twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "/x")
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("err = %v, want it to name %s", err, tc.key)
			}
		})
	}
	if _, err := Parse([]byte(svc+fmt.Sprintf(ph, "{ connection: svc, hosts: [api.test], header: Authorization, prefix: 'Bearer ' }")), "/x"); err != nil {
		t.Fatalf("a placeholder bound to svc's connection: %v", err)
	}
}

// A remote MCP server that speaks MCP authorization: each person connects;
// no client id (registered dynamically) and no endpoints (discovered).
func TestMCPConnectorOAuth2Parses(t *testing.T) {
	c, err := Parse([]byte("approvals: { public_url: 'https://sluice.example.com' }\nconnectors:\n  - { slug: tools, provider: mcp, url: 'https://tools.example.com/mcp', credential: { oauth2: { flow: authorization_code, scopes: [tools.read] } } }\n"), "/x")
	if err != nil {
		t.Fatal(err)
	}
	if o := c.Connectors[0].Credential.OAuth2; o == nil || o.Flow != "authorization_code" || o.ClientID != "" {
		t.Fatalf("oauth2 = %+v", o)
	}
}
