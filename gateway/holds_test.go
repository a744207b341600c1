package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
)

func tokenHash(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

// approversYAML names bob and alice (both in finance) and carol (not); the
// refund rule asks group:finance, and agentA's calls are made for alice.
var approversYAML = fmt.Sprintf(`
approvers:
  users:
    - { name: bob, groups: [finance], token_sha256: %s }
    - { name: alice, groups: [finance, admins], token_sha256: %s }
    - { name: carol, groups: [support], token_sha256: %s }
`, tokenHash("tok-bob"), tokenHash("tok-alice"), tokenHash("tok-carol"))

// startHolds starts a gateway with approvers and a short hold wait.
func startHolds(t testing.TB, up *upstreamServer, extra string, edit func(*config.Config)) *testGateway {
	t.Helper()
	return startGateway(t, up.URL, approversYAML+extra, func(c *config.Config) {
		c.Gateway.HoldWait = config.Duration(50 * time.Millisecond)
		if edit != nil {
			edit(c)
		}
	})
}

// admin calls the admin API with a bearer token ("" for none).
func (g *testGateway) admin(t testing.TB, token, method, path, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+g.AdminAddr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("admin %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, raw: string(raw)}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("admin reply is not JSON: %q", raw)
	}
	return r
}

func holdOf(t testing.TB, r reply) (id, status string) {
	t.Helper()
	h, ok := r.body["hold"].(map[string]any)
	if !ok {
		t.Fatalf("no hold in %d %s", r.status, r.raw)
	}
	id, _ = h["id"].(string)
	status, _ = h["status"].(string)
	return id, status
}

func poll(t testing.TB, c *http.Client, id, wait string) reply {
	t.Helper()
	resp, err := c.Get("http://sluice/v1/holds/" + id + "?wait=" + wait)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, raw: string(raw)}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("poll reply is not JSON: %q", raw)
	}
	return r
}

const refund = `{"body":{"amount":5,"reason":"dup"}}`

func TestHoldApprovePollAndWebhook(t *testing.T) {
	up := newUpstream(t)
	hooks := make(chan string, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hooks <- string(b)
	}))
	t.Cleanup(hook.Close)
	g := startHolds(t, up, "approvals: { webhook_url: "+hook.URL+", public_url: https://review.example }", nil)
	c := g.client(agentA)

	r := doCall(t, c, "tickets.create_refund", refund)
	id, st := holdOf(t, r)
	if r.status != 202 || st != "pending" || r.body["hold"].(map[string]any)["poll"] != "/v1/holds/"+id {
		t.Fatalf("ask: %d %s, want 202 pending with a poll link", r.status, r.raw)
	}
	t.Run("webhook links to the hold", func(t *testing.T) {
		select {
		case b := <-hooks:
			var m map[string]string
			if err := json.Unmarshal([]byte(b), &m); err != nil || !strings.Contains(m["text"], "https://review.example/holds/"+id) {
				t.Fatalf("webhook body %q", b)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no webhook")
		}
	})
	t.Run("a re-sent identical call returns the same hold", func(t *testing.T) {
		r := doCall(t, c, "tickets.create_refund", refund)
		if id2, _ := holdOf(t, r); id2 != id || r.status != 202 {
			t.Fatalf("re-send: %d %s, want 202 for hold %s", r.status, r.raw, id)
		}
	})
	t.Run("another session cannot see the hold", func(t *testing.T) {
		other := agentA
		other.Session = "s-2"
		if r := poll(t, g.client(other), id, "0s"); r.status != 404 {
			t.Fatalf("other session poll: %d %s, want 404", r.status, r.raw)
		}
	})
	t.Run("the sandbox socket has no approve endpoint", func(t *testing.T) {
		resp, err := c.Post("http://sluice/v1/holds/"+id+"/approve", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 && resp.StatusCode != 405 {
			t.Fatalf("approve on the sandbox socket: %d", resp.StatusCode)
		}
	})
	t.Run("unauthenticated admin calls are 401", func(t *testing.T) {
		for _, tok := range []string{"", "wrong"} {
			if r := g.admin(t, tok, "POST", "/api/v1/holds/"+id+"/approve", `{}`); r.status != 401 {
				t.Fatalf("token %q: %d %s", tok, r.status, r.raw)
			}
		}
	})
	if n := up.requests.Load(); n != 0 {
		t.Fatalf("%d upstream requests before approval", n)
	}
	if r := g.admin(t, "tok-bob", "GET", "/api/v1/holds?status=pending", ""); r.status != 200 || !strings.Contains(r.raw, id) || !strings.Contains(r.raw, `"amount":5`) {
		t.Fatalf("list: %d %s", r.status, r.raw)
	}
	// The agent long-polls while bob approves.
	got := make(chan reply, 1)
	go func() { got <- poll(t, c, id, "10s") }()
	time.Sleep(50 * time.Millisecond)
	ar := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", `{"reason":"ok"}`)
	if _, st := holdOf(t, ar); ar.status != 200 || st != "executed" {
		t.Fatalf("approve: %d %s", ar.status, ar.raw)
	}
	pr := <-got
	if pr.status != 200 || pr.body["status"] != float64(200) || !strings.Contains(pr.raw, `"path":"/refunds"`) {
		t.Fatalf("poll after approval: %d %s, want the upstream's result", pr.status, pr.raw)
	}
	if strings.Contains(pr.raw, testSecret) || strings.Contains(ar.raw, testSecret) {
		t.Fatal("the credential reached the agent or the approver")
	}
	up.mu.Lock()
	key := up.lastKey
	up.mu.Unlock()
	if n := up.requests.Load(); n != 1 || key != testSecret {
		t.Fatalf("upstream saw %d requests with key %q; want 1 with the credential", n, key)
	}
	if r := poll(t, c, id, "0s"); r.status != 200 {
		t.Fatalf("second poll: %d", r.status)
	}
	// The audit log has the hold's story.
	var events []string
	for _, rec := range auditEvents(t, g) {
		if rec.Fields["hold"] == id {
			events = append(events, rec.Event)
			if rec.Event == "hold_approved" && rec.Fields["by"] != "bob" {
				t.Errorf("hold_approved by %v", rec.Fields["by"])
			}
		}
	}
	if want := "hold_created hold_approved hold_executed"; strings.Join(events, " ") != want {
		t.Fatalf("audit events %v, want %s", events, want)
	}
}

func TestHoldWaitingCallCompletes(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", func(c *config.Config) { c.Gateway.HoldWait = config.Duration(10 * time.Second) })
	c := g.client(agentA)
	got := make(chan reply, 1)
	go func() { got <- doCall(t, c, "tickets.create_refund", refund) }()
	var id string
	for deadline := time.Now().Add(5 * time.Second); id == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		r := g.admin(t, "tok-bob", "GET", "/api/v1/holds?status=pending", "")
		if hs, _ := r.body["holds"].([]any); len(hs) == 1 {
			id, _ = hs[0].(map[string]any)["id"].(string)
		}
	}
	if id == "" {
		t.Fatal("no pending hold appeared")
	}
	start := time.Now()
	if r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", ""); r.status != 200 {
		t.Fatalf("approve: %d %s", r.status, r.raw)
	}
	r := <-got
	t.Logf("approve → agent result: %v", time.Since(start))
	if r.status != 200 || !strings.Contains(r.raw, "/refunds") {
		t.Fatalf("the waiting call: %d %s, want 200 with the result", r.status, r.raw)
	}
}

func TestHoldConcurrentDecisions(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	c := g.client(agentA)
	t.Run("50 approvals execute once", func(t *testing.T) {
		id, _ := holdOf(t, doCall(t, c, "tickets.create_refund", `{"body":{"amount":50}}`))
		before := up.requests.Load()
		var ok, conflict atomic.Int32
		var wg sync.WaitGroup
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", "")
				switch {
				case r.status == 200:
					ok.Add(1)
				case r.status == 409 && r.code() == "conflict":
					conflict.Add(1)
				default:
					t.Errorf("approve: %d %s", r.status, r.raw)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 1 || conflict.Load() != 49 || up.requests.Load()-before != 1 {
			t.Fatalf("%d ok, %d conflicts, %d upstream requests; want 1, 49, 1", ok.Load(), conflict.Load(), up.requests.Load()-before)
		}
	})
	t.Run("approve racing deny: one wins", func(t *testing.T) {
		for i := range 10 {
			id, _ := holdOf(t, doCall(t, c, "tickets.create_refund", fmt.Sprintf(`{"body":{"amount":%d}}`, 100+i)))
			before := up.requests.Load()
			res := make(chan int, 2)
			go func() { res <- g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", "").status }()
			go func() { res <- g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/deny", `{"reason":"no"}`).status }()
			a, b := <-res, <-res
			if a+b != 200+409 {
				t.Fatalf("statuses %d and %d, want one 200 and one 409", a, b)
			}
			_, st := holdOf(t, g.admin(t, "tok-bob", "GET", "/api/v1/holds/"+id, ""))
			if n := up.requests.Load() - before; (st == "executed") != (n == 1) || n > 1 {
				t.Fatalf("hold %s with %d upstream requests", st, n)
			}
		}
	})
}

func TestHoldRefusals(t *testing.T) {
	up := newUpstream(t)
	dir := t.TempDir()
	g := startHolds(t, up, "rego: ["+dir+"]", func(c *config.Config) {
		for i, p := range c.Policies {
			if p.Match == "tickets.create_refund" {
				c.Policies[i].HoldTTL = config.Duration(1500 * time.Millisecond)
			}
		}
	})
	c := g.client(agentA)
	t.Run("args tampering", func(t *testing.T) {
		id, _ := holdOf(t, doCall(t, c, "tickets.create_refund", `{"body":{"amount":7}}`))
		if r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", ""); r.status != 200 {
			t.Fatalf("approve: %d %s", r.status, r.raw)
		}
		resend := func(args string) reply {
			req, _ := http.NewRequest("POST", "http://sluice/v1/tools/tickets.create_refund", strings.NewReader(args))
			req.Header.Set("Sluice-Hold", id)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			r := reply{status: resp.StatusCode, raw: string(raw)}
			_ = json.Unmarshal(raw, &r.body)
			return r
		}
		before := up.requests.Load()
		if r := resend(`{"body":{"amount":7000}}`); r.status != 409 || r.code() != "args_mismatch" {
			t.Fatalf("tampered re-send: %d %s, want 409 args_mismatch", r.status, r.raw)
		}
		if r := resend(`{"body":{"amount":7}}`); r.status != 200 {
			t.Fatalf("identical re-send: %d %s, want the stored result", r.status, r.raw)
		}
		if up.requests.Load() != before {
			t.Fatal("a re-send reached the upstream")
		}
	})
	t.Run("self-approval and non-approvers", func(t *testing.T) {
		id, _ := holdOf(t, doCall(t, c, "tickets.create_refund", `{"body":{"amount":8}}`))
		for _, tc := range []struct{ tok, code string }{{"tok-alice", "self_approval_forbidden"}, {"tok-carol", "not_an_approver"}} {
			for _, verb := range []string{"approve", "deny"} {
				if r := g.admin(t, tc.tok, "POST", "/api/v1/holds/"+id+"/"+verb, `{"reason":"x"}`); r.status != 403 || r.code() != tc.code {
					t.Fatalf("%s %s: %d %s, want 403 %s", tc.tok, verb, r.status, r.raw, tc.code)
				}
			}
		}
		if r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/nope/approve", ""); r.status != 404 {
			t.Fatalf("unknown hold: %d", r.status)
		}
		r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/deny", `{"reason":"not today"}`)
		if r.status != 200 {
			t.Fatalf("deny: %d %s", r.status, r.raw)
		}
		if p := poll(t, c, id, "0s"); p.status != 403 || p.code() != "approval_denied" || !strings.Contains(p.message(), "not today") {
			t.Fatalf("poll denied: %d %s", p.status, p.raw)
		}
	})
	t.Run("expiry", func(t *testing.T) {
		id, _ := holdOf(t, doCall(t, c, "tickets.create_refund", `{"body":{"amount":9}}`))
		if p := poll(t, c, id, "5s"); p.status != 403 || p.code() != "approval_expired" {
			t.Fatalf("poll past expiry: %d %s, want 403 approval_expired", p.status, p.raw)
		}
		if r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", ""); r.status != 410 {
			t.Fatalf("approve after expiry: %d %s, want 410", r.status, r.raw)
		}
	})
	t.Run("policy changed to block before approval", func(t *testing.T) {
		id, _ := holdOf(t, doCall(t, c, "tickets.create_refund", `{"body":{"amount":10}}`))
		mod := "package sluice.policies.team\n\nimport rego.v1\n\ndecisions contains {\"action\": \"block\", \"reason\": \"refunds frozen\", \"rule\": \"team.freeze\"} if input.tool == \"tickets.create_refund\"\n"
		if err := os.WriteFile(filepath.Join(dir, "team.rego"), []byte(mod), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := g.Reload(context.Background()); err != nil {
			t.Fatal(err)
		}
		before := up.requests.Load()
		r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", "")
		if _, st := holdOf(t, r); r.status != 200 || st != "failed" {
			t.Fatalf("approve: %d %s, want the hold failed", r.status, r.raw)
		}
		if p := poll(t, c, id, "0s"); p.status != 403 || p.code() != "policy_block" {
			t.Fatalf("poll: %d %s, want 403 policy_block", p.status, p.raw)
		}
		if up.requests.Load() != before {
			t.Fatal("a call blocked on re-evaluation reached the upstream")
		}
	})
}

func TestHoldLimitsAndStoreFailure(t *testing.T) {
	up := newUpstream(t)
	// The webhook points at a port nothing listens on: the hold must not care.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	g := startHolds(t, up, "approvals: { webhook_url: "+dead.URL+" }", func(c *config.Config) { c.Gateway.MaxPendingHolds, c.Gateway.MaxPendingHoldsPerSandbox = 2, 2 })
	c := g.client(agentA)
	for i := range 2 {
		if r := doCall(t, c, "tickets.create_refund", fmt.Sprintf(`{"body":{"amount":%d}}`, i+1)); r.status != 202 {
			t.Fatalf("hold %d: %d %s", i, r.status, r.raw)
		}
	}
	if r := doCall(t, c, "tickets.create_refund", `{"body":{"amount":3}}`); r.status != 429 || r.code() != "rate_limited" {
		t.Fatalf("third pending hold: %d %s, want 429 rate_limited", r.status, r.raw)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(g.logBuf.String(), "webhook not delivered"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the failed webhook was not logged")
		}
	}
	g.store.Close()
	if r := doCall(t, c, "tickets.create_refund", `{"body":{"amount":4}}`); r.status != 503 || r.code() != "approval_unavailable" {
		t.Fatalf("store closed: %d %s, want 503 approval_unavailable", r.status, r.raw)
	}
	if up.requests.Load() != 0 {
		t.Fatal("an ask reached the upstream")
	}
}

func TestAskWithoutApproversIsRefused(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", func(c *config.Config) {
		for i, p := range c.Policies {
			if p.Match == "tickets.create_refund" {
				c.Policies[i].Approvers = nil
			}
		}
	})
	if r := doCall(t, g.client(agentA), "tickets.create_refund", refund); r.status != 503 || r.code() != "approval_unavailable" {
		t.Fatalf("ask naming no approvers: %d %s, want 503 approval_unavailable", r.status, r.raw)
	}
}

func TestReviewUIMounted(t *testing.T) {
	up := newUpstream(t)
	hash, err := bcrypt.GenerateFromPassword([]byte("pw-dana"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	g := startHolds(t, up, "", func(c *config.Config) {
		c.Approvers.Users = append(c.Approvers.Users, config.User{Name: "dana", Groups: []string{"finance"}, PasswordHash: string(hash)})
	})
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Get("http://" + g.AdminAddr() + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Fatalf("GET /login on the admin listener: %d, CSP %q; want the review UI", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}
	// Token users still use the API next to the UI; a cookie-less request
	// is not let in by the UI hook.
	if r := g.admin(t, "tok-bob", "GET", "/api/v1/holds", ""); r.status != 200 {
		t.Fatalf("API with a token: %d %s", r.status, r.raw)
	}
	if r := g.admin(t, "", "GET", "/api/v1/holds", ""); r.status != 401 {
		t.Fatalf("API without credentials: %d %s", r.status, r.raw)
	}
}

// TestAuditAPINeedsAPerson: the audit tail names callers, tools and
// destinations, so the admin listener serves it only to an authenticated
// person.
func TestAuditAPINeedsAPerson(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	if r := doCall(t, g.client(agentA), "tickets.list_tickets", `{}`); r.status != 200 {
		t.Fatalf("control call: %d %s", r.status, r.raw)
	}
	if r := g.admin(t, "", "GET", "/api/v1/audit", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("audit without a token: %d %s, want 401", r.status, r.raw)
	}
	if r := g.admin(t, "tok-wrong", "GET", "/api/v1/audit", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("audit with a wrong token: %d %s, want 401", r.status, r.raw)
	}
	r := g.admin(t, "tok-bob", "GET", "/api/v1/audit?limit=5", "")
	recs, _ := r.body["records"].([]any)
	if r.status != 200 || len(recs) == 0 || len(recs) > 5 {
		t.Fatalf("audit with bob's token: %d, %d records: %s", r.status, len(recs), r.raw)
	}
}

// TestHoldAuditFailure: an ask call whose hold_created record cannot be
// written is refused 503 audit_unavailable (not approval_unavailable: the
// approval service is fine), is not held and sends nothing.
func TestHoldAuditFailure(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	c := g.client(agentA)
	if r := doCall(t, c, "tickets.create_refund", refund); r.status != 202 {
		t.Fatalf("control ask: %d %s", r.status, r.raw)
	}
	if err := os.Remove(g.cfg.Audit.Path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/full", g.cfg.Audit.Path); err != nil {
		t.Fatal(err)
	}
	before := up.requests.Load()
	// Other arguments: the same ones would find the control's pending hold.
	r := doCall(t, c, "tickets.create_refund", `{"body":{"amount":6,"reason":"dup"}}`)
	if r.status != 503 || r.code() != "audit_unavailable" {
		t.Fatalf("ask with a failing audit log: %d %s, want 503 audit_unavailable", r.status, r.raw)
	}
	if up.requests.Load() != before {
		t.Fatal("the upstream was reached")
	}
	hs, err := g.Holds().List(context.Background(), holds.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	pending := 0
	for _, h := range hs {
		if h.Status == holds.Pending {
			pending++
		}
	}
	if pending != 1 {
		t.Fatalf("%d pending holds, want only the control's", pending)
	}
}
