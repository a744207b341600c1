package gateway

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault"
)

const testSecret = "sk-test-0123456789abcdef"

// upstreamServer is the real HTTP API behind the tickets connector.
type upstreamServer struct {
	*httptest.Server
	requests atomic.Int64
	mu       sync.Mutex
	lastKey  string
	lastPath string
}

func newUpstream(t testing.TB) *upstreamServer {
	u := &upstreamServer{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		u.mu.Lock()
		u.lastKey, u.lastPath = r.Header.Get("X-Api-Key"), r.URL.EscapedPath()
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/echo":
			k := r.Header.Get("X-Api-Key")
			w.Header().Set("X-Echo", k)
			fmt.Fprintf(w, `{"raw":%q,"b64":%q}`, k, base64.StdEncoding.EncodeToString([]byte(k)))
		case r.URL.Path == "/tickets/redirect":
			// C6: a redirect to the metadata address must not be followed.
			w.Header().Set("Location", "http://169.254.169.254/latest/meta-data/")
			w.WriteHeader(http.StatusFound)
		case r.URL.Path == "/tickets":
			fmt.Fprintf(w, `{"tickets":[{"id":"T-1"}],"limit":%q}`, r.URL.Query().Get("limit"))
		default:
			fmt.Fprintf(w, `{"path":%q}`, r.URL.EscapedPath())
		}
	}))
	t.Cleanup(u.Close)
	return u
}

type testGateway struct {
	*Server
	cfg    *config.Config
	dir    string
	logBuf *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// gatewayYAML is the configuration most tests use; %s are the socket dir,
// the upstream URL and the extra policy/rego lines.
const gatewayYAML = `
gateway:
  sandbox_socket: %[1]s/relay.sock
  trusted_relay_uids: [%[4]d]
  admin_listen: 127.0.0.1:0
store: sqlite:%[1]s/sluice.db
audit: { path: %[1]s/audit.log }
secrets: { backend: local, local: { path: %[1]s/secrets.json, key_file: %[1]s/secrets.key } }
connectors:
  - slug: tickets
    spec: %[5]s
    base_url: %[2]s
    allow_private: [127.0.0.0/8]
    credential: { secret: tickets-key }
  - slug: loopback-unguarded
    spec: %[5]s
    base_url: %[2]s
  - slug: metadata
    spec: %[5]s
    base_url: http://169.254.169.254
    allow_private: [169.254.0.0/16]
    allow_private_covers_metadata: true   # C1: refused even when allow-listed and acknowledged
agents:
  - { name: agent-a, connectors: [tickets, loopback-unguarded, metadata] }
  - { name: agent-b, connectors: [] }
policies:
  - { match: "tickets.list_tickets", action: allow }
  - { match: "tickets.get_ticket", action: allow }
  - { match: "tickets.echo_auth", action: allow }
  - { match: "tickets.create_refund", action: ask, approvers: [group:finance] }
  - { match: "loopback-unguarded.*", action: allow }
  - { match: "metadata.*", action: allow }
  - { match: "*", action: block }
%[3]s
`

func startGateway(t testing.TB, upstreamURL, extra string, edit func(*config.Config)) *testGateway {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-gw-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	spec, _ := filepath.Abs("testdata/tickets.yaml")
	data := fmt.Sprintf(gatewayYAML, dir, upstreamURL, extra, os.Getuid(), spec)
	cfg, err := config.Parse([]byte(data), dir)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	st, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Set(context.Background(), "tickets-key", "project", vault.NewSecret([]byte(testSecret))); err != nil {
		t.Fatal(err)
	}
	logBuf := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := New(context.Background(), cfg, Options{Logger: log, Tracing: testTracing})
	if err != nil {
		t.Fatal(err)
	}
	return serveTest(t, srv, cfg, dir, logBuf)
}

// serveTest serves srv until the test ends (closing it then, and failing
// the test if its log holds testSecret) and waits until it is ready.
func serveTest(t testing.TB, srv *Server, cfg *config.Config, dir string, logBuf *syncBuffer) *testGateway {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	g := &testGateway{Server: srv, cfg: cfg, dir: dir, logBuf: logBuf, cancel: cancel, done: make(chan error, 1)}
	go func() { g.done <- srv.Serve(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-g.done:
		t.Fatalf("serve: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("gateway not ready after 10s")
	}
	t.Cleanup(func() {
		cancel()
		<-g.done
		srv.Close()
		if strings.Contains(logBuf.String(), testSecret) {
			t.Errorf("the gateway log contains the secret")
		}
	})
	return g
}

// client speaks HTTP over the sandbox socket as a relay would: preamble first.
func (g *testGateway) client(id wire.Identity) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, g.cfg.Gateway.SandboxSocket, id)
		},
		MaxIdleConnsPerHost: 16,
	}}
}

var agentA = wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "alice", Host: "h1"}

type reply struct {
	status int
	raw    string
	body   map[string]any
}

func (r reply) code() string {
	e, _ := r.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (r reply) message() string {
	e, _ := r.body["error"].(map[string]any)
	s, _ := e["message"].(string)
	return s
}

func doCall(t testing.TB, c *http.Client, tool, args string) reply {
	t.Helper()
	resp, err := c.Post("http://sluice/v1/tools/"+tool, "application/json", strings.NewReader(args))
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, raw: string(raw)}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("reply is not JSON: %q", raw)
	}
	return r
}

func auditEvents(t testing.TB, g *testGateway) []audit.Record {
	t.Helper()
	return egresstest.AuditRecords(t, g.cfg.Audit.Path, testSecret)
}

func eventsFor(recs []audit.Record, rid string) []string {
	var ev []string
	for _, r := range recs {
		if r.RequestID == rid {
			ev = append(ev, r.Event)
		}
	}
	return ev
}

func TestToolCallPipeline(t *testing.T) {
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil)
	c := g.client(agentA)

	t.Run("allowed call carries the credential upstream and not back", func(t *testing.T) {
		before := up.requests.Load()
		r := doCall(t, c, "tickets.list_tickets", `{"query":{"limit":5}}`)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.raw)
		}
		if up.requests.Load() != before+1 || up.lastKey != testSecret {
			t.Fatalf("upstream saw %d requests, key %q", up.requests.Load()-before, up.lastKey)
		}
		if strings.Contains(r.raw, testSecret) {
			t.Fatal("reply contains the secret")
		}
		body, _ := r.body["body"].(map[string]any)
		if body["limit"] != "5" || r.body["status"] != float64(200) {
			t.Fatalf("reply does not carry the upstream answer: %s", r.raw)
		}
		rid, _ := r.body["request_id"].(string)
		if ev := eventsFor(auditEvents(t, g), rid); strings.Join(ev, ",") != "decision,result" {
			t.Fatalf("audit events for %s = %v, want decision then result", rid, ev)
		}
		if !strings.Contains(g.logBuf.String(), `"request_id":"`+rid+`","decision":"allow"`) {
			t.Fatalf("no canonical decision line for %s in log:\n%s", rid, g.logBuf.String())
		}
	})

	t.Run("a call by its function-safe alias is the tool's call", func(t *testing.T) {
		r := doCall(t, c, "tickets_list_tickets", `{"query":{"limit":5}}`)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.raw)
		}
		rid, _ := r.body["request_id"].(string)
		n := 0
		for _, rec := range auditEvents(t, g) {
			if rec.RequestID == rid {
				n++
				if rec.Fields["tool"] != "tickets.list_tickets" {
					t.Errorf("audit record %s names tool %v, want tickets.list_tickets", rec.Event, rec.Fields["tool"])
				}
			}
		}
		if n == 0 {
			t.Errorf("no audit record for the alias call %s", rid)
		}
		if !strings.Contains(g.logBuf.String(), `"request_id":"`+rid+`","decision":"allow"`) {
			t.Fatalf("no decision line for the alias call %s", rid)
		}
	})

	refusals := []struct {
		name, tool, args string
		status           int
		code, mention    string
	}{
		{"block", "tickets.delete_ticket", `{"path":{"id":"T-1"}}`, 403, "policy_block", ""},
		{"unknown tool", "tickets.drop_database", `{}`, 404, "unknown_tool", "tickets.drop_database"},
		{"ask without approvals", "tickets.create_refund", `{"body":{"amount":5}}`, 503, "approval_unavailable", ""},
		{"wrong type", "tickets.list_tickets", `{"query":{"limit":"ten"}}`, 400, "schema_violation", "query.limit"},
		{"out of range", "tickets.list_tickets", `{"query":{"limit":1000}}`, 400, "schema_violation", "query.limit"},
		{"unknown param", "tickets.list_tickets", `{"query":{"limt":5}}`, 400, "schema_violation", "query.limt"},
		{"missing body field", "tickets.create_refund", `{"body":{"reason":"x"}}`, 400, "schema_violation", "body"},
		{"extra top-level key", "tickets.list_tickets", `{"qurey":{}}`, 400, "schema_violation", "qurey"},
		{"not JSON", "tickets.list_tickets", `{"query":`, 400, "schema_violation", ""},
		{"guard refuses loopback without allow_private", "loopback-unguarded.list_tickets", `{}`, 403, "egress_denied", "loopback"},
		{"metadata refused even when allow-listed", "metadata.list_tickets", `{}`, 403, "egress_denied", "metadata"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			before := up.requests.Load()
			r := doCall(t, c, tc.tool, tc.args)
			if r.status != tc.status || r.code() != tc.code {
				t.Fatalf("got %d %s, want %d %s: %s", r.status, r.code(), tc.status, tc.code, r.raw)
			}
			if !strings.Contains(r.message(), tc.mention) {
				t.Errorf("message %q does not name %q", r.message(), tc.mention)
			}
			if n := up.requests.Load() - before; n != 0 {
				t.Fatalf("%d requests reached the upstream", n)
			}
			rid, _ := r.body["error"].(map[string]any)["request_id"].(string)
			if len(eventsFor(auditEvents(t, g), rid)) == 0 {
				t.Fatalf("refusal %s not audited", rid)
			}
		})
	}

	t.Run("path parameters stay one segment", func(t *testing.T) {
		for _, id := range []string{"../admin", "..", "%2e%2e%2fadmin", "a/b", "x?y#z"} {
			r := doCall(t, c, "tickets.get_ticket", fmt.Sprintf(`{"path":{"id":%q}}`, id))
			if r.status == 400 {
				continue
			}
			up.mu.Lock()
			p := up.lastPath
			up.mu.Unlock()
			rest, ok := strings.CutPrefix(p, "/tickets/")
			if r.status != 200 || !ok || strings.Contains(rest, "/") || rest == ".." || rest == "." {
				t.Errorf("id %q reached upstream path %q (status %d)", id, p, r.status)
			}
		}
	})

	t.Run("echoed credential is scrubbed and audited", func(t *testing.T) {
		r := doCall(t, c, "tickets.echo_auth", `{}`)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.raw)
		}
		b64 := base64.StdEncoding.EncodeToString([]byte(testSecret))
		if strings.Contains(r.raw, testSecret) || strings.Contains(r.raw, b64) {
			t.Fatalf("reply reflects the secret: %s", r.raw)
		}
		if !strings.Contains(r.raw, "[redacted-by-sluice]") {
			t.Fatalf("reply not scrubbed: %s", r.raw)
		}
		rid, _ := r.body["request_id"].(string)
		if ev := eventsFor(auditEvents(t, g), rid); !strings.Contains(strings.Join(ev, ","), "secret_reflected") {
			t.Fatalf("audit events %v lack secret_reflected", ev)
		}
	})

	t.Run("not granted, and missing from the tool list", func(t *testing.T) {
		cb := g.client(wire.Identity{Sandbox: "sb-2", Agent: "agent-b", Session: "s", User: "bob"})
		if r := doCall(t, cb, "tickets.list_tickets", `{}`); r.status != 403 || r.code() != "not_granted" {
			t.Fatalf("got %d %s", r.status, r.code())
		}
		if names := toolNames(t, cb); len(names) != 0 {
			t.Fatalf("agent-b sees tools %v", names)
		}
		names := toolNames(t, c)
		if !names["tickets.list_tickets"] || !names["tickets.create_refund"] || names["tickets.delete_ticket"] {
			t.Fatalf("agent-a's tools = %v; want list and ask tools, not the blocked delete", names)
		}
	})

	t.Run("an agent not configured is told so, not given an empty list", func(t *testing.T) {
		cu := g.client(wire.Identity{Sandbox: "sb-3", Agent: "agent-nobody", Session: "s", User: "bob"})
		resp, err := cu.Get("http://sluice/v1/tools")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), `"code":"unknown_agent"`) || !strings.Contains(string(b), `agent \"agent-nobody\" is not configured`) {
			t.Fatalf("GET /v1/tools as an unknown agent: %d %s, want 403 unknown_agent", resp.StatusCode, b)
		}
	})

	t.Run("spoofed identity headers are ignored", func(t *testing.T) {
		cb := g.client(wire.Identity{Sandbox: "sb-2", Agent: "agent-b", Session: "s", User: "bob"})
		req, _ := http.NewRequest("POST", "http://sluice/v1/tools/tickets.list_tickets", strings.NewReader(`{}`))
		req.Header.Set("X-Sluice-Agent", "agent-a")
		req.Header.Set("X-Sluice-Identity", `{"agent":"agent-a"}`)
		resp, err := cb.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 403 {
			t.Fatalf("status %d; a header changed the identity", resp.StatusCode)
		}
	})

	t.Run("admin routes are not on the sandbox socket", func(t *testing.T) {
		for _, p := range []string{"/metrics", "/healthz", "/readyz", "/api/v1/audit", "/api/v1/holds", "/"} {
			resp, err := c.Get("http://sluice" + p)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 404 {
				t.Errorf("%s over the sandbox socket: %d, want 404", p, resp.StatusCode)
			}
		}
	})

	t.Run("admin listener serves metrics and readiness", func(t *testing.T) {
		for path, want := range map[string]string{"/metrics": "sluice_decisions", "/readyz": `"ready":true`, "/healthz": "ok"} {
			resp, err := http.Get("http://" + g.AdminAddr() + path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
				t.Errorf("%s: %d %s", path, resp.StatusCode, b)
			}
		}
	})
}

func toolNames(t *testing.T, c *http.Client) map[string]bool {
	t.Helper()
	resp, err := c.Get("http://sluice/v1/tools")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Tools []struct {
			Name   string          `json:"name"`
			Alias  string          `json:"alias"`
			Schema json.RawMessage `json:"schema"`
		} `json:"tools"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tl := range v.Tools {
		if len(tl.Schema) == 0 {
			t.Errorf("tool %s has no schema", tl.Name)
		}
		if tl.Alias != strings.Replace(tl.Name, ".", "_", 1) {
			t.Errorf("tool %s is listed with alias %q", tl.Name, tl.Alias)
		}
		names[tl.Name] = true
	}
	return names
}

func TestAuditFailureClosesEveryCall(t *testing.T) {
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil)
	c := g.client(agentA)
	if r := doCall(t, c, "tickets.list_tickets", `{}`); r.status != 200 {
		t.Fatalf("control call: %d %s", r.status, r.raw)
	}
	// Swap the audit file for a symlink to /dev/full: the next write fails with ENOSPC.
	if err := os.Remove(g.cfg.Audit.Path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/full", g.cfg.Audit.Path); err != nil {
		t.Fatal(err)
	}
	before := up.requests.Load()
	for _, tc := range []struct{ tool, args string }{{"tickets.list_tickets", `{}`}, {"tickets.delete_ticket", `{"path":{"id":"1"}}`}} {
		r := doCall(t, c, tc.tool, tc.args)
		if r.status != 503 || r.code() != "audit_unavailable" {
			t.Fatalf("%s with a failing audit log: %d %s", tc.tool, r.status, r.raw)
		}
	}
	if n := up.requests.Load() - before; n != 0 {
		t.Fatalf("%d requests reached the upstream while the audit log was failing", n)
	}
}

func TestConnectionsWithoutTrustOrIdentityAreRefused(t *testing.T) {
	up := newUpstream(t)
	t.Run("no preamble", func(t *testing.T) {
		g := startGateway(t, up.URL, "", nil)
		got := rawExchange(t, g.cfg.Gateway.SandboxSocket, "GET /v1/tools HTTP/1.1\r\nHost: x\r\n\r\n")
		if !strings.HasPrefix(got, "HTTP/1.1 400") || !strings.Contains(got, `"identity_required"`) {
			t.Fatalf("reply %q", got)
		}
	})
	t.Run("untrusted peer", func(t *testing.T) {
		g := startGateway(t, up.URL, "", func(c *config.Config) { c.Gateway.TrustedRelayUIDs = []uint32{4242} })
		line, _ := wire.Encode(agentA)
		got := rawExchange(t, g.cfg.Gateway.SandboxSocket, string(line)+"GET /v1/tools HTTP/1.1\r\nHost: x\r\n\r\n")
		if !strings.HasPrefix(got, "HTTP/1.1 403") || !strings.Contains(got, `"untrusted_peer"`) {
			t.Fatalf("reply %q", got)
		}
	})
}

// rawExchange writes msg and reads until the gateway closes the connection.
func rawExchange(t *testing.T, sock, msg string) string {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	// The gateway may refuse and close before reading what we send (an
	// untrusted peer is refused on accept), so a failed write is expected.
	_, _ = io.WriteString(c, msg)
	b, err := io.ReadAll(bufio.NewReader(c))
	if err != nil {
		t.Fatalf("read: %v (the gateway should close the connection)", err)
	}
	return string(b)
}

// TestPolicyFileChangeReloads covers hot reload without SIGHUP: a broken
// module at cold start blocks everything until the file is fixed, and a
// change to a loaded policy takes effect by itself.
func TestPolicyFileChangeReloads(t *testing.T) {
	up := newUpstream(t)
	dir := t.TempDir()
	mod := filepath.Join(dir, "team.rego")
	if err := os.WriteFile(mod, []byte("package sluice.policies.team\n\nthis is not rego"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, up.URL, "rego: ["+dir+"]", nil)
	c := g.client(agentA)
	if r := doCall(t, c, "tickets.list_tickets", `{}`); r.code() != "policy_block" {
		t.Fatalf("broken cold start: %d %s, want policy_block", r.status, r.raw)
	}
	fixed := "package sluice.policies.team\n\nimport rego.v1\n\ndecisions contains {\"action\": \"block\", \"reason\": \"frozen\", \"rule\": \"team.freeze\"} if input.tool == \"tickets.get_ticket\"\n"
	if err := os.WriteFile(mod, []byte(fixed), 0o644); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "tickets.list_tickets", `{}`, 200)
	if r := doCall(t, c, "tickets.get_ticket", `{"path":{"id":"1"}}`); r.code() != "policy_block" || !strings.Contains(r.message(), "frozen") {
		t.Fatalf("team rule after the fix: %d %s", r.status, r.raw)
	}
	// Now the engine watches the directory itself.
	blockList := strings.Replace(fixed, `"tickets.get_ticket"`, `"tickets.list_tickets"`, 1)
	if err := os.WriteFile(mod, []byte(blockList), 0o644); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "tickets.list_tickets", `{}`, 403)
}

// waitStatus polls a call until it answers status, or fails after 10s.
func waitStatus(t *testing.T, c *http.Client, tool, args string, status int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := doCall(t, c, tool, args)
		if r.status == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still answers %d %s after 10s, want %d", tool, r.status, r.raw, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
