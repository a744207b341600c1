//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// The gateway process, its namespace, the upstream, configuration files,
// the sandbox-side client and the log and audit readers are gwenv's; what
// is here is only what the e2e tests add: the C3 host names, the larger
// tickets API, the main configuration and the D9 sweep.

// sluiceBin is the binary TestMain built ("" when the host cannot run the
// suite: gwenv.New then skips each test with the reason).
var sluiceBin string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	if gwenv.SkipReason() == "" {
		dir, err := os.MkdirTemp("", "sluice-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		if sluiceBin, err = gwenv.Build(dir); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
	}
	return m.Run()
}

func requireHost(t testing.TB) {
	t.Helper()
	if why := gwenv.SkipReason(); why != "" {
		t.Skip(why)
	}
}

// The identities sandboxd would relay (alice is agent-a's user).
var (
	agentA = gwenv.AgentA
	agentB = gwenv.AgentB
)

// c3Hosts are the names THREATS C3 resolves to internal addresses, added
// to each namespace's /etc/hosts.
const c3Hosts = `127.0.0.1 internal.test
10.1.2.3 rfc1918.test
fd00::1 ula.test
169.254.169.254 meta.test
127.0.0.1 upstream.test
`

// newEnv is gwenv.New with the e2e tickets API (get, delete and a hostile
// echo besides list and refund) and the C3 host names. Every reply the
// tests read is kept (gwenv.Env.Keep) so the D9 check at cleanup can grep
// it with the logs for the secret.
func newEnv(t testing.TB) *gwenv.Env {
	t.Helper()
	e := gwenv.New(t, sluiceBin)
	spec, err := filepath.Abs("testdata/tickets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e.Spec = spec
	e.NS.AddHosts(t, c3Hosts)
	// D9: registered before any gateway, so it runs after every gateway stopped.
	t.Cleanup(func() { checkNoSecretAnywhere(e) })
	return e
}

// checkNoSecretAnywhere is D9: the secret is in no reply, no gateway log and
// no file the gateway wrote, except the sealed secret store.
func checkNoSecretAnywhere(e *gwenv.Env) {
	t := e.T
	forms := e.SecretForms()
	hit := func(where string, b []byte) {
		for name, f := range forms {
			if bytes.Contains(b, []byte(f)) {
				t.Errorf("D9: secret (%s form) found in %s", name, where)
			}
		}
	}
	for i, r := range e.Kept() {
		hit(fmt.Sprintf("reply #%d", i), r)
	}
	for i, g := range e.Gateways() {
		hit(fmt.Sprintf("gateway #%d stderr", i), g.Stderr())
	}
	_ = filepath.WalkDir(e.Dir, func(p string, d os.DirEntry, err error) error {
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

// mainConfig is the configuration most tests use: gwenv's base with the
// e2e rules and no approval service (an ask is then 503).
func mainConfig(e *gwenv.Env, stem string) gwenv.Doc {
	d := e.BaseConfig(stem)
	delete(d.Gateway(), "hold_wait")
	delete(d, "approvers")
	d["policies"] = []map[string]any{
		{"match": "tickets.list_tickets", "action": "allow"},
		{"match": "tickets.get_ticket", "action": "allow"},
		{"match": "tickets.echo_auth", "action": "allow"},
		{"match": "tickets.create_refund", "action": "ask"},
		{"match": "tickets.delete_ticket", "action": "block", "reason": "deleting tickets is not for agents"},
		{"match": "*", "action": "block"},
	}
	return d
}

// decisionLines returns the canonical tool_call lines for request id rid.
func decisionLines(g *gwenv.Gateway, rid string) []map[string]any {
	var out []map[string]any
	for _, m := range g.LogLines() {
		if m["msg"] == "tool_call" && m["request_id"] == rid {
			out = append(out, m)
		}
	}
	return out
}

// toolNames lists GET /v1/tools for id.
func toolNames(t testing.TB, g *gwenv.Gateway, id wire.Identity) []string {
	t.Helper()
	r := g.For(t).Do(id, http.MethodGet, "/v1/tools", "", nil)
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
func expect(t *testing.T, r gwenv.Reply, status int, code string) {
	t.Helper()
	if r.Status != status || r.Code != code {
		t.Fatalf("got %d %q, want %d %q; body: %s", r.Status, r.Code, status, code, r.Body)
	}
	if code != "" && r.RequestID == "" && status != http.StatusNotFound {
		t.Errorf("refusal %s carries no request_id: %s", code, r.Body)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// serveStream is an upstream's /stream for expectStreamed: server-sent
// events, the first at once, the second when release receives (the test
// has seen the first) or after 10 s.
func serveStream(rw http.ResponseWriter, release <-chan struct{}) {
	rw.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(rw, "data: one\n\n")
	rw.(http.Flusher).Flush()
	select {
	case <-release:
	case <-time.After(10 * time.Second):
	}
	fmt.Fprint(rw, "data: two\n\n")
}

// expectStreamed GETs url, an upstream's /stream (server-sent events: the
// first at once, the second once release receives), through c, and fails
// t unless the first event arrives while the upstream still holds the
// stream open: a gateway that buffered the reply delivers nothing until
// the end.
func expectStreamed(t *testing.T, c *http.Client, url string, release chan<- struct{}) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make(chan string, 1)
	go func() {
		b := make([]byte, 64)
		k, _ := io.ReadAtLeast(resp.Body, b, len("data: one\n\n"))
		first <- string(b[:k])
	}()
	select {
	case got := <-first:
		if got != "data: one\n\n" {
			t.Fatalf("first event %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first event did not arrive while the upstream held the stream open: the gateway buffered it")
	}
	release <- struct{}{}
	rest, _ := io.ReadAll(resp.Body)
	if string(rest) != "data: two\n\n" {
		t.Fatalf("rest %q", rest)
	}
}
