package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
)

// recsOf returns the audit records of event whose field key is val.
func recsOf(recs []audit.Record, event, key, val string) []audit.Record {
	var out []audit.Record
	for _, r := range recs {
		if r.Event == event && r.Fields[key] == val {
			out = append(out, r)
		}
	}
	return out
}

// TestGrantAlwaysAllow is THREATS E7 through the gateway: an "always
// allow" grant lets exactly the approved call through for the same agent
// and user, and nothing else.
func TestGrantAlwaysAllow(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", func(c *config.Config) {
		c.Agents = append(c.Agents, config.Agent{Name: "agent-c", Connectors: []string{"tickets"}})
	})
	c := g.client(agentA)
	first := doCall(t, c, "tickets.create_refund", refund)
	hold, _ := holdOf(t, first)
	if first.status != 202 {
		t.Fatalf("ask: %d %s", first.status, first.raw)
	}

	refused := []struct {
		name, token, path, body string
		status                  int
		code                    string
	}{
		{"the requester cannot grant (E1)", "tok-alice", "/approve", `{"always":true}`, 403, "self_approval_forbidden"},
		{"not an approver", "tok-carol", "/approve", `{"always":true}`, 403, "not_an_approver"},
		{"ttl over 24h", "tok-bob", "/approve", `{"always":true,"ttl":"25h"}`, 400, "bad_request"},
		{"ttl not a duration", "tok-bob", "/approve", `{"always":true,"ttl":"forever"}`, 400, "bad_request"},
		{"ttl without always", "tok-bob", "/approve", `{"ttl":"1h"}`, 400, "bad_request"},
		{"always on deny", "tok-bob", "/deny", `{"always":true,"reason":"no"}`, 400, "bad_request"},
		{"no token", "", "/approve", `{"always":true}`, 401, "unauthenticated"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			r := g.admin(t, tc.token, "POST", "/api/v1/holds/"+hold+tc.path, tc.body)
			if r.status != tc.status || r.code() != tc.code {
				t.Fatalf("%d %s, want %d %s", r.status, r.raw, tc.status, tc.code)
			}
			if l := g.admin(t, "tok-bob", "GET", "/api/v1/grants?status=all", ""); l.status != 200 || strings.Contains(l.raw, hold) {
				t.Fatalf("grants after a refused approval: %d %s", l.status, l.raw)
			}
		})
	}

	ar := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+hold+"/approve", `{"reason":"weekly","always":true,"ttl":"1h"}`)
	gr, _ := ar.body["grant"].(map[string]any)
	grant, _ := gr["id"].(string)
	if _, st := holdOf(t, ar); ar.status != 200 || st != "executed" || grant == "" || gr["user"] != "alice" || gr["agent"] != "agent-a" ||
		gr["tool"] != "tickets.create_refund" || gr["granted_by"] != "bob" || gr["hold"] != hold {
		t.Fatalf("approve always: %d %s", ar.status, ar.raw)
	}
	if n := up.requests.Load(); n != 1 {
		t.Fatalf("upstream saw %d requests after approval, want 1", n)
	}
	if recs := recsOf(auditEvents(t, g), "hold_approved", "hold", hold); len(recs) != 1 || recs[0].Fields["grant"] != grant || recs[0].Fields["always"] != true {
		t.Fatalf("hold_approved records %+v", recs)
	}

	other := agentA
	other.User = "dave"
	otherAgent := agentA
	otherAgent.Agent = "agent-c"
	calls := []struct {
		name    string
		id      func() *http.Client
		args    string
		status  int
		granted bool
	}{
		{"identical call is sent without a hold", func() *http.Client { return c }, refund, 200, true},
		{"identical call again", func() *http.Client { return c }, refund, 200, true},
		{"other amount asks again (E7)", func() *http.Client { return c }, `{"body":{"amount":5000,"reason":"dup"}}`, 202, false},
		{"other reason asks again (E7)", func() *http.Client { return c }, `{"body":{"amount":5,"reason":"dupe"}}`, 202, false},
		{"other user asks again", func() *http.Client { return g.client(other) }, refund, 202, false},
		{"other agent asks again", func() *http.Client { return g.client(otherAgent) }, refund, 202, false},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			before := up.requests.Load()
			r := doCall(t, tc.id(), "tickets.create_refund", tc.args)
			rid, _ := r.body["request_id"].(string)
			if r.status != tc.status {
				t.Fatalf("%d %s, want %d", r.status, r.raw, tc.status)
			}
			recs := auditEvents(t, g)
			used := recsOf(recs, "grant_used", "grant", grant)
			var mine []audit.Record
			for _, u := range used {
				if u.RequestID == rid {
					mine = append(mine, u)
				}
			}
			if !tc.granted {
				if id, st := holdOf(t, r); id == hold || st != "pending" || up.requests.Load() != before || len(mine) != 0 {
					t.Fatalf("hold %s %s (first %s), upstream %d→%d, grant_used %d", id, st, hold, before, up.requests.Load(), len(mine))
				}
				if len(recsOf(recs, "hold_created", "hold", mustHold(t, r))) != 1 {
					t.Fatal("no hold_created record for the new hold")
				}
				return
			}
			if up.requests.Load() != before+1 || r.body["status"] != float64(200) || strings.Contains(r.raw, testSecret) {
				t.Fatalf("upstream %d→%d, reply %s", before, up.requests.Load(), r.raw)
			}
			if len(mine) != 1 || mine[0].Fields["hold"] != hold || mine[0].Fields["granted_by"] != "bob" || mine[0].Fields["user"] != "alice" {
				t.Fatalf("grant_used records for %s: %+v", rid, mine)
			}
			var decision *audit.Record
			for i, rec := range recs {
				if rec.RequestID == rid && rec.Event == "decision" {
					decision = &recs[i]
				}
			}
			if decision == nil || decision.Fields["decision"] != "allow" || decision.Fields["rule"] != "grant:"+grant ||
				!strings.Contains(decision.Fields["reason"].(string), "bob") {
				t.Fatalf("decision record %+v", decision)
			}
		})
	}

	t.Run("a re-send naming the hold gets its answer, not a second execution", func(t *testing.T) {
		before := up.requests.Load()
		req, _ := http.NewRequest("POST", "http://sluice/v1/tools/tickets.create_refund", strings.NewReader(refund))
		req.Header.Set("Sluice-Hold", hold)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || up.requests.Load() != before {
			t.Fatalf("re-send: %d %s, upstream %d→%d", resp.StatusCode, raw, before, up.requests.Load())
		}
	})
	t.Run("list", func(t *testing.T) {
		l := g.admin(t, "tok-carol", "GET", "/api/v1/grants", "")
		var body struct {
			Grants []map[string]any `json:"grants"`
		}
		if err := json.Unmarshal([]byte(l.raw), &body); l.status != 200 || err != nil || len(body.Grants) != 1 || body.Grants[0]["id"] != grant {
			t.Fatalf("list: %d %s", l.status, l.raw)
		}
		if l := g.admin(t, "", "GET", "/api/v1/grants", ""); l.status != 401 {
			t.Fatalf("unauthenticated list: %d", l.status)
		}
	})
	t.Run("revoke", func(t *testing.T) {
		if r := g.admin(t, "", "DELETE", "/api/v1/grants/"+grant, ""); r.status != 401 {
			t.Fatalf("unauthenticated revoke: %d %s", r.status, r.raw)
		}
		if r := g.admin(t, "tok-carol", "DELETE", "/api/v1/grants/"+grant, ""); r.status != 200 {
			t.Fatalf("revoke: %d %s", r.status, r.raw)
		}
		if r := g.admin(t, "tok-carol", "DELETE", "/api/v1/grants/"+grant, ""); r.status != 409 || r.code() != "conflict" {
			t.Fatalf("second revoke: %d %s", r.status, r.raw)
		}
		if r := g.admin(t, "tok-carol", "DELETE", "/api/v1/grants/nope", ""); r.status != 404 || r.code() != "not_found" {
			t.Fatalf("revoke unknown: %d %s", r.status, r.raw)
		}
		recs := recsOf(auditEvents(t, g), "grant_revoked", "grant", grant)
		if len(recs) != 1 || recs[0].Fields["by"] != "carol" {
			t.Fatalf("grant_revoked records %+v", recs)
		}
		before := up.requests.Load()
		r := doCall(t, c, "tickets.create_refund", refund)
		if id, st := holdOf(t, r); r.status != 202 || st != "pending" || id == hold || up.requests.Load() != before {
			t.Fatalf("after revoke: %d %s", r.status, r.raw)
		}
	})
}

func mustHold(t *testing.T, r reply) string {
	t.Helper()
	id, _ := holdOf(t, r)
	return id
}

// TestGrantNeverOverridesBlock: a grant turns only ask into allow. Once a
// Rego module blocks the tool, the granted call is 403 policy_block, the
// grant is not used and nothing is sent.
func TestGrantNeverOverridesBlock(t *testing.T) {
	up := newUpstream(t)
	dir := t.TempDir()
	mod := filepath.Join(dir, "team.rego")
	module := "package sluice.policies.team\n\nimport rego.v1\n\ndecisions contains {\"action\": \"block\", \"reason\": \"frozen\", \"rule\": \"team.freeze\"} if input.tool == \"TOOL\"\n"
	if err := os.WriteFile(mod, []byte(strings.Replace(module, "TOOL", "tickets.none", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startHolds(t, up, "rego: ["+dir+"]", nil)
	c := g.client(agentA)
	hold := mustHold(t, doCall(t, c, "tickets.create_refund", refund))
	if r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+hold+"/approve", `{"always":true}`); r.status != 200 {
		t.Fatalf("approve always: %d %s", r.status, r.raw)
	}
	if r := doCall(t, c, "tickets.create_refund", refund); r.status != 200 {
		t.Fatalf("granted call: %d %s", r.status, r.raw)
	}
	if err := os.WriteFile(mod, []byte(strings.Replace(module, "TOOL", "tickets.create_refund", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "tickets.create_refund", refund, 403)
	before := up.requests.Load()
	r := doCall(t, c, "tickets.create_refund", refund)
	rid, _ := r.body["error"].(map[string]any)["request_id"].(string)
	if r.status != 403 || r.code() != "policy_block" || up.requests.Load() != before {
		t.Fatalf("blocked granted call: %d %s, upstream %d→%d", r.status, r.raw, before, up.requests.Load())
	}
	if ev := eventsFor(auditEvents(t, g), rid); strings.Join(ev, " ") != "decision" {
		t.Fatalf("audit events of the blocked call %v, want only its decision", ev)
	}
}
