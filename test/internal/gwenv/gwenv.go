//go:build linux

// Package gwenv runs the real `sluice serve` binary for the suites that
// test it from outside (test/e2e, test/fault, test/attack): it builds the binary, makes a network namespace per test
// (lo up, its own /etc/hosts and resolv.conf), runs an upstream API on that
// namespace's loopback whose behaviour a test switches (answer, hang,
// reset, garbage, redirect), writes the gateway's configuration, starts and
// kills the gateway inside the namespace and talks to it over the sandbox
// socket exactly as sandboxd relays an agent: the identity preamble, then
// HTTP bytes.
//
// Nothing here contacts an address outside loopback and the test's own
// namespaces.
package gwenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-gw/sluice/sandboxd/relay"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

//go:embed testdata/tickets.yaml
var ticketsSpec []byte

// Agent identities as sandboxd would relay them. Alice is agent-a's user.
var (
	AgentA = wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s1", User: "alice"}
	AgentB = wire.Identity{Sandbox: "sb-2", Agent: "agent-b", Session: "s2", User: "bob"}
)

// Approver tokens written into the configuration by BaseConfig: carol is
// in group finance (the refund rule's approvers); alice is in finance too,
// so that approving her own call is refused for being hers, not for her
// not being an approver.
const (
	CarolToken = "carol-token-0123456789"
	AliceToken = "alice-token-0123456789"
)

// Why the host cannot run gateway tests ("" when it can).
func SkipReason() string {
	if os.Geteuid() != 0 {
		return "needs root: network namespaces and tmpfs mounts"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "needs iproute2's `ip` for network namespaces: " + err.Error()
	}
	return ""
}

// Build compiles ./cmd/sluice into dir and returns the binary's path.
func Build(dir string) (string, error) { return build(dir, "./cmd/sluice", nil) }

// BuildStatic compiles pkg (a path from the module root, such as
// ./cmd/sandboxd) with CGO_ENABLED=0 into dir, named after pkg's last
// element, and returns the binary's path. sandboxd's init needs it: it
// applies privilege changes to every thread, which AllThreadsSyscall
// refuses under cgo.
func BuildStatic(dir, pkg string) (string, error) {
	return build(dir, pkg, []string{"CGO_ENABLED=0"})
}

func build(dir, pkg string, env []string) (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		return "", fmt.Errorf("build %s: no module root from `go env GOMOD`: %v", pkg, err)
	}
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ---------------------------------------------------------------------------
// Network namespace

// NetNS is a network namespace made for one test.
type NetNS struct{ Name string }

const nsHosts = "127.0.0.1 localhost\n::1 localhost\n"

// NewNetNS makes a namespace with lo up; the resolver points at its own
// loopback, where nothing answers unless the test listens there.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	n := &NetNS{Name: "sluice-gw-" + randHex(4)}
	if out, err := exec.Command("ip", "netns", "add", n.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", n.Name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", n.Name, err, out)
		}
	})
	if out, err := exec.Command("ip", "-n", n.Name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s link set lo up: %v: %s", n.Name, err, out)
	}
	etc := filepath.Join("/etc/netns", n.Name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(etc) })
	if err := os.WriteFile(filepath.Join(etc, "hosts"), []byte(nsHosts), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

// AddHosts appends lines to the namespace's /etc/hosts (`ip netns exec`
// bind-mounts it, so a gateway launched afterwards sees them).
func (n *NetNS) AddHosts(t testing.TB, lines string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join("/etc/netns", n.Name, "hosts"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.WriteString(f, lines); err != nil {
		t.Fatal(err)
	}
}

// AddAddr assigns cidr to the namespace's lo (a "public" test address that
// never leaves the namespace, which has no other interface).
func (n *NetNS) AddAddr(t testing.TB, cidr string) {
	t.Helper()
	args := []string{"-n", n.Name, "addr", "add", cidr, "dev", "lo"}
	if strings.Contains(cidr, ":") {
		args = append(args, "nodad") // never tentative: a listener binds it at once (a CI run once saw EADDRNOTAVAIL)
	}
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip addr add %s: %v: %s", cidr, err, out)
	}
}

// Do runs fn on an OS thread inside the namespace; sockets made in fn stay
// in it. A thread that cannot get back stays locked and dies.
func (n *NetNS) Do(fn func() error) error {
	return relay.InNetNS(filepath.Join("/run/netns", n.Name), fn)
}

// Listen opens a TCP listener inside the namespace.
func (n *NetNS) Listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := n.Do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("listen %s in %s: %v", addr, n.Name, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// DNSAddr is where ServeDNS answers inside a namespace; a configuration
// names it in dns.upstreams.
const DNSAddr = "127.0.0.1:5353"

// ServeDNS answers DNS over UDP at DNSAddr inside the namespace with h
// until the test ends.
func (n *NetNS) ServeDNS(t testing.TB, h mdns.HandlerFunc) {
	t.Helper()
	var pc net.PacketConn
	if err := n.Do(func() (err error) {
		pc, err = net.ListenPacket("udp", DNSAddr)
		return err
	}); err != nil {
		t.Fatalf("listen udp %s in %s: %v", DNSAddr, n.Name, err)
	}
	ds := &mdns.Server{PacketConn: pc, Handler: h}
	go func() { _ = ds.ActivateAndServe() }()
	t.Cleanup(func() { _ = ds.Shutdown() })
}

// DNSReply answers q from table (a name without its final dot, to an IPv4
// address): an A record with ttl for a listed name, no record for another
// type of question about it, NXDOMAIN for a name not listed.
func DNSReply(q *mdns.Msg, table map[string]string, ttl uint32) *mdns.Msg {
	m := new(mdns.Msg)
	m.SetReply(q)
	ip, ok := table[strings.TrimSuffix(q.Question[0].Name, ".")]
	switch {
	case !ok:
		m.Rcode = mdns.RcodeNameError
	case q.Question[0].Qtype == mdns.TypeA && !strings.Contains(ip, ":"):
		rr, _ := mdns.NewRR(fmt.Sprintf("%s %d IN A %s", q.Question[0].Name, ttl, ip))
		m.Answer = []mdns.RR{rr}
	case q.Question[0].Qtype == mdns.TypeAAAA && strings.Contains(ip, ":"):
		rr, _ := mdns.NewRR(fmt.Sprintf("%s %d IN AAAA %s", q.Question[0].Name, ttl, ip))
		m.Answer = []mdns.RR{rr}
	}
	return m
}

// ---------------------------------------------------------------------------
// Upstream

// Mode is how the upstream answers.
type Mode int32

// Upstream behaviours.
const (
	ModeOK        Mode = iota // a JSON answer
	ModeHang                  // read the request, never answer
	ModeReset                 // read the request, close with RST
	ModeGarbage               // answer bytes that are not HTTP
	ModeBadStatus             // answer status 099
	ModeCtlHeader             // a response header value with a control byte
	ModeRedirect              // 302 to the metadata address
	ModeRaw                   // the bytes set by SetRaw, then close
)

// Seen is one request as the upstream received it.
type Seen struct {
	Method, Path string
	EscapedPath  string // the path as sent, percent-encoding kept
	RequestURI   string
	Header       http.Header
	Body         string
}

// Upstream is the API behind the connector, on the namespace's loopback.
type Upstream struct {
	Port    int
	Accepts atomic.Int64
	mode    atomic.Int32
	raw     atomic.Pointer[string]
	arrived chan struct{} // one value per request received
	release chan struct{} // closed at cleanup: hung handlers return

	mu      sync.Mutex
	reqs    []Seen
	idem    map[string]string // POST /charges: Idempotency-Key → the first reply
	charges int               // POST /charges applied (the side effect)
}

// Counting returns ln counting each connection it accepts in n.
func Counting(ln net.Listener, n *atomic.Int64) net.Listener { return countingListener{ln, n} }

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// NewUpstream listens on 127.0.0.1:0 inside ns.
func NewUpstream(t testing.TB, ns *NetNS) *Upstream {
	t.Helper()
	u := &Upstream{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	ln := ns.Listen(t, "127.0.0.1:0")
	u.Port = ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: u, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(countingListener{ln, &u.Accepts}) }()
	t.Cleanup(func() { close(u.release); _ = srv.Close() })
	return u
}

// SetMode switches how the next requests are answered.
func (u *Upstream) SetMode(m Mode) { u.mode.Store(int32(m)) }

// SetRaw makes the next requests answered with exactly b (ModeRaw).
func (u *Upstream) SetRaw(b string) {
	u.raw.Store(&b)
	u.SetMode(ModeRaw)
}

// Requests returns what the upstream received so far.
func (u *Upstream) Requests() []Seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Seen(nil), u.reqs...)
}

// Charges returns how many charges POST /charges applied: a request whose
// Idempotency-Key was seen before is answered with the stored first reply
// and applies none.
func (u *Upstream) Charges() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.charges
}

// charge applies POST /charges as an API that honours Idempotency-Key
// does (Stripe's convention): the first request with a key is applied and
// its reply stored before anything is answered; a repeated key gets the
// stored reply, replayed true, and is not applied again. A request
// without a key is always applied.
func (u *Upstream) charge(key, body string) (reply string, replayed bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if r, ok := u.idem[key]; ok && key != "" {
		return r, true
	}
	u.charges++
	var in struct {
		Amount int `json:"amount"`
	}
	_ = json.Unmarshal([]byte(body), &in)
	b, _ := json.Marshal(map[string]any{"charge": fmt.Sprintf("ch_%d", u.charges), "amount": in.Amount})
	if key != "" {
		if u.idem == nil {
			u.idem = map[string]string{}
		}
		u.idem[key] = string(b)
	}
	return string(b), false
}

// AwaitRequest waits until a request arrived (one per call).
func (u *Upstream) AwaitRequest(t testing.TB, within time.Duration) {
	t.Helper()
	select {
	case <-u.arrived:
	case <-time.After(within):
		t.Fatalf("no request reached the upstream within %v", within)
	}
}

// ServeHTTP records the request and answers it as the current Mode says.
// In ModeOK it is the tickets API: GET /tickets, any method on
// /tickets/{id} (the id as received, still escaped), POST /refunds, and
// GET /echo, a hostile endpoint that reflects X-Api-Key in its body and
// headers, plain and base64. POST /charges honours Idempotency-Key (see
// charge) and is applied when it arrives, in every mode: in ModeHang the
// charge is made and its reply lost, the case a retry must not repeat.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.reqs = append(u.reqs, Seen{Method: r.Method, Path: r.URL.Path, EscapedPath: r.URL.EscapedPath(), RequestURI: r.RequestURI,
		Header: r.Header.Clone(), Body: string(body)})
	u.mu.Unlock()
	var charged string
	var replayed bool
	if r.Method == http.MethodPost && r.URL.EscapedPath() == "/charges" {
		charged, replayed = u.charge(r.Header.Get("Idempotency-Key"), string(body))
	}
	select {
	case u.arrived <- struct{}{}:
	default:
	}
	raw := func(b string) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		_, _ = io.WriteString(c, b)
		c.Close()
	}
	switch Mode(u.mode.Load()) {
	case ModeHang:
		select {
		case <-r.Context().Done():
		case <-u.release:
		}
		return
	case ModeReset:
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close sends RST
		}
		c.Close()
		return
	case ModeGarbage:
		raw("\x16\x03\x01 this is not HTTP at all\r\n\r\n")
		return
	case ModeBadStatus:
		raw("HTTP/1.1 099 Weird\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		return
	case ModeCtlHeader:
		raw("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Evil: a\x01b\r\nContent-Length: 2\r\n\r\n{}")
		return
	case ModeRaw:
		raw(*u.raw.Load())
		return
	case ModeRedirect:
		w.Header().Set("Location", "http://169.254.169.254/latest/meta-data/")
		w.WriteHeader(http.StatusFound)
		return
	}
	reply := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	switch esc := r.URL.EscapedPath(); {
	case r.Method == http.MethodGet && esc == "/echo":
		// A hostile upstream: it reflects the credential it was given.
		key := r.Header.Get("X-Api-Key")
		b64 := base64.StdEncoding.EncodeToString([]byte(key))
		w.Header().Set("X-Echo-Key", key)
		w.Header().Set("X-Echo-Key-B64", b64)
		reply(map[string]string{"key": key, "key_b64": b64})
	case r.Method == http.MethodGet && esc == "/tickets":
		reply(map[string]any{"tickets": []map[string]string{{"id": "t-1", "title": "printer on fire"}}})
	case strings.HasPrefix(esc, "/tickets/"):
		reply(map[string]string{"id": strings.TrimPrefix(esc, "/tickets/"), "method": r.Method})
	case r.Method == http.MethodPost && esc == "/refunds":
		reply(map[string]string{"refund": "ok"})
	case r.Method == http.MethodPost && esc == "/charges":
		if replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		reply(json.RawMessage(charged))
	default:
		http.NotFound(w, r)
	}
}

// ---------------------------------------------------------------------------
// Environment and configuration

// Env is one test's world: a namespace, an upstream in it, a temp dir, the
// connector's secret and the sluice binary.
type Env struct {
	T      testing.TB
	NS     *NetNS
	Up     *Upstream
	Dir    string
	Secret string
	Bin    string
	// Spec is the tickets connector's OpenAPI document for BaseConfig:
	// New points it at gwenv's own; a suite may point it at a larger one.
	Spec string
	// Environ, when set, is added to the environment of every gateway
	// launched after (OTEL_* for the tracing tests).
	Environ []string

	mu   sync.Mutex
	kept [][]byte
	gws  []*Gateway
}

// New makes an Env. bin is the sluice binary from Build.
func New(t testing.TB, bin string) *Env {
	t.Helper()
	if why := SkipReason(); why != "" {
		t.Skip(why)
	}
	// A short path: the socket path must fit sun_path (108 bytes).
	dir, err := os.MkdirTemp("", "sluice-gw-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	spec := filepath.Join(dir, "tickets.yaml")
	if err := os.WriteFile(spec, ticketsSpec, 0o644); err != nil {
		t.Fatal(err)
	}
	e := &Env{T: t, Dir: dir, Secret: "sk-live-" + randHex(16), Bin: bin, Spec: spec}
	e.NS = NewNetNS(t)
	e.Up = NewUpstream(t, e.NS)
	return e
}

// Doc is a sluice.yaml document, as maps a test can change before Write.
type Doc map[string]any

// Gateway returns the document's gateway section.
func (d Doc) Gateway() map[string]any { return d["gateway"].(map[string]any) }

// Rule returns the policies[] entry whose match is m (nil if none).
func (d Doc) Rule(m string) map[string]any {
	for _, r := range d["policies"].([]map[string]any) {
		if r["match"] == m {
			return r
		}
	}
	return nil
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// CoreConfig is the part of every configuration that is not about tools
// or egress: the sandbox socket (trusting root as the relay), the admin
// listener inside the namespace, a 5s upstream timeout, the store, the
// audit log and the local secret store. Files live in the env's dir under
// stem.
func (e *Env) CoreConfig(stem string) Doc {
	return Doc{
		"gateway": map[string]any{
			"sandbox_socket":     filepath.Join(e.Dir, stem+".sock"),
			"trusted_relay_uids": []uint32{0},
			// The namespace is private, and 10000-18999 lies below the
			// kernel's ephemeral range: no outgoing socket holds the port.
			"admin_listen":     fmt.Sprintf("127.0.0.1:%d", 10000+mrand.IntN(9000)),
			"upstream_timeout": "5s",
		},
		"store": "sqlite:" + filepath.Join(e.Dir, stem+".db"),
		"audit": map[string]any{"path": filepath.Join(e.Dir, stem+"-audit.log")},
		"secrets": map[string]any{
			"backend": "local",
			"local":   map[string]any{"path": filepath.Join(e.Dir, "secrets.json"), "key_file": filepath.Join(e.Dir, "secrets.key")},
		},
	}
}

// ticketsConnector is the connectors[] entry BaseConfig uses: slug
// tickets, the env's Spec, the loopback upstream admitted by
// allow_private, the API key from secret tickets-key.
func (e *Env) ticketsConnector() map[string]any {
	return map[string]any{
		"slug": "tickets", "spec": e.Spec,
		"base_url":      fmt.Sprintf("http://127.0.0.1:%d", e.Up.Port),
		"allow_private": []string{"127.0.0.0/8"},
		"credential":    map[string]any{"secret": "tickets-key"},
	}
}

// BaseConfig is the configuration the suites start from: CoreConfig,
// connector tickets (ticketsConnector); agent-a may list (allow) and
// refund (ask group:finance, short hold_wait); everything else is blocked.
func (e *Env) BaseConfig(stem string) Doc {
	d := e.CoreConfig(stem)
	d.Gateway()["hold_wait"] = "100ms"
	d["connectors"] = []map[string]any{e.ticketsConnector()}
	d["agents"] = []map[string]any{
		{"name": "agent-a", "connectors": []string{"tickets"}},
		{"name": "agent-b", "connectors": []string{}},
	}
	d["policies"] = []map[string]any{
		{"match": "tickets.list_tickets", "action": "allow"},
		{"match": "tickets.create_refund", "action": "ask", "approvers": []string{"group:finance"}},
		{"match": "*", "action": "block"},
	}
	d["approvers"] = map[string]any{"users": []map[string]any{
		{"name": "carol", "groups": []string{"finance"}, "token_sha256": sum(CarolToken)},
		{"name": "alice", "groups": []string{"finance"}, "token_sha256": sum(AliceToken)},
	}}
	return d
}

// Write writes d as <stem>.yaml (stem from the socket name) and returns
// its path. The first Write of an env whose secrets backend is local
// stores the connector's secret (tickets-key) with the real CLI.
func (e *Env) Write(d Doc) string {
	e.T.Helper()
	data, err := yaml.Marshal(map[string]any(d))
	if err != nil {
		e.T.Fatal(err)
	}
	stem := strings.TrimSuffix(filepath.Base(d.Gateway()["sandbox_socket"].(string)), ".sock")
	path := filepath.Join(e.Dir, stem+".yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		e.T.Fatal(err)
	}
	sec, _ := d["secrets"].(map[string]any)
	if _, err := os.Stat(filepath.Join(e.Dir, "secrets.json")); errors.Is(err, os.ErrNotExist) && sec["backend"] == "local" {
		e.SetSecret(path, "tickets-key", e.Secret)
	}
	return path
}

// CLI runs the sluice binary with args and stdin, outside the namespace
// (the subcommands it is for open no socket), and returns its combined
// output and exit error.
func (e *Env) CLI(stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.Bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// SetSecret stores a secret with the real CLI, the value on stdin.
func (e *Env) SetSecret(path, name, value string) {
	e.T.Helper()
	out, err := e.CLI(value+"\n", "secrets", "set", name, "--scope", "project", "--config", path)
	if err != nil {
		e.T.Fatalf("sluice secrets set %s: %v\n%s", name, err, out)
	}
	if strings.Contains(out, value) {
		e.T.Fatalf("sluice secrets set printed the value")
	}
}

// Keep records b as something the sandbox side read. Do, Raw and AdminDo
// keep what they read; a suite keeps what it reads another way, so that a
// sweep for leaked secrets (Kept) sees all of it.
func (e *Env) Keep(b []byte) {
	e.mu.Lock()
	e.kept = append(e.kept, bytes.Clone(b))
	e.mu.Unlock()
}

// Kept returns everything kept so far.
func (e *Env) Kept() [][]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([][]byte(nil), e.kept...)
}

// Gateways returns every gateway the env launched, in order.
func (e *Env) Gateways() []*Gateway {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*Gateway(nil), e.gws...)
}

// SecretForms are the spellings of the env's Secret a leak sweep looks
// for, by name: raw, base64, base64url, hex and the part after the sk-live-
// prefix.
func (e *Env) SecretForms() map[string]string {
	s := []byte(e.Secret)
	return map[string]string{
		"raw":        e.Secret,
		"base64":     base64.StdEncoding.EncodeToString(s),
		"base64url":  base64.RawURLEncoding.EncodeToString(s),
		"hex":        hex.EncodeToString(s),
		"raw-suffix": e.Secret[len("sk-live-"):],
	}
}

// ---------------------------------------------------------------------------
// Gateway process

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// Gateway is a running `sluice serve` inside the env's namespace, seen
// from one test: its helpers fail that test. For gives a subtest its own
// view of the same process.
type Gateway struct {
	*proc
	t testing.TB
}

// proc is the gateway process, shared by every view.
type proc struct {
	e      *Env
	Config string // the configuration file
	Sock   string
	Admin  string
	Audit  string
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{}
	err    error // of Wait, once exited is closed
}

// For returns a view of the gateway whose helpers report to t (call it in
// each subtest: FailNow must run on the failing test's own goroutine).
func (g *Gateway) For(t testing.TB) *Gateway { return &Gateway{proc: g.proc, t: t} }

// Start launches the gateway for the config at path (doc d) and waits
// until /readyz answers 200.
func (e *Env) Start(d Doc, path string) *Gateway {
	e.T.Helper()
	g := e.Launch(d, path)
	g.AwaitSocket()
	g.AwaitReady()
	return g
}

// Launch runs `ip netns exec NS sluice serve --config path` (ip execs the
// binary, so the child's pid is the gateway's) and returns at once.
func (e *Env) Launch(d Doc, path string) *Gateway {
	e.T.Helper()
	g := &Gateway{t: e.T, proc: &proc{e: e, Config: path, Sock: d.Gateway()["sandbox_socket"].(string), Admin: d.Gateway()["admin_listen"].(string),
		Audit: d["audit"].(map[string]any)["path"].(string), stderr: &syncBuffer{}, exited: make(chan struct{})}}
	g.cmd = exec.Command("ip", "netns", "exec", e.NS.Name, e.Bin, "serve", "--config", path)
	g.cmd.Stderr, g.cmd.Stdout = g.stderr, g.stderr
	if len(e.Environ) > 0 {
		g.cmd.Env = append(os.Environ(), e.Environ...)
	}
	if err := g.cmd.Start(); err != nil {
		e.T.Fatalf("start gateway: %v", err)
	}
	go func() { g.err = g.cmd.Wait(); close(g.exited) }()
	e.mu.Lock()
	e.gws = append(e.gws, g)
	e.mu.Unlock()
	e.T.Cleanup(g.Stop)
	return g
}

// Pid is the gateway process's pid.
func (g *Gateway) Pid() int { return g.cmd.Process.Pid }

// Exited is closed when the process ended.
func (g *Gateway) Exited() <-chan struct{} { return g.exited }

// ExitErr waits for the process to end and returns how it ended (the
// error of exec.Cmd.Wait).
func (g *Gateway) ExitErr() error {
	<-g.exited
	return g.err
}

// Stderr is everything the gateway logged.
func (g *Gateway) Stderr() []byte { return g.stderr.Bytes() }

// AwaitSocket waits until the sandbox socket exists.
func (g *Gateway) AwaitSocket() {
	t := g.t
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-g.exited:
			t.Fatalf("gateway exited: %v\nstderr:\n%s", g.err, g.Stderr())
		default:
		}
		if _, err := os.Stat(g.Sock); err == nil {
			if _, _, err := g.AdminGet("/healthz"); err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway socket or admin listener not up after 60s\nstderr:\n%s", g.Stderr())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AwaitReady waits until /readyz answers 200.
func (g *Gateway) AwaitReady() {
	t := g.t
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if st, _, err := g.AdminGet("/readyz"); err == nil && st == http.StatusOK {
			return
		}
		select {
		case <-g.exited:
			t.Fatalf("gateway exited: %v\nstderr:\n%s", g.err, g.Stderr())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not ready after 60s\nstderr:\n%s", g.Stderr())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop ends the gateway: SIGTERM, then SIGKILL after a grace period.
func (g *proc) Stop() {
	select {
	case <-g.exited:
		return
	default:
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(15 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.exited
	}
}

// Kill9 sends SIGKILL and waits for the process to be gone.
func (g *Gateway) Kill9() {
	g.Signal(syscall.SIGKILL)
	<-g.exited
}

// Signal sends sig to the gateway.
func (g *Gateway) Signal(sig syscall.Signal) {
	if err := g.cmd.Process.Signal(sig); err != nil {
		g.t.Fatalf("signal gateway: %v", err)
	}
}

// AdminClient is an HTTP client whose connections are made inside the namespace.
func (g *Gateway) AdminClient() *http.Client {
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := g.e.NS.Do(func() (err error) {
				c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// AdminGet fetches path from the admin listener inside the namespace.
func (g *Gateway) AdminGet(path string) (int, []byte, error) {
	resp, err := g.AdminClient().Get("http://" + g.Admin + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// AdminDo calls the admin API with a bearer token and returns the status,
// the error code (if any) and the decoded body.
func (g *Gateway) AdminDo(method, path, token, body string) (int, string, map[string]any) {
	t := g.t
	t.Helper()
	req, err := http.NewRequest(method, "http://"+g.Admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := g.AdminClient().Do(req)
	if err != nil {
		t.Fatalf("admin %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	g.e.Keep(b)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	code := ""
	if e, ok := m["error"].(map[string]any); ok {
		code, _ = e["code"].(string)
	}
	return resp.StatusCode, code, m
}

// LogLines returns the gateway's JSON log lines.
func (g *Gateway) LogLines() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(g.Stderr()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// AwaitLog waits (generously) for a log line pred accepts.
func (g *Gateway) AwaitLog(what string, pred func(map[string]any) bool) map[string]any {
	t := g.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, m := range g.LogLines() {
			if pred(m) {
				return m
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %s within 30s\nstderr:\n%s", what, g.Stderr())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AuditRecords reads the audit log's complete lines (a line still being
// written, without its newline, is left for the next read).
func (g *Gateway) AuditRecords() []map[string]any {
	t := g.t
	t.Helper()
	data, err := os.ReadFile(g.Audit)
	if err != nil {
		t.Errorf("read audit log: %v", err)
		return nil
	}
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		data = nil
	}
	var out []map[string]any
	for _, l := range bytes.Split(data, []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Errorf("audit line is not JSON: %v: %q", err, l)
			continue
		}
		out = append(out, m)
	}
	return out
}

// AuditEvent returns the audit records of event whose fields, rendered as
// JSON, contain sub.
func (g *Gateway) AuditEvent(event, sub string) []map[string]any {
	var out []map[string]any
	for _, r := range g.AuditRecords() {
		if r["event"] != event {
			continue
		}
		b, _ := json.Marshal(r)
		if strings.Contains(string(b), sub) {
			out = append(out, r)
		}
	}
	return out
}

// AwaitAudit waits for an audit record of event containing sub.
func (g *Gateway) AwaitAudit(event, sub string) map[string]any {
	t := g.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if rs := g.AuditEvent(event, sub); len(rs) > 0 {
			return rs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit record %s containing %q within 30s", event, sub)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AwaitAuditFields waits for an audit record of event whose fields hold
// every key of match with its value (compared as fmt.Sprint renders them)
// and returns it.
func (g *Gateway) AwaitAuditFields(event string, match map[string]any) map[string]any {
	t := g.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, r := range g.AuditRecords() {
			f, _ := r["fields"].(map[string]any)
			ok := r["event"] == event
			for k, v := range match {
				ok = ok && fmt.Sprint(f[k]) == fmt.Sprint(v)
			}
			if ok {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit record %s with fields %v within 30s", event, match)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Sandbox side

// Dial opens the sandbox socket and writes id's identity preamble.
func (g *Gateway) Dial(id wire.Identity) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return wire.Dial(ctx, g.Sock, id)
}

// Client is an HTTP client over the sandbox socket as id.
func (g *Gateway) Client(id wire.Identity) *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       func(context.Context, string, string) (net.Conn, error) { return g.Dial(id) },
	}}
}

// Reply is one answer from the sandbox socket.
type Reply struct {
	Status    int
	Header    http.Header
	Raw       []byte // headers and body, as the sandbox saw them
	Body      []byte
	Code      string // error.code
	Message   string // error.message
	RequestID string
	HoldID    string // hold.id of a 202
	HoldState string
	// Result is a tool call's upstream answer as the gateway relays it.
	Result struct {
		Status  int                 `json:"status"`
		Headers map[string][]string `json:"headers"`
		Body    json.RawMessage     `json:"body"`
	}
}

// Do sends method path with body (JSON when not empty) and extra headers.
func (g *Gateway) Do(id wire.Identity, method, path, body string, hdr http.Header) Reply {
	t := g.t
	t.Helper()
	req, err := http.NewRequest(method, "http://sluice"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := g.Client(id).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v\nstderr:\n%s", method, path, err, g.Stderr())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	r := Reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
	var raw bytes.Buffer
	_ = resp.Header.Write(&raw)
	raw.Write(b)
	r.Raw = raw.Bytes()
	g.e.Keep(r.Raw)
	var eb struct {
		Error struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
		} `json:"error"`
		RequestID string `json:"request_id"`
		Hold      struct{ ID, Status string }
	}
	if json.Unmarshal(b, &eb) == nil {
		r.Code, r.Message, r.RequestID, r.HoldID, r.HoldState = eb.Error.Code, eb.Error.Message, eb.Error.RequestID, eb.Hold.ID, eb.Hold.Status
		if r.RequestID == "" {
			r.RequestID = eb.RequestID
		}
	}
	_ = json.Unmarshal(b, &r.Result)
	return r
}

// Call invokes tool with the arguments document args.
func (g *Gateway) Call(id wire.Identity, tool, args string) Reply {
	g.t.Helper()
	return g.Do(id, http.MethodPost, "/v1/tools/"+tool, args, nil)
}

// Raw opens the socket as id, writes b verbatim and returns everything the
// gateway sent until it closed the connection or wait passed, and whether
// it closed.
func (g *Gateway) Raw(id wire.Identity, b []byte, wait time.Duration) (string, bool) {
	g.t.Helper()
	c, err := g.Dial(id)
	if err != nil {
		g.t.Fatal(err)
	}
	return g.exchange(c, b, wait)
}

// RawNoPreamble is Raw on a connection that starts without an identity
// preamble: b is the first thing the gateway reads.
func (g *Gateway) RawNoPreamble(b []byte, wait time.Duration) (string, bool) {
	g.t.Helper()
	c, err := net.DialTimeout("unix", g.Sock, 10*time.Second)
	if err != nil {
		g.t.Fatalf("dial %s: %v", g.Sock, err)
	}
	return g.exchange(c, b, wait)
}

func (g *Gateway) exchange(c net.Conn, b []byte, wait time.Duration) (string, bool) {
	t := g.t
	t.Helper()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	// The gateway may refuse and close before reading everything sent; a
	// failed write is then expected and its answer is still readable.
	if _, err := c.Write(b); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("write: %v", err)
	}
	out, err := io.ReadAll(c)
	g.e.Keep(out)
	// EOF, or a reset because the gateway closed with the request unread:
	// either way the gateway ended the connection. A timeout means it did not.
	var ne net.Error
	return string(out), !(errors.As(err, &ne) && ne.Timeout())
}

// StatusOf parses the status code and the JSON error code of a raw HTTP
// answer ("" when there is none).
func StatusOf(raw string) (int, string, http.Header) {
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(raw)), nil)
	if err != nil {
		return 0, "", nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &eb)
	return resp.StatusCode, eb.Error.Code, resp.Header
}

// ---------------------------------------------------------------------------
// TLS upstreams

// UpstreamPKI makes a test CA (CommonName "upstream test CA", valid an hour
// either side of now) and a leaf for hosts signed by it, for the TLS
// upstreams a test runs. It returns the leaf, the CA as PEM (for a
// gateway's upstream_ca_file) and the CA as a pool (for a client).
func UpstreamPKI(t testing.TB, hosts ...string) (tls.Certificate, []byte, *x509.CertPool) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "upstream test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), pool
}

// RelayPKI are the files of a gateway's relay_tls listener and of one
// remote sandboxd: one CA signs both leaves.
type RelayPKI struct {
	CA                    string // the CA (PEM): the gateway's client_ca_file and sandboxd's ca_file
	ServerCert, ServerKey string // the gateway's leaf, for 127.0.0.1
	ClientCert, ClientKey string // sandboxd's leaf, for DNS name host
	OtherCert, OtherKey   string // a leaf from another CA, for host too
}

// NewRelayPKI writes a RelayPKI into dir for a sandbox host named host.
func NewRelayPKI(t testing.TB, dir, host string) RelayPKI {
	t.Helper()
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	write := func(name string, b []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(stem string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage, ips []net.IP, names []string) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: stem},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: ips, DNSNames: names,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		return write(stem+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644),
			write(stem+".key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	}
	ca, caKey, caPEM := newCA("relay test CA")
	other, otherKey, _ := newCA("another CA")
	p := RelayPKI{CA: write("relay-ca.pem", caPEM, 0o644)}
	p.ServerCert, p.ServerKey = leaf("gateway-relay", ca, caKey, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	p.ClientCert, p.ClientKey = leaf("sandbox-host", ca, caKey, x509.ExtKeyUsageClientAuth, nil, []string{host})
	p.OtherCert, p.OtherKey = leaf("other-host", other, otherKey, x509.ExtKeyUsageClientAuth, nil, []string{host})
	return p
}
