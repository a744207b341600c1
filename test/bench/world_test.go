//go:build linux

package bench

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// world is the run's shared setup: a namespace with the upstreams every
// section talks to, and a temp dir for configs.
type world struct {
	t       testing.TB
	ns      *netns
	dir     string
	apiPort int            // the tool upstream on 127.0.0.1
	caPool  *x509.CertPool // signs the TLS upstream's certificate
	dnsAddr string         // the bare miekg/dns responder (also the gateway's DNS upstream)
	secret  string
	apiPid  int // the tool upstream's process (its CPU per call in the throughput rows)

	eg    *egressGW // started by the first section that needs it
	egErr error

	ag      againstBuild // the gateway at BENCH_AGAINST, built once
	egAt    *egressGW    // the egress gateway and relay with that binary
	egAtErr error
}

// benchAgent is the identity every sandbox-side request carries.
var benchAgent = wire.Identity{Sandbox: "sb-bench", Agent: "agent-a", Session: "s-bench", User: "alice"}

func newWorld(t testing.TB) *world {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Peers that drop privileges (squid runs as proxy) write here.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ns: newNetns(t), dir: dir, secret: "sk-bench-" + randHex(16)}

	// The tool upstream runs in a process of its own (this test binary
	// again, serving the listener it inherits), as a real API does: the
	// direct-call baseline then crosses a process boundary like every
	// other row, instead of being a call within one process.
	al := w.ns.listen(t, "tcp", "127.0.0.1:0")
	w.apiPort = al.Addr().(*net.TCPAddr).Port
	w.apiPid = startUpstream(t, al)
	hello := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if serveBulk(rw, r) { // bulk_test.go
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprintf(rw, "hello from %s %s", r.Host, r.URL.Path)
	})
	cert, _, pool := gwenv.UpstreamPKI(t, "pkg.test")
	w.caPool = pool
	hl := w.ns.listen(t, "tcp", egressIP+":80")
	tl := w.ns.listen(t, "tcp", egressIP+":443")
	var servers []*http.Server
	for _, s := range []struct {
		l net.Listener
		h http.Handler
	}{{hl, hello}, {tls.NewListener(tl, &tls.Config{Certificates: []tls.Certificate{cert}}), hello}} {
		srv := &http.Server{Handler: s.h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		go func() { _ = srv.Serve(s.l) }()
	}

	// The bare miekg/dns responder: every A question for pkg.test answers
	// egressIP with a TTL of an hour; anything else is NXDOMAIN.
	var pc net.PacketConn
	if err := w.ns.do(func() (err error) { pc, err = net.ListenPacket("udp", "127.0.0.1:5353"); return err }); err != nil {
		t.Fatal(err)
	}
	w.dnsAddr = "127.0.0.1:5353"
	ds := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(bareDNS)}
	go func() { _ = ds.ActivateAndServe() }()
	t.Cleanup(func() {
		for _, s := range servers {
			_ = s.Close()
		}
		_ = ds.Shutdown()
	})
	return w
}

// bareDNS is the miekg/dns baseline's whole handler.
func bareDNS(rw mdns.ResponseWriter, q *mdns.Msg) {
	m := new(mdns.Msg)
	m.SetReply(q)
	if len(q.Question) == 1 && strings.EqualFold(q.Question[0].Name, "pkg.test.") && q.Question[0].Qtype == mdns.TypeA {
		m.Answer = []mdns.RR{&mdns.A{Hdr: mdns.RR_Header{Name: q.Question[0].Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 3600}, A: net.ParseIP(egressIP)}}
	} else if len(q.Question) == 1 && q.Question[0].Qtype != mdns.TypeA && strings.EqualFold(q.Question[0].Name, "pkg.test.") {
		// NODATA for AAAA and the rest.
	} else {
		m.Rcode = mdns.RcodeNameError
	}
	_ = rw.WriteMsg(m)
}

// ---------------------------------------------------------------------------
// The gateway

// gwOpts vary the real gateway's configuration between rows.
type gwOpts struct {
	Name       string
	Credential bool     // the connector attaches the stored API key
	Rego       string   // a user module (source) under rego:
	AuditDisk  bool     // audit log on the disk (fsync) instead of /dev/shm
	AuditSync  string   // audit.sync: "" (always) or "interval"
	Approvers  bool     // bench.create_item asks; an approver token exists
	HoldWait   string   // gateway.hold_wait
	MaxHolds   int      // gateway.max_pending_holds
	Egress     []string // agent-a's egress allowlist
	ExtAuthz   bool     // gateway.ext_authz on a Unix socket beside the sandbox socket
	RegoExtra  string   // a second user module (source)
	Store      string   // store: ("" = an SQLite file in the gateway's directory)
	NoInputs   bool     // audit.record_inputs: false
	Data       string   // a data.json beside the user module (with Rego)
	Bundle     string   // policy.bundle.url (polled every 100ms)

	// OAuthTokenURL: the connector's credential is credential.oauth2
	// (client_credentials, client sid1) against this token endpoint.
	OAuthTokenURL string

	Env []string // added to the gateway's environment (OTEL_*)
	Bin string   // the sluice binary ("" = the one built from this tree)

	Debug string // serve --debug-listen: Go's profiles on this loopback address (BENCH_PROFILE)
}

// approverToken is the bench approver's API token (bob, group ops).
const approverToken = "bench-approver-token-0123456789"

// gw is a running `sluice serve` inside the world's namespace.
type gw struct {
	w     *world
	p     *proc
	sock  string
	admin string
	cfg   string
	authz string // the ext_authz socket, when gwOpts.ExtAuthz
}

// startGateway writes a config for o and runs the real binary in the
// namespace, waiting for /readyz.
func (w *world) startGateway(t testing.TB, o gwOpts) (*gw, error) {
	t.Helper()
	d := filepath.Join(w.dir, o.Name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	audit := filepath.Join(d, "audit.log")
	if !o.AuditDisk {
		shm, err := os.MkdirTemp("/dev/shm", "sluice-bench-")
		if err != nil {
			return nil, fmt.Errorf("audit on /dev/shm: %w", err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(shm) })
		audit = filepath.Join(shm, "audit.log")
	}
	spec, err := filepath.Abs("testdata/bench.yaml")
	if err != nil {
		return nil, err
	}
	conn := map[string]any{"slug": "bench", "spec": spec, "base_url": fmt.Sprintf("http://127.0.0.1:%d", w.apiPort),
		"allow_private": []string{"127.0.0.0/8"}}
	if o.Credential {
		conn["credential"] = map[string]any{"secret": "bench-key"}
	}
	if o.OAuthTokenURL != "" {
		conn["credential"] = map[string]any{"oauth2": map[string]any{"flow": "client_credentials", "client_id": oauthtest.ServiceID,
			"client_secret": "bench-oauth-secret", "token_url": o.OAuthTokenURL, "scopes": []string{"openid"}}}
	}
	admin := fmt.Sprintf("127.0.0.1:%d", freePort())
	g := map[string]any{
		"sandbox_socket": filepath.Join(d, "gw.sock"), "trusted_relay_uids": []int{0},
		"admin_listen": admin, "upstream_timeout": "10s",
	}
	if o.HoldWait != "" {
		g["hold_wait"] = o.HoldWait
	}
	if o.MaxHolds > 0 {
		g["max_pending_holds"] = o.MaxHolds
		g["max_pending_holds_per_sandbox"] = o.MaxHolds // one sandbox makes every hold
	}
	policies := []map[string]any{{"match": "*", "action": "allow"}}
	if o.Approvers {
		policies = []map[string]any{{"match": "bench.create_item", "action": "ask", "approvers": []string{"group:ops"}}, {"match": "*", "action": "allow"}}
	}
	egress := o.Egress
	if egress == nil {
		egress = []string{}
	}
	store := o.Store
	if store == "" {
		store = "sqlite:" + filepath.Join(d, "store.db")
	} else {
		g["replica_id"] = o.Name // replicas on one host sharing the database: one audit head each
	}
	doc := map[string]any{
		"gateway": g,
		"store":   store,
		"audit":   auditSection(audit, o.AuditSync, o.NoInputs),
		"secrets": map[string]any{"backend": "local", "local": map[string]any{
			"path": filepath.Join(d, "secrets.json"), "key_file": filepath.Join(d, "secrets.key")}},
		"connectors": []any{conn},
		"agents":     []map[string]any{{"name": "agent-a", "connectors": []string{"bench"}, "egress": egress}},
		"policies":   policies,
		"dns":        map[string]any{"upstreams": []string{w.dnsAddr}},
		"egress":     map[string]any{"max_tunnels_per_caller": 64},
	}
	if o.Approvers {
		doc["approvers"] = map[string]any{"users": []map[string]any{{"name": "bob", "groups": []string{"ops"}, "token_sha256": sha256Hex(approverToken)}}}
	}
	if o.Rego != "" {
		rp := filepath.Join(d, "bench.rego")
		if err := os.WriteFile(rp, []byte(o.Rego), 0o644); err != nil {
			return nil, err
		}
		doc["rego"] = []string{rp}
		if o.RegoExtra != "" {
			if err := os.WriteFile(filepath.Join(d, "extra.rego"), []byte(o.RegoExtra), 0o644); err != nil {
				return nil, err
			}
			doc["rego"] = []string{d} // both modules: the directory holds them
		}
	}
	if o.Data != "" && o.Rego != "" {
		if err := os.WriteFile(filepath.Join(d, "data.json"), []byte(o.Data), 0o644); err != nil {
			return nil, err
		}
		doc["rego"] = []string{d} // the module and its data document
	}
	if o.Bundle != "" {
		doc["policy"] = map[string]any{"bundle": map[string]any{"url": o.Bundle, "poll": "100ms"}}
	}
	if o.ExtAuthz {
		g["ext_authz"] = map[string]any{"listen": "unix:" + filepath.Join(d, "authz.sock"), "trusted_uids": []int{0}}
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(d, "sluice.yaml")
	if err := os.WriteFile(cfg, data, 0o600); err != nil {
		return nil, err
	}
	bin := sluiceBin
	if o.Bin != "" {
		bin = o.Bin // its own secrets store format
	}
	if o.Credential {
		cmd := exec.Command(bin, "secrets", "set", "bench-key", "--scope", "project", "--config", cfg)
		cmd.Stdin = strings.NewReader(w.secret + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("sluice secrets set: %w: %s", err, out)
		}
	}
	if o.OAuthTokenURL != "" {
		cmd := exec.Command(bin, "secrets", "set", "bench-oauth-secret", "--scope", "project", "--config", cfg)
		cmd.Stdin = strings.NewReader(oauthtest.ServiceSecret + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("sluice secrets set: %w: %s", err, out)
		}
	}
	argv := []string{bin, "serve", "--config", cfg}
	if o.Debug != "" {
		argv = append(argv, "--debug-listen", o.Debug)
	}
	if len(o.Env) > 0 {
		argv = append(append([]string{"env"}, o.Env...), argv...) // env execs: the pid is the gateway's
	}
	p := start(t, w.ns, argv...)
	gwy := &gw{w: w, p: p, sock: filepath.Join(d, "gw.sock"), admin: admin, cfg: cfg}
	if o.ExtAuthz {
		gwy.authz = filepath.Join(d, "authz.sock")
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if !p.running() {
			return nil, fmt.Errorf("gateway exited: %v: %s", p.err, lastLines(p.out.String(), 5))
		}
		if _, err := os.Stat(gwy.sock); err == nil {
			if st, _, err := gwy.adminDo("GET", "/readyz", ""); err == nil && st == 200 {
				return gwy, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("gateway not ready after 60s: %s", lastLines(p.out.String(), 5))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pid is the gateway's own pid (ip netns exec execs the binary).
func (g *gw) pid() int { return g.p.cmd.Process.Pid }

// adminDo calls the admin API (inside the namespace) as the bench approver.
func (g *gw) adminDo(method, path, body string) (int, []byte, error) {
	tr := g.w.ns.transport()
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://"+g.admin+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+approverToken)
	resp, err := (&http.Client{Transport: tr, Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// toolCall invokes tool with args over c and wants want.
func toolCall(c *http.Client, tool, args string, want int) ([]byte, error) {
	resp, err := c.Post("http://sluice/v1/tools/"+tool, "application/json", strings.NewReader(args))
	if err != nil {
		return nil, fmt.Errorf("call %s: %w", tool, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("call %s: read: %w", tool, err)
	}
	if resp.StatusCode != want {
		return b, fmt.Errorf("call %s: status %d, want %d: %s", tool, resp.StatusCode, want, oneLine(string(b)))
	}
	return b, nil
}

// getOK issues GET url over c and wants 200.
func getOK(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return nil
}

func jsonField(b []byte, path ...string) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return ""
	}
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[p]
	}
	s, _ := v.(string)
	return s
}

// lookPath finds a peer's binary or says which Debian package lacks.
func lookPath(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		pkg := map[string]string{"bwrap": "bubblewrap", "dnsmasq": "dnsmasq-base", "nsenter": "util-linux"}[name]
		if pkg == "" {
			pkg = name
		}
		return "", fmt.Errorf("%s is not installed (Debian package %s)", name, pkg)
	}
	return p, nil
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// auditSection is the config's audit section: the path, and audit.sync
// when a row measures the interval mode.
func auditSection(path, sync string, noInputs bool) map[string]any {
	a := map[string]any{"path": path}
	if sync != "" {
		a["sync"] = sync
	}
	if noInputs {
		a["record_inputs"] = false
	}
	return a
}

// upstreamEnv makes the test binary serve the tool upstream on fd 3.
const upstreamEnv = "SLUICE_BENCH_UPSTREAM"

// apiHandler is the tool upstream: it reads the body and answers 23 bytes.
var apiHandler = http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	rw.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(rw, `{"ok":true,"id":"it-1"}`)
})

// startUpstream runs the tool upstream in a child process serving l, and
// stops it at the end of the test. It returns the child's pid.
func startUpstream(t testing.TB, l net.Listener) int {
	t.Helper()
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatalf("upstream listener: %v", err)
	}
	l.Close() // the child holds its own copy
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), upstreamEnv+"=1")
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	// Not Pdeathsig: it fires when the forking OS thread exits, which a
	// Go program does not control. The child watches its parent instead.
	if err := cmd.Start(); err != nil {
		t.Fatalf("upstream process: %v", err)
	}
	f.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// serveUpstream is the child's whole life: serve fd 3 until killed.
func serveUpstream() int {
	l, err := net.FileListener(os.NewFile(3, "upstream"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench upstream:", err)
		return 1
	}
	parent := os.Getppid()
	go func() { // the test process died without killing us: go too
		for range time.Tick(time.Second) {
			if os.Getppid() != parent {
				os.Exit(0)
			}
		}
	}()
	srv := &http.Server{Handler: apiHandler, ReadHeaderTimeout: 10 * time.Second}
	_ = srv.Serve(l)
	return 0
}
