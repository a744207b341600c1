package sandboxd

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestReportKill: a limit kill is POSTed to the admin listener with the
// session token and the report's fields; a refused report, and a report
// past maxReports in flight, are recorded in the event log instead, and
// without gateway_admin nothing is sent. (The real gateway's side is
// test/attack TestLimitKillReachesGatewayAudit.)
func TestReportKill(t *testing.T) {
	type seen struct {
		auth, ctype string
		body        limitReport
	}
	start := func(t *testing.T, status int) (string, func() []seen) {
		var mu sync.Mutex
		var got []seen
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var s seen
			s.auth, s.ctype = r.Header.Get("Authorization"), r.Header.Get("Content-Type")
			b, _ := io.ReadAll(r.Body)
			if r.Method != http.MethodPost || r.URL.Path != "/api/v1/sandbox-events" || json.Unmarshal(b, &s.body) != nil {
				t.Errorf("request %s %s %q", r.Method, r.URL.Path, b)
			}
			mu.Lock()
			got = append(got, s)
			mu.Unlock()
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"error":{"code":"audit_unavailable"}}`))
		}))
		t.Cleanup(srv.Close)
		return srv.URL, func() []seen { mu.Lock(); defer mu.Unlock(); return append([]seen(nil), got...) }
	}
	manager := func(t *testing.T, admin string) (*Manager, func() []event) {
		dir := t.TempDir()
		tok := filepath.Join(dir, "token")
		if err := os.WriteFile(tok, []byte("tok-1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		ev, err := openEventLog(filepath.Join(dir, "events.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		m := &Manager{cfg: Config{GatewayAdmin: admin, GatewaySessionTokenFile: tok, Host: "node-a"},
			log: slog.New(slog.NewTextHandler(io.Discard, nil)), events: ev, reports: make(chan struct{}, maxReports)}
		return m, func() []event {
			m.pending.Wait()
			b, _ := os.ReadFile(filepath.Join(dir, "events.jsonl"))
			var out []event
			for l := range strings.Lines(string(b)) {
				var e event
				if err := json.Unmarshal([]byte(l), &e); err != nil {
					t.Fatalf("event line %q: %v", l, err)
				}
				out = append(out, e)
			}
			return out
		}
	}
	sb := &sandbox{info: Info{ID: "sb-1", Agent: "agent-a", Session: "s-1", User: "alice"}}

	t.Run("delivered", func(t *testing.T) {
		url, got := start(t, http.StatusOK)
		m, events := manager(t, url)
		m.reportEvent(sb, "oom", 64<<20)
		if evs := events(); len(evs) != 0 {
			t.Errorf("events %+v, want none for a delivered report", evs)
		}
		want := limitReport{Event: "oom", Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "alice", Host: "node-a", Limit: 64 << 20}
		if g := got(); len(g) != 1 || g[0].body != want || g[0].auth != "Bearer tok-1" || g[0].ctype != "application/json" {
			t.Fatalf("gateway saw %+v, want one %+v with the token", g, want)
		}
	})
	t.Run("refused: gateway_report_failed", func(t *testing.T) {
		url, got := start(t, http.StatusServiceUnavailable)
		m, events := manager(t, url)
		m.reportEvent(sb, "pids_limit", 64)
		evs := events()
		if len(evs) != 1 || evs[0].Event != "gateway_report_failed" || evs[0].Sandbox != "sb-1" ||
			!strings.Contains(evs[0].Error, "report pids_limit: status 503") || strings.Contains(evs[0].Error, "tok-1") {
			t.Fatalf("events %+v, want one gateway_report_failed naming status 503 and not the token", evs)
		}
		if len(got()) != 1 {
			t.Fatal("the report was not sent once")
		}
	})
	t.Run("too many in flight: gateway_report_dropped", func(t *testing.T) {
		url, got := start(t, http.StatusOK)
		m, events := manager(t, url)
		for range maxReports {
			m.reports <- struct{}{}
		}
		m.reportEvent(sb, "timeout", 1000)
		evs := events()
		if len(evs) != 1 || evs[0].Event != "gateway_report_dropped" || len(got()) != 0 {
			t.Fatalf("events %+v, %d sent; want one gateway_report_dropped and nothing sent", evs, len(got()))
		}
	})
	t.Run("without gateway_admin nothing is sent", func(t *testing.T) {
		m, events := manager(t, "")
		m.reportEvent(sb, "oom", 1)
		if evs := events(); len(evs) != 0 {
			t.Fatalf("events %+v, want none", evs)
		}
	})
}
