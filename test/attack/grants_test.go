//go:build linux

package attack

import (
	"net/http"
	"testing"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// fieldsOf returns an audit record's fields.
func fieldsOf(r map[string]any) map[string]any {
	f, _ := r["fields"].(map[string]any)
	return f
}

// auditFor returns the records of event with request id rid.
func auditFor(g *gwenv.Gateway, event, rid string) []map[string]any {
	var out []map[string]any
	for _, r := range g.AuditRecords() {
		if r["event"] == event && r["request_id"] == rid {
			out = append(out, r)
		}
	}
	return out
}

// TestGatewayGrants is THREATS E7 through the real binary: carol approves
// alice's refund of 42 with "always allow this exact call"; the identical
// call is then sent without a hold (audited grant_used, decision allow
// with rule grant:ID), also after a restart, while the same tool with any
// other argument, another user or another agent asks again; after carol
// revokes the grant the identical call is held again.
func TestGatewayGrants(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	d := e.BaseConfig("grants")
	d["agents"] = []map[string]any{
		{"name": "agent-a", "connectors": []string{"tickets"}},
		{"name": "agent-d", "connectors": []string{"tickets"}},
	}
	path := e.Write(d)
	g := e.Start(d, path)
	const args = `{"body":{"amount":42}}`
	refunds := func() int {
		n := 0
		for _, r := range e.Up.Requests() {
			if r.Path == "/refunds" {
				n++
			}
		}
		return n
	}
	pending := func(g *gwenv.Gateway) int {
		_, _, body := g.AdminDo(http.MethodGet, "/api/v1/holds?status=pending", gwenv.CarolToken, "")
		hs, _ := body["holds"].([]any)
		return len(hs)
	}

	first := g.Call(agentA, "tickets.create_refund", args)
	if first.Status != http.StatusAccepted {
		t.Fatalf("ask: %d %s", first.Status, first.Body)
	}
	var grant string
	t.Run("E7 the requester cannot grant", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "E7", "alice (the requester, in finance) approves her own refund with always: true",
			"403 self_approval_forbidden, no grant, the hold stays pending, nothing upstream")
		st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+first.HoldID+"/approve", gwenv.AliceToken, `{"always":true}`)
		_, _, list := g.AdminDo(http.MethodGet, "/api/v1/grants?status=all", gwenv.CarolToken, "")
		gs, _ := list["grants"].([]any)
		c.Observef("%d %s, grants %d, refunds upstream %d", st, code, len(gs), refunds())
		if st != http.StatusForbidden || code != "self_approval_forbidden" || len(gs) != 0 || refunds() != 0 {
			t.Errorf("%d %s, grants %v, refunds %d", st, code, list, refunds())
		}
	})
	t.Run("E7 approve with always", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "E7", "carol approves the refund of 42 with always: true, ttl 1h",
			"200 executed once, a grant for agent-a, alice, tickets.create_refund and the hold's request hash; hold_approved audits the grant")
		st, _, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+first.HoldID+"/approve", gwenv.CarolToken, `{"reason":"monthly","always":true,"ttl":"1h"}`)
		hold, _ := body["hold"].(map[string]any)
		gr, _ := body["grant"].(map[string]any)
		grant, _ = gr["id"].(string)
		rec := g.AwaitAudit("hold_approved", first.HoldID)
		c.Observef("%d %v, grant %v for %v/%v/%v sha %v; hold_approved grant %v; refunds upstream %d", st, hold["status"], grant,
			gr["agent"], gr["user"], gr["tool"], gr["sha256"] == hold["sha256"], fieldsOf(rec)["grant"], refunds())
		if st != http.StatusOK || hold["status"] != "executed" || grant == "" || gr["agent"] != "agent-a" || gr["user"] != "alice" ||
			gr["tool"] != "tickets.create_refund" || gr["sha256"] != hold["sha256"] || fieldsOf(rec)["grant"] != grant || refunds() != 1 {
			t.Fatalf("approve: %d %v; hold_approved %v; refunds %d", st, body, rec, refunds())
		}
	})
	if grant == "" {
		t.Fatal("no grant")
	}

	// sent asserts a call the grant covers: 200 from the upstream, no
	// hold, grant_used and a decision record naming the grant.
	sent := func(t *testing.T, g *gwenv.Gateway, c *casebook.Case) {
		before, holds := refunds(), pending(g)
		r := g.Call(agentA, "tickets.create_refund", args)
		used := auditFor(g, "grant_used", r.RequestID)
		dec := auditFor(g, "decision", r.RequestID)
		rule := ""
		if len(dec) == 1 {
			rule, _ = fieldsOf(dec[0])["rule"].(string)
		}
		c.Observef("%d, hold %q, pending holds %d→%d, refunds upstream +%d, grant_used %d, decision rule %q",
			r.Status, r.HoldID, holds, pending(g), refunds()-before, len(used), rule)
		if r.Status != http.StatusOK || r.HoldID != "" || pending(g) != holds || refunds()-before != 1 {
			t.Errorf("identical call: %d %s; pending %d→%d; refunds +%d", r.Status, r.Body, holds, pending(g), refunds()-before)
		}
		if len(used) != 1 || fieldsOf(used[0])["grant"] != grant || fieldsOf(used[0])["hold"] != first.HoldID || fieldsOf(used[0])["granted_by"] != "carol" {
			t.Errorf("grant_used records %v", used)
		}
		if len(dec) != 1 || fieldsOf(dec[0])["decision"] != "allow" || rule != "grant:"+grant {
			t.Errorf("decision records %v", dec)
		}
	}
	// held asserts a call the grant does not cover: a new pending hold
	// (hold_created audited), nothing upstream, no grant_used.
	held := func(t *testing.T, g *gwenv.Gateway, c *casebook.Case, id string, r gwenv.Reply, before int) {
		created := auditFor(g, "hold_created", r.RequestID)
		used := auditFor(g, "grant_used", r.RequestID)
		c.Observef("%d %s, new hold %v, hold_created %d, grant_used %d, refunds upstream +%d",
			r.Status, r.HoldState, r.HoldID != "" && r.HoldID != first.HoldID, len(created), len(used), refunds()-before)
		if r.Status != http.StatusAccepted || r.HoldState != "pending" || r.HoldID == "" || r.HoldID == first.HoldID ||
			len(created) != 1 || fieldsOf(created[0])["hold"] != r.HoldID || len(used) != 0 || refunds() != before {
			t.Errorf("%s: %d %s; hold_created %v; grant_used %v; refunds %d→%d", id, r.Status, r.Body, created, used, before, refunds())
		}
	}

	t.Run("E7 the identical call", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "E7", "alice's agent repeats the granted refund of 42 byte for byte",
			"200 from the upstream, no hold; audit grant_used with the grant id and a decision allow with rule grant:ID")
		sent(t, g, c)
	})
	others := agentA
	others.User = "dave"
	otherAgent := agentA
	otherAgent.Agent, otherAgent.Sandbox = "agent-d", "sb-4"
	for _, tc := range []struct {
		name, args string
		as         wire.Identity
	}{
		{"amount 4200 instead of 42", `{"body":{"amount":4200}}`, agentA},
		{"amount 42 and a reason", `{"body":{"amount":42,"reason":"again"}}`, agentA},
		{"another user (dave) through agent-a", args, others},
		{"another agent (agent-d) for alice", args, otherAgent},
	} {
		t.Run("E7 "+tc.name, func(t *testing.T) {
			g := g.For(t)
			c := casebook.Expect(t, "E7", "the granted refund tool called with "+tc.name,
				"202: a new pending hold (hold_created audited), nothing upstream, the grant not used")
			before := refunds()
			held(t, g, c, tc.name, g.Call(tc.as, "tickets.create_refund", tc.args), before)
		})
	}
	t.Run("E7 the grant survives a restart", func(t *testing.T) {
		g.Stop()
		g = e.Start(d, path)
		g := g.For(t)
		c := casebook.Expect(t, "E7", "the gateway restarts; alice's agent repeats the granted refund",
			"200 from the upstream, no hold (grants are in the store); grant_used audited")
		sent(t, g, c)
	})
	t.Run("E7 after revocation", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "E7", "carol revokes the grant (DELETE /api/v1/grants/ID); alice's agent repeats the refund",
			"revoke 200 audited grant_revoked; the identical call 202 held again, nothing upstream")
		st, _, _ := g.AdminDo(http.MethodDelete, "/api/v1/grants/"+grant, gwenv.CarolToken, "")
		rev := g.AuditEvent("grant_revoked", grant)
		before := refunds()
		r := g.Call(agentA, "tickets.create_refund", args)
		if st != http.StatusOK || len(rev) != 1 || fieldsOf(rev[0])["by"] != "carol" {
			t.Errorf("revoke %d; grant_revoked %v", st, rev)
		}
		held(t, g, c, "after revocation", r, before)
		c.Observef("revoke %d, grant_revoked %d; then %d %s, refunds upstream +%d", st, len(rev), r.Status, r.HoldState, refunds()-before)
	})
}
