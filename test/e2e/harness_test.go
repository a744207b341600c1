//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-gw/sluice/sandboxd/relay"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// sluiceBin is the binary TestMain built; skipReason is why the host cannot
// run these tests (empty when it can).
var (
	sluiceBin  string
	skipReason string
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	switch {
	case os.Geteuid() != 0:
		skipReason = "e2e tests need root: they create network namespaces and mount a tmpfs"
	default:
		if _, err := exec.LookPath("ip"); err != nil {
			skipReason = "e2e tests need iproute2's `ip` for network namespaces: " + err.Error()
		}
	}
	if skipReason == "" {
		dir, err := os.MkdirTemp("", "sluice-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		gomod, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
			fmt.Fprintln(os.Stderr, "e2e: cannot find the module root with `go env GOMOD`:", err)
			return 1
		}
		sluiceBin = filepath.Join(dir, "sluice")
		build := exec.Command("go", "build", "-o", sluiceBin, "./cmd/sluice")
		build.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: go build ./cmd/sluice: %v\n%s", err, out)
			return 1
		}
	}
	return m.Run()
}

func requireHost(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ---------------------------------------------------------------------------
// Network namespace

// netns is a network namespace made for one test, with lo up and its own
// /etc/hosts and /etc/resolv.conf (ip netns exec bind-mounts them). The
// resolver points at the namespace's own loopback, where nothing answers, so
// no name can leak to a real DNS server.
type netns struct{ name string }

// nsHosts are the names THREATS C3 resolves to internal addresses.
const nsHosts = `127.0.0.1 localhost
::1 localhost
127.0.0.1 internal.test
10.1.2.3 rfc1918.test
fd00::1 ula.test
169.254.169.254 meta.test
127.0.0.1 upstream.test
`

func newNetns(t testing.TB) *netns {
	t.Helper()
	n := &netns{name: "sluice-e2e-" + randHex(4)}
	if out, err := exec.Command("ip", "netns", "add", n.name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", n.name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", n.name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", n.name, err, out)
		}
	})
	if out, err := exec.Command("ip", "-n", n.name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s link set lo up: %v: %s", n.name, err, out)
	}
	etc := filepath.Join("/etc/netns", n.name)
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

// do runs fn on an OS thread that has entered the namespace. Sockets made in
// fn keep the namespace after the thread returns to the test's own. If the
// thread cannot get back, it stays locked and dies with its goroutine.
func (n *netns) do(fn func() error) error {
	return relay.InNetNS(filepath.Join("/run/netns", n.name), fn)
}

// ---------------------------------------------------------------------------
// Upstream

// seen is one request as the upstream received it.
type seen struct {
	Method      string
	Path        string
	EscapedPath string
	RequestURI  string
	Header      http.Header
}

// upstream is the API behind the connectors: it listens on the namespace's
// loopback, counts accepted connections and records every request.
type upstream struct {
	port    int
	accepts atomic.Int64
	mu      sync.Mutex
	reqs    []seen
}

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

func newUpstream(t testing.TB, ns *netns) *upstream {
	t.Helper()
	u := &upstream{}
	var ln net.Listener
	if err := ns.do(func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatalf("upstream listen in %s: %v", ns.name, err)
	}
	u.port = ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: u, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(countingListener{ln, &u.accepts}) }()
	t.Cleanup(func() { _ = srv.Close() })
	return u
}

func (u *upstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.reqs...)
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.reqs = append(u.reqs, seen{Method: r.Method, Path: r.URL.Path, EscapedPath: r.URL.EscapedPath(), RequestURI: r.RequestURI, Header: r.Header.Clone()})
	u.mu.Unlock()
	_, _ = io.Copy(io.Discard, r.Body)
	esc := r.URL.EscapedPath()
	reply := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	switch {
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
	default:
		http.NotFound(w, r)
	}
}

// ---------------------------------------------------------------------------
// Environment and configuration

// env is one test's world: a namespace, an upstream in it, a temp dir and
// the secret the connector uses. Every reply the tests read is kept so the
// D9 check at cleanup can grep it with the logs for the secret.
type env struct {
	t      testing.TB
	ns     *netns
	up     *upstream
	dir    string
	secret string

	mu      sync.Mutex
	replies [][]byte
	gws     []*gateway
}

func newEnv(t testing.TB) *env {
	t.Helper()
	requireHost(t)
	// A short path: the socket path must fit sun_path (108 bytes).
	dir, err := os.MkdirTemp("", "sluice-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	e := &env{t: t, dir: dir, secret: "sk-live-" + randHex(16)}
	e.ns = newNetns(t)
	e.up = newUpstream(t, e.ns)
	// D9: registered before any gateway, so it runs after every gateway stopped.
	t.Cleanup(e.checkNoSecretAnywhere)
	return e
}

// secretForms are the spellings of the secret that must never appear.
func (e *env) secretForms() map[string]string {
	s := []byte(e.secret)
	return map[string]string{
		"raw":        e.secret,
		"base64":     base64.StdEncoding.EncodeToString(s),
		"base64url":  base64.RawURLEncoding.EncodeToString(s),
		"hex":        hex.EncodeToString(s),
		"raw-suffix": e.secret[len("sk-live-"):],
	}
}

func (e *env) keep(b []byte) {
	e.mu.Lock()
	e.replies = append(e.replies, bytes.Clone(b))
	e.mu.Unlock()
}

// checkNoSecretAnywhere is D9: the secret is in no reply, no gateway log and
// no file the gateway wrote, except the sealed secret store.
func (e *env) checkNoSecretAnywhere() {
	t := e.t
	forms := e.secretForms()
	hit := func(where string, b []byte) {
		for name, f := range forms {
			if bytes.Contains(b, []byte(f)) {
				t.Errorf("D9: secret (%s form) found in %s", name, where)
			}
		}
	}
	e.mu.Lock()
	for i, r := range e.replies {
		hit(fmt.Sprintf("reply #%d", i), r)
	}
	for i, g := range e.gws {
		hit(fmt.Sprintf("gateway #%d stderr", i), g.stderr.Bytes())
	}
	e.mu.Unlock()
	_ = filepath.WalkDir(e.dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&os.ModeSocket != 0 || strings.HasPrefix(d.Name(), "secrets.") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil {
			hit(p, b)
		}
		return nil
	})
}

// connector is one connectors[] entry.
type connector struct {
	Slug         string       `yaml:"slug"`
	Spec         string       `yaml:"spec"`
	BaseURL      string       `yaml:"base_url"`
	AllowPrivate []string     `yaml:"allow_private,omitempty"`
	Credential   *credSection `yaml:"credential,omitempty"`
}

type credSection struct {
	Secret string `yaml:"secret"`
}

type rule struct {
	Match  string `yaml:"match"`
	Action string `yaml:"action"`
	Reason string `yaml:"reason,omitempty"`
}

type agent struct {
	Name       string   `yaml:"name"`
	Connectors []string `yaml:"connectors"`
}

// gwConfig is the part of sluice.yaml the tests vary.
type gwConfig struct {
	Name        string // file name stem; several configs may share an env
	TrustedUIDs []uint32
	AuditPath   string
	Connectors  []connector
	Agents      []agent
	Policies    []rule
	Rego        []string
}

func specPath(t testing.TB) string {
	p, err := filepath.Abs("testdata/tickets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ticketsConnector is the main connector: loopback upstream, admitted by
// allow_private, with the API key from the local store.
func (e *env) ticketsConnector() connector {
	return connector{
		Slug:         "tickets",
		Spec:         specPath(e.t),
		BaseURL:      fmt.Sprintf("http://127.0.0.1:%d", e.up.port),
		AllowPrivate: []string{"127.0.0.0/8"},
		Credential:   &credSection{Secret: "tickets-key"},
	}
}

// mainConfig is the configuration most tests use.
func (e *env) mainConfig() gwConfig {
	return gwConfig{
		Name:       "sluice",
		Connectors: []connector{e.ticketsConnector()},
		Agents:     []agent{{Name: "agent-a", Connectors: []string{"tickets"}}, {Name: "agent-b", Connectors: []string{}}},
		Policies: []rule{
			{Match: "tickets.list_tickets", Action: "allow"},
			{Match: "tickets.get_ticket", Action: "allow"},
			{Match: "tickets.echo_auth", Action: "allow"},
			{Match: "tickets.create_refund", Action: "ask"},
			{Match: "tickets.delete_ticket", Action: "block", Reason: "deleting tickets is not for agents"},
			{Match: "*", Action: "block"},
		},
	}
}

// writeConfig writes c as YAML and returns its path and the admin address.
func (e *env) writeConfig(c gwConfig) (path, admin string) {
	e.t.Helper()
	if c.Name == "" {
		c.Name = "sluice"
	}
	if c.TrustedUIDs == nil {
		c.TrustedUIDs = []uint32{0}
	}
	if c.AuditPath == "" {
		c.AuditPath = filepath.Join(e.dir, c.Name+"-audit.log")
	}
	// The namespace is private, and 20000-29999 lies below the kernel's
	// ephemeral range (32768+), so no outgoing socket can hold the port.
	admin = fmt.Sprintf("127.0.0.1:%d", 20000+mrand.IntN(10000))
	doc := map[string]any{
		"gateway": map[string]any{
			"sandbox_socket":     filepath.Join(e.dir, c.Name+".sock"),
			"trusted_relay_uids": c.TrustedUIDs,
			"admin_listen":       admin,
			"upstream_timeout":   "5s",
		},
		"store": "sqlite:" + filepath.Join(e.dir, c.Name+".db"),
		"audit": map[string]any{"path": c.AuditPath},
		"secrets": map[string]any{
			"backend": "local",
			"local":   map[string]any{"path": filepath.Join(e.dir, "secrets.json"), "key_file": filepath.Join(e.dir, "secrets.key")},
		},
		"connectors": c.Connectors,
		"agents":     c.Agents,
		"policies":   c.Policies,
	}
	if len(c.Rego) > 0 {
		doc["rego"] = c.Rego
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		e.t.Fatal(err)
	}
	path = filepath.Join(e.dir, c.Name+".yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		e.t.Fatal(err)
	}
	return path, admin
}

// sluice runs the CLI (outside the namespace; it opens no socket) and
// returns its combined output and exit error.
func sluice(t testing.TB, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sluiceBin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// setSecret stores the connector's API key with the real CLI, value on stdin.
func (e *env) setSecret(cfgPath string) {
	e.t.Helper()
	out, err := sluice(e.t, e.secret+"\n", "secrets", "set", "tickets-key", "--scope", "project", "--config", cfgPath)
	if err != nil {
		e.t.Fatalf("sluice secrets set: %v\n%s", err, out)
	}
	if strings.Contains(out, e.secret) {
		e.t.Fatalf("sluice secrets set printed the value")
	}
}

// ---------------------------------------------------------------------------
// Gateway process

// syncBuffer is a bytes.Buffer safe for the process's writer and the test.
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

// gateway is a running `sluice serve` inside the env's namespace.
type gateway struct {
	e      *env
	cfg    string
	sock   string
	admin  string
	audit  string
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{}
	err    error // of Wait, once exited is closed
}

// startGateway runs `ip netns exec NS sluice serve --config cfg` (ip execs
// the binary, so the child's pid is the gateway's) and waits until the
// socket exists and /readyz answers 200. wantReady false only waits for the
// socket.
func (e *env) startGateway(cfgPath, admin string) *gateway {
	e.t.Helper()
	g := e.launch(cfgPath, admin)
	g.awaitReady(true)
	return g
}

func (e *env) launch(cfgPath, admin string) *gateway {
	e.t.Helper()
	stem := strings.TrimSuffix(filepath.Base(cfgPath), ".yaml")
	g := &gateway{e: e, cfg: cfgPath, admin: admin, sock: filepath.Join(e.dir, stem+".sock"),
		stderr: &syncBuffer{}, exited: make(chan struct{})}
	if c, err := readAuditPath(cfgPath); err == nil {
		g.audit = c
	}
	g.cmd = exec.Command("ip", "netns", "exec", e.ns.name, sluiceBin, "serve", "--config", cfgPath)
	g.cmd.Stderr = g.stderr
	g.cmd.Stdout = g.stderr
	if err := g.cmd.Start(); err != nil {
		e.t.Fatalf("start gateway: %v", err)
	}
	go func() { g.err = g.cmd.Wait(); close(g.exited) }()
	e.mu.Lock()
	e.gws = append(e.gws, g)
	e.mu.Unlock()
	e.t.Cleanup(g.stop)
	return g
}

func readAuditPath(cfgPath string) (string, error) {
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		return "", err
	}
	var doc struct {
		Audit struct {
			Path string `yaml:"path"`
		} `yaml:"audit"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return "", err
	}
	return doc.Audit.Path, nil
}

func (g *gateway) awaitReady(wantReady bool) {
	t := g.e.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-g.exited:
			t.Fatalf("gateway exited before ready: %v\nstderr:\n%s", g.err, g.stderr.Bytes())
		default:
		}
		if _, err := os.Stat(g.sock); err == nil {
			if !wantReady {
				return
			}
			if st, _, err := g.adminGet("/readyz"); err == nil && st == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not ready after 30s\nstderr:\n%s", g.stderr.Bytes())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the gateway: SIGTERM, then SIGKILL after a grace period.
func (g *gateway) stop() {
	select {
	case <-g.exited:
		return
	default:
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.exited
	}
}

// signal sends sig to the gateway process.
func (g *gateway) signal(sig syscall.Signal) {
	if err := g.cmd.Process.Signal(sig); err != nil {
		g.e.t.Fatalf("signal gateway: %v", err)
	}
}

// adminGet fetches path from the admin listener inside the namespace.
func (g *gateway) adminGet(path string) (int, []byte, error) {
	return g.adminGetAuth(path, "")
}

// adminGetAuth is adminGet with a bearer token ("" for none).
func (g *gateway) adminGetAuth(path, token string) (int, []byte, error) {
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := g.e.ns.do(func() (err error) {
				c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	req, err := http.NewRequest(http.MethodGet, "http://"+g.admin+path, nil)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// logLines returns the gateway's JSON log lines.
func (g *gateway) logLines() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(g.stderr.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// decisionLines returns the canonical tool_call lines for request id rid.
func (g *gateway) decisionLines(rid string) []map[string]any {
	var out []map[string]any
	for _, m := range g.logLines() {
		if m["msg"] == "tool_call" && m["request_id"] == rid {
			out = append(out, m)
		}
	}
	return out
}

// awaitLog waits for a log line that pred accepts.
func (g *gateway) awaitLog(t testing.TB, what string, pred func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, m := range g.logLines() {
			if pred(m) {
				return m
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %s within 10s\nstderr:\n%s", what, g.stderr.Bytes())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// auditRecords reads the audit log.
func (g *gateway) auditRecords() []map[string]any {
	g.e.t.Helper()
	data, err := os.ReadFile(g.audit)
	if err != nil {
		g.e.t.Fatalf("read audit log: %v", err)
	}
	var out []map[string]any
	for _, l := range bytes.Split(data, []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			g.e.t.Fatalf("audit line is not JSON: %v: %q", err, l)
		}
		out = append(out, m)
	}
	return out
}

// ---------------------------------------------------------------------------
// Sandbox-side client

var (
	agentA = wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s1", User: "alice"}
	agentB = wire.Identity{Sandbox: "sb-2", Agent: "agent-b", Session: "s2", User: "bob"}
)

// client speaks to the gateway as sandboxd would: each connection starts
// with the identity preamble, then plain HTTP.
func (g *gateway) client(t testing.TB, id wire.Identity) *http.Client {
	if err := id.Validate(); err != nil {
		t.Fatalf("identity: %v", err)
	}
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, g.sock, id)
		},
	}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// reply is one answer from the sandbox socket.
type reply struct {
	Status    int
	Header    http.Header
	Raw       []byte // headers and body, as the sandbox saw them
	Body      []byte
	Code      string
	Message   string
	RequestID string
	Result    struct {
		Status  int                 `json:"status"`
		Headers map[string][]string `json:"headers"`
		Body    json.RawMessage     `json:"body"`
	}
}

func (g *gateway) do(t testing.TB, id wire.Identity, method, path, body string, hdr http.Header) reply {
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
	resp, err := g.client(t, id).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v\nstderr:\n%s", method, path, err, g.stderr.Bytes())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	var r reply
	r.Status, r.Header, r.Body = resp.StatusCode, resp.Header, b
	var raw bytes.Buffer
	_ = resp.Header.Write(&raw)
	raw.Write(b)
	r.Raw = raw.Bytes()
	g.e.keep(r.Raw)
	var eb struct {
		Error struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
		} `json:"error"`
		RequestID string `json:"request_id"`
	}
	if json.Unmarshal(b, &eb) == nil {
		r.Code, r.Message, r.RequestID = eb.Error.Code, eb.Error.Message, eb.Error.RequestID
		if r.RequestID == "" {
			r.RequestID = eb.RequestID
		}
	}
	_ = json.Unmarshal(b, &r.Result)
	return r
}

// call invokes tool with the arguments document args.
func (g *gateway) call(t testing.TB, id wire.Identity, tool, args string) reply {
	t.Helper()
	return g.do(t, id, http.MethodPost, "/v1/tools/"+tool, args, nil)
}

// toolNames lists GET /v1/tools for id.
func (g *gateway) toolNames(t testing.TB, id wire.Identity) []string {
	t.Helper()
	r := g.do(t, id, http.MethodGet, "/v1/tools", "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/tools: %d %s", r.Status, r.Body)
	}
	var lst struct {
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(r.Body, &lst); err != nil {
		t.Fatalf("GET /v1/tools: %v: %s", err, r.Body)
	}
	var names []string
	for _, t := range lst.Tools {
		names = append(names, t.Name)
	}
	return names
}

// expect checks status and error code.
func expect(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.Status != status || r.Code != code {
		t.Fatalf("got %d %q, want %d %q; body: %s", r.Status, r.Code, status, code, r.Body)
	}
	if code != "" && r.RequestID == "" && status != http.StatusNotFound {
		t.Errorf("refusal %s carries no request_id: %s", code, r.Body)
	}
}

// rawExchange opens the socket, writes pre verbatim and returns everything
// the gateway sent until it closed the connection (or 5s passed).
func (g *gateway) rawExchange(t testing.TB, pre []byte) (string, bool) {
	t.Helper()
	c, err := net.DialTimeout("unix", g.sock, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", g.sock, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// The gateway may refuse and close before reading everything we send;
	// a failed write is then expected and its answer is still readable.
	if _, err := c.Write(pre); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("write: %v", err)
	}
	b, err := io.ReadAll(c)
	// EOF, or a reset because the gateway closed with our request unread:
	// either way the gateway ended the connection. A timeout means it did not.
	closed := true
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		closed = false
	}
	g.e.keep(b)
	return string(b), closed
}

func itoa(n int) string { return strconv.Itoa(n) }

// upstreamPKI makes a test CA (returned as PEM and as a pool) and a leaf
// for hosts signed by it, for the TLS upstreams of the egress suites.
func upstreamPKI(t testing.TB, hosts ...string) (tls.Certificate, []byte, *x509.CertPool) {
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
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), pool
}
