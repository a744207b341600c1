package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/store"
)

// env is a real holds.Manager over a real SQLite store, with the UI in an
// httptest server.
type env struct {
	t      *testing.T
	mgr    *holds.Manager
	ui     *UI
	srv    *httptest.Server
	mu     sync.Mutex
	now    time.Time
	audits []string
	sent   chan holds.Hold
}

func hash(t testing.TB, pw string) string {
	h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

func newEnv(t *testing.T, edit func(*Options)) *env {
	t.Helper()
	st, err := store.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, now: time.Now(), sent: make(chan holds.Hold, 10)}
	e.mgr = holds.New(holds.Options{Store: st, Execute: func(ctx context.Context, h holds.Hold) (holds.Result, bool) {
		e.sent <- h
		return holds.Result{HTTPStatus: 200, Body: []byte(`{"ok":true}`)}, true
	}})
	opt := Options{
		Holds: e.mgr,
		Users: []config.User{
			{Name: "alice", Groups: []string{"finance"}, PasswordHash: hash(t, "alice-pw")},
			{Name: "bob", PasswordHash: hash(t, "bob-pw")},
			{Name: "carol", PasswordHash: hash(t, "carol-pw")},
		},
		Now: e.clock,
		Audit: func(ctx context.Context, event string, f map[string]any) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.audits = append(e.audits, fmt.Sprintf("%s %v", event, f["user"]))
			return nil
		},
		AuditFile: auditFile(t, audit.Record{Event: "hold_created", Fields: map[string]any{"note": "<script>alert(1)</script>"}}),
	}
	if edit != nil {
		edit(&opt)
	}
	e.ui, err = New(opt)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.ui)
	t.Cleanup(e.srv.Close)
	return e
}

// auditFile writes recs to a new audit log and returns its path.
func auditFile(t *testing.T, recs ...audit.Record) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if _, err := l.Append(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func (e *env) clock() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.now
}

func (e *env) advance(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.now = e.now.Add(d)
}

// hold creates a pending hold for bob, decided by alice or group finance.
func (e *env) hold(args string) holds.Hold {
	e.t.Helper()
	h, _, err := e.mgr.Create(context.Background(), holds.Hold{
		Tool: "tickets.delete", Args: []byte(args),
		Request: holds.Request{Method: "DELETE", URL: "https://api.example/tickets/7",
			Headers: map[string][]string{"Accept": {"application/json"}}, Body: []byte(args)},
		Credential: "tickets-key",
		Caller:     holds.Caller{Sandbox: "sb1", Agent: "triage", Session: "s-1", User: "bob"},
		Approvers:  []string{"alice", "group:finance"}, Rule: "ask-deletes", Reason: "deleting needs a person",
		Expires: time.Now().Add(15 * time.Minute),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

// browser is a cookie-keeping client that does not follow redirects.
type browser struct {
	t *testing.T
	c *http.Client
	e *env
}

func (e *env) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: e.t, e: e, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (b *browser) get(path string) (*http.Response, string) {
	b.t.Helper()
	r, err := b.c.Get(b.e.srv.URL + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	return r, string(body)
}

func (b *browser) post(path string, form url.Values, hdr map[string]string) (*http.Response, string) {
	b.t.Helper()
	req, _ := http.NewRequest("POST", b.e.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	r, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	return r, string(body)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no csrf field in page:\n%.500s", body)
	}
	return m[1]
}

// login signs in and returns the session's CSRF token.
func (b *browser) login(name, pw string) string {
	b.t.Helper()
	_, page := b.get("/login")
	r, body := b.post("/login", url.Values{"csrf": {csrfOf(b.t, page)}, "username": {name}, "password": {pw}}, nil)
	if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/" {
		b.t.Fatalf("login %s: %d %s", name, r.StatusCode, body)
	}
	_, q := b.get("/")
	return csrfOf(b.t, q)
}

func TestLogin(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name, user, pw string
		wantStatus     int
	}{
		{"right password", "alice", "alice-pw", http.StatusSeeOther},
		{"wrong password", "alice", "nope", http.StatusUnauthorized},
		{"unknown user", "mallory", "alice-pw", http.StatusUnauthorized},
		{"empty password", "alice", "", http.StatusUnauthorized},
		{"other user's password", "bob", "alice-pw", http.StatusUnauthorized},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := e.browser()
			_, page := b.get("/login")
			r, _ := b.post("/login", url.Values{"csrf": {csrfOf(t, page)}, "username": {c.user}, "password": {c.pw}}, nil)
			if r.StatusCode != c.wantStatus {
				t.Fatalf("status %d, want %d", r.StatusCode, c.wantStatus)
			}
			var sess *http.Cookie
			for _, ck := range r.Cookies() {
				if ck.Name == sessionCookie && ck.MaxAge >= 0 {
					sess = ck
				}
			}
			if (sess != nil) != (c.wantStatus == http.StatusSeeOther) {
				t.Fatalf("session cookie %v for status %d", sess, r.StatusCode)
			}
			if sess != nil && (!sess.HttpOnly || sess.SameSite != http.SameSiteStrictMode || sess.Path != "/") {
				t.Errorf("session cookie attributes: %+v", sess)
			}
		})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	want := []string{"ui.login alice", "ui.login_failed alice", "ui.login_failed mallory", "ui.login_failed alice", "ui.login_failed bob"}
	if fmt.Sprint(e.audits) != fmt.Sprint(want) {
		t.Errorf("audit events %v, want %v", e.audits, want)
	}
}

func TestLoginRateLimitedPerUser(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.LoginFailures = 3 })
	// from returns a browser whose connections come from a loopback
	// address of its own (all of 127.0.0.0/8 is local on Linux).
	from := func(ip string) *browser {
		b := e.browser()
		b.c.Transport = &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext}
		return b
	}
	try := func(b *browser, user, pw string) int {
		_, page := b.get("/login")
		r, _ := b.post("/login", url.Values{"csrf": {csrfOf(t, page)}, "username": {user}, "password": {pw}}, nil)
		return r.StatusCode
	}
	attacker, owner := from("127.0.0.1"), from("127.0.0.2")
	for i := 0; i < 3; i++ {
		if s := try(attacker, "alice", "wrong"); s != http.StatusUnauthorized {
			t.Fatalf("failure %d: status %d", i, s)
		}
	}
	if s := try(attacker, "alice", "alice-pw"); s != http.StatusTooManyRequests {
		t.Fatalf("right password after 3 failures from the same address: status %d, want 429", s)
	}
	if s := try(attacker, "carol", "carol-pw"); s != http.StatusSeeOther {
		t.Fatalf("another user is not limited: status %d", s)
	}
	if s := try(owner, "alice", "alice-pw"); s != http.StatusSeeOther {
		t.Fatalf("the owner from another address is locked out by someone else's failures: status %d", s)
	}
	e.advance(16 * time.Minute)
	if s := try(attacker, "alice", "alice-pw"); s != http.StatusSeeOther {
		t.Fatalf("after the window: status %d", s)
	}

	// Guessing spread over many addresses: the name locks for everyone
	// after globalFactor times the per-address limit.
	e.advance(16 * time.Minute)
	for i := 0; i < 3*globalFactor; i++ {
		b := from(fmt.Sprintf("127.0.%d.%d", 1+i/200, 10+i%200))
		if s := try(b, "bob", "wrong"); s != http.StatusUnauthorized {
			t.Fatalf("spread failure %d: status %d", i, s)
		}
	}
	if s := try(from("127.0.9.9"), "bob", "bob-pw"); s != http.StatusTooManyRequests {
		t.Fatalf("after %d failures from many addresses: status %d, want 429", 3*globalFactor, s)
	}
}

func TestSecurityHeaders(t *testing.T) {
	e := newEnv(t, nil)
	b := e.browser()
	b.login("alice", "alice-pw")
	for _, path := range []string{"/login", "/", "/history", "/audit", "/ui/static/app.js", "/nope"} {
		t.Run(path, func(t *testing.T) {
			r, _ := b.get(path)
			want := map[string]string{
				"Content-Security-Policy": csp,
				"X-Content-Type-Options":  "nosniff",
				"X-Frame-Options":         "DENY",
				"Referrer-Policy":         "same-origin",
			}
			for k, v := range want {
				if got := r.Header.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if c := r.Header.Get("Content-Security-Policy"); strings.Contains(c, "unsafe-inline") || !strings.Contains(c, "script-src 'self'") {
				t.Errorf("CSP allows inline script: %q", c)
			}
		})
	}
	// No inline script anywhere: every <script> has a src.
	_, page := b.get("/")
	if regexp.MustCompile(`<script(?:\s[^>]*)?>\s*[^<\s]`).MatchString(page) || strings.Contains(page, " on") && regexp.MustCompile(`\son[a-z]+=`).MatchString(page) {
		t.Errorf("page has inline script or event handlers")
	}
}

func TestUnauthenticated(t *testing.T) {
	e := newEnv(t, nil)
	h := e.hold(`{"id":7}`)
	b := e.browser()
	for _, c := range []struct {
		name, method, path string
		want               int
	}{
		{"queue redirects to login", "GET", "/", http.StatusSeeOther},
		{"hold page redirects", "GET", "/holds/" + h.ID, http.StatusSeeOther},
		{"event stream is 401", "GET", "/ui/events", http.StatusUnauthorized},
		{"approve is 401", "POST", "/holds/" + h.ID + "/approve", http.StatusUnauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r *http.Response
			if c.method == "GET" {
				r, _ = b.get(c.path)
			} else {
				r, _ = b.post(c.path, url.Values{"csrf": {"x"}}, nil)
			}
			if r.StatusCode != c.want {
				t.Fatalf("status %d, want %d", r.StatusCode, c.want)
			}
		})
	}
	if got, _ := e.mgr.Get(context.Background(), h.ID); got.Status != holds.Pending {
		t.Fatalf("hold status %s after unauthenticated POST", got.Status)
	}
}

func TestCSRFAndDecisions(t *testing.T) {
	e := newEnv(t, nil)
	alice, bob, carol := e.browser(), e.browser(), e.browser()
	aliceTok, bobTok, carolTok := alice.login("alice", "alice-pw"), bob.login("bob", "bob-pw"), carol.login("carol", "carol-pw")

	t.Run("login without token", func(t *testing.T) {
		b := e.browser()
		b.get("/login")
		r, _ := b.post("/login", url.Values{"username": {"alice"}, "password": {"alice-pw"}}, nil)
		if r.StatusCode != http.StatusForbidden {
			t.Fatalf("status %d, want 403", r.StatusCode)
		}
	})

	h := e.hold(`{"id":7}`)
	cases := []struct {
		name   string
		b      *browser
		path   string
		form   url.Values
		hdr    map[string]string
		want   int
		wantIn string
	}{
		{"approve without csrf token", alice, "/approve", url.Values{}, nil, 403, "CSRF"},
		{"approve with a wrong token", alice, "/approve", url.Values{"csrf": {aliceTok + "x"}}, nil, 403, "CSRF"},
		{"approve with another session's token", alice, "/approve", url.Values{"csrf": {carolTok}}, nil, 403, "CSRF"},
		{"cross-origin POST with the right token", alice, "/approve", url.Values{"csrf": {aliceTok}}, map[string]string{"Origin": "https://evil.example"}, 403, "Cross-origin"},
		{"requester approves own hold (forged POST)", bob, "/approve", url.Values{"csrf": {bobTok}}, nil, 403, "self_approval_forbidden"},
		{"requester denies own hold", bob, "/deny", url.Values{"csrf": {bobTok}}, nil, 403, "self_approval_forbidden"},
		{"non-approver approves", carol, "/approve", url.Values{"csrf": {carolTok}}, nil, 403, "not_an_approver"},
		{"logout without token", alice, "LOGOUT", url.Values{}, nil, 403, "CSRF"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := "/holds/" + h.ID + c.path
			if c.path == "LOGOUT" {
				path = "/logout"
			}
			r, body := c.b.post(path, c.form, c.hdr)
			if r.StatusCode != c.want || !strings.Contains(body, c.wantIn) {
				t.Fatalf("status %d (want %d), body has %q: %v", r.StatusCode, c.want, c.wantIn, strings.Contains(body, c.wantIn))
			}
			if got, _ := e.mgr.Get(context.Background(), h.ID); got.Status != holds.Pending {
				t.Fatalf("hold became %s", got.Status)
			}
		})
	}

	t.Run("requester sees the hold without controls", func(t *testing.T) {
		r, body := bob.get("/holds/" + h.ID)
		if r.StatusCode != 200 || strings.Contains(body, `id="approve"`) || !strings.Contains(body, `id="no-approve"`) {
			t.Fatalf("status %d; approve control shown: %v", r.StatusCode, strings.Contains(body, `id="approve"`))
		}
		_, q := bob.get("/")
		if !strings.Contains(q, h.ID) || !strings.Contains(q, "your request") {
			t.Fatalf("requester's queue lacks the hold")
		}
	})
	t.Run("non-approver does not see the hold", func(t *testing.T) {
		r, _ := carol.get("/holds/" + h.ID)
		_, q := carol.get("/")
		if r.StatusCode != 404 || strings.Contains(q, h.ID) {
			t.Fatalf("status %d, in queue %v", r.StatusCode, strings.Contains(q, h.ID))
		}
	})
	t.Run("approver approves", func(t *testing.T) {
		_, body := alice.get("/holds/" + h.ID)
		if !strings.Contains(body, `id="approve"`) {
			t.Fatal("approver has no approve control")
		}
		r, _ := alice.post("/holds/"+h.ID+"/approve", url.Values{"csrf": {aliceTok}, "reason": {"fine"}}, map[string]string{"Origin": e.srv.URL})
		if r.StatusCode != http.StatusSeeOther {
			t.Fatalf("status %d", r.StatusCode)
		}
		select {
		case sent := <-e.sent:
			if sent.ID != h.ID {
				t.Fatalf("executed %s", sent.ID)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("not executed")
		}
		got, _ := e.mgr.Get(context.Background(), h.ID)
		if got.Status != holds.Done || got.DecidedBy != "alice" || got.DecisionReason != "fine" {
			t.Fatalf("hold %+v", got)
		}
		r, _ = alice.post("/holds/"+h.ID+"/approve", url.Values{"csrf": {aliceTok}}, nil)
		if r.StatusCode != http.StatusConflict {
			t.Fatalf("second approval: status %d, want 409", r.StatusCode)
		}
		_, hist := alice.get("/history")
		if !strings.Contains(hist, h.ID) {
			t.Fatal("history lacks the decided hold")
		}
	})
	t.Run("logout ends the session", func(t *testing.T) {
		r, _ := alice.post("/logout", url.Values{"csrf": {aliceTok}}, nil)
		if r.StatusCode != http.StatusSeeOther {
			t.Fatalf("logout status %d", r.StatusCode)
		}
		if r, _ := alice.get("/"); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("after logout: %d", r.StatusCode)
		}
	})
}

func TestSessionExpiry(t *testing.T) {
	cases := []struct {
		name  string
		steps []time.Duration // requests after these pauses
		alive bool
	}{
		{"active within idle", []time.Duration{20 * time.Minute, 20 * time.Minute}, true},
		{"idle 31 minutes", []time.Duration{31 * time.Minute}, false},
		{"active but past 8h", []time.Duration{25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute,
			25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute,
			25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute,
			25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute}, false},
	}
	for _, c := range cases {
		for _, where := range []string{"memory", "store"} { // Options.Sessions unset, or the gateway's store
			t.Run(c.name+"/"+where, func(t *testing.T) {
				e := newEnv(t, func(o *Options) {
					if where == "store" {
						o.Sessions = sessionStore(t)
					}
				})
				b := e.browser()
				b.login("alice", "alice-pw")
				var r *http.Response
				for _, d := range c.steps {
					e.advance(d)
					r, _ = b.get("/")
				}
				if (r.StatusCode == 200) != c.alive {
					t.Fatalf("status %d, alive want %v", r.StatusCode, c.alive)
				}
			})
		}
	}
}

func TestHostileHoldRendersSafely(t *testing.T) {
	e := newEnv(t, nil)
	big := strings.Repeat("A", 1<<20)
	args, _ := json.Marshal(map[string]string{
		"html":  "<script>alert(1)</script><img src=x onerror=alert(2)>",
		"bidi":  "invoice\u202Etxt.exe",
		"zw":    "pay\u200Bpal",
		"ctl":   "a\x1b[31mred\x07",
		"big":   big,
		"quote": `" onmouseover="alert(3)`,
	})
	h := e.hold(string(args))
	b := e.browser()
	b.login("alice", "alice-pw")
	r, body := b.get("/holds/" + h.ID)
	if r.StatusCode != 200 {
		t.Fatalf("status %d", r.StatusCode)
	}
	for _, c := range []struct {
		name    string
		present []string
		absent  []string
	}{
		{"script escaped", []string{"&lt;script&gt;alert(1)&lt;/script&gt;"}, []string{"<script>alert", "<img src=x"}},
		{"bidi override marked", []string{"⟦U+202E⟧"}, []string{"\u202E"}},
		{"zero-width marked", []string{"⟦U+200B⟧"}, []string{"\u200B"}},
		{"escape and bell marked", []string{"⟦U+001B⟧", "⟦U+0007⟧"}, []string{"\x1b", "\x07"}},
		{"quote escaped", []string{`\&#34; onmouseover=\&#34;alert(3)`}, []string{`" onmouseover="`}},
		{"credential named, never valued", []string{"attached by the gateway: tickets-key"}, nil},
		{"big value cut with an expand control", []string{"<details class=\"more\"><summary>show 262144 more bytes</summary>", "more bytes not shown"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range c.present {
				if !strings.Contains(body, p) {
					t.Errorf("page lacks %q", p)
				}
			}
			for _, a := range c.absent {
				if strings.Contains(body, a) {
					t.Errorf("page contains %q", a)
				}
			}
		})
	}
	// Two copies (args and body) of at most 4 KiB + 256 KiB each.
	if n := strings.Count(body, "A"); n > 2*(previewBytes+expandedBytes)+1000 {
		t.Errorf("page carries %d bytes of the big value", n)
	}
	_, audit := b.get("/audit")
	if strings.Contains(audit, "<script>alert") || !strings.Contains(audit, "&lt;script&gt;") {
		t.Errorf("audit view does not escape")
	}
}

func TestEventsStreamLiveChanges(t *testing.T) {
	e := newEnv(t, nil)
	b := e.browser()
	b.login("alice", "alice-pw")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/ui/events", nil)
	r, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if ct := r.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	buf := make([]byte, 4096)
	if _, err := r.Body.Read(buf); err != nil { // the retry preamble
		t.Fatal(err)
	}
	h := e.hold(`{"id":1}`)
	var got strings.Builder
	for !strings.Contains(got.String(), "\n\n") {
		n, err := r.Body.Read(buf)
		if err != nil {
			t.Fatalf("read: %v (so far %q)", err, got.String())
		}
		got.Write(buf[:n])
	}
	want := fmt.Sprintf("event: changed\ndata: {\"id\":%q,\"kind\":\"created\"}\n\n", h.ID)
	if got.String() != want {
		t.Fatalf("event %q, want %q", got.String(), want)
	}
}

func TestVisible(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"plain", "hello", "hello"},
		{"html", `<a href="x">&`, "&lt;a href=&#34;x&#34;&gt;&amp;"},
		{"rlo", "a\u202Eb", `a<span class="cc" title="invisible or bidi control character">⟦U+202E⟧</span>b`},
		{"isolate", "\u2066", `<span class="cc" title="invisible or bidi control character">⟦U+2066⟧</span>`},
		{"bom", "\uFEFF", `<span class="cc" title="invisible or bidi control character">⟦U+FEFF⟧</span>`},
		{"c1", "\u0085", `<span class="cc" title="invisible or bidi control character">⟦U+0085⟧</span>`},
		{"nul", "\x00", `<span class="cc" title="invisible or bidi control character">⟦U+0000⟧</span>`},
		{"invalid utf-8", "a\xffb", `a<span class="cc" title="invalid UTF-8 byte">⟦0xFF⟧</span>b`},
		{"newline and tab kept", "a\n\tb", "a\n\tb"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := string(visible(c.in)); got != c.want {
				t.Fatalf("visible(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestNewRejectsBadUsers(t *testing.T) {
	st, _ := store.Open(context.Background(), "sqlite::memory:")
	defer st.Close()
	m := holds.New(holds.Options{Store: st})
	for _, c := range []struct {
		name string
		opt  Options
	}{
		{"no holds", Options{}},
		{"plain-text password", Options{Holds: m, Users: []config.User{{Name: "a", PasswordHash: "secret"}}}},
		{"no name", Options{Holds: m, Users: []config.User{{PasswordHash: hash(t, "x")}}}},
		{"oidc without issuer", Options{Holds: m, OIDC: &OIDC{ClientID: "c", RedirectURL: "http://x/cb"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := New(c.opt); err == nil || !strings.HasPrefix(err.Error(), "review: ") {
				t.Fatalf("err %v", err)
			}
		})
	}
	if _, err := New(Options{Holds: m, Users: []config.User{{Name: "a", PasswordHash: "secret"}}}); err != nil && strings.Contains(err.Error(), "secret") {
		t.Fatalf("error leaks the hash field: %v", err)
	}
	_ = errors.New
}

func TestPersonForAdminAPI(t *testing.T) {
	e := newEnv(t, nil)
	b := e.browser()
	tok := b.login("alice", "alice-pw")
	su, _ := url.Parse(e.srv.URL)
	var sid string
	for _, c := range b.c.Jar.Cookies(su) {
		if c.Name == sessionCookie {
			sid = c.Value
		}
	}
	for _, c := range []struct {
		name, method, cookie, csrf, origin string
		ok                                 bool
	}{
		{"GET with the session", "GET", sid, "", "", true},
		{"GET without a session", "GET", "", "", "", false},
		{"GET with a made-up session", "GET", "forged", "", "", false},
		{"POST with the CSRF header", "POST", sid, tok, "", true},
		{"POST without the CSRF header", "POST", sid, "", "", false},
		{"POST with a wrong CSRF header", "POST", sid, tok[1:], "", false},
		{"POST from another origin", "POST", sid, tok, "https://evil.example", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, e.srv.URL+"/api/v1/holds", nil)
			if c.cookie != "" {
				r.AddCookie(&http.Cookie{Name: sessionCookie, Value: c.cookie})
			}
			if c.csrf != "" {
				r.Header.Set("X-CSRF-Token", c.csrf)
			}
			if c.origin != "" {
				r.Header.Set("Origin", c.origin)
			}
			p, ok := e.ui.Person(r)
			if ok != c.ok || (ok && p.Name != "alice") {
				t.Fatalf("Person = %v, %v; want ok %v", p, ok, c.ok)
			}
		})
	}
}

func TestSecureCookieOverTLS(t *testing.T) {
	e := newEnv(t, nil)
	srv := httptest.NewTLSServer(e.ui)
	defer srv.Close()
	c := srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	r, err := c.Get(srv.URL + "/login")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	var login *http.Cookie
	for _, ck := range r.Cookies() {
		if ck.Name == "sluice_login" {
			login = ck
		}
	}
	if login == nil || !login.Secure {
		t.Fatalf("login cookie over TLS not Secure: %+v", login)
	}
	req, _ := http.NewRequest("POST", srv.URL+"/login", strings.NewReader(url.Values{"csrf": {csrfOf(t, string(body))}, "username": {"alice"}, "password": {"alice-pw"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(login)
	r, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	for _, ck := range r.Cookies() {
		if ck.Name == sessionCookie {
			if !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
				t.Fatalf("session cookie over TLS: %+v", ck)
			}
			return
		}
	}
	t.Fatalf("no session cookie (status %d)", r.StatusCode)
}

func TestDenyAndExpired(t *testing.T) {
	e := newEnv(t, nil)
	alice := e.browser()
	tok := alice.login("alice", "alice-pw")
	t.Run("deny with a reason", func(t *testing.T) {
		h := e.hold(`{"id":1}`)
		r, _ := alice.post("/holds/"+h.ID+"/deny", url.Values{"csrf": {tok}, "reason": {"not today"}}, nil)
		if r.StatusCode != http.StatusSeeOther {
			t.Fatalf("status %d", r.StatusCode)
		}
		got, _ := e.mgr.Get(context.Background(), h.ID)
		if got.Status != holds.Denied || got.DecidedBy != "alice" || got.DecisionReason != "not today" {
			t.Fatalf("hold %+v", got)
		}
		_, page := alice.get("/holds/" + h.ID)
		if strings.Contains(page, `id="approve"`) || !strings.Contains(page, "not today") {
			t.Fatal("decided hold page still offers approval or lacks the reason")
		}
	})
	t.Run("approve after expiry is 410", func(t *testing.T) {
		h, _, err := e.mgr.Create(context.Background(), holds.Hold{Tool: "t.x", Args: []byte(`{}`),
			Request: holds.Request{Method: "GET", URL: "https://api.example/x"}, Caller: holds.Caller{Agent: "a", User: "bob"},
			Approvers: []string{"alice"}, Expires: time.Now().Add(50 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		r, body := alice.post("/holds/"+h.ID+"/approve", url.Values{"csrf": {tok}}, nil)
		if r.StatusCode != http.StatusGone || !strings.Contains(body, "expired") {
			t.Fatalf("status %d", r.StatusCode)
		}
	})
	t.Run("unknown hold is 404", func(t *testing.T) {
		r, _ := alice.post("/holds/nope/approve", url.Values{"csrf": {tok}}, nil)
		if r.StatusCode != http.StatusNotFound {
			t.Fatalf("status %d", r.StatusCode)
		}
	})
}

// TestApproveAlways drives the "always allow" checkbox: it needs the CSRF
// token like any POST, the requester cannot grant, a bad lifetime or the
// box on Deny is refused without deciding, and a checked box approves and
// stores a grant bound to the hold's agent, user, tool and request hash.
func TestApproveAlways(t *testing.T) {
	e := newEnv(t, nil)
	alice, bob := e.browser(), e.browser()
	aliceTok, bobTok := alice.login("alice", "alice-pw"), bob.login("bob", "bob-pw")
	h := e.hold(`{"id":8}`)
	origin := map[string]string{"Origin": e.srv.URL}
	t.Run("the form offers the box", func(t *testing.T) {
		_, body := alice.get("/holds/" + h.ID)
		if !strings.Contains(body, `name="always"`) || !strings.Contains(body, `name="ttl"`) {
			t.Fatal("approve form has no always-allow control")
		}
	})
	refused := []struct {
		name   string
		b      *browser
		path   string
		form   url.Values
		want   int
		wantIn string
	}{
		{"without csrf token", alice, "/approve", url.Values{"always": {"on"}}, 403, "CSRF"},
		{"requester grants own call", bob, "/approve", url.Values{"csrf": {bobTok}, "always": {"on"}}, 403, "self_approval_forbidden"},
		{"lifetime not offered", alice, "/approve", url.Values{"csrf": {aliceTok}, "always": {"on"}, "ttl": {"720h"}}, 400, "1h, 8h or 24h"},
		{"always on deny", alice, "/deny", url.Values{"csrf": {aliceTok}, "always": {"on"}, "reason": {"no"}}, 400, "only with Approve"},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			r, body := c.b.post("/holds/"+h.ID+c.path, c.form, origin)
			if r.StatusCode != c.want || !strings.Contains(body, c.wantIn) {
				t.Fatalf("status %d (want %d), body has %q: %v", r.StatusCode, c.want, c.wantIn, strings.Contains(body, c.wantIn))
			}
			if got, _ := e.mgr.Get(context.Background(), h.ID); got.Status != holds.Pending {
				t.Fatalf("hold became %s", got.Status)
			}
			if gs, _ := e.mgr.Grants(context.Background(), true, 0); len(gs) != 0 {
				t.Fatalf("grants made: %+v", gs)
			}
		})
	}
	t.Run("approver grants for 1h", func(t *testing.T) {
		r, body := alice.post("/holds/"+h.ID+"/approve", url.Values{"csrf": {aliceTok}, "always": {"on"}, "ttl": {"1h"}}, origin)
		if r.StatusCode != http.StatusSeeOther {
			t.Fatalf("status %d: %.300s", r.StatusCode, body)
		}
		<-e.sent
		gs, err := e.mgr.Grants(context.Background(), false, 0)
		if err != nil || len(gs) != 1 {
			t.Fatalf("grants %+v, %v", gs, err)
		}
		g := gs[0]
		if g.Hold != h.ID || g.By != "alice" || g.Agent != "triage" || g.User != "bob" || g.Tool != h.Tool || g.SHA256 != h.SHA256 ||
			g.Expires.Sub(g.Created) != time.Hour {
			t.Fatalf("grant %+v", g)
		}
	})
}
