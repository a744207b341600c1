//go:build linux

package attack

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestGatewayHoldsPerSandbox is THREATS B9 through the real binary. With
// max_pending_holds 8 and max_pending_holds_per_sandbox 2, one sandbox's
// flood of asks gets 2 holds and then 429 too_many_holds (audited as the
// call's decision), while another sandbox of the same agent and user is
// still held. And an ask identical to one from another sandbox gets a hold
// of its own: holds are deduplicated only within one sandbox, never
// answered with another sandbox's hold id and request id.
func TestGatewayHoldsPerSandbox(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	d := e.BaseConfig("holdcap")
	d.Gateway()["max_pending_holds"] = 8
	d.Gateway()["max_pending_holds_per_sandbox"] = 2
	g := e.Start(d, e.Write(d))
	other := agentA
	other.Sandbox = "sb-other"

	t.Run("flood", func(t *testing.T) {
		c := casebook.Expect(t, "B9", "one sandbox sends 6 different ask calls; max_pending_holds 8, max_pending_holds_per_sandbox 2",
			"the first 2 held (202 pending), the other 4 429 too_many_holds, each audited as a decision with that code; another sandbox of the same agent and user is still held (202)")
		var held, capped int
		for i := range 6 {
			r := g.Call(agentA, "tickets.create_refund", fmt.Sprintf(`{"body":{"amount":%d}}`, 100+i))
			switch {
			case r.Status == http.StatusAccepted && r.HoldState == "pending":
				held++
			case r.Status == http.StatusTooManyRequests && r.Code == "too_many_holds":
				capped++
				g.AwaitAuditFields("decision", map[string]any{"code": "too_many_holds", "sandbox": agentA.Sandbox})
				g.AwaitLog("too_many_holds", func(l map[string]any) bool { return l["request_id"] == r.RequestID && l["reason"] == "too_many_holds" })
			default:
				t.Errorf("ask %d: %d %s %s", i, r.Status, r.Code, r.Message)
			}
		}
		o := g.Call(other, "tickets.create_refund", `{"body":{"amount":200}}`)
		c.Observef("%d held, %d too_many_holds; another sandbox: %d %s", held, capped, o.Status, o.HoldState)
		if held != 2 || capped != 4 {
			t.Errorf("%d held, %d capped; want 2 and 4", held, capped)
		}
		if o.Status != http.StatusAccepted || o.HoldState != "pending" {
			t.Errorf("another sandbox of agent-a: %d %s, want 202 pending", o.Status, o.Body)
		}
		if n := len(e.Up.Requests()); n != 0 {
			t.Errorf("%d upstream requests; held and capped calls send nothing", n)
		}
	})

	t.Run("identical ask from another sandbox", func(t *testing.T) {
		c := casebook.Expect(t, "B9", "two sandboxes of one agent, session and user send the identical ask; the first sends it twice",
			"the first sandbox's re-send gets its own hold back; the second sandbox gets a hold of its own (other hold id and request id), each audited hold_created with its sandbox")
		args := `{"body":{"amount":777}}`
		one := gwenv.AgentA
		one.Sandbox, one.Session = "sb-dedupe-1", "s-shared"
		two := one
		two.Sandbox = "sb-dedupe-2"
		a := g.Call(one, "tickets.create_refund", args)
		again := g.Call(one, "tickets.create_refund", args)
		b := g.Call(two, "tickets.create_refund", args)
		c.Observef("sandbox 1: hold %s request %s, re-sent: hold %s; sandbox 2: %d hold %s request %s",
			a.HoldID, a.RequestID, again.HoldID, b.Status, b.HoldID, b.RequestID)
		for _, r := range []gwenv.Reply{a, again, b} {
			if r.Status != http.StatusAccepted || r.HoldID == "" {
				t.Fatalf("ask: %d %s, want 202 with a hold", r.Status, r.Body)
			}
		}
		if again.HoldID != a.HoldID {
			t.Errorf("the same sandbox's re-send got hold %s, want its own %s", again.HoldID, a.HoldID)
		}
		if b.HoldID == a.HoldID || b.RequestID == a.RequestID {
			t.Errorf("the second sandbox got hold %s request %s: the first sandbox's (%s, %s)", b.HoldID, b.RequestID, a.HoldID, a.RequestID)
		}
		g.AwaitAuditFields("hold_created", map[string]any{"hold": a.HoldID, "sandbox": one.Sandbox})
		g.AwaitAuditFields("hold_created", map[string]any{"hold": b.HoldID, "sandbox": two.Sandbox})
		// Each sandbox sees only its own hold.
		if p := g.Do(two, http.MethodGet, "/v1/holds/"+a.HoldID, "", nil); p.Status != http.StatusNotFound {
			t.Errorf("sandbox 2 polling sandbox 1's hold: %d, want 404", p.Status)
		}
	})
}
