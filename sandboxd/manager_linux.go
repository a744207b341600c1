package sandboxd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// Ports inside every sandbox's network namespace.
const (
	ProxyPort = 3128
	DNSPort   = 53
)

// SandboxUID is the uid (and gid) code runs as inside a sandbox.
const SandboxUID = 1000

// SandboxUser is SandboxUID's name inside (its /etc/passwd, $USER).
const SandboxUser = "sandbox"

// InitUID is the uid a sandbox's init runs as once confined: not
// SandboxUID, so that no code of the sandbox can signal, prlimit, renice or
// trace its init (THREATS A13). Its gid stays SandboxUID.
const InitUID = 999

// Errors callers classify (errors.Is).
var (
	ErrNotFound = errors.New("sandbox not found")
	ErrInvalid  = errors.New("invalid request")
	ErrTooLarge = errors.New("too large")
	ErrFull     = errors.New("no free uid range")
	ErrDenied   = errors.New("path leaves the workspace")
)

// Exit describes one sandbox's only way out, for an ExitOpener.
type Exit struct {
	NetNS      string        // /proc/PID/ns/net of the sandbox's init
	Identity   wire.Identity // the preamble every relayed connection starts with
	Gateway    string        // the gateway's socket
	SocketPath string        // host path of the per-sandbox socket (seen at /run/sluice/gateway.sock)
	// GatewayAddr and GatewayTLS: a gateway on another host (config
	// gateway_tls), used instead of Gateway when GatewayAddr is set.
	GatewayAddr string
	GatewayTLS  *tls.Config
	ProxyPort   int
	DNSPort     int
	DNSCacheFor time.Duration // as relay.Options.DNSCacheFor (config dns_cache)
}

// ExitOpener opens a sandbox's listeners (sandboxd/relay); the Closer
// closes them on destroy. cmd/sandboxd wires relay.Open here.
type ExitOpener func(ctx context.Context, e Exit) (io.Closer, error)

// Options configure a Manager.
type Options struct {
	Config Config
	Logger *slog.Logger
	// Exits opens each sandbox's exits; nil leaves sandboxes with none.
	Exits ExitOpener
	// InitPath is the binary re-executed as init (default /proc/self/exe);
	// it must call RunInit when its first argument is InitArg.
	InitPath string
}

// CreateRequest asks for one sandbox.
type CreateRequest struct {
	// Template names one of the configured templates (config templates):
	// the sandbox gets its rootfs, limits (as defaults and ceilings),
	// egress and env. An unknown name is refused.
	Template string            `json:"template,omitempty"`
	Agent    string            `json:"agent"`
	Session  string            `json:"session,omitempty"`
	User     string            `json:"user,omitempty"`
	Limits   Limits            `json:"limits,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// Lifetime destroys the sandbox after this long (0 = the configured
	// default; none = until DELETE).
	Lifetime time.Duration `json:"lifetime,omitempty"`
	// Egress narrows the agent's raw egress allowlist for this sandbox
	// (names or *.names); nil: the agent's list. It can only narrow: the
	// gateway refuses at create a host outside the agent's list
	// (checkEgress) and enforces the intersection at every request. It
	// travels in the sandbox's identity (wire.Identity.Egress).
	Egress []string `json:"egress,omitempty"`
}

// Info describes a live sandbox.
type Info struct {
	ID       string    `json:"id"`
	Template string    `json:"template,omitempty"`
	Agent    string    `json:"agent"`
	Session  string    `json:"session,omitempty"`
	User     string    `json:"user,omitempty"`
	Created  time.Time `json:"created"`
	Limits   Limits    `json:"limits"`
	// Egress is the sandbox's narrowing (canonical, as in its identity);
	// empty: its agent's allowlist.
	Egress []string `json:"egress,omitempty"`
	Pid    int      `json:"pid"` // host pid of the sandbox's init
	// Failed says why the sandbox can run nothing more (its init died);
	// empty while it can.
	Failed string `json:"failed,omitempty"`
}

// ExecRequest runs one command in a sandbox.
type ExecRequest struct {
	Argv []string
	Env  map[string]string // added to the sandbox's environment
	// Stdin is the command's input (nil = empty). An *os.File is passed
	// through as is.
	Stdin io.Reader
	// Stdout and Stderr receive at most OutputBytes each, then a
	// truncation marker; nil collects them into the result.
	Stdout, Stderr io.Writer
	Timeout        time.Duration // 0 = the sandbox's exec_timeout
	OutputBytes    int           // 0 = the sandbox's output_bytes
}

// KilledBy says which limit ended (or hit) a command.
type KilledBy string

// The limits a command can run into.
const (
	KilledByNone    KilledBy = ""
	KilledByOOM     KilledBy = "oom"
	KilledByPids    KilledBy = "pids"
	KilledByTimeout KilledBy = "timeout"
)

// String returns the name used in the API and events.
func (k KilledBy) String() string { return string(k) }

// ExecResult is a finished command.
type ExecResult struct {
	ExitCode  int      `json:"exit_code"`
	Signal    int      `json:"signal,omitempty"`
	Stdout    string   `json:"stdout"`
	Stderr    string   `json:"stderr"`
	Truncated bool     `json:"truncated"`
	KilledBy  KilledBy `json:"killed_by,omitempty"`
	Millis    int64    `json:"duration_ms"`
}

// TruncatedMarker ends an output stream cut at its cap.
const TruncatedMarker = "\n[sluice: output truncated]\n"

// Manager creates, runs and destroys sandboxes.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	exits  ExitOpener
	gwTLS  *tls.Config // config gateway_tls, nil when the gateway is local
	init   string
	events *eventLog
	state  *stateDir

	pending sync.WaitGroup // background destroys, cleanups and reports
	creates sync.WaitGroup // Creates past their closed check (Close waits)
	// watchers wait for each init's exit (initwatch_linux.go); each
	// ends once its init has exited.
	watchers sync.WaitGroup
	reports  chan struct{} // cap maxReports: limit reports in flight (gateway_admin_linux.go)
	// pools hold sandboxes built ahead, by template ("": none)
	// (pool_linux.go).
	pools   map[string]*warmPool
	refills sync.WaitGroup
	// lastCreate is when the last create or exec began or ended,
	// inCreate how many creates run (under mu): refills wait for a quiet
	// moment (pool_linux.go).
	lastCreate time.Time
	inCreate   int
	// closing is closed when Close begins (refills stop waiting).
	closing chan struct{}
	// refillRate bounds pool refills (config pool.refill_per_second);
	// nil: unbounded.
	refillRate *rate.Limiter

	tmplMu sync.Mutex
	tmpls  map[string]*mountTemplate // by rootfs, each built by its first fork
	cgs    *cgroupPool
	nss    *nsPool
	home   *nsSet // sandboxd's own namespaces, where forking threads go back
	forks  *forkThreads

	mu      sync.Mutex
	boxes   map[string]*sandbox
	slots   []bool
	pins    map[string]*pinEntry // by pin id
	pinning map[nsKey]bool       // namespaces pinned or being pinned
	closed  bool
}

type sandbox struct {
	info Info
	slot int
	dir  string
	env  []string
	cmd  *exec.Cmd
	ctl  *ctlConn
	cg   *cgroup
	tmpl string // the mount template's directory, in the init's mount namespace
	// affinity is the CPU mask the init gives itself once confined (it
	// is born on one CPU); nil: it was not pinned.
	affinity []uint64
	exit     io.Closer
	timer    *time.Timer
	built    bool // setup done: built and confined
	execMu   sync.Mutex
	// dead: the init has exited (or stopped answering); execs are refused.
	dead atomic.Bool
	// ending: teardown has begun, so the init's exit is no death.
	ending atomic.Bool
	failed string // why the init died (initwatch_linux.go); under Manager.mu
	// pidfd is set for an init a previous sandboxd started (re-adopted,
	// adopt_linux.go): not this process's child, so it is killed and
	// waited for through its pidfd; cmd is nil.
	pidfd *os.File
	// watch is the pidfd file the init's watcher waits on; release closes
	// it to end the watcher without ending the init.
	watch *os.File
}

// New prepares the state directory and returns a Manager.
func New(opts Options) (*Manager, error) {
	if err := opts.Config.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.InitPath == "" {
		opts.InitPath = "/proc/self/exe"
	}
	if opts.Config.Pool.Size > 0 { // pool.size is spares' newer name
		opts.Config.Spares = opts.Config.Pool.Size
	}
	// 0711: a sandbox's init (an unmapped uid on the host) must be able to
	// reach its own directory, but not list the others.
	if err := os.MkdirAll(opts.Config.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("sandboxd: state dir: %w", err)
	}
	if err := os.Chmod(opts.Config.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("sandboxd: state dir: %w", err)
	}
	if err := searchable(filepath.Dir(opts.Config.StateDir)); err != nil {
		return nil, err
	}
	if _, err := seccompProgram(); err != nil {
		return nil, fmt.Errorf("sandboxd: %w", err)
	}
	var gwTLS *tls.Config
	if g := opts.Config.GatewayTLS; g.Address != "" {
		var err error
		if gwTLS, err = newGatewayTLS(g, opts.Config.Host); err != nil {
			return nil, fmt.Errorf("sandboxd: %w", err)
		}
	}
	// Sandboxes a previous sandboxd left running keep their directories.
	recs, badRecs := loadBoxRecords(opts.Config.StateDir)
	keep := map[string]bool{}
	for _, r := range recs {
		keep[filepath.Base(r.Dir)] = true
	}
	sd, err := openStateDir(opts.Config.StateDir, opts.Logger, keep)
	if err != nil {
		return nil, err
	}
	sweepStale(opts.Config.CgroupParent)
	home, err := openHomeNS()
	if err != nil {
		sd.close()
		return nil, err
	}
	ev, err := openEventLog(filepath.Join(opts.Config.StateDir, "events.jsonl"))
	if err != nil {
		home.close()
		sd.close()
		return nil, err
	}
	m := &Manager{
		cfg: opts.Config, log: opts.Logger, exits: opts.Exits, gwTLS: gwTLS, init: opts.InitPath, events: ev, state: sd, home: home,
		boxes: map[string]*sandbox{}, slots: make([]bool, opts.Config.UIDs.Count),
		pins: map[string]*pinEntry{}, pinning: map[nsKey]bool{},
		reports: make(chan struct{}, maxReports), tmpls: map[string]*mountTemplate{}, closing: make(chan struct{}),
		cgs: &cgroupPool{parent: opts.Config.CgroupParent, max: opts.Config.pooled() + 4},
	}
	m.newPools()
	if r := opts.Config.Pool.RefillPerSecond; r > 0 {
		m.refillRate = rate.NewLimiter(rate.Limit(r), 1)
	}
	m.nss = newNSPool(m.template, home)
	m.forks = newForkThreads(2)
	m.readoptBoxes(context.Background(), recs, badRecs)
	m.startRefills()
	m.readoptPins(context.Background())
	return m, nil
}

// searchable checks that every directory from dir up to / lets others
// search it: a sandbox's init runs as an unmapped uid on the host and must
// reach its own directory under state_dir to build its root there.
func searchable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("sandboxd: state_dir: %w", err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("sandboxd: state_dir: parent %s is not searchable by others (needs o+x)", d)
		}
		if d == "/" {
			return nil
		}
	}
}

func checkEnv(env map[string]string) error {
	for k, v := range env {
		if !envKey.MatchString(k) || reservedEnv[k] || len(v) > 32<<10 || bytes.IndexByte([]byte(v), 0) >= 0 {
			return fmt.Errorf("%w: env %q", ErrInvalid, k)
		}
	}
	return nil
}

func (m *Manager) baseEnv(id string, extra map[string]string) []string {
	proxy := "http://127.0.0.1:" + strconv.Itoa(ProxyPort)
	env := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
		"HOME=/workspace", "TMPDIR=/tmp", "USER=" + SandboxUser, "LANG=C.UTF-8",
		"HTTP_PROXY=" + proxy, "HTTPS_PROXY=" + proxy, "http_proxy=" + proxy, "https_proxy=" + proxy,
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
		"SLUICE_URL=" + proxy, "SLUICE_SANDBOX=" + id,
		"SLUICE_MCP_URL=" + proxy + "/mcp", // the gateway's MCP door, through the same relay
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Create builds and starts a sandbox; on any error nothing is left behind.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (_ Info, err error) {
	if req.Agent == "" {
		return Info{}, fmt.Errorf("%w: agent is required", ErrInvalid)
	}
	if err := checkEnv(req.Env); err != nil {
		return Info{}, err
	}
	ceil, from := m.cfg.Limits, "sandboxd.yaml limits"
	if req.Template != "" {
		if req, err = m.applyTemplate(req); err != nil {
			return Info{}, err
		}
		ceil, from = m.templateLimits(req.Template), "sandboxd.yaml templates."+req.Template+".limits"
	}
	// The configured limits are ceilings: a request may lower them, never
	// raise them (THREATS B8). Refused, not capped, so the caller knows.
	if err := req.Limits.Within(ceil, from); err != nil {
		m.refuseLimit(req.Agent, "", err)
		return Info{}, fmt.Errorf("sandboxd: create: %w", err)
	}
	if err := (Limits{Lifetime: req.Lifetime}).Within(ceil, from); err != nil {
		m.refuseLimit(req.Agent, "", err)
		return Info{}, fmt.Errorf("sandboxd: create: %w", err)
	}
	lim := req.Limits.Or(ceil)
	if req.Lifetime != 0 {
		lim.Lifetime = req.Lifetime
	}
	if err := lim.Validate("limits"); err != nil {
		return Info{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	// The identity is checked before any resource is spent (the real
	// sandbox ID has the same shape as this placeholder).
	probe := wire.Identity{Sandbox: "0000000000000000", Agent: req.Agent, Session: req.Session, User: req.User, Host: m.cfg.Host}
	var egress []string
	if req.Egress != nil {
		if probe.Egress, err = wire.FormatEgress(req.Egress); err != nil {
			return Info{}, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		egress, _ = wire.ParseEgress(probe.Egress)
	}
	if err := probe.Validate(); err != nil {
		return Info{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	// A narrowing the gateway does not confirm builds nothing.
	if probe.Egress != "" {
		if err := m.checkEgress(ctx, probe); err != nil {
			m.events.write(event{Event: "egress_refused", Agent: req.Agent, Session: req.Session, User: req.User, Egress: probe.Egress, Error: err.Error()})
			return Info{}, fmt.Errorf("sandboxd: create: %w", err)
		}
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return Info{}, fmt.Errorf("sandboxd: create: manager closed")
	}
	var trust *gatewayTrust
	if m.cfg.GatewayAdmin != "" {
		for _, k := range trustEnv {
			if _, ok := req.Env[k]; ok {
				return Info{}, fmt.Errorf("%w: env %q is set from gateway_admin", ErrInvalid, k)
			}
		}
		for k := range req.Env {
			if strings.HasPrefix(k, "SLUICE_SECRET_") {
				return Info{}, fmt.Errorf("%w: env %q is set from gateway_admin", ErrInvalid, k)
			}
		}
		// Before any resource is spent: no sandbox without what
		// interception needs (fail closed).
		if trust, err = fetchGatewayTrustWith(ctx, m.cfg.GatewayAdmin, m.cfg.GatewaySessionTokenFile); err != nil {
			return Info{}, fmt.Errorf("sandboxd: create: %w", err)
		}
	}
	// From here the create spends shared resources (the namespace sets,
	// the fork threads, cgroups): Close waits for it before releasing them.
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return Info{}, fmt.Errorf("sandboxd: create: manager closed")
	}
	m.creates.Add(1)
	m.lastCreate = time.Now()
	m.inCreate++
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.inCreate--
		m.lastCreate = time.Now()
		m.mu.Unlock()
		m.creates.Done()
	}()
	sb := m.takeSpare(req.Template, lim)
	pooled := sb != nil
	m.startRefill(m.pools[req.Template])
	defer func() {
		if err != nil && sb != nil {
			m.teardown(sb, false)
		}
	}()
	if sb != nil {
		if err := sb.cg.setLimits(lim); err != nil {
			return Info{}, fmt.Errorf("sandboxd: create: %w", err)
		}
	} else if sb, err = m.fork(lim, req.Template); err != nil {
		return Info{}, err
	}
	id := sb.info.ID
	ident := probe
	ident.Sandbox = id
	m.mu.Lock() // the init's watcher reads it
	sb.info = Info{ID: id, Template: req.Template, Agent: req.Agent, Session: req.Session, User: req.User, Created: time.Now().UTC(), Limits: lim, Egress: egress, Pid: sb.info.Pid}
	m.mu.Unlock()
	env := req.Env
	if trust != nil {
		// run/ is bound into the sandbox: files written here now appear
		// at /run/sluice also in a sandbox built ahead.
		tenv, err := trust.install(filepath.Join(sb.dir, "run"), m.cfg.Rootfs)
		if err != nil {
			return Info{}, fmt.Errorf("sandboxd: create: %w", err)
		}
		env = make(map[string]string, len(req.Env)+len(tenv))
		for k, v := range req.Env {
			env[k] = v
		}
		for k, v := range tenv {
			env[k] = v
		}
	}
	sb.env = m.baseEnv(id, env)
	openExits := func() error {
		if m.exits == nil {
			return nil
		}
		x, err := m.exits(ctx, Exit{
			NetNS: fmt.Sprintf("/proc/%d/ns/net", sb.info.Pid), Identity: ident, Gateway: m.cfg.Gateway,
			GatewayAddr: m.cfg.GatewayTLS.Address, GatewayTLS: m.gwTLS,
			SocketPath: filepath.Join(sb.dir, "run", "gateway.sock"), ProxyPort: ProxyPort, DNSPort: DNSPort, DNSCacheFor: m.cfg.relayDNSCache(),
		})
		if err != nil {
			return fmt.Errorf("sandboxd: create: open exits: %w", err)
		}
		sb.exit = x
		return nil
	}
	if sb.built {
		err = openExits()
	} else {
		// The exits open while the init builds its root.
		err = m.setup(sb, openExits)
	}
	if err != nil {
		return Info{}, err
	}
	m.mu.Lock()
	if m.closed { // Close ran meanwhile: it will not see this sandbox
		m.mu.Unlock()
		return Info{}, fmt.Errorf("sandboxd: create: manager closed")
	}
	m.boxes[id] = sb
	if lim.Lifetime > 0 {
		sb.timer = time.AfterFunc(lim.Lifetime, func() { _ = m.Destroy(id) })
	}
	m.mu.Unlock()
	// Not re-adoptable without it, but it runs as well: reported, not fatal.
	if err := m.saveBox(sb, ident); err != nil {
		m.log.Warn("sandbox state not saved: a restarted sandboxd cannot re-adopt it", "sandbox", id, "err", err)
		m.events.write(event{Event: "state_not_saved", Sandbox: id, Agent: req.Agent, Error: err.Error()})
	}
	m.events.write(event{Event: "created", Sandbox: id, Template: req.Template, Pooled: pooled, Agent: req.Agent, Session: req.Session, User: req.User, Pid: sb.info.Pid})
	m.log.Info("sandbox created", "sandbox", id, "agent", req.Agent, "pid", sb.info.Pid)
	return sb.info, nil
}

// fork allocates a uid slot, the state directory and the cgroup, and
// starts an init that waits for its setup message.
func (m *Manager) fork(lim Limits, template string) (_ *sandbox, err error) {
	id := newID()
	sb := &sandbox{info: Info{ID: id, Template: template, Limits: lim}, dir: filepath.Join(m.state.boxes, id), slot: -1}
	defer func() {
		if err != nil {
			m.teardown(sb, false)
		}
	}()
	m.mu.Lock()
	for i, used := range m.slots {
		if !used {
			m.slots[i], sb.slot = true, i
			break
		}
	}
	m.mu.Unlock()
	if sb.slot < 0 {
		return nil, ErrFull
	}
	if err := os.Mkdir(sb.dir, 0o755); err != nil {
		return nil, fmt.Errorf("sandboxd: create: %w", err)
	}
	if sb.cg, err = m.cgs.get(id, lim); err != nil {
		return nil, fmt.Errorf("sandboxd: create: %w", err)
	}
	if err := m.start(sb); err != nil {
		return nil, err
	}
	// What the init builds on, made while its runtime starts: it reads
	// none of it before the setup message.
	for _, d := range []string{filepath.Join(sb.dir, "root"), filepath.Join(sb.dir, "run"), filepath.Join(sb.dir, "etc")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, fmt.Errorf("sandboxd: create: %w", err)
		}
	}
	// Where the init listens for a sandboxd that re-adopts it: owned by
	// the init's own host uid (its root inside), outside the sandbox's
	// root and run/, so nothing inside the sandbox ever sees it.
	if m.cfg.AdoptWait > 0 {
		d := filepath.Dir(ctlSock(sb.dir))
		host := m.cfg.UIDs.Base + sb.slot*65536
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("sandboxd: create: %w", err)
		}
		if err := os.Chown(d, host, host+SandboxUID); err != nil {
			return nil, fmt.Errorf("sandboxd: create: %w", err)
		}
	}
	// The sandbox's /etc/hosts, /etc/hostname, /etc/passwd and
	// /etc/group, bound in by its init. Owned by the host's root (nobody
	// inside), mode 0644: read-only to the sandbox. passwd and group name
	// the sandbox's own users, so `id` and $HOME lookups say "sandbox",
	// and no host account name shows inside.
	host := hostname(id)
	for name, body := range map[string]string{
		"hosts":    "127.0.0.1 localhost\n::1 localhost\n127.0.1.1 " + host + "\n",
		"hostname": host + "\n",
		"passwd":   etcPasswd,
		"group":    etcGroup,
	} {
		if err := os.WriteFile(filepath.Join(sb.dir, "etc", name), []byte(body), 0o644); err != nil {
			return nil, fmt.Errorf("sandboxd: create: %w", err)
		}
	}
	return sb, nil
}

// etcPasswd and etcGroup are /etc/passwd and /etc/group in every
// sandbox: root (uid 0 is the unmapped overflow inside, but tools expect
// the name), the sandbox user code runs as, the init's own uid and nobody.
var (
	etcPasswd = fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\n"+
		"%[1]s:x:%[2]d:%[2]d:sandbox user:/workspace:/bin/sh\n"+
		"sandbox-init:x:%[3]d:%[2]d:sandbox init:/nonexistent:/usr/sbin/nologin\n"+
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", SandboxUser, SandboxUID, InitUID)
	etcGroup = fmt.Sprintf("root:x:0:\n%[1]s:x:%[2]d:\nnogroup:x:65534:\n", SandboxUser, SandboxUID)
)

// ctlSockFor is the re-adoption socket setupMsg names ("" with adopt_wait 0).
func (m *Manager) ctlSockFor(sb *sandbox) string {
	if m.cfg.AdoptWait <= 0 {
		return ""
	}
	return ctlSock(sb.dir)
}

// hostname is the host name of sandbox id.
func hostname(id string) string { return "sandbox-" + id[:8] }

// template returns the Manager's mount template of the configured rootfs,
// building it on first use (not once Close has begun: Close would not see
// it).
func (m *Manager) template() (*mountTemplate, error) {
	return m.templateOf(m.cfg.Rootfs)
}

// templateOf is template for rootfs: each rootfs a template names has a
// mount template of its own, in a directory of its own.
func (m *Manager) templateOf(rootfs string) (*mountTemplate, error) {
	m.tmplMu.Lock()
	defer m.tmplMu.Unlock()
	if t := m.tmpls[rootfs]; t != nil {
		return t, nil
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("sandboxd: create: manager closed")
	}
	dir := filepath.Join(m.cfg.StateDir, templateDir)
	if rootfs != m.cfg.Rootfs {
		sum := sha256.Sum256([]byte(rootfs))
		dir += "-" + hex.EncodeToString(sum[:6])
	}
	t, err := newMountTemplate(rootfs, dir)
	if err != nil {
		return nil, err
	}
	m.tmpls[rootfs] = t
	return t, nil
}

// start re-executes the binary as the sandbox's init in fresh namespaces,
// born in the sandbox's cgroup, so nothing of the sandbox ever runs
// outside it. The init then waits for its setup message.
func (m *Manager) start(sb *sandbox) error {
	rootfs := m.rootfsOf(sb.info.Template)
	tmpl, err := m.templateOf(rootfs)
	if err != nil {
		return err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sandboxd: start: %w", err)
	}
	parent, child := os.NewFile(uintptr(fds[0]), "ctl"), os.NewFile(uintptr(fds[1]), "ctl-init")
	defer child.Close()
	if sb.ctl, err = newCtlConn(parent); err != nil {
		parent.Close()
		return err
	}
	parent.Close() // newCtlConn dup'ed it
	sb.ctl.max = maxReply
	logf, err := os.OpenFile(filepath.Join(sb.dir, "init.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("sandboxd: start: %w", err)
	}
	defer logf.Close()
	host := m.cfg.UIDs.Base + sb.slot*65536
	cmd := &exec.Cmd{
		Path: m.init,
		Args: []string{"sandboxd", InitArg},
		// The init needs no parallelism (fewer threads to confine) and
		// no collection while it builds the sandbox (RunInit turns the
		// collector on before it serves execs).
		Env:        []string{"GOMAXPROCS=1", "GOGC=off"},
		Stderr:     logf,
		ExtraFiles: []*os.File{child},
		SysProcAttr: &syscall.SysProcAttr{
			// Network and IPC namespaces: the nsSet's, which the forking
			// thread joins.
			Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
				syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: host, Size: 65536}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: host, Size: 65536}},
			GidMappingsEnableSetgroups: true,
			// Root of its user namespace (it mounts), but already in the
			// sandbox's group: confine then only checks the gid, one
			// all-threads call fewer. Files and tmpfs roots the init makes
			// are group-owned by it with group permissions no wider than
			// other's (read, search), so this opens nothing.
			Credential: &syscall.Credential{Uid: 0, Gid: SandboxUID},
			Setsid:     true,
		},
	}
	// Born in its cgroup: nothing of the sandbox ever runs outside it.
	// Forked from a thread inside a fresh nsSet (made ahead, or now when
	// none waits): the sandbox's network and IPC namespaces are the
	// set's, its mount namespace starts as a copy of the set's.
	var set *nsSet
	if rootfs == m.cfg.Rootfs { // the sets made ahead copy this rootfs's template
		set = m.nss.take()
	}
	// Born on one CPU: the init's threads then share one, so its start
	// needs no TLB shootdowns between CPUs (inter-processor interrupts,
	// which a VM makes dear) and confine's all-threads steps do not spin
	// waiting for a thread elsewhere. It gives all its threads this
	// thread's mask back once confined, before any code of the sandbox.
	var home unix.CPUSet
	pinned := false
	pin := func() {
		var cpu uint32
		if unix.SchedGetaffinity(0, &home) != nil {
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); e != 0 {
			return
		}
		var one unix.CPUSet
		one.Set(int(cpu))
		pinned = unix.SchedSetaffinity(0, &one) == nil
	}
	prepare := func() error {
		pin()
		if set != nil {
			return set.enter()
		}
		var err error
		set, err = makeNSSet(tmpl) // leaves this thread inside it
		return err
	}
	// Then the thread goes home (namespaces and CPUs) to serve the next
	// fork; one that cannot is discarded (forkThreads). No thread of
	// sandboxd keeps a sandbox's namespaces.
	leave := func() bool {
		if pinned && unix.SchedSetaffinity(0, &home) != nil {
			return false
		}
		if err := m.home.enter(); err != nil {
			m.log.Error("sandboxd: forking thread cannot go back to its namespaces", "err", err)
			return false
		}
		return true
	}
	var ownGroups *cgroup
	if !sb.cg.v2 {
		ownGroups = m.cgs.home()
	}
	err = sb.cg.startIn(m.forks, ownGroups, prepare, func(fd int) {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}, cmd.Start, leave)
	if set != nil {
		set.close() // the init holds the namespaces now (or nobody)
	}
	if pinned {
		words := home[:]
		for len(words) > 0 && words[len(words)-1] == 0 {
			words = words[:len(words)-1]
		}
		sb.affinity = make([]uint64, len(words))
		for i, w := range words {
			sb.affinity[i] = uint64(w)
		}
	}
	if err != nil {
		return fmt.Errorf("sandboxd: start init: %w", err)
	}
	sb.cmd, sb.info.Pid, sb.tmpl = cmd, cmd.Process.Pid, tmpl.dir
	return m.watchInit(sb)
}

// setup sends the init its sandbox and waits until it reports the sandbox
// built and confined. onNet, if set, runs as soon as the init reports lo
// up, alongside the rest of the build; setup returns its error too.
func (m *Manager) setup(sb *sandbox, onNet func() error) (err error) {
	prog, err := seccompWire()
	if err != nil {
		return fmt.Errorf("sandboxd: start: %w", err)
	}
	err = sb.ctl.send(setupMsg{Seccomp: prog,
		Hostname: hostname(sb.info.ID), Template: sb.tmpl, RootDir: filepath.Join(sb.dir, "root"),
		RunDir: filepath.Join(sb.dir, "run"), EtcDir: filepath.Join(sb.dir, "etc"), WorkspaceBytes: sb.info.Limits.WorkspaceBytes,
		TmpBytes: sb.info.Limits.TmpBytes, UID: SandboxUID, GID: SandboxUID, InitUID: InitUID, ProxyPort: ProxyPort, DNSPort: DNSPort,
		Affinity: sb.affinity, CtlSock: m.ctlSockFor(sb), AdoptWaitMS: m.cfg.AdoptWait.Milliseconds(),
	})
	if err != nil {
		return fmt.Errorf("sandboxd: start: %w", err)
	}
	_ = sb.ctl.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer func() { _ = sb.ctl.c.SetReadDeadline(time.Time{}) }()
	var netErr chan error
	defer func() {
		if netErr != nil {
			err = errors.Join(err, <-netErr)
		}
		sb.built = err == nil
	}()
	for {
		var rep replyMsg
		if _, err := sb.ctl.recv(&rep); err != nil {
			return fmt.Errorf("sandboxd: start: init: %w (see %s)", err, filepath.Join(sb.dir, "init.log"))
		}
		switch {
		case rep.Error != "":
			return fmt.Errorf("sandboxd: start: %s", rep.Error)
		case rep.NetReady && netErr == nil:
			netErr = make(chan error, 1)
			if onNet == nil {
				netErr <- nil
				continue
			}
			go func() { netErr <- onNet() }()
		case rep.NetReady:
			return fmt.Errorf("sandboxd: start: init: second net_ready")
		case netErr == nil:
			return fmt.Errorf("sandboxd: start: init: done before net_ready")
		default:
			return nil
		}
	}
}

func (m *Manager) get(id string) (*sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.boxes[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return sb, nil
}

// Get describes one sandbox.
func (m *Manager) Get(id string) (Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.boxes[id]
	if !ok {
		return Info{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return sb.describe(), nil
}

// describe is sb's Info with its state; the caller holds Manager.mu.
func (sb *sandbox) describe() Info {
	in := sb.info
	in.Failed = sb.failed
	return in
}

// List describes every live sandbox, oldest first.
func (m *Manager) List() []Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Info, 0, len(m.boxes))
	for _, sb := range m.boxes {
		out = append(out, sb.describe())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Destroy kills everything in the sandbox, closes its exits and removes its
// state. When it returns the sandbox is unknown to the API, its exits are
// closed (no connection of it reaches the gateway any more) and its init
// has been sent SIGKILL, which the kernel turns into SIGKILL for every
// process of its pid namespace. Reaping, removing the cgroup and the state
// directory and freeing the uid range finish in the background; the
// "destroyed" event is written once they are done, then the session is
// ended at the gateway. Close waits for all of it.
func (m *Manager) Destroy(id string) error {
	m.mu.Lock()
	sb, ok := m.boxes[id]
	delete(m.boxes, id)
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return m.teardown(sb, true, func(err error) {
		ev := event{Event: "destroyed", Sandbox: id, Agent: sb.info.Agent, Session: sb.info.Session}
		if err != nil {
			ev.Error = err.Error()
		}
		m.events.write(ev)
		m.log.Info("sandbox destroyed", "sandbox", id)
		m.endSession(sb.info)
	})
}

// endSession tells the gateway that a destroyed sandbox's session ended
// (POST gateway_admin/api/v1/sessions/{session}/end with the token of
// gateway_session_token_file), so its pending holds expire and anything
// still carrying the session is refused. It runs only when both keys are
// set, the sandbox has a session and no other live sandbox carries it. A
// failure is logged and recorded as the event session_end_failed; it never
// fails the Destroy: the sandbox is gone either way, and an operator can
// still end the session with sluice sessions end.
func (m *Manager) endSession(info Info) {
	if m.cfg.GatewayAdmin == "" || m.cfg.GatewaySessionTokenFile == "" || info.Session == "" {
		return
	}
	if m.sessionCarried(info.Session) { // a live sandbox or pin: the last one ends it
		return
	}
	ev := event{Event: "session_ended", Sandbox: info.ID, Agent: info.Agent, Session: info.Session, User: info.User}
	if err := postSessionEnd(m.cfg.GatewayAdmin, m.cfg.GatewaySessionTokenFile, info.Session); err != nil {
		m.log.Warn("sandbox session not ended at the gateway", "sandbox", info.ID, "session", info.Session, "err", err)
		ev.Event, ev.Error = "session_end_failed", err.Error()
	}
	m.events.write(ev)
}

// postSessionEnd ends session on the gateway's admin listener at base.
// Errors name the step and never carry the token.
func postSessionEnd(base, tokenFile, session string) error {
	if err := postAdmin(base, tokenFile, "/api/v1/sessions/"+url.PathEscape(session)+"/end", nil); err != nil {
		return fmt.Errorf("end session: %w", err)
	}
	return nil
}

// teardown undoes whatever part of Create happened. It closes the exits
// and sends SIGKILL to the init at once: killing pid 1 of a pid namespace
// kills every process in it, and its exit is reported once they are all
// gone. Reaping the init, removing the cgroup and the state directory and
// freeing the uid slot follow, in the background with async (Close waits
// for them); then done, if set, runs with the cleanup's error.
func (m *Manager) teardown(sb *sandbox, async bool, done ...func(error)) error {
	var errs []error
	if sb.timer != nil {
		sb.timer.Stop()
	}
	if sb.exit != nil {
		errs = append(errs, sb.exit.Close())
	}
	sb.ending.Store(true)
	if sb.cmd != nil && sb.cmd.Process != nil {
		_ = sb.cmd.Process.Kill()
	} else if sb.pidfd != nil {
		sb.killAdopted()
	}
	finish := func() error {
		if sb.cmd != nil && sb.cmd.Process != nil {
			_ = sb.cmd.Wait()
		} else if sb.pidfd != nil {
			sb.reapAdopted()
		}
		if sb.ctl != nil {
			sb.ctl.Close()
		}
		err := m.cleanup(sb)
		for _, f := range done {
			f(err)
		}
		return err
	}
	if !async {
		return errors.Join(append(errs, finish())...)
	}
	m.pending.Add(1)
	go func() {
		defer m.pending.Done()
		if err := finish(); err != nil {
			m.log.Error("sandbox cleanup", "sandbox", sb.info.ID, "err", err)
		}
	}()
	return errors.Join(errs...)
}

// cleanup removes the cgroup and the state directory and frees the slot.
func (m *Manager) cleanup(sb *sandbox) error {
	var errs []error
	m.forgetBox(sb.info.ID)
	if sb.cg != nil {
		// Its init has been reaped (or never started): the group is
		// empty and may serve another sandbox.
		errs = append(errs, m.cgs.put(sb.cg))
	}
	if sb.dir != "" {
		// The sandbox's mounts lived in its own mount namespace, gone with
		// its last process; only plain files and directories remain.
		if err := os.RemoveAll(sb.dir); err != nil {
			errs = append(errs, fmt.Errorf("sandboxd: remove state: %w", err))
		}
	}
	if sb.slot >= 0 {
		m.mu.Lock()
		m.slots[sb.slot] = false
		m.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Close destroys every sandbox and unpins every pinned namespace.
func (m *Manager) Close() error {
	m.mu.Lock()
	if !m.closed {
		close(m.closing)
	}
	m.closed = true
	m.mu.Unlock()
	m.refills.Wait()
	m.creates.Wait() // a create in flight ends (built, or torn down) first
	var errs []error
	kept := m.cfg.OnStop == OnStopKeep && m.cfg.AdoptWait > 0
	errs = append(errs, m.closePools(kept))
	for _, in := range m.List() {
		if kept && in.Failed == "" {
			errs = append(errs, m.release(in.ID))
			continue
		}
		if err := m.Destroy(in.ID); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	for _, p := range m.Pins() {
		if p.Pod != nil || kept { // the next sandboxd re-adopts it
			errs = append(errs, m.releasePin(p.ID))
			continue
		}
		if err := m.Unpin(p.ID); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	m.pending.Wait()
	m.watchers.Wait() // every init was killed above: their events are written
	m.pending.Wait()  // and the reports they started are sent
	m.forks.close()   // waits for a fork's thread to be back home: it still reads the sets below
	errs = append(errs, m.cgs.close(), m.nss.close())
	m.home.close()
	m.tmplMu.Lock()
	for k, t := range m.tmpls {
		errs = append(errs, t.close())
		delete(m.tmpls, k)
	}
	m.tmplMu.Unlock()
	errs = append(errs, m.events.close())
	if m.state != nil {
		errs = append(errs, m.state.closeKeeping(kept))
	}
	return errors.Join(errs...)
}

// event is one line of events.jsonl.
// refuseLimit records a request refused for asking more than a ceiling.
func (m *Manager) refuseLimit(agent, sandbox string, err error) {
	m.events.write(event{Event: "limit_refused", Sandbox: sandbox, Agent: agent, Error: err.Error()})
}

type event struct {
	Time     time.Time `json:"time"`
	Event    string    `json:"event"`
	Sandbox  string    `json:"sandbox"`
	Agent    string    `json:"agent,omitempty"`
	Session  string    `json:"session,omitempty"`
	User     string    `json:"user,omitempty"`
	Pid      int       `json:"pid,omitempty"`
	NetNS    string    `json:"netns,omitempty"`
	Argv0    string    `json:"argv0,omitempty"`
	ExitCode *int      `json:"exit_code,omitempty"`
	KilledBy KilledBy  `json:"killed_by,omitempty"`
	Millis   int64     `json:"duration_ms,omitempty"`
	Error    string    `json:"error,omitempty"`
	Egress   string    `json:"egress,omitempty"`
	// Template and Pooled, on created: the template named, and whether a
	// pooled sandbox served the create (false: it forked its own).
	Template string `json:"template,omitempty"`
	Pooled   bool   `json:"pooled,omitempty"`
}

// eventLog appends JSON lines outside every sandbox.
type eventLog struct {
	mu sync.Mutex
	f  *os.File
}

func openEventLog(path string) (*eventLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandboxd: events: %w", err)
	}
	return &eventLog{f: f}, nil
}

func (l *eventLog) write(e event) {
	e.Time = time.Now().UTC()
	b, _ := json.Marshal(e)
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write(append(b, '\n'))
}

func (l *eventLog) close() error { return l.f.Close() }
