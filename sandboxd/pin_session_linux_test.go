//go:build linux

package sandboxd

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestFetchGatewayTrustToken: the placeholders request carries the
// session token of gateway_session_token_file (the gateway answers it only
// with one); /ca.pem, a certificate, is fetched without it. A missing or
// empty token file fails the fetch before anything is asked, and a 401
// fails it closed; no error carries the token.
func TestFetchGatewayTrustToken(t *testing.T) {
	const token = "sandboxd-session-token"
	ca := testCert(t, true)
	dir := t.TempDir()
	good := filepath.Join(dir, "token")
	if err := os.WriteFile(good, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrong, []byte("not-the-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name      string
		tokenFile string
		wantErr   string // "" = the fetch succeeds
		wantAsked bool   // the admin listener saw a placeholders request
	}{
		{"token sent", good, "", true},
		{"no token file configured", "", "status 401 (set gateway_session_token_file)", true},
		{"wrong token", wrong, "GET /api/v1/placeholders: status 401", true},
		{"token file missing", filepath.Join(dir, "absent"), "gateway_session_token_file", false},
		{"token file empty", empty, "gateway_session_token_file: empty", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			auth := map[string][]string{}
			mux := http.NewServeMux()
			mux.HandleFunc("GET /ca.pem", func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				auth["/ca.pem"] = append(auth["/ca.pem"], r.Header.Get("Authorization"))
				mu.Unlock()
				_, _ = w.Write(ca)
			})
			// As the gateway answers it: only with the session token.
			mux.HandleFunc("GET /api/v1/placeholders", func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				auth["/api/v1/placeholders"] = append(auth["/api/v1/placeholders"], r.Header.Get("Authorization"))
				mu.Unlock()
				if r.Header.Get("Authorization") != "Bearer "+token {
					w.WriteHeader(http.StatusUnauthorized)
					_, _ = w.Write([]byte(`{"error":{"code":"unauthenticated"}}`))
					return
				}
				_, _ = w.Write([]byte(`{"placeholders":[{"secret":"gh","placeholder":"sluice:secret:gh:AbC"}]}`))
			})
			srv := httptest.NewServer(mux)
			defer srv.Close()

			g, err := fetchGatewayTrustWith(context.Background(), srv.URL, tc.tokenFile)
			mu.Lock()
			defer mu.Unlock()
			asked := len(auth["/api/v1/placeholders"]) > 0
			if asked != tc.wantAsked {
				t.Fatalf("placeholders asked: %v, want %v", asked, tc.wantAsked)
			}
			for _, a := range auth["/ca.pem"] {
				if a != "" {
					t.Fatalf("GET /ca.pem carried Authorization %q; the token is for the placeholders only", a)
				}
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "gateway_admin: ") {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), token) {
					t.Fatalf("the error carries the token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := auth["/api/v1/placeholders"]; len(got) != 1 || got[0] != "Bearer "+token {
				t.Fatalf("placeholders Authorization %q, want the bearer token", got)
			}
			if g.env["SLUICE_SECRET_GH"] != "sluice:secret:gh:AbC" {
				t.Fatalf("env %v", g.env)
			}
		})
	}
}

// needPinTools skips without what pinning needs.
func needPinTools(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: pinning needs CAP_SYS_ADMIN and CAP_NET_ADMIN over a network namespace")
	}
	for _, tool := range []string{"ip", "nft", "nsenter", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (iproute2, nftables, util-linux)", tool)
		}
	}
}

var pinSeq atomic.Int32

// testNetNS makes a named network namespace and returns its path.
func testNetNS(t *testing.T) (name, path string) {
	t.Helper()
	name = fmt.Sprintf("sbx-pinend-%d-%d", os.Getpid(), pinSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name, "/run/netns/" + name
}

// TestUnpinEndsSession: a removed pin ends its session at the gateway as
// a destroyed sandbox does — by the API's Unpin or when the other runtime
// tears the namespace down (ip netns del, or the pinned process exiting) —
// with the session token, unless another live pin still carries the
// session; a failure is an event and never fails the unpin.
func TestUnpinEndsSession(t *testing.T) {
	needPinTools(t)
	const token = "pin-session-token"
	old := pinWatchInterval
	pinWatchInterval = 50 * time.Millisecond
	t.Cleanup(func() { pinWatchInterval = old })

	type removal int
	const (
		byUnpin removal = iota
		byNetNSDel
		byProcessExit
	)
	cases := []struct {
		name      string
		how       removal
		status    int // the admin listener's answer
		session   string
		sharedBy  bool // a second pin carries the session and stays
		wantPosts int
		wantEvent string
		wantErr   string
	}{
		{name: "unpin ends the session", how: byUnpin, status: 200, session: "sess/pin-1", wantPosts: 1, wantEvent: "session_ended"},
		{name: "ip netns del ends the session", how: byNetNSDel, status: 200, session: "sess-del", wantPosts: 1, wantEvent: "session_ended"},
		{name: "the pinned process exiting ends the session", how: byProcessExit, status: 200, session: "sess-exit", wantPosts: 1, wantEvent: "session_ended"},
		{name: "gateway refuses", how: byUnpin, status: 401, session: "sess-1", wantPosts: 1, wantEvent: "session_end_failed", wantErr: "status 401"},
		{name: "no session", how: byUnpin, status: 200},
		{name: "session still carried by another pin", how: byUnpin, status: 200, session: "sess-shared", sharedBy: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &endRecorder{status: tc.status}
			srv := httptest.NewServer(rec)
			defer srv.Close()
			base, err := os.MkdirTemp("", "sandboxd-pinend-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(base) })
			if err := os.Chmod(base, 0o711); err != nil {
				t.Fatal(err)
			}
			tokFile := filepath.Join(base, "token")
			if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := Default()
			cfg.StateDir, cfg.CgroupParent = filepath.Join(base, "state"), "sluice-test-pin-end"
			cfg.Gateway = filepath.Join(base, "gw.sock") // nothing connects in this test
			cfg.GatewayAdmin, cfg.GatewaySessionTokenFile = srv.URL, tokFile
			m, err := New(Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()

			req := PinRequest{Agent: "agent-a", Session: tc.session}
			nsName, nsPath := "", ""
			var proc *exec.Cmd
			if tc.how == byProcessExit {
				proc = exec.Command("unshare", "--net", "sleep", "60")
				if err := proc.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = proc.Process.Kill(); _ = proc.Wait() })
				// unshare has made its namespace once /proc/PID/ns/net differs.
				deadline := time.Now().Add(5 * time.Second)
				for {
					a, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", proc.Process.Pid))
					b, _ := os.Readlink("/proc/self/ns/net")
					if a != "" && a != b {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("unshare --net did not make a namespace")
					}
					time.Sleep(10 * time.Millisecond)
				}
				req.PID = proc.Process.Pid
			} else {
				nsName, nsPath = testNetNS(t)
				req.NetNS = nsPath
			}
			info, err := m.Pin(ctx, req)
			if err != nil {
				t.Fatalf("pin: %v", err)
			}
			var other PinInfo
			if tc.sharedBy {
				_, p2 := testNetNS(t)
				if other, err = m.Pin(ctx, PinRequest{NetNS: p2, Agent: "agent-a", Session: tc.session}); err != nil {
					t.Fatalf("second pin: %v", err)
				}
			}
			if n := len(rec.snapshot()); n != 0 {
				t.Fatalf("%d posts before the pin was removed", n)
			}

			switch tc.how {
			case byUnpin:
				if err := m.Unpin(info.ID); err != nil {
					t.Fatalf("unpin: %v (a failed session end must not fail it)", err)
				}
			case byNetNSDel:
				if out, err := exec.Command("ip", "netns", "del", nsName).CombinedOutput(); err != nil {
					t.Fatalf("ip netns del: %v: %s", err, out)
				}
			case byProcessExit:
				_ = proc.Process.Kill()
				_ = proc.Wait()
			}
			// Unpin is synchronous; the watcher needs a few ticks.
			deadline := time.Now().Add(10 * time.Second)
			for pinned(m, info.ID) || len(rec.snapshot()) < tc.wantPosts {
				if time.Now().After(deadline) {
					t.Fatalf("after 10s: still pinned %v, %d posts, want unpinned and %d", pinned(m, info.ID), len(rec.snapshot()), tc.wantPosts)
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // no late extra post
			paths := rec.snapshot()
			if len(paths) != tc.wantPosts {
				t.Fatalf("%d posts %v, want %d", len(paths), paths, tc.wantPosts)
			}
			if tc.wantPosts > 0 {
				rec.mu.Lock()
				auth := rec.auths[0]
				rec.mu.Unlock()
				want := "POST /api/v1/sessions/" + strings.ReplaceAll(tc.session, "/", "%2F") + "/end"
				if paths[0] != want || auth != "Bearer "+token {
					t.Fatalf("posted %q with %q, want %q with the token", paths[0], auth, want)
				}
			}
			if tc.sharedBy {
				if !pinned(m, other.ID) {
					t.Fatal("the other pin went too")
				}
				if err := m.Unpin(other.ID); err != nil {
					t.Fatal(err)
				}
				if paths := rec.snapshot(); len(paths) != 1 {
					t.Fatalf("after the last pin carrying the session: %d posts %v, want 1", len(paths), paths)
				}
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}

			evs := readEvents(t, filepath.Join(cfg.StateDir, "events.jsonl"), token)
			var got *event
			seen := map[string]bool{}
			for i, e := range evs {
				if e.Sandbox == info.ID {
					seen[e.Event] = true
				}
				if strings.HasPrefix(e.Event, "session_") && e.Sandbox == info.ID {
					got = &evs[i]
				}
			}
			if !seen["pinned"] || !seen["unpinned"] {
				t.Fatalf("events %v, want pinned and unpinned", seen)
			}
			if gone := tc.how != byUnpin; seen["pin_namespace_gone"] != gone {
				t.Fatalf("pin_namespace_gone recorded %v, want %v", seen["pin_namespace_gone"], gone)
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

// TestPinGone: the watcher's test of whether the pinned path still names
// the pinned namespace.
func TestPinGone(t *testing.T) {
	key := func(t *testing.T, path string) nsKey {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		return nsKey{dev: sys.Dev, ino: sys.Ino}
	}
	own := key(t, "/proc/self/ns/net")
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path string
		key        nsKey
		want       string
	}{
		{"still the namespace", "/proc/self/ns/net", own, ""},
		{"removed", filepath.Join(t.TempDir(), "absent"), own, "no longer exists"},
		{"another namespace or file at the path", file, own, "names another namespace"},
		{"process gone", "/proc/999999999/ns/net", own, "no longer exists"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := pinGone(tc.path, tc.key)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("pinGone = %q, want %q", got, tc.want)
			}
		})
	}
}

func pinned(m *Manager, id string) bool {
	for _, p := range m.Pins() {
		if p.ID == id {
			return true
		}
	}
	return false
}

func (e *endRecorder) snapshot() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.paths...)
}

// readEvents reads events.jsonl and fails if secret appears in it.
func readEvents(t *testing.T, path, secret string) []event {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), secret) {
		t.Fatal("the token is in the event log")
	}
	var evs []event
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var e event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
	return evs
}
