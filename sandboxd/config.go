// Package sandboxd makes sandboxes for untrusted agent code whose only way
// out is the gateway: each sandbox is a re-exec of the sandboxd binary as a
// minimal init inside new user, mount, pid, net, ipc, uts and cgroup
// namespaces, on a read-only root with one writable, size-capped
// /workspace, no capabilities, no_new_privs, a seccomp filter, Landlock and
// cgroup limits. The init confines itself before it starts anything, so
// every command it runs inherits the same confinement; sandboxd keeps the
// controls (cgroups, timeouts, output caps, file transfer, events) on the
// host side, where the code inside cannot reach them.
package sandboxd

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/internal/yamlkeys"
	"go.yaml.in/yaml/v3"
)

// Config is sandboxd.yaml, decoded strictly.
type Config struct {
	// API is the Unix socket the API listens on.
	API string `yaml:"api"`
	// Gateway is the gateway's sandbox socket that every exit relays to.
	Gateway string `yaml:"gateway"`
	// GatewayTLS, when its address is set, sends every exit to a gateway
	// on another host instead (its gateway.relay_tls listener), over
	// mutual TLS; Gateway is then not used.
	GatewayTLS GatewayTLS `yaml:"gateway_tls"`
	// StateDir holds events.jsonl, a lock, sandboxes/ with one directory
	// per sandbox (a tmpfs sandboxd mounts there), and template/, where
	// the read-only part every sandbox's root shares is mounted in a mount
	// namespace of sandboxd's own (on the host it is an empty directory).
	StateDir string `yaml:"state_dir"`
	// Rootfs is the directory whose system folders are bound read-only
	// into every sandbox ("/" = the host's). They are bound once, into the
	// mount template, when the first sandbox is made: files change live,
	// but a mount added under rootfs later shows in sandboxes only after
	// sandboxd restarts.
	Rootfs string `yaml:"rootfs"`
	// CgroupParent names the group created under each controller's root
	// that holds every sandbox's group.
	CgroupParent string `yaml:"cgroup_parent"`
	// UIDs is the host range sandbox users are mapped into.
	UIDs UIDRange `yaml:"uids"`
	// Limits are the defaults for a sandbox that does not say.
	Limits Limits `yaml:"limits"`
	// Host is reported in every identity preamble.
	Host string `yaml:"host"`
	// Spares is how many sandboxes to keep built ahead of time with the
	// default limits (fresh namespaces, uid range, cgroup and root, already
	// confined; each serves one Create and is never reused): a Create whose
	// workspace and tmp sizes are the defaults then only rewrites the
	// cgroup limits and opens the exits. Others are built on demand.
	Spares int `yaml:"spares"`
	// GatewayAdmin is the URL of the gateway's admin listener (optional).
	// When set, every Create fetches the interception CA and the
	// placeholders from it and puts them into the sandbox (trust.go); a
	// failed fetch fails the Create.
	GatewayAdmin string `yaml:"gateway_admin"`
	// GatewaySessionTokenFile holds the token (its SHA-256 is in the
	// gateway's gateway.session_tokens_sha256) with which Destroy and
	// unpin end the sandbox's session on gateway_admin, and with which
	// Create reads the placeholders (GET /api/v1/placeholders answers 401
	// without it). Optional; needs gateway_admin. The file is read at each
	// use, so the token can be rotated.
	GatewaySessionTokenFile string `yaml:"gateway_session_token_file"`
	// DNSCache is how long each sandbox's DNS stub reuses the gateway's
	// positive answer to an A or AAAA question, never past its TTL (the
	// relay's DNSCacheFor); 0 asks the gateway every time. Default 1s.
	DNSCache time.Duration `yaml:"dns_cache"`
	// Pods maps Kubernetes pods that sluice-cni pins (POST /v1/pods) to
	// the identity their connections carry, by the pod's namespace. A pod
	// whose namespace no rule names is refused, so its ADD fails and it
	// never starts: the mapping is an allow-list kept on the host, not
	// something a pod's own spec can choose.
	Pods []PodRule `yaml:"pods"`
	// KubeAPI is where pods rules with agent_from or session_from read
	// the pod's labels and service account (default: in-cluster).
	KubeAPI KubeAPI `yaml:"kube_api"`
	// AdoptWait is how long a sandbox outlives a sandboxd that died
	// (kill -9, a crash, an upgrade): its init waits that long for a new
	// sandboxd to re-adopt it, then ends. 0: sandboxes die with sandboxd.
	// A sandboxd that stops on SIGTERM destroys its sandboxes either way.
	// Default 10m, at most 24h.
	AdoptWait time.Duration `yaml:"adopt_wait"`
	// OnStop is what SIGTERM does to live sandboxes: "destroy" (default)
	// kills them and removes their state; "keep" (needs adopt_wait) leaves
	// them running for the next sandboxd to re-adopt, so that an upgrade
	// (systemctl restart with KillMode=process) keeps every sandbox.
	OnStop string `yaml:"on_stop"`
	// Pool is the warm pool: sandboxes built ahead with the default limits
	// and no identity, each taken by one create (which binds its identity
	// and opens its exits) and never reused. It is spares under its issue
	// 24 name, with a refill rate; set one of pool.size and spares.
	Pool Pool `yaml:"pool"`
	// Templates are named kinds of sandbox (templates.go): a create that
	// names one gets its rootfs, limits, egress and env.
	Templates map[string]Template `yaml:"templates"`
}

// Pool sizes the warm pool and bounds how fast it refills.
type Pool struct {
	Size int `yaml:"size"`
	// RefillPerSecond bounds how many pooled sandboxes are built per
	// second in the background (a burst of creates then does not turn into
	// a burst of forks competing with the sandboxes just handed out);
	// 0 = as fast as one builder goes.
	RefillPerSecond float64 `yaml:"refill_per_second"`
	// PerTemplate keeps a pool of its own for each template it names,
	// of that template's sandboxes; size is the pool of sandboxes made
	// without a template.
	PerTemplate map[string]int `yaml:"per_template"`
}

// The values of on_stop.
const (
	OnStopDestroy = "destroy"
	OnStopKeep    = "keep"
)

// PodRule gives the pods of one Kubernetes namespace their identity. The
// session is the pod's own (namespace/name/uid), so ending it ends one pod.
type PodRule struct {
	Namespace string `yaml:"namespace"` // the pod's namespace, exactly
	Agent     string `yaml:"agent"`
	// AgentFrom takes the agent from the pod instead ("label:KEY" or
	// "serviceaccount"); the value must be one of Agents.
	AgentFrom string   `yaml:"agent_from"`
	Agents    []string `yaml:"agents"`
	// SessionFrom takes the session from the pod ("label:KEY" or
	// "serviceaccount"), as namespace/value; default namespace/name/uid.
	SessionFrom string   `yaml:"session_from"`
	User        string   `yaml:"user"`
	Egress      []string `yaml:"egress"` // narrows the agent's egress allowlist, as a pin's egress does
}

// relayDNSCache is DNSCache as relay.Options.DNSCacheFor says it (there 0
// means the default and a negative value means off).
func (c Config) relayDNSCache() time.Duration {
	if c.DNSCache <= 0 {
		return -1
	}
	return c.DNSCache
}

// GatewayTLS is where and how to reach a remote gateway's relay listener.
// The certificate in CertFile is this host's: the gateway requires the
// Host of every preamble to be one of its DNS names. The files are read
// again when they change, so a renewed certificate is used from the next
// connection on.
type GatewayTLS struct {
	Address    string `yaml:"address"`     // host:port of gateway.relay_tls.listen
	CertFile   string `yaml:"cert_file"`   // this host's client certificate (PEM)
	KeyFile    string `yaml:"key_file"`    // its key (PEM)
	CAFile     string `yaml:"ca_file"`     // the CA the gateway's certificate must chain to
	ServerName string `yaml:"server_name"` // the name the gateway's certificate must carry; default: address's host
}

// UIDRange is the host uid/gid range sandboxes map into: sandbox n of at
// most Count maps its uids 0..65535 to Base+n*65536.
type UIDRange struct {
	Base  int `yaml:"base"`
	Count int `yaml:"count"`
}

// Limits bound one sandbox. Zero means "use the default". The configured
// limits (Config.Limits) are both the defaults and the ceilings: a create
// or exec request may ask for less, never for more (CeilingError).
type Limits struct {
	Pids           int           `yaml:"pids" json:"pids,omitempty"`
	MemoryBytes    int64         `yaml:"memory_bytes" json:"memory_bytes,omitempty"`
	CPUMillis      int           `yaml:"cpu_millis" json:"cpu_millis,omitempty"` // 1000 = one core
	WorkspaceBytes int64         `yaml:"workspace_bytes" json:"workspace_bytes,omitempty"`
	TmpBytes       int64         `yaml:"tmp_bytes" json:"tmp_bytes,omitempty"`
	OutputBytes    int           `yaml:"output_bytes" json:"output_bytes,omitempty"`
	FileBytes      int64         `yaml:"file_bytes" json:"file_bytes,omitempty"`
	ExecTimeout    time.Duration `yaml:"exec_timeout" json:"exec_timeout,omitempty"`
	Lifetime       time.Duration `yaml:"lifetime" json:"lifetime,omitempty"` // 0 = until destroyed
}

// DefaultLimits are used for every zero field of Config.Limits.
var DefaultLimits = Limits{
	Pids:           128,
	MemoryBytes:    256 << 20,
	CPUMillis:      1000,
	WorkspaceBytes: 64 << 20,
	TmpBytes:       16 << 20,
	OutputBytes:    1 << 20,
	FileBytes:      16 << 20,
	ExecTimeout:    60 * time.Second,
}

// Default is the configuration used when a key is absent.
func Default() Config {
	return Config{
		API:          "/run/sluice/sandboxd.sock",
		Gateway:      "/run/sluice/relay.sock",
		StateDir:     "/var/lib/sluice-sandboxd",
		Rootfs:       "/",
		CgroupParent: "sluice-sandboxd",
		UIDs:         UIDRange{Base: 100000, Count: 256},
		Limits:       DefaultLimits,
		DNSCache:     time.Second,
		AdoptWait:    10 * time.Minute,
		OnStop:       OnStopDestroy,
	}
}

// LoadConfig reads path strictly (unknown keys are errors) over Default
// and validates the result.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		// Named as sluice names its config: "config FILE: KEY: … (line N)",
		// one problem a line.
		lines := strings.Split(err.Error(), "\n")
		for i, l := range lines {
			lines[i] = "config " + path + ": " + strings.TrimPrefix(l, "config: ")
		}
		return Config{}, errors.New(strings.Join(lines, "\n"))
	}
	return c, nil
}

// ParseConfig decodes b strictly over Default and validates it. Errors
// name the key by its path and, where the file has it, its line, as
// sluice's config errors do: "config: limits.pids: … (line 4)". Byte
// counts under limits may be sizes ("512MiB", "1GiB").
func ParseConfig(b []byte) (Config, error) {
	c := Default()
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	var doc *yaml.Node
	if len(root.Content) > 0 {
		doc = root.Content[0]
		if err := yamlkeys.Check(doc, reflect.TypeOf(c), ""); err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if err := sizeKeys(doc); err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if err := checkTemplateKeys(doc); err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if err := doc.Decode(&c); err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
	}
	c.Limits = c.Limits.Or(DefaultLimits)
	if err := c.Validate(); err != nil {
		return Config{}, withLine(doc, err)
	}
	return c, nil
}

// UnknownKeyError names a key sandboxd.yaml does not have, and its line.
type UnknownKeyError = yamlkeys.UnknownKeyError

// byteKeys are the limits given in bytes, which may be written as sizes.
var byteKeys = []string{"memory_bytes", "workspace_bytes", "tmp_bytes", "output_bytes", "file_bytes"}

// sizeKeys rewrites every size under limits ("1GiB") to its byte count,
// in place, so that the decoder sees a number.
func sizeKeys(doc *yaml.Node) error {
	return sizeKeysIn(child(doc, "limits"), "limits")
}

// sizeKeysIn is sizeKeys for the limits mapping lim at key.
func sizeKeysIn(lim *yaml.Node, key string) error {
	if lim == nil {
		return nil
	}
	for _, k := range byteKeys {
		v := child(lim, k)
		if v == nil || v.Kind != yaml.ScalarNode || v.Tag == "!!int" {
			continue
		}
		n, err := ParseSize(v.Value)
		if err != nil {
			return fmt.Errorf("%s.%s: %w (line %d)", key, k, err, v.Line)
		}
		v.Value, v.Tag, v.Style = strconv.FormatInt(n, 10), "!!int", 0
	}
	return nil
}

// child is the value of key in mapping n, or nil.
func child(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// withLine adds to each error of a Validate error ("config: KEY: …")
// the line of KEY, when the file has that key.
func withLine(doc *yaml.Node, err error) error {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	for i, e := range errs {
		if n := keyNode(doc, e.Error()); n != nil {
			errs[i] = fmt.Errorf("%w (line %d)", e, n.Line)
		}
	}
	return errors.Join(errs...)
}

// keyNode is the node of the key msg ("config: KEY: …") names, or nil.
func keyNode(doc *yaml.Node, msg string) *yaml.Node {
	rest, ok := strings.CutPrefix(msg, "config: ")
	key, _, ok2 := strings.Cut(rest, ": ")
	if doc == nil || !ok || !ok2 {
		return nil
	}
	n := doc
	for _, k := range strings.Split(key, ".") {
		if n = child(n, k); n == nil {
			return nil
		}
	}
	return n
}

// Validate checks every key and reports every bad one (errors.Join),
// each naming its key.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, p := range []struct{ key, v string }{
		{"api", c.API}, {"gateway", c.Gateway}, {"state_dir", c.StateDir}, {"rootfs", c.Rootfs},
	} {
		if p.v == "" || !filepath.IsAbs(p.v) {
			bad("config: %s: must be an absolute path, got %q", p.key, p.v)
		}
	}
	if c.CgroupParent == "" || filepath.Base(c.CgroupParent) != c.CgroupParent || c.CgroupParent == ".." {
		bad("config: cgroup_parent: must be one path element, got %q", c.CgroupParent)
	}
	if c.UIDs.Base < 65536 {
		bad("config: uids.base: must be >= 65536 so no sandbox maps onto host system users, got %d", c.UIDs.Base)
	}
	if c.UIDs.Count < 1 || int64(c.UIDs.Base)+int64(c.UIDs.Count)*65536 > 1<<32-2 {
		bad("config: uids.count: %d slots do not fit above base %d", c.UIDs.Count, c.UIDs.Base)
	}
	if c.DNSCache < 0 || c.DNSCache > time.Hour {
		bad("config: dns_cache: must be in 0s..1h, got %s", c.DNSCache)
	}
	if c.Spares < 0 || c.Spares > 64 || c.Spares >= c.UIDs.Count {
		bad("config: spares: must be in 0..64 and below uids.count, got %d", c.Spares)
	}
	switch {
	case c.Pool.Size < 0 || c.Pool.Size > 64 || (c.Pool.Size > 0 && c.Pool.Size >= c.UIDs.Count):
		bad("config: pool.size: must be in 0..64 and below uids.count, got %d", c.Pool.Size)
	case c.Pool.Size > 0 && c.Spares > 0:
		bad("config: pool.size: set pool.size or spares, not both (spares is its older name)")
	}
	if c.Pool.RefillPerSecond < 0 || c.Pool.RefillPerSecond > 1000 {
		bad("config: pool.refill_per_second: must be in 0..1000, got %g", c.Pool.RefillPerSecond)
	}
	if f := c.GatewaySessionTokenFile; f != "" {
		if !filepath.IsAbs(f) {
			bad("config: gateway_session_token_file: must be an absolute path, got %q", f)
		} else if c.GatewayAdmin == "" {
			bad("config: gateway_session_token_file: needs gateway_admin (where sessions are ended)")
		}
	}
	if c.AdoptWait < 0 || c.AdoptWait > 24*time.Hour {
		bad("config: adopt_wait: must be in 0s..24h, got %s", c.AdoptWait)
	}
	switch c.OnStop {
	case OnStopDestroy:
	case OnStopKeep:
		if c.AdoptWait <= 0 {
			bad("config: on_stop: keep needs adopt_wait above 0s (a kept sandbox waits that long for the next sandboxd)")
		}
	default:
		bad("config: on_stop: must be destroy or keep, got %q", c.OnStop)
	}
	seen := map[string]bool{}
	for i, r := range c.Pods {
		switch {
		case r.Namespace == "":
			bad("config: pods[%d].namespace: is required", i)
		case seen[r.Namespace]:
			bad("config: pods[%d].namespace: %q is mapped twice", i, r.Namespace)
		}
		seen[r.Namespace] = true
		errs = append(errs, r.validate(i))
	}
	errs = append(errs, c.KubeAPI.validate(), c.validateTemplates())
	errs = append(errs, checkGatewayAdmin(c.GatewayAdmin), c.GatewayTLS.validate(c.Host), c.Limits.Validate("limits"))
	return errors.Join(errs...)
}

// Validate checks that every limit is positive and bounded; key prefixes
// the error.
func (l Limits) Validate(key string) error {
	switch {
	case l.Pids < 8 || l.Pids > 1<<20:
		return fmt.Errorf("config: %s.pids: must be in 8..1048576, got %d", key, l.Pids)
	case l.MemoryBytes < 16<<20:
		return fmt.Errorf("config: %s.memory_bytes: must be >= 16MiB, got %s", key, sizeString(l.MemoryBytes))
	case l.CPUMillis < 10:
		return fmt.Errorf("config: %s.cpu_millis: must be >= 10, got %d", key, l.CPUMillis)
	case l.WorkspaceBytes < 1<<20:
		return fmt.Errorf("config: %s.workspace_bytes: must be >= 1MiB, got %s", key, sizeString(l.WorkspaceBytes))
	case l.TmpBytes < 1<<20:
		return fmt.Errorf("config: %s.tmp_bytes: must be >= 1MiB, got %s", key, sizeString(l.TmpBytes))
	case l.OutputBytes < 1:
		return fmt.Errorf("config: %s.output_bytes: must be positive, got %d", key, l.OutputBytes)
	case l.FileBytes < 1:
		return fmt.Errorf("config: %s.file_bytes: must be positive, got %d", key, l.FileBytes)
	case l.ExecTimeout <= 0:
		return fmt.Errorf("config: %s.exec_timeout: must be positive, got %s", key, l.ExecTimeout)
	case l.Lifetime < 0:
		return fmt.Errorf("config: %s.lifetime: must not be negative, got %s", key, l.Lifetime)
	}
	return nil
}

// CeilingError refuses a requested limit above its ceiling, or one that
// is negative. The request is refused, not capped: the caller asked for
// something sandboxd will not give, and must see that.
type CeilingError struct {
	Limit     string // the limit's key, e.g. "memory_bytes"
	Requested string
	Ceiling   string // "" when the fault is a negative value
	From      string // where the ceiling is set
}

func (e *CeilingError) Error() string {
	if e.Ceiling == "" {
		return fmt.Sprintf("%s: requested %s must not be negative", e.Limit, e.Requested)
	}
	return fmt.Sprintf("%s: requested %s is above the ceiling %s (%s.%s)", e.Limit, e.Requested, e.Ceiling, e.From, e.Limit)
}

// Within checks every field a request set (non-zero) against ceil, naming
// from (e.g. "sandboxd.yaml limits") as where the ceilings are set. A
// Lifetime ceiling of 0 means none.
func (l Limits) Within(ceil Limits, from string) error {
	const num, size, dur = 0, 1, 2
	for _, f := range []struct {
		name      string
		req, ceil int64
		kind      int
	}{
		{"pids", int64(l.Pids), int64(ceil.Pids), num},
		{"memory_bytes", l.MemoryBytes, ceil.MemoryBytes, size},
		{"cpu_millis", int64(l.CPUMillis), int64(ceil.CPUMillis), num},
		{"workspace_bytes", l.WorkspaceBytes, ceil.WorkspaceBytes, size},
		{"tmp_bytes", l.TmpBytes, ceil.TmpBytes, size},
		{"output_bytes", int64(l.OutputBytes), int64(ceil.OutputBytes), size},
		{"file_bytes", l.FileBytes, ceil.FileBytes, size},
		{"exec_timeout", int64(l.ExecTimeout), int64(ceil.ExecTimeout), dur},
		{"lifetime", int64(l.Lifetime), int64(ceil.Lifetime), dur},
	} {
		str := func(v int64) string { return strconv.FormatInt(v, 10) }
		switch f.kind {
		case dur:
			str = func(v int64) string { return time.Duration(v).String() }
		case size:
			str = sizeString
		}
		switch {
		case f.req < 0:
			return &CeilingError{Limit: f.name, Requested: str(f.req), From: from}
		case f.name == "lifetime" && f.ceil == 0: // no ceiling
		case f.req > f.ceil:
			return &CeilingError{Limit: f.name, Requested: str(f.req), Ceiling: str(f.ceil), From: from}
		}
	}
	return nil
}

// Or fills every zero field of l from d.
func (l Limits) Or(d Limits) Limits {
	l.Pids = cmp.Or(l.Pids, d.Pids)
	l.MemoryBytes = cmp.Or(l.MemoryBytes, d.MemoryBytes)
	l.CPUMillis = cmp.Or(l.CPUMillis, d.CPUMillis)
	l.WorkspaceBytes = cmp.Or(l.WorkspaceBytes, d.WorkspaceBytes)
	l.TmpBytes = cmp.Or(l.TmpBytes, d.TmpBytes)
	l.OutputBytes = cmp.Or(l.OutputBytes, d.OutputBytes)
	l.FileBytes = cmp.Or(l.FileBytes, d.FileBytes)
	l.ExecTimeout = cmp.Or(l.ExecTimeout, d.ExecTimeout)
	l.Lifetime = cmp.Or(l.Lifetime, d.Lifetime)
	return l
}

// checkGatewayAdmin validates the gateway_admin key: empty, or an http(s)
// URL with a host and nothing but a path.
func checkGatewayAdmin(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("config: gateway_admin: want the http(s) URL of the gateway's admin listener, got %q", s)
	}
	return nil
}

// sizeUnits are the suffixes ParseSize accepts, largest first.
var sizeUnits = []struct {
	suffix string
	n      int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"kB", 1e3}, {"KB", 1e3}, {"B", 1},
}

// ParseSize reads a byte count: a plain number ("1048576") or a number
// with a unit, IEC ("512MiB", "1GiB") or SI ("500MB"). A size that does
// not fit in int64 or is negative is refused.
func ParseSize(s string) (int64, error) {
	num, mult := s, int64(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.n
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 || v > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a size (bytes, or like 512MiB or 1GiB)", s)
	}
	return v * mult, nil
}

// FormatSize writes n with the largest IEC unit that divides it exactly
// ("1GiB", "1536KiB"), or as plain bytes.
func FormatSize(n int64) string {
	for _, u := range sizeUnits[:4] {
		if n != 0 && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// sizeString is n in bytes, followed by its size when a unit divides it
// ("67108864 (64MiB)"), so an error shows both what was written and what
// it means.
func sizeString(n int64) string {
	if f := FormatSize(n); f != strconv.FormatInt(n, 10) {
		return strconv.FormatInt(n, 10) + " (" + f + ")"
	}
	return strconv.FormatInt(n, 10)
}
