//go:build linux

package sandboxd

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestSessionTokenFileConfig(t *testing.T) {
	cases := []struct{ name, yaml, wantErr string }{
		{"absent", "", ""},
		{"with gateway_admin", "gateway_admin: http://127.0.0.1:9090\ngateway_session_token_file: /etc/sluice/session.token\n", ""},
		{"relative", "gateway_admin: http://127.0.0.1:9090\ngateway_session_token_file: session.token\n", "gateway_session_token_file: must be an absolute path"},
		{"without gateway_admin", "gateway_session_token_file: /etc/sluice/session.token\n", "needs gateway_admin"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("got %v, want error containing %q", err, tc.wantErr)
			}
		})
	}
}

// endRecorder is an admin listener that records session ends.
type endRecorder struct {
	mu     sync.Mutex
	paths  []string
	auths  []string
	status int
}

func (e *endRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.paths = append(e.paths, r.Method+" "+r.URL.EscapedPath())
	e.auths = append(e.auths, r.Header.Get("Authorization"))
	w.WriteHeader(e.status)
	_, _ = w.Write([]byte(`{"session":{}}`))
}

// TestDestroyEndsSession: Destroy posts the end of the sandbox's session
// to gateway_admin with the token; a failure is an event and never fails
// the Destroy.
func TestDestroyEndsSession(t *testing.T) {
	const token = "session-token-value"
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String()
	dead.Close() // nothing listens there any more

	cases := []struct {
		name      string
		status    int    // the admin listener's answer
		admin     string // "" = the recorder
		noToken   bool   // the token file is missing
		session   string
		sharedBy  bool // another live sandbox carries the session
		wantPosts int
		wantEvent string
		wantErr   string // in the event's error
	}{
		{name: "ends the session", status: 200, session: "sess/1", wantPosts: 1, wantEvent: "session_ended"},
		{name: "gateway refuses", status: 401, session: "sess-1", wantPosts: 1, wantEvent: "session_end_failed", wantErr: "status 401"},
		{name: "gateway unreachable", admin: deadURL, session: "sess-1", wantEvent: "session_end_failed", wantErr: "end session"},
		{name: "token file missing", status: 200, noToken: true, session: "sess-1", wantEvent: "session_end_failed", wantErr: "gateway_session_token_file"},
		{name: "no session", status: 200, session: ""},
		{name: "session still used by another sandbox", status: 200, session: "sess-1", sharedBy: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &endRecorder{status: tc.status}
			srv := httptest.NewServer(rec)
			defer srv.Close()
			base, err := os.MkdirTemp("", "sandboxd-end-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(base) })
			if err := os.Chmod(base, 0o711); err != nil {
				t.Fatal(err)
			}
			tokFile := filepath.Join(base, "token")
			if !tc.noToken {
				if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cfg := Default()
			cfg.StateDir, cfg.CgroupParent = filepath.Join(base, "state"), "sluice-test-session-end"
			cfg.GatewayAdmin, cfg.GatewaySessionTokenFile = srv.URL, tokFile
			if tc.admin != "" {
				cfg.GatewayAdmin = tc.admin
			}
			m, err := New(Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			m.mu.Lock()
			m.boxes = map[string]*sandbox{"sb-1": {info: Info{ID: "sb-1", Agent: "a", Session: tc.session}, slot: -1}}
			if tc.sharedBy {
				m.boxes["sb-2"] = &sandbox{info: Info{ID: "sb-2", Agent: "a", Session: tc.session}, slot: -1}
			}
			m.mu.Unlock()
			if err := m.Destroy("sb-1"); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
			m.pending.Wait() // the session ends after the state is gone
			rec.mu.Lock()
			paths, auths := rec.paths, rec.auths
			rec.mu.Unlock()
			if len(paths) != tc.wantPosts {
				t.Fatalf("%d posts %v, want %d", len(paths), paths, tc.wantPosts)
			}
			if tc.wantPosts > 0 {
				want := "POST /api/v1/sessions/" + strings.ReplaceAll(tc.session, "/", "%2F") + "/end"
				if paths[0] != want || auths[0] != "Bearer "+token {
					t.Fatalf("posted %q with %q, want %q with the token", paths[0], auths[0], want)
				}
			}
			m.mu.Lock()
			m.boxes = map[string]*sandbox{} // Close would end sb-2's session too
			m.mu.Unlock()
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(filepath.Join(cfg.StateDir, "events.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(raw), token) {
				t.Fatal("the token is in the event log")
			}
			var got *event
			for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
				var e event
				if err := json.Unmarshal([]byte(line), &e); err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(e.Event, "session_") {
					got = &e
				}
			}
			switch {
			case tc.wantEvent == "" && got != nil:
				t.Fatalf("unexpected event %+v", *got)
			case tc.wantEvent != "" && (got == nil || got.Event != tc.wantEvent || got.Session != tc.session ||
				!strings.Contains(got.Error, tc.wantErr)):
				t.Fatalf("event %+v, want %s with error containing %q", got, tc.wantEvent, tc.wantErr)
			}
		})
	}
}
