// Package config decodes and validates sluice.yaml.
//
// Decoding is strict: an unknown or misspelt key is an error naming its path
// ("connectors[0].credentail"), and every value is checked with an error that
// names its key. Relative paths in the file are resolved against the file's
// directory. Provisioning (loading specs, compiling Rego, opening stores) is
// the caller's step after Validate; this package touches no network and opens
// no files but the config itself.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/internal/yamlkeys"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Config is the whole of sluice.yaml.
type Config struct {
	Gateway    Gateway     `yaml:"gateway"`
	Store      string      `yaml:"store"`
	Audit      Audit       `yaml:"audit"`
	Secrets    Secrets     `yaml:"secrets"`
	Connectors []Connector `yaml:"connectors"`
	Agents     []Agent     `yaml:"agents"`
	Policies   []Policy    `yaml:"policies"`
	Rego       []string    `yaml:"rego"`
	Approvers  Approvers   `yaml:"approvers"`
	Approvals  Approvals   `yaml:"approvals"`
	Egress     Egress      `yaml:"egress"`
	DNS        DNS         `yaml:"dns"`
	Usage      Usage       `yaml:"usage"`
	// Policy, DecisionLogs and Receipts are the policy life cycle
	// (policylife.go): bundles, decision-log export, approval receipts.
	Policy       PolicySettings `yaml:"policy"`
	DecisionLogs *DecisionLogs  `yaml:"decision_logs"`
	Receipts     Receipts       `yaml:"receipts"`

	// Dir is the directory relative paths were resolved against.
	Dir string `yaml:"-"`
}

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

// Audit configures the audit log.
type Audit struct {
	Path string `yaml:"path"`
	// Sync is when records are fsynced: "always" (default: a call's result
	// record is fsynced before its answer is released) or "interval"
	// (records are written before the call proceeds and fsynced by a
	// background loop at most SyncInterval later; a host crash can lose up
	// to SyncInterval of records).
	Sync string `yaml:"sync"`
	// SyncInterval bounds the fsync delay of sync: interval (default 10ms,
	// at most 1s).
	SyncInterval Duration `yaml:"sync_interval"`
	// Checkpoint, when set, has the gateway append a signed statement of
	// the log's head to a second file at an interval (THREATS G9).
	Checkpoint *AuditCheckpoint `yaml:"checkpoint"`
	// RecordInputs has every decision record carry the decision's full
	// input document (arguments included; credentials never: they are
	// attached after the decision), for `sluice policy replay`. Default
	// on; false records none.
	RecordInputs *bool `yaml:"record_inputs"`
	// RecordInputMax caps the recorded input (bytes of JSON; default
	// DefaultRecordInputMax, at most MaxRecordInputMax). A larger input
	// is recorded without its bodies, or not at all, and the record says
	// so (input_truncated, input_size, input_cut).
	RecordInputMax int `yaml:"record_input_max"`
}

// Usage says which tools' calls are counted for input.usage: calls per
// agent, user and session over 1 min / 1 h / 1 day, and the sum of one
// numeric argument. A tool in neither list has no input.usage.
type Usage struct {
	// Tools are the tools (exact names) whose calls are counted.
	Tools []string `yaml:"tools"`
	// Sum maps a tool to the body argument summed ("amount", or a dotted
	// path into the body such as "refund.amount"); the tool is counted
	// too.
	Sum map[string]string `yaml:"sum"`
}

// Counted reports whether tool's calls are counted, and the argument
// summed ("" when none).
func (u Usage) Counted(tool string) (bool, string) {
	if arg, ok := u.Sum[tool]; ok {
		return true, arg
	}
	return slices.Contains(u.Tools, tool), ""
}

// Recording inputs (audit.record_input_max): the default, and the most an
// audit line (256 KiB) leaves room for beside the record's other fields.
const (
	DefaultRecordInputMax = 64 << 10
	MaxRecordInputMax     = 192 << 10
)

// InputsRecorded reports audit.record_inputs (default on).
func (a Audit) InputsRecorded() bool { return a.RecordInputs == nil || *a.RecordInputs }

// AuditCheckpoint configures the signed checkpoints of the audit log's head.
type AuditCheckpoint struct {
	// Path is the file checkpoints are appended to, one JSON line each,
	// fsynced; it belongs on another disk, machine or sink than the log.
	Path string `yaml:"path"`
	// Interval between checkpoints (default 1m, at least 1s).
	Interval Duration `yaml:"interval"`
	// KeyFile holds the Ed25519 signing key (created at first start);
	// default audit-checkpoint.key beside audit.path.
	KeyFile string `yaml:"key_file"`
}

// DefaultCheckpointInterval is audit.checkpoint.interval's default.
const DefaultCheckpointInterval = time.Minute

// Audit sync modes (audit.sync).
const (
	AuditSyncAlways   = "always"
	AuditSyncInterval = "interval"
)

// MaxAuditSyncInterval bounds audit.sync_interval: the records a host crash
// can lose.
const MaxAuditSyncInterval = time.Second

// Secrets selects the credential backend.
type Secrets struct {
	Backend string      `yaml:"backend"`
	Local   LocalSecret `yaml:"local"`
	Vault   *Vault      `yaml:"vault"`
}

// LocalSecret places the embedded store.
type LocalSecret struct {
	Path    string `yaml:"path"`
	KeyFile string `yaml:"key_file"`
}

// Vault configures the HashiCorp Vault backend.
type Vault struct {
	Address string    `yaml:"address"`
	CAFile  string    `yaml:"ca_file"`
	Auth    VaultAuth `yaml:"auth"`
	// KVMount and KVPrefix place named secrets (credential.secret):
	// KVMount/data/KVPrefix/<project|user/NAME|connector/SLUG>/<name>, field
	// "value". Defaults secret and sluice.
	KVMount  string `yaml:"kv_mount"`
	KVPrefix string `yaml:"kv_prefix"`
	// TransitMount signs per-call JWTs (credential.vault.transit_key).
	TransitMount string `yaml:"transit_mount"`
	// CacheTTL is how long a KV value is used without asking Vault again;
	// also how long an outage is bridged. Default 60s.
	CacheTTL Duration `yaml:"cache_ttl"`
	// Timeout bounds one request to Vault. Default 5s.
	Timeout Duration `yaml:"timeout"`
	// LeaseIdle: a dynamic secret unused this long is revoked. Default 15m.
	LeaseIdle Duration `yaml:"lease_idle"`
	// Issuer is the iss claim of per-call JWTs. Default "sluice".
	Issuer string `yaml:"issuer"`
}

// VaultAuth is how the gateway logs in to Vault.
type VaultAuth struct {
	Method       string `yaml:"method"`
	TokenFile    string `yaml:"token_file"`
	RoleIDFile   string `yaml:"role_id_file"`
	SecretIDFile string `yaml:"secret_id_file"`
	// SecretIDWrapped: secret_id_file holds a response-wrapping token
	// around the secret_id, unwrapped once at start (an already-unwrapped
	// token fails the start: someone else has the secret_id).
	SecretIDWrapped bool   `yaml:"secret_id_wrapped"`
	Role            string `yaml:"role"`
	JWTFile         string `yaml:"jwt_file"`
	Mount           string `yaml:"mount"`
}

// Connector is one API the gateway fronts.
type Connector struct {
	Slug         string   `yaml:"slug"`
	Provider     string   `yaml:"provider"`
	Spec         string   `yaml:"spec"`
	BaseURL      string   `yaml:"base_url"`
	AllowPrivate []string `yaml:"allow_private"`
	// AllowPrivateCoversMetadata acknowledges an allow_private entry that
	// overlaps a cloud metadata range (MetadataRanges). Without it such an
	// entry is an error: the guard still refuses the metadata addresses it
	// knows, but the rest of those ranges (other link-local instance
	// services) become dialable.
	AllowPrivateCoversMetadata bool        `yaml:"allow_private_covers_metadata"`
	Credential                 *Credential `yaml:"credential"`
	// URL is a remote MCP server's streamable HTTP endpoint (provider:
	// mcp): the gateway is its MCP client and re-exposes its tools.
	URL string `yaml:"url"`
	// Refresh is how often a remote MCP server's tool list is fetched
	// again besides its notifications/tools/list_changed (provider: mcp;
	// default 5m).
	Refresh Duration `yaml:"refresh"`
	// ListUser is the service identity a per-user credential ({user} in
	// its Vault path) is fetched for when the gateway lists a remote MCP
	// server's tools (provider: mcp): a listing has no caller. Unset, such
	// a remote's tools are unavailable (mcp_list.go).
	ListUser string `yaml:"list_user"`
	// Strict refuses the connector when any operation of its spec is
	// skipped or any defect is found, instead of loading what can be.
	Strict bool `yaml:"strict"`
}

// Credential says how the gateway authenticates to a connector's API.
type Credential struct {
	// Secret names a secret in the configured store.
	Secret string `yaml:"secret"`
	// Vault references a Vault secret (the Vault issue).
	Vault *VaultRef `yaml:"vault"`
	// Scheme picks one of the spec's securitySchemes by name; empty means
	// the operation's own requirement decides.
	Scheme string `yaml:"scheme"`
	// Header, Query and Prefix attach explicitly instead of by securityScheme:
	// the value goes into Header (with Prefix, e.g. "Bearer ") or Query.
	Header string `yaml:"header"`
	Query  string `yaml:"query"`
	Prefix string `yaml:"prefix"`
	// OAuth2 makes the gateway an OAuth 2.0 client of the connector's API
	// (package gateway/oauth): per person (authorization_code, connected
	// on the review UI's Connections page) or per connector
	// (client_credentials). The access token goes in Authorization: Bearer.
	OAuth2 *OAuth2 `yaml:"oauth2"`
}

// OAuth2 is a connector's OAuth 2.0 client. The URLs default to the spec's
// oauth2 securityScheme flow (Scheme names it when there are several).
type OAuth2 struct {
	Flow     string `yaml:"flow"` // authorization_code | client_credentials
	ClientID string `yaml:"client_id"`
	// ClientSecret names a secret in the configured store (local or
	// Vault), looked up at the connector's scope, then the project's.
	ClientSecret     string   `yaml:"client_secret"`
	Scopes           []string `yaml:"scopes"`
	Scheme           string   `yaml:"scheme"`
	AuthorizationURL string   `yaml:"authorization_url"`
	TokenURL         string   `yaml:"token_url"`
	// RevocationURL (RFC 7009) is where Disconnect revokes the tokens;
	// without it they are only deleted here.
	RevocationURL string `yaml:"revocation_url"`
	// OnMissing is what a call for a person without a usable connection
	// gets: "refuse" (default: 403 connection_required) or "hold" (held
	// like an ask until the person connects, then sent once).
	OnMissing string `yaml:"on_missing"`
}

// VaultRef is a Vault-backed credential: exactly one of KV, Dynamic,
// TransitKey or OIDCRole. KV and Dynamic paths may contain {user} (the
// person the session acts for: a call without one is refused) and
// {connector}.
type VaultRef struct {
	// KV is a KV API path (secret/data/billing for KV v2); Field picks the
	// value (default "value").
	KV    string `yaml:"kv"`
	Field string `yaml:"field"`
	// Dynamic is a path that returns a leased secret (database/creds/ro):
	// leased per session, renewed, revoked when the session ends. Without
	// Field, its username and password become user:password (basic auth).
	Dynamic string `yaml:"dynamic"`
	// TransitKey signs a JWT per call (claims: agent, session, user, tool,
	// aud, req_sha256) with the transit engine; TTL default 5m.
	TransitKey string `yaml:"transit_key"`
	// OIDCRole mints Vault identity tokens (no per-call claims).
	OIDCRole string `yaml:"oidc_role"`
	// Audience is the aud claim (transit_key: required; oidc_role: checked).
	Audience string   `yaml:"audience"`
	TTL      Duration `yaml:"ttl"`
}

// Agent is a kind of agent and what it is granted.
type Agent struct {
	Name       string   `yaml:"name"`
	Connectors []string `yaml:"connectors"`
	Egress     []string `yaml:"egress"`
	// RateLimit caps each of this agent's sandboxes' tool calls; nil is
	// no cap (the pending-approval cap still applies).
	RateLimit *RateLimit `yaml:"rate_limit"`
}

// RateLimit is a token bucket: PerSecond calls on average, Burst at once
// (default: PerSecond rounded up).
type RateLimit struct {
	PerSecond float64 `yaml:"per_second"`
	Burst     int     `yaml:"burst"`
}

// Policy is one simple rule.
type Policy struct {
	Match     string   `yaml:"match"`
	Action    string   `yaml:"action"`
	Approvers []string `yaml:"approvers"`
	Reason    string   `yaml:"reason"`
	// HoldTTL overrides gateway.hold_ttl for calls this (ask) rule holds.
	HoldTTL Duration `yaml:"hold_ttl"`
}

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

// Approvers configures who may approve held calls (the holds issue).
type Approvers struct {
	Users []User `yaml:"users"`
	OIDC  *OIDC  `yaml:"oidc"`
}

// User is an embedded approver account.
type User struct {
	Name         string   `yaml:"name"`
	Groups       []string `yaml:"groups"`
	PasswordHash string   `yaml:"password_hash"`
	// TokenSHA256 is the hex SHA-256 of this person's admin API token
	// (`sluice approvals`, Authorization: Bearer TOKEN); empty: no token.
	TokenSHA256 string `yaml:"token_sha256"`
}

// Approvals configures notifications about held calls.
type Approvals struct {
	// WebhookURL receives a Slack-compatible {"text": …} POST for every new hold.
	WebhookURL string `yaml:"webhook_url"`
	// PublicURL is the review UI's address as approvers reach it, for the
	// links in notifications (default: http://ADMIN_LISTEN).
	PublicURL string `yaml:"public_url"`
}

// OIDC is approver login through an OpenID provider.
type OIDC struct {
	Issuer           string `yaml:"issuer"`
	ClientID         string `yaml:"client_id"`
	ClientSecretFile string `yaml:"client_secret_file"`
	GroupsClaim      string `yaml:"groups_claim"`
}

// Duration is a time.Duration written as "30s" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a duration (like 30s): %q", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// Std returns the time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// Defaults returns the embedded defaults that an empty file gets.
func Defaults() *Config {
	return &Config{
		Gateway: Gateway{
			SandboxSocket:            "/run/sluice/relay.sock",
			TrustedRelayUIDs:         []uint32{0},
			HoldWait:                 Duration(30 * time.Second),
			HoldTTL:                  Duration(15 * time.Minute),
			MaxPendingHolds:          100,
			MaxConnections:           4096,
			MaxConnectionsPerSandbox: 128,
			RequestBodyTimeout:       Duration(20 * time.Second),
			RequestBodyMinRate:       500,
			AdminListen:              "127.0.0.1:8080",
			MaxResponseBytes:         10 << 20,
			UpstreamTimeout:          Duration(30 * time.Second),
			MCP:                      MCP{ToolNames: "names", MaxMessageBytes: 4 << 20},
		},
		Egress: Egress{
			MaxTunnelsPerCaller: 64,
			IdleTimeout:         Duration(5 * time.Minute),
			HandshakeTimeout:    Duration(10 * time.Second),
			Intercept:           Intercept{CADir: "/var/lib/sluice/ca"},
		},
		DNS: DNS{
			CacheMax:           4096,
			Timeout:            Duration(2 * time.Second),
			SubdomainThreshold: 100,
			SubdomainWindow:    Duration(10 * time.Minute),
		},
		Store:   "sqlite:/var/lib/sluice/sluice.db",
		Audit:   Audit{Path: "/var/lib/sluice/audit.log", Sync: AuditSyncAlways, SyncInterval: Duration(10 * time.Millisecond)},
		Secrets: Secrets{Backend: "local", Local: LocalSecret{Path: "/var/lib/sluice/secrets.json", KeyFile: "/var/lib/sluice/secrets.key"}},
	}
}

// Load reads, strictly decodes and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data, filepath.Dir(abs))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes data over the defaults, resolves relative paths against dir
// and validates.
func Parse(data []byte, dir string) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, err
	}
	c := Defaults()
	if len(root.Content) > 0 {
		if err := yamlkeys.Check(root.Content[0], reflect.TypeOf(*c), ""); err != nil {
			return nil, err
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(c); err != nil {
			return nil, err
		}
	}
	c.Dir = dir
	c.resolvePaths()
	if c.Gateway.ReplicaID == "" {
		c.Gateway.ReplicaID = DefaultReplicaID()
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// DefaultReplicaID is gateway.replica_id when the file does not set it:
// env POD_NAME (a Kubernetes pod), else HOSTNAME, else the host name.
func DefaultReplicaID() string {
	for _, env := range []string{"POD_NAME", "HOSTNAME"} {
		if v := os.Getenv(env); v != "" {
			return v
		}
	}
	host, _ := os.Hostname()
	return host
}

// UnknownKeyError names a key that sluice.yaml does not have.
type UnknownKeyError = yamlkeys.UnknownKeyError

func (c *Config) abs(p string) string {
	if p == "" || filepath.IsAbs(p) || strings.HasPrefix(p, "https://") || strings.HasPrefix(p, "http://") {
		return p
	}
	return filepath.Join(c.Dir, p)
}

func (c *Config) resolvePaths() {
	c.Gateway.SandboxSocket = c.abs(c.Gateway.SandboxSocket)
	if rt := &c.Gateway.RelayTLS; rt.Listen != "" {
		rt.CertFile, rt.KeyFile, rt.ClientCAFile = c.abs(rt.CertFile), c.abs(rt.KeyFile), c.abs(rt.ClientCAFile)
	}
	c.resolveExtAuthz()
	c.resolveHosted()
	c.Audit.Path = c.abs(c.Audit.Path)
	if cp := c.Audit.Checkpoint; cp != nil {
		cp.Path = c.abs(cp.Path)
		if cp.KeyFile == "" && c.Audit.Path != "" {
			cp.KeyFile = filepath.Join(filepath.Dir(c.Audit.Path), "audit-checkpoint.key")
		}
		cp.KeyFile = c.abs(cp.KeyFile)
		if cp.Interval == 0 {
			cp.Interval = Duration(DefaultCheckpointInterval)
		}
	}
	c.Secrets.Local.Path = c.abs(c.Secrets.Local.Path)
	c.Secrets.Local.KeyFile = c.abs(c.Secrets.Local.KeyFile)
	if rest, ok := strings.CutPrefix(c.Store, "sqlite:"); ok && rest != ":memory:" {
		c.Store = "sqlite:" + c.abs(rest)
	}
	c.Egress.Intercept.CADir = c.abs(c.Egress.Intercept.CADir)
	if v := c.Secrets.Vault; v != nil {
		v.CAFile = c.abs(v.CAFile)
		v.Auth.TokenFile = c.abs(v.Auth.TokenFile)
		v.Auth.RoleIDFile = c.abs(v.Auth.RoleIDFile)
		v.Auth.SecretIDFile = c.abs(v.Auth.SecretIDFile)
		v.Auth.JWTFile = c.abs(v.Auth.JWTFile)
	}
	c.Egress.Intercept.UpstreamCAFile = c.abs(c.Egress.Intercept.UpstreamCAFile)
	for i := range c.Connectors {
		c.Connectors[i].Spec = c.abs(c.Connectors[i].Spec)
	}
	for i := range c.Rego {
		c.Rego[i] = c.abs(c.Rego[i])
	}
	c.resolvePolicyLife()
}

var (
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// ReplicaRE is what gateway.replica_id may be: a short token safe in
	// a file name, a log line and an SQL key.
	ReplicaRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	slugRE       = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	headerNameRE = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]{1,128}$`)
	nameRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	headerRE     = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	matchRE      = regexp.MustCompile(`^[A-Za-z0-9_.*?-]+$`)
)

// Validate checks every value and names the key of the first bad one.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	g := c.Gateway
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
	c.validateExtAuthz(bad)
	c.validateHosted(bad)
	c.validatePolicyLife(bad)
	switch {
	case strings.HasPrefix(c.Store, "sqlite:"):
		if strings.TrimPrefix(c.Store, "sqlite:") == "" {
			bad("store", "sqlite: needs a path")
		}
	case strings.HasPrefix(c.Store, "postgres://"), strings.HasPrefix(c.Store, "postgresql://"):
		// Checked in full when the store opens (sslmode, pool size,
		// statement_timeout); never echoed here: it may hold a password.
		if _, err := url.Parse(c.Store); err != nil {
			bad("store", "not a postgres:// URL (the value is not shown: it may hold a password)")
		}
	default:
		bad("store", "want sqlite:/path or postgres://…, got %q", RedactURL(c.Store))
	}
	if c.Audit.Path == "" {
		bad("audit.path", "must be set: the gateway does not run without an audit log")
	}
	switch c.Audit.Sync {
	case AuditSyncAlways:
	case AuditSyncInterval:
		if iv := c.Audit.SyncInterval.Std(); iv <= 0 || iv > MaxAuditSyncInterval {
			bad("audit.sync_interval", "must be positive and at most %s with audit.sync: interval, got %s", MaxAuditSyncInterval, iv)
		}
	default:
		bad("audit.sync", "want always or interval, got %q", c.Audit.Sync)
	}
	for i, t := range c.Usage.Tools {
		if !strings.Contains(t, ".") || strings.ContainsAny(t, "*?[ ") {
			bad(fmt.Sprintf("usage.tools[%d]", i), "want an exact tool name <connector>.<operation>, got %q", t)
		}
	}
	for t, arg := range c.Usage.Sum {
		if !strings.Contains(t, ".") || strings.ContainsAny(t, "*?[ ") {
			bad("usage.sum."+t, "want an exact tool name <connector>.<operation> as the key")
		}
		if arg == "" || strings.HasPrefix(arg, ".") || strings.HasSuffix(arg, ".") || strings.Contains(arg, "..") {
			bad("usage.sum."+t, "want the body argument to sum (amount, or a dotted path like refund.amount), got %q", arg)
		}
	}
	if m := c.Audit.RecordInputMax; m < 0 || m > MaxRecordInputMax {
		bad("audit.record_input_max", "must be 0 (the default, %d) to %d bytes, got %d", DefaultRecordInputMax, MaxRecordInputMax, m)
	}
	if cp := c.Audit.Checkpoint; cp != nil {
		if cp.Path == "" {
			bad("audit.checkpoint.path", "must be set when audit.checkpoint is")
		} else if cp.Path == c.Audit.Path {
			bad("audit.checkpoint.path", "must not be audit.path: checkpoints belong in a second location")
		}
		if iv := cp.Interval.Std(); iv < time.Second {
			bad("audit.checkpoint.interval", "must be at least 1s, got %s", iv)
		}
	}
	switch c.Secrets.Backend {
	case "local":
		if c.Secrets.Local.Path == "" {
			bad("secrets.local.path", "must be set")
		}
		if c.Secrets.Local.KeyFile == "" {
			bad("secrets.local.key_file", "must be set")
		}
	case "vault":
		if c.Secrets.Vault == nil || c.Secrets.Vault.Address == "" {
			bad("secrets.vault.address", "must be set when secrets.backend is vault")
		} else if u, err := url.Parse(c.Secrets.Vault.Address); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad("secrets.vault.address", "want an http(s) URL, got %q", RedactURL(c.Secrets.Vault.Address))
		}
		if c.Secrets.Vault != nil {
			vc := c.Secrets.Vault
			for key, d := range map[string]Duration{"cache_ttl": vc.CacheTTL, "timeout": vc.Timeout, "lease_idle": vc.LeaseIdle} {
				if d < 0 {
					bad("secrets.vault."+key, "must not be negative")
				}
			}
			for key, m := range map[string]string{"kv_mount": vc.KVMount, "kv_prefix": vc.KVPrefix, "transit_mount": vc.TransitMount, "auth.mount": vc.Auth.Mount} {
				if m != "" && (!vaultPathOK(m) || strings.Contains(m, "{")) {
					bad("secrets.vault."+key, "not a Vault path: %q", m)
				}
			}
			a := vc.Auth
			need := map[string][]string{"token": {"token_file"}, "approle": {"role_id_file", "secret_id_file"}, "jwt": {"role", "jwt_file"}, "kubernetes": {"role"}}
			have := map[string]string{"token_file": a.TokenFile, "role_id_file": a.RoleIDFile, "secret_id_file": a.SecretIDFile, "role": a.Role, "jwt_file": a.JWTFile}
			for _, key := range need[a.Method] {
				if have[key] == "" {
					bad("secrets.vault.auth."+key, "is required with auth.method %s", a.Method)
				}
			}
			switch c.Secrets.Vault.Auth.Method {
			case "token", "approle", "jwt", "kubernetes":
			default:
				bad("secrets.vault.auth.method", "want token, approle, jwt or kubernetes, got %q", c.Secrets.Vault.Auth.Method)
			}
		}
	default:
		bad("secrets.backend", "want local or vault, got %q", c.Secrets.Backend)
	}

	slugs := map[string]bool{}
	for i, cn := range c.Connectors {
		k := fmt.Sprintf("connectors[%d]", i)
		if !slugRE.MatchString(cn.Slug) {
			bad(k+".slug", "want lower-case letters, digits and dashes (at most 63), got %q", cn.Slug)
		} else if slugs[cn.Slug] {
			bad(k+".slug", "%q is used twice", cn.Slug)
		}
		slugs[cn.Slug] = true
		mcp := cn.Provider == "mcp"
		switch {
		case cn.Provider != "" && cn.Provider != "openapi" && !mcp:
			bad(k+".provider", "want openapi or mcp, got %q", cn.Provider)
		case mcp:
			mcpConnectorProblems(k, cn, bad)
		case cn.URL != "":
			bad(k+".url", "only with provider: mcp (an OpenAPI connector has spec and base_url)")
		case cn.Refresh != 0:
			bad(k+".refresh", "only with provider: mcp")
		case cn.ListUser != "":
			bad(k+".list_user", "only with provider: mcp")
		}
		switch { // a provider: mcp connector has no spec (mcpConnectorProblems)
		case mcp:
		case cn.Spec == "":
			bad(k+".spec", "must be set (a file or an https URL)")
		case strings.HasPrefix(cn.Spec, "http://"):
			bad(k+".spec", "a spec URL must be https")
		}
		if u, err := url.Parse(cn.Spec); !mcp && err == nil && u.Scheme == "https" && u.User != nil {
			bad(k+".spec", "a spec URL must not carry user info (got %q): a credential does not belong in sluice.yaml", RedactURL(cn.Spec))
		}
		if cn.BaseURL != "" && !mcp {
			u, err := url.Parse(cn.BaseURL)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
				bad(k+".base_url", "want http(s)://host[:port][/path] without user, query or fragment, got %q", RedactURL(cn.BaseURL))
			}
		}
		covers := false
		for j, p := range cn.AllowPrivate {
			pfx, err := ParseAllowPrivate(p)
			if err != nil {
				bad(fmt.Sprintf("%s.allow_private[%d]", k, j), "%v", err)
				continue
			}
			if m, ok := CoversMetadata(pfx); ok {
				covers = true
				if !cn.AllowPrivateCoversMetadata {
					bad(fmt.Sprintf("%s.allow_private[%d]", k, j), "%s overlaps the cloud metadata range %s: instance services there hand out credentials; narrow it, or set %s.allow_private_covers_metadata: true if this connector really needs it", p, m, k)
				}
			}
		}
		if cn.AllowPrivateCoversMetadata && !covers {
			bad(k+".allow_private_covers_metadata", "no allow_private entry overlaps a metadata range: remove the key")
		}
		if cr := cn.Credential; cr != nil {
			ck := k + ".credential"
			switch {
			case cr.Secret == "" && cr.Vault == nil && cr.OAuth2 == nil:
				bad(ck, "needs secret, vault or oauth2")
			case cr.Secret != "" && cr.Vault != nil:
				bad(ck, "secret and vault are exclusive")
			case cr.OAuth2 != nil && (cr.Secret != "" || cr.Vault != nil || cr.Header != "" || cr.Query != "" || cr.Scheme != ""):
				bad(ck+".oauth2", "is exclusive with secret, vault, header, query and scheme (the access token goes in Authorization: Bearer)")
			case cr.Secret != "" && !nameRE.MatchString(cr.Secret):
				bad(ck+".secret", "not a secret name: %q", cr.Secret)
			}
			reservedSecret(ck+".secret", cr.Secret, bad) // oauthnames.go
			if cr.Vault != nil {
				v := cr.Vault
				n := 0
				for _, s := range []string{v.KV, v.Dynamic, v.TransitKey, v.OIDCRole} {
					if s != "" {
						n++
					}
				}
				if n != 1 {
					bad(ck+".vault", "needs exactly one of kv, dynamic, transit_key or oidc_role")
				}
				if c.Secrets.Backend != "vault" {
					bad(ck+".vault", "needs secrets.backend: vault")
				}
				for key, p := range map[string]string{"kv": v.KV, "dynamic": v.Dynamic} {
					if p != "" && !vaultPathOK(p) {
						bad(ck+".vault."+key, "want a Vault path of letters, digits, '_', '-', '.', '/' and the placeholders {user} and {connector}, without '..' or a leading '/', got %q", p)
					}
				}
				for key, p := range map[string]string{"transit_key": v.TransitKey, "oidc_role": v.OIDCRole} {
					if p != "" && !nameRE.MatchString(p) {
						bad(ck+".vault."+key, "not a name: %q", p)
					}
				}
				if v.Field != "" && v.KV == "" && v.Dynamic == "" {
					bad(ck+".vault.field", "only with kv or dynamic")
				}
				if v.TransitKey != "" && v.Audience == "" {
					bad(ck+".vault.audience", "is required with transit_key (the upstream checks it)")
				}
				if v.TTL != 0 && (v.TransitKey == "" || v.TTL.Std() < time.Second || v.TTL.Std() > time.Hour) {
					bad(ck+".vault.ttl", "only with transit_key, between 1s and 1h")
				}
			}
			if o := cr.OAuth2; o != nil {
				validateOAuth2(ck+".oauth2", o, c, cn.Provider == "mcp", bad)
			}
			if cr.Header != "" && cr.Query != "" {
				bad(ck, "header and query are exclusive")
			}
			if cr.Header != "" && !headerRE.MatchString(cr.Header) {
				bad(ck+".header", "not a header name: %q", cr.Header)
			}
			if strings.ContainsAny(cr.Prefix, "\r\n\x00") {
				bad(ck+".prefix", "must not contain CR, LF or NUL")
			}
			if cr.Scheme != "" && (cr.Header != "" || cr.Query != "") {
				bad(ck+".scheme", "scheme and header/query are exclusive")
			}
		}
	}
	agents := map[string]bool{}
	for i, a := range c.Agents {
		k := fmt.Sprintf("agents[%d]", i)
		if !nameRE.MatchString(a.Name) {
			bad(k+".name", "not a name: %q", a.Name)
		} else if agents[a.Name] {
			bad(k+".name", "%q is used twice", a.Name)
		}
		agents[a.Name] = true
		for j, s := range a.Connectors {
			if !slugs[s] {
				bad(fmt.Sprintf("%s.connectors[%d]", k, j), "no connector has slug %q", s)
			}
		}
		for j, h := range a.Egress {
			if !ValidEgress(h) {
				bad(fmt.Sprintf("%s.egress[%d]", k, j), "want a lower-case host name or *.domain, got %q", h)
			}
		}
		if rl := a.RateLimit; rl != nil {
			switch {
			case !(rl.PerSecond > 0) || rl.PerSecond > 1e6:
				bad(k+".rate_limit.per_second", "want a number of calls per second above 0 and at most 1000000, got %v", rl.PerSecond)
			case rl.Burst < 0 || rl.Burst > 1e6:
				bad(k+".rate_limit.burst", "want 0 (per_second rounded up) to 1000000 calls, got %d", rl.Burst)
			case rl.Burst == 0:
				rl.Burst = int(math.Ceil(rl.PerSecond))
			}
		}
	}
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
	for i, p := range c.Policies {
		k := fmt.Sprintf("policies[%d]", i)
		if !matchRE.MatchString(p.Match) {
			bad(k+".match", "want a tool name or glob like billing-api.get_*, got %q", p.Match)
		}
		switch p.Action {
		case "allow", "block":
			if len(p.Approvers) > 0 {
				bad(k+".approvers", "only ask rules have approvers")
			}
		case "ask":
		default:
			bad(k+".action", "want allow, ask or block, got %q", p.Action)
		}
	}
	for i, p := range c.Policies {
		if p.HoldTTL < 0 || (p.HoldTTL != 0 && p.Action != "ask") {
			bad(fmt.Sprintf("policies[%d].hold_ttl", i), "only ask rules have a hold_ttl, and it must be positive")
		}
	}
	for i, r := range c.Rego {
		if r == "" {
			bad(fmt.Sprintf("rego[%d]", i), "empty path")
		}
	}
	for i, u := range c.Approvers.Users {
		if !nameRE.MatchString(u.Name) {
			bad(fmt.Sprintf("approvers.users[%d].name", i), "not a name: %q", u.Name)
		}
		if u.TokenSHA256 != "" && !sha256RE.MatchString(u.TokenSHA256) {
			bad(fmt.Sprintf("approvers.users[%d].token_sha256", i), "want 64 lowercase hex digits (sha256sum of the token)")
		}
	}
	if c.Approvers.OIDC != nil && c.Approvals.PublicURL == "" {
		bad("approvals.public_url", "must be set with approvers.oidc: the OIDC redirect URL is built from it")
	}
	for _, kv := range [][2]string{{"approvals.webhook_url", c.Approvals.WebhookURL}, {"approvals.public_url", c.Approvals.PublicURL}} {
		k, v := kv[0], kv[1]
		if v == "" {
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad(k, "want an http(s) URL")
		}
	}
	return errors.Join(errs...)
}

// ParseAllowPrivate parses one allow_private entry: a CIDR (host bits
// cleared: 10.0.0.5/8 is 10.0.0.0/8) or a bare address, which means that
// address alone (10.0.0.5 is 10.0.0.5/32, fd00::5 is fd00::5/128). The
// gateway admits exactly what this returns.
func ParseAllowPrivate(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("want a CIDR like 10.0.0.0/8 or an address like 10.0.0.5, got %q (no zone)", s)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("want a CIDR like 10.0.0.0/8 or an address like 10.0.0.5, got %q", s)
	}
	return p.Masked(), nil
}

// validateOAuth2 checks a connector's oauth2 client. URLs left empty
// come from the spec (checked when it is loaded).
func validateOAuth2(k string, o *OAuth2, c *Config, mcp bool, bad func(key, format string, args ...any)) {
	switch o.Flow {
	case "authorization_code":
		if c.Approvals.PublicURL == "" {
			bad("approvals.public_url", "must be set with %s.flow: authorization_code: the redirect URL is built from it", k)
		}
	case "client_credentials":
		if o.ClientSecret == "" {
			bad(k+".client_secret", "is required with flow: client_credentials")
		}
	case "":
		bad(k+".flow", "must be set: authorization_code (per person) or client_credentials (per connector)")
	default:
		bad(k+".flow", "want authorization_code or client_credentials, got %q", o.Flow)
	}
	if o.ClientID == "" && !mcp { // a remote MCP server's may be registered (RFC 7591)
		bad(k+".client_id", "must be set")
	} else if strings.ContainsAny(o.ClientID, "\r\n\x00") {
		bad(k+".client_id", "must not contain CR, LF or NUL")
	}
	reservedSecret(k+".client_secret", o.ClientSecret, bad) // oauthnames.go
	if o.ClientSecret != "" && !nameRE.MatchString(o.ClientSecret) {
		bad(k+".client_secret", "not a secret name: %q (name a secret in the store; the value never goes in sluice.yaml)", o.ClientSecret)
	}
	for i, sc := range o.Scopes {
		if sc == "" || strings.ContainsAny(sc, " \t\r\n\x00\"\\") {
			bad(fmt.Sprintf("%s.scopes[%d]", k, i), "not a scope token: %q", sc)
		}
	}
	for key, v := range map[string]string{"authorization_url": o.AuthorizationURL, "token_url": o.TokenURL, "revocation_url": o.RevocationURL} {
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.Fragment != "" {
			bad(k+"."+key, "want an absolute http(s) URL without user info or fragment, got %q", RedactURL(v))
		}
	}
	switch o.OnMissing {
	case "", "refuse":
	case "hold":
		if o.Flow != "authorization_code" {
			bad(k+".on_missing", "hold is for flow: authorization_code (a person connects)")
		}
	default:
		bad(k+".on_missing", "want refuse or hold, got %q", o.OnMissing)
	}
	if o.AuthorizationURL != "" && o.Flow == "client_credentials" {
		bad(k+".authorization_url", "is not used with flow: client_credentials")
	}
}

// RedactURL is s fit for an error message: a URL can carry a credential
// in its user info (https://user:token@host) or its query (?api_key=…),
// so both are replaced by "REDACTED" (the fragment is dropped), and text
// that does not parse as a URL is not shown at all.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(not shown: not a URL)"
	}
	if u.Opaque != "" { // scheme:opaque, e.g. sqlite:path or postgres:… without //
		if strings.ContainsAny(u.Opaque, "@?") || u.RawQuery != "" {
			return u.Scheme + ":REDACTED"
		}
		return u.Scheme + ":" + u.Opaque
	}
	user, query := u.User != nil, u.RawQuery != "" || u.ForceQuery
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	out := u.String()
	if user {
		if scheme, rest, ok := strings.Cut(out, "//"); ok {
			out = scheme + "//REDACTED@" + rest
		}
	}
	if query {
		out += "?REDACTED"
	}
	return out
}

// MetadataRanges are where cloud instance metadata and credential services
// live, and the IPv6 forms that embed the IPv4 ones (IPv4-mapped, NAT64
// RFC 6052, 6to4 RFC 3056). An allow_private entry overlapping one needs
// allow_private_covers_metadata. The guard refuses the known metadata
// addresses whatever allow_private says; these ranges are wider because
// new services appear in them (EKS Pod Identity at 169.254.170.23 and
// fd00:ec2::23).
var MetadataRanges = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),     // link-local: AWS, GCP, Azure, OpenStack, Oracle IMDS; AWS ECS/EKS credentials
	netip.MustParsePrefix("fd00:ec2::/32"),      // AWS IMDS and EKS Pod Identity over IPv6
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
	netip.MustParsePrefix("168.63.129.16/32"),   // Azure WireServer
	netip.MustParsePrefix("::ffff:169.254.0.0/112"),
	netip.MustParsePrefix("64:ff9b::a9fe:0/112"),
	netip.MustParsePrefix("2002:a9fe::/32"),
	netip.MustParsePrefix("::ffff:100.100.100.200/128"),
	netip.MustParsePrefix("64:ff9b::6464:64c8/128"),
	netip.MustParsePrefix("2002:6464:64c8::/48"),
	netip.MustParsePrefix("::ffff:168.63.129.16/128"),
	netip.MustParsePrefix("64:ff9b::a83f:8110/128"),
	netip.MustParsePrefix("2002:a83f:8110::/48"),
}

// CoversMetadata returns the first metadata range p overlaps.
func CoversMetadata(p netip.Prefix) (netip.Prefix, bool) {
	for _, m := range MetadataRanges {
		if p.Overlaps(m) {
			return m, true
		}
	}
	return netip.Prefix{}, false
}

// ValidEgress reports whether h is an agents[].egress entry: a lower-case
// DNS name ("pypi.org") or "*." followed by one ("*.pythonhosted.org", any
// name below it, at any depth, but not the domain itself). Labels are
// letters, digits, '-' and '_', 1-63 bytes; the name at most 253 bytes.
// It is the syntax of a sandbox's egress narrowing too (sandboxd/wire).
func ValidEgress(h string) bool { return wire.ValidEgressHost(h) }

// Agent returns the named agent's grants, or nil.
func (c *Config) Agent(name string) *Agent {
	for i := range c.Agents {
		if c.Agents[i].Name == name {
			return &c.Agents[i]
		}
	}
	return nil
}

var vaultPathRE = regexp.MustCompile(`^[A-Za-z0-9_.{}-]+(/[A-Za-z0-9_.{}-]+)*$`)

// vaultPathOK accepts a relative Vault API path whose only braces are the
// {user} and {connector} placeholders and which has no "." or ".." segment.
func vaultPathOK(p string) bool {
	if !vaultPathRE.MatchString(p) {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	rest := strings.NewReplacer("{user}", "", "{connector}", "").Replace(p)
	return !strings.ContainsAny(rest, "{}")
}

// DefaultMCPRefresh is how often a remote MCP server's tool list is
// fetched again when connectors[].refresh is unset.
const DefaultMCPRefresh = 5 * time.Minute

// mcpConnectorProblems checks a provider: mcp connector: an https url
// (http only to an address literal, which the guard then judges with
// allow_private), no spec or base_url, a credential sent in a header.
func mcpConnectorProblems(k string, cn Connector, bad func(key, format string, args ...any)) {
	u, err := url.Parse(cn.URL)
	switch {
	case cn.URL == "":
		bad(k+".url", "is required with provider: mcp (the remote server's streamable HTTP endpoint, https://…)")
	case err != nil || u.Host == "" || u.User != nil || u.Fragment != "":
		bad(k+".url", "want https://host[:port][/path] without user or fragment, got %q", RedactURL(cn.URL))
	case u.Scheme == "http":
		if _, err := netip.ParseAddr(u.Hostname()); err != nil {
			bad(k+".url", "a remote MCP server by name must be https (plain http only to an address literal inside allow_private), got %q", RedactURL(cn.URL))
		}
	case u.Scheme != "https":
		bad(k+".url", "want https://…, got %q", RedactURL(cn.URL))
	}
	if cn.Spec != "" {
		bad(k+".spec", "not with provider: mcp (the tools are listed by the remote server)")
	}
	if cn.BaseURL != "" {
		bad(k+".base_url", "not with provider: mcp (use url)")
	}
	if cn.Refresh != 0 && (cn.Refresh.Std() < 10*time.Second || cn.Refresh.Std() > 24*time.Hour) {
		bad(k+".refresh", "want between 10s and 24h, got %s", cn.Refresh.Std())
	}
	listUserProblems(k, cn, bad) // mcp_list.go
	if cr := cn.Credential; cr != nil {
		if cr.Query != "" {
			bad(k+".credential.query", "not with provider: mcp (an MCP request carries the credential in a header)")
		}
		if cr.Scheme != "" {
			bad(k+".credential.scheme", "not with provider: mcp (there is no spec; use header and prefix, default Authorization: Bearer)")
		}
		if cr.Prefix != "" && cr.Header == "" {
			bad(k+".credential.prefix", "needs credential.header with provider: mcp")
		}
		if o := cr.OAuth2; o != nil { // MCP authorization (gateway/oauth/discover.go)
			mcpOAuth2Problems(k+".credential.oauth2", o, bad)
		}
	}
}
