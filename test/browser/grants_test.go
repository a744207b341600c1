package browser

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestGrantsPage: an "always allow" grant with at most 2 calls, made from
// the approve form in Chromium, is on the Grants page with its uses, what
// is left and its window; a use shows at once; a revoke without the
// page's CSRF token is refused and the grant stands; the Revoke button
// revokes it (audited grant_revoked), the page lists it as revoked by
// its revoker, and the same call is held again and reaches nothing.
func TestGrantsPage(t *testing.T) {
	r := newRig(t)
	alice := r.signIn("alice", "alice-pw")
	const args = `{"body":{"amount":7,"reason":"weekly"}}`
	answer, cancel := r.ask(args)
	defer cancel()
	alice.do(chromedp.WaitVisible(chromedp.CSS("#queue li.hold-item.actionable")),
		chromedp.Click(chromedp.CSS("#queue li.hold-item a")), chromedp.WaitVisible(chromedp.CSS("#approve")),
		chromedp.Click(chromedp.CSS("#approve-always")), chromedp.SetValue(chromedp.CSS("#approve-ttl"), "1h"),
		chromedp.SetValue(chromedp.CSS("#approve-uses"), "2"), chromedp.Click(chromedp.CSS("#approve")))
	select {
	case res := <-answer:
		if res.err != nil || res.status != 200 {
			t.Fatalf("the approved call: %d %q %v", res.status, res.body, res.err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the approved call did not complete")
	}
	// The approve POST lands back on the hold's page, decided (no form).
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if ok, err := chromedp.Run(alice.ctx, chromedp.Evaluate[bool](`document.readyState == "complete" && !document.querySelector("#approve")`)); err == nil && ok {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the hold's page still offers approving after the approval")
		}
	}
	gs, err := r.gw.Holds().Grants(context.Background(), false, 10)
	if err != nil || len(gs) != 1 || gs[0].MaxUses != 2 {
		t.Fatalf("grants after approving: %+v %v; want one with max_uses 2", gs, err)
	}
	g := gs[0]
	item := "#grant-" + g.ID
	text := func() string {
		return eval[string](alice, `document.querySelector("`+item+`") ? document.querySelector("`+item+`").innerText : ""`)
	}
	alice.do(chromedp.Navigate(r.base+"/grants"), chromedp.WaitVisible(chromedp.CSS(item)))
	if s := text(); !strings.Contains(s, "payments.create_refund") || !strings.Contains(s, "uses 0 of 2") || !strings.Contains(s, "left 2") ||
		!strings.Contains(s, "granted by alice") || !strings.Contains(s, "active") || !strings.Contains(s, "(in 59m") && !strings.Contains(s, "(in 1h") {
		t.Fatalf("the new grant on the page:\n%s", s)
	}
	if n := eval[int](alice, `document.querySelectorAll("nav a[href='/grants'][aria-current=page]").length`); n != 1 {
		t.Errorf("the nav does not mark the Grants page as current (%d)", n)
	}

	// One use: the page says so.
	ctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if st, body, err := r.call(ctx, "payments.create_refund", args); err != nil || st != 200 {
		t.Fatalf("the same call under the grant: %d %q %v", st, body, err)
	}
	alice.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(item)))
	if s := text(); !strings.Contains(s, "uses 1 of 2") || !strings.Contains(s, "left 1") {
		t.Fatalf("after one use:\n%s", s)
	}
	alice.shot("grants-active")

	// A revoke without the page's token: refused, the grant stands.
	if st := postFrom(alice, "/grants/"+g.ID+"/revoke", map[string]string{}); st != 403 {
		t.Fatalf("revoke without the CSRF token: %d, want 403", st)
	}
	if cur, err := r.gw.Holds().Grant(context.Background(), g.ID); err != nil || !cur.Revoked.IsZero() {
		t.Fatalf("the grant after a forged revoke: %+v %v; want it standing", cur, err)
	}

	// Revoke from the page.
	alice.do(chromedp.Click(chromedp.CSS("#revoke-"+g.ID)), chromedp.WaitVisible(chromedp.CSS("#grants-message")))
	if msg := eval[string](alice, `document.querySelector("#grants-message").innerText`); !strings.Contains(msg, "Revoked the grant for payments.create_refund") {
		t.Fatalf("message after revoking: %q", msg)
	}
	if n := eval[int](alice, `document.querySelectorAll("`+item+`").length`); n != 0 {
		t.Fatal("a revoked grant is still listed among the active ones")
	}
	alice.do(chromedp.Click(chromedp.CSS("#grants-all")), chromedp.WaitVisible(chromedp.CSS(item)))
	if s := text(); !strings.Contains(s, "revoked") || !strings.Contains(s, "by alice") || strings.Contains(s, "Revoke\n") ||
		eval[int](alice, `document.querySelectorAll("#revoke-`+g.ID+`").length`) != 0 {
		t.Fatalf("the revoked grant on the page (all):\n%s", s)
	}
	alice.shot("grants-revoked")

	// The same call is held again: nothing sent under the revoked grant.
	r.mu.Lock()
	before := len(r.hits)
	r.mu.Unlock()
	again, acancel := r.ask(args)
	defer acancel()
	held := r.pending(1)
	select {
	case res := <-again:
		t.Fatalf("the call after the revoke was answered without approval: %d %q", res.status, res.body)
	default:
	}
	r.mu.Lock()
	after := len(r.hits)
	r.mu.Unlock()
	if after != before || held[0].Tool != "payments.create_refund" {
		t.Fatalf("after the revoke: upstream requests %d → %d, held %+v; want none sent and the call held", before, after, held[0])
	}
	recs, err := tailAudit(r.cfg.Audit.Path, 1000)
	if err != nil {
		t.Fatal(err)
	}
	revoked := 0
	for _, raw := range recs {
		var rec struct {
			Event  string         `json:"event"`
			Fields map[string]any `json:"fields"`
		}
		if json.Unmarshal(raw, &rec) == nil && rec.Event == "grant_revoked" && rec.Fields["grant"] == g.ID && rec.Fields["by"] == "alice" {
			revoked++
		}
	}
	if revoked != 1 {
		t.Fatalf("grant_revoked records for %s by alice: %d, want 1", g.ID, revoked)
	}
}
