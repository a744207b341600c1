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
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/internal/yamlkeys"
	"go.yaml.in/yaml/v3"
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
	resolveHosted(c)
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
// Each section's checks are in the file of its types (gateway.go, audit.go,
// secrets.go, connectors.go, policy.go, egress.go, extauthz.go,
// policylife.go); the order of the errors is the order of the file's
// sections.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	validateGateway(c.Gateway, bad)
	c.validateExtAuthz(bad)
	validateHosted(c, bad)
	c.validatePolicyLife(bad)
	validateStore(c.Store, bad)
	validateAudit(c, bad)
	validateSecrets(c.Secrets, bad)
	slugs := validateConnectors(c, bad)
	validateAgents(c.Agents, slugs, bad)
	validateEgress(c, bad)
	validatePolicies(c, bad)
	return errors.Join(errs...)
}

// Agent returns the named agent's grants, or nil.
func (c *Config) Agent(name string) *Agent {
	for i := range c.Agents {
		if c.Agents[i].Name == name {
			return &c.Agents[i]
		}
	}
	return nil
}
