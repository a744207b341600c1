package browser

import (
	"bufio"
	"bytes"
	"context"
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
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"

	"github.com/sluice-gw/sluice/gateway"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/review"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

const chromium = "/usr/bin/chromium"

const secret = "pay-secret-8c1f0e"

const rigYAML = `
gateway:
  sandbox_socket: %[1]s/relay.sock
  trusted_relay_uids: [%[2]d]
  admin_listen: 127.0.0.1:0
  hold_wait: 60s
store: sqlite:%[1]s/sluice.db
audit: { path: %[1]s/audit.log }
secrets: { backend: local, local: { path: %[1]s/secrets.json, key_file: %[1]s/secrets.key } }
connectors:
  - slug: payments
    spec: %[3]s
    base_url: %[4]s
    allow_private: [127.0.0.0/8]
    credential: { secret: payments-key }
agents:
  - { name: triage, connectors: [payments] }
policies:
  - { match: "payments.create_refund", action: ask, approvers: [group:finance], reason: "refunds move money" }
  - { match: "*", action: block }
approvers:
  users:
    - { name: alice, groups: [finance], password_hash: "%[5]s" }
    - { name: bob, groups: [finance], password_hash: "%[6]s" }
`

// agent is the identity the held calls are made for: bob. Bob is in group
// finance too, so only the self-approval rule keeps him from approving.
var agent = wire.Identity{Sandbox: "sb-1", Agent: "triage", Session: "s-1", User: "bob", Host: "h1"}

// rig is a real gateway with the review UI mounted on its admin listener,
// an upstream that counts what reaches it, and a Chromium.
type rig struct {
	t       *testing.T
	gw      *gateway.Server
	cfg     *config.Config
	base    string // the admin listener, where the UI is
	browser context.Context
	ui      *review.UI

	mu   sync.Mutex
	hits []*http.Request
	keys []string
}

func artifactDir(t *testing.T) string {
	if d := os.Getenv("SLUICE_ARTIFACTS"); d != "" {
		d = filepath.Join(d, "browser")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

func pwHash(t *testing.T, pw string) string {
	h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

func newRig(t *testing.T) *rig {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		t.Skipf("skipping: %s is missing (install Debian's chromium; test.sh does)", chromium)
	}
	r := &rig{t: t}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		req.Body = io.NopCloser(bytes.NewReader(body))
		r.hits = append(r.hits, req)
		r.keys = append(r.keys, req.Header.Get("X-Api-Key"))
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprint(w, `{"refund":"r-1","state":"sent"}`)
	}))
	t.Cleanup(up.Close)

	dir, err := os.MkdirTemp("", "sluice-br-") // short: the socket path has a length limit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	spec, _ := filepath.Abs("testdata/payments.yaml")
	y := fmt.Sprintf(rigYAML, dir, os.Getuid(), spec, up.URL, pwHash(t, "alice-pw"), pwHash(t, "bob-pw"))
	cfg, err := config.Parse([]byte(y), dir)
	if err != nil {
		t.Fatal(err)
	}
	r.cfg = cfg
	st, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Set(context.Background(), "payments-key", "project", vault.NewSecret([]byte(secret))); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw, err := gateway.New(context.Background(), cfg, gateway.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	r.gw = gw
	ui, err := review.New(review.Options{
		Holds: gw.Holds(), Grants: gw.Holds(), Users: cfg.Approvers.Users, Log: log,
		AuditFile: cfg.Audit.Path,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.ui = ui
	gw.SetReviewUI(ui)
	gw.SetAdminAuth(ui.Person)
	r.base, r.browser = serveWithBrowser(t, gw)
	return r
}

// serveWithBrowser serves gw until the test ends and starts a Chromium;
// it returns the admin listener's URL and the browser.
func serveWithBrowser(t *testing.T, gw *gateway.Server) (string, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ctx) }()
	select {
	case <-gw.Ready():
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("gateway not ready")
	}
	t.Cleanup(func() { cancel(); <-done; gw.Close() })
	return "http://" + gw.AdminAddr(), startBrowser(t)
}

// startBrowser starts a Chromium that ends with the test.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	// chromedp's defaults (headless, no first run, no background networking,
	// no sync, and disable-dev-shm-usage, without which pages never load in a
	// small container) plus what this machine needs.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	alloc, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, bcancel := chromedp.NewContext(alloc)
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() { bcancel(); acancel() })
	return bctx
}

func tailAudit(path string, n int) ([]json.RawMessage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []json.RawMessage
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		out = append(out, json.RawMessage(bytes.Clone(sc.Bytes())))
		if len(out) > n {
			out = out[1:]
		}
	}
	return out, sc.Err()
}

// call makes the agent's tool call over the sandbox socket, as a relay
// would: identity preamble first. It returns the status and body.
func (r *rig) call(ctx context.Context, tool, args string) (int, string, error) {
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, r.cfg.Gateway.SandboxSocket, agent)
		},
	}}
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://sluice/v1/tools/"+tool, strings.NewReader(args))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

type result struct {
	status int
	body   string
	err    error
}

// ask starts a held call in the background; its answer arrives on the channel.
func (r *rig) ask(args string) (<-chan result, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	ch := make(chan result, 1)
	go func() {
		s, b, err := r.call(ctx, "payments.create_refund", args)
		ch <- result{s, b, err}
	}()
	return ch, cancel
}

// pending waits until the store has n pending holds and returns them.
func (r *rig) pending(n int) []holds.Hold {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		hs, err := r.gw.Holds().List(context.Background(), holds.Filter{Status: []holds.Status{holds.Pending}})
		if err != nil {
			r.t.Fatal(err)
		}
		if len(hs) >= n {
			return hs
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d pending holds, want %d", len(hs), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// person is one signed-in browser profile (its own cookies).
type person struct {
	ctx     context.Context
	r       *rig
	name    string
	dialogs chan string
}

func (r *rig) signIn(name, pw string) *person {
	r.t.Helper()
	ctx, cancel := chromedp.NewContext(r.browser, chromedp.WithNewBrowserContext())
	r.t.Cleanup(cancel)
	ctx, tcancel := context.WithTimeout(ctx, 180*time.Second)
	r.t.Cleanup(tcancel)
	p := &person{ctx: ctx, r: r, name: name, dialogs: make(chan string, 10)}
	// Any alert, confirm or prompt is a script injection that ran: record it.
	if err := chromedp.Listen(ctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			p.dialogs <- d.Message
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}); err != nil {
		r.t.Fatal(err)
	}
	p.do(chromedp.Navigate(r.base+"/"),
		chromedp.WaitVisible(chromedp.CSS("#username")),
		chromedp.SendKeys(chromedp.CSS("#username"), name),
		chromedp.SendKeys(chromedp.CSS("#password"), pw),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#queue")),
	)
	return p
}

func (p *person) do(steps ...chromedp.Action[chromedp.Void]) {
	p.r.t.Helper()
	if err := chromedp.Do(p.ctx, steps...); err != nil {
		p.r.t.Fatalf("%s's browser: %v", p.name, err)
	}
}

func eval[T any](p *person, js string) T {
	p.r.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		p.r.t.Fatalf("%s's browser: eval %q: %v", p.name, js, err)
	}
	return v
}

func (p *person) shot(name string) {
	p.r.t.Helper()
	b, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.r.t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(artifactDir(p.r.t), name+".png")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.r.t.Fatal(err)
	}
	p.r.t.Logf("screenshot: %s", path)
}

// postFrom makes a POST from inside the page (same origin, the person's
// cookies), as a forged form or a script would, and returns the status.
func postFrom(p *person, path string, form map[string]string) int {
	p.r.t.Helper()
	b, _ := json.Marshal(form)
	return eval[int](p, fmt.Sprintf(`fetch(%q, {method: "POST", body: new URLSearchParams(%s), redirect: "manual"}).then(r => r.status)`, path, b))
}

func TestApproverWatchesHoldArriveAndApproves(t *testing.T) {
	r := newRig(t)
	alice := r.signIn("alice", "alice-pw")
	alice.do(chromedp.WaitVisible(chromedp.CSS("#live.on"))) // the event stream is connected
	if got := eval[string](alice, `document.querySelector("#queue").innerText`); !strings.Contains(got, "Nothing is waiting") {
		t.Fatalf("queue not empty at start: %q", got)
	}
	alice.shot("01-queue-empty")
	// Mark this page: a reload would lose the mark.
	eval[bool](alice, `window.__noReload = true`)

	answer, cancel := r.ask(`{"body":{"amount":42,"reason":"duplicate charge"}}`)
	defer cancel()
	alice.do(chromedp.WaitVisible(chromedp.CSS("#queue li.hold-item.actionable")))
	if !eval[bool](alice, `window.__noReload === true`) {
		t.Fatal("the queue page reloaded; the hold should arrive live")
	}
	alice.shot("02-queue-live-hold")
	h := r.pending(1)[0]

	alice.do(chromedp.Click(chromedp.CSS("#queue li.hold-item a")), chromedp.WaitVisible(chromedp.CSS("#approve")))
	page := eval[string](alice, `document.body.innerText`)
	for _, want := range []string{"POST", "/refunds", "attached by the gateway: payments-key", `"amount": 42`,
		"refunds move money", "triage", "s-1", "bob", "expires"} {
		if !strings.Contains(page, want) {
			t.Errorf("hold page lacks %q", want)
		}
	}
	if strings.Contains(page, secret) {
		t.Fatal("hold page shows the credential's value")
	}
	alice.shot("03-hold-page")
	alice.do(chromedp.EmulateViewport(375, 812, chromedp.EmulateMobile))
	if w := eval[int](alice, `document.documentElement.scrollWidth`); w > 375 {
		t.Errorf("page is %dpx wide at a 375px viewport", w)
	}
	alice.shot("04-hold-page-375px")
	alice.do(chromedp.EmulateViewport(1280, 900))

	alice.do(chromedp.SendKeys(chromedp.CSS("#approve-reason"), "checked with the customer"),
		chromedp.Click(chromedp.CSS("#approve")),
		chromedp.WaitVisible(chromedp.CSS("#status")))
	select {
	case res := <-answer:
		// The gateway answers 200 with the upstream's status and body inside.
		if res.err != nil || res.status != 200 || !strings.Contains(res.body, `"status":201`) || !strings.Contains(res.body, `"refund":"r-1"`) {
			t.Fatalf("agent's call: %d %q %v", res.status, res.body, res.err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the agent's waiting call did not complete after approval")
	}
	got, err := r.gw.Holds().Get(context.Background(), h.ID)
	if err != nil || got.Status != holds.Done || got.DecidedBy != "alice" || got.DecisionReason != "checked with the customer" {
		t.Fatalf("hold after approval: %+v %v", got, err)
	}
	// The approve form posts and the hold page loads again: poll, since
	// the old page's #status can satisfy WaitVisible before the new one
	// has replaced it.
	var status string
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		// An evaluation that meets the navigation fails; try again.
		if v, err := chromedp.Run(alice.ctx, chromedp.Evaluate[string](`(document.querySelector("#status") || {innerText: ""}).innerText`)); err == nil {
			status = v
		}
		if status == "executed" || status == "executing" {
			break
		}
	}
	if status != "executed" && status != "executing" {
		t.Errorf("hold page status %q", status)
	}
	r.mu.Lock()
	if len(r.hits) != 1 || r.keys[0] != secret {
		t.Errorf("upstream saw %d requests (key attached: %v)", len(r.hits), len(r.keys) > 0 && r.keys[0] == secret)
	}
	r.mu.Unlock()
	alice.shot("05-hold-executed")
}

func TestRequesterSeesHoldButCannotApprove(t *testing.T) {
	r := newRig(t)
	answer, cancel := r.ask(`{"body":{"amount":7}}`)
	defer cancel()
	h := r.pending(1)[0]

	bob := r.signIn("bob", "bob-pw")
	bob.do(chromedp.WaitVisible(chromedp.CSS("#queue li.hold-item")))
	bob.do(chromedp.Click(chromedp.CSS("#queue li.hold-item a")), chromedp.WaitVisible(chromedp.CSS("#no-approve")))
	if n := eval[int](bob, `document.querySelectorAll("#approve, #deny, form[action$='/approve']").length`); n != 0 {
		t.Fatalf("the requester has %d approve/deny controls", n)
	}
	bob.shot("06-requester-no-controls")

	csrf := eval[string](bob, `document.querySelector("input[name=csrf]").value`)
	cases := []struct {
		name string
		who  *person
		path string
		form map[string]string
		want int
	}{
		{"requester's forged approve with a valid CSRF token", bob, "/holds/" + h.ID + "/approve", map[string]string{"csrf": csrf, "reason": "me"}, 403},
		{"requester's forged deny", bob, "/holds/" + h.ID + "/deny", map[string]string{"csrf": csrf}, 403},
		{"requester through the JSON API with the CSRF header", bob, "", nil, 403},
	}
	alice := r.signIn("alice", "alice-pw")
	cases = append(cases, struct {
		name string
		who  *person
		path string
		form map[string]string
		want int
	}{"approver's approve without a CSRF token", alice, "/holds/" + h.ID + "/approve", map[string]string{"reason": "no token"}, 403})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := "E1" // the requester approving their own call
			if c.who == alice {
				id = "E2" // a decision without the UI session's CSRF token
			}
			cb := casebook.Expect(t, id, c.name+" (review UI in Chromium, signed in)", fmt.Sprintf("%d, the hold stays pending", c.want))
			var got int
			defer func() {
				cur, _ := r.gw.Holds().Get(context.Background(), h.ID)
				cb.Observef("%d, hold %s", got, cur.Status)
			}()
			if c.path == "" {
				got = eval[int](c.who, fmt.Sprintf(`fetch("/api/v1/holds/%s/approve", {method: "POST", headers: {"X-CSRF-Token": %q,
					"Content-Type": "application/json"}, body: "{}"}).then(r => r.status)`, h.ID, csrf))
			} else {
				got = postFrom(c.who, c.path, c.form)
			}
			if got != c.want {
				t.Fatalf("status %d, want %d", got, c.want)
			}
			if cur, _ := r.gw.Holds().Get(context.Background(), h.ID); cur.Status != holds.Pending {
				t.Fatalf("hold became %s", cur.Status)
			}
		})
	}
	bob.do(chromedp.Navigate(r.base+"/holds/"+h.ID+"/approve"+"?x"), chromedp.Sleep(0)) // a GET is not a decision
	if cur, _ := r.gw.Holds().Get(context.Background(), h.ID); cur.Status != holds.Pending {
		t.Fatalf("hold became %s", cur.Status)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.hits) != 0 {
		t.Fatalf("upstream reached %d times", len(r.hits))
	}
	select {
	case res := <-answer:
		t.Fatalf("the agent's call answered before any decision: %d %s", res.status, res.body)
	default:
	}
}

func TestHostileHoldRendersSafely(t *testing.T) {
	r := newRig(t)
	big := strings.Repeat("A", 1_000_000)
	args, _ := json.Marshal(map[string]any{"body": map[string]any{
		"amount": 1,
		"reason": "<script>alert(1)</script><img src=x onerror=alert(2)>refund for \u202Egnp.exe\u202C and pay\u200Bpal",
		"note":   big,
	}})
	// The gateway's schema check caps one string argument at 64 KiB, so a
	// 1 MB string cannot arrive through a call; the hold is created through
	// the gateway's own holds manager, as the ask path does, to show the UI
	// stays safe beyond what the gateway admits.
	h, _, err := r.gw.Holds().Create(context.Background(), holds.Hold{
		Tool: "payments.create_refund", Args: args,
		Request: holds.Request{Method: "POST", URL: "http://payments.test/refunds?q=\u202Eevil",
			Headers: map[string][]string{"Content-Type": {"application/json"}, "X-Note": {"<b>bold</b>\u2066"}}, Body: args},
		Credential: "payments-key",
		Caller:     holds.Caller{Sandbox: "sb-1", Agent: "triage<script>alert(3)</script>", Session: "s-1", User: "bob"},
		Approvers:  []string{"group:finance"}, Rule: "policies[0]", Reason: "refunds move money",
		Expires: time.Now().Add(15 * time.Minute),
	})
	if err != nil {
		t.Fatal(err)
	}

	cb := casebook.Expect(t, "E4", "a held call whose arguments carry <script>, an onerror <img>, bidi overrides (U+202E) and a zero-width space, shown to the approver in Chromium",
		"the exact bytes shown as text (the script text visible, each invisible control as a visible marker), no element or script from the arguments, no dialog")
	var shown []string
	defer func() { cb.Observef("markers shown %v; failed checks: %v", shown, t.Failed()) }()
	alice := r.signIn("alice", "alice-pw")
	alice.do(chromedp.WaitVisible(chromedp.CSS("#queue li.hold-item")))
	alice.shot("07-hostile-queue")
	alice.do(chromedp.Navigate(r.base+"/holds/"+h.ID), chromedp.WaitVisible(chromedp.CSS("#args")))
	alice.shot("08-hostile-hold")

	markers := eval[[]string](alice, `Array.from(document.querySelectorAll("#args .cc")).map(e => e.textContent)`)
	shown = markers
	for _, want := range []string{"⟦U+202E⟧", "⟦U+202C⟧", "⟦U+200B⟧"} {
		found := false
		for _, m := range markers {
			found = found || m == want
		}
		if !found {
			t.Errorf("no visible marker %s among %v", want, markers)
		}
	}
	for _, c := range []struct {
		name string
		js   string
		want bool
	}{
		{"no script element from the arguments", `Array.from(document.scripts).every(s => s.src.endsWith("/ui/static/app.js"))`, true},
		{"no img element from the arguments", `document.querySelectorAll("main img").length === 0`, true},
		{"the script text shown as text", `document.querySelector("#args").innerText.includes("<script>alert(1)</script>")`, true},
		{"no raw bidi override in the rendered text", `document.querySelector("main").innerText.includes("\u202E")`, false},
		{"the big value cut behind a closed <details>", `(() => { const d = document.querySelector("#args details.more"); return !!d && !d.open })()`, true},
		{"rendered text far below 1 MB", `document.body.innerText.length < 40000`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := eval[bool](alice, c.js); got != c.want {
				t.Fatalf("%s = %v", c.js, got)
			}
		})
	}
	alice.do(chromedp.Click(chromedp.CSS("#args details.more summary")))
	if !eval[bool](alice, `document.querySelector("#args details.more").open`) {
		t.Error("the expand control does not open")
	}
	alice.do(chromedp.Sleep(300 * time.Millisecond))
	select {
	case msg := <-alice.dialogs:
		t.Fatalf("a JavaScript dialog opened: %q (injected script ran)", msg)
	default:
	}
}

// TestAlwaysAllowFromTheForm (E7): the approver ticks "Always allow this
// exact call" (1 hour) in Chromium and approves. The same call again is
// sent at once (200, no hold, audited grant_used); the same tool with
// other arguments is held again and reaches nothing.
func TestAlwaysAllowFromTheForm(t *testing.T) {
	r := newRig(t)
	cb := casebook.Expect(t, "E7", `"always allow this exact call" ticked in the review UI (Chromium), then the same call and one with other arguments`,
		"the same arguments: 200 at once with no hold, audited grant_used; other arguments: a new pending hold, nothing sent")
	alice := r.signIn("alice", "alice-pw")
	const args = `{"body":{"amount":7,"reason":"late parcel"}}`
	answer, cancel := r.ask(args)
	defer cancel()
	alice.do(chromedp.WaitVisible(chromedp.CSS("#queue li.hold-item.actionable")),
		chromedp.Click(chromedp.CSS("#queue li.hold-item a")), chromedp.WaitVisible(chromedp.CSS("#approve")),
		chromedp.Click(chromedp.CSS("#approve-always")), chromedp.SetValue(chromedp.CSS("#approve-ttl"), "1h"),
		chromedp.SendKeys(chromedp.CSS("#approve-reason"), "recurring"), chromedp.Click(chromedp.CSS("#approve")))
	select {
	case res := <-answer:
		if res.err != nil || res.status != 200 {
			t.Fatalf("the approved call: %d %q %v", res.status, res.body, res.err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the approved call did not complete")
	}
	ctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	again, body, err := r.call(ctx, "payments.create_refund", args)
	pending, _ := r.gw.Holds().List(context.Background(), holds.Filter{Status: []holds.Status{holds.Pending}})
	if err != nil || again != 200 || len(pending) != 0 {
		t.Fatalf("the same call again: %d %q %v with %d pending holds; want 200 and no hold", again, body, err, len(pending))
	}
	other, ocancel := r.ask(`{"body":{"amount":7000,"reason":"late parcel"}}`)
	defer ocancel()
	held := r.pending(1)
	select {
	case res := <-other:
		t.Fatalf("the call with other arguments was answered without approval: %d %q", res.status, res.body)
	default:
	}
	grantUsed := 0
	recs, err := tailAudit(r.cfg.Audit.Path, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range recs {
		var rec struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(raw, &rec) == nil && rec.Event == "grant_used" {
			grantUsed++
		}
	}
	r.mu.Lock()
	hits := len(r.hits)
	r.mu.Unlock()
	cb.Observef("same call again %d with %d pending holds; other arguments held (%s); grant_used records %d; upstream requests %d", again, len(pending), held[0].ID, grantUsed, hits)
	if grantUsed != 1 || hits != 2 {
		t.Errorf("grant_used records %d, upstream requests %d; want 1 and 2 (the approved call and its repeat)", grantUsed, hits)
	}
}
