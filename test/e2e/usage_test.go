//go:build linux

package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestUsageWindowRule is issue 23's "the 4th refund today asks": a module
// reads input.usage and asks once the user's refunds today pass three, and
// blocks once their amounts pass 1000. Eight callers at once: exactly three
// are sent and five held. After a restart of the real binary the counters
// are still there: the ninth refund asks, and one that takes the day's
// sum past 1000 is blocked.
func TestUsageWindowRule(t *testing.T) {
	requireHost(t)
	c := casebook.Expect(t, "E12", "8 concurrent refunds against \"the 4th refund today asks\", then a restart",
		"exactly 3 sent (200) and 5 held (202); after a restart the 9th is held and one past 1000 in the day is 403 policy_block, audited with its input.usage")
	e := newEnv(t)
	d := usageConfig(t, e)
	path := e.Write(d)
	g := e.Start(d, path)

	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := g.Call(agentA, "tickets.create_refund", fmt.Sprintf(`{"body":{"amount":10,"reason":"r%d"}}`, i))
			mu.Lock()
			statuses[r.Status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	c.Observef("statuses %v", statuses)
	if statuses[http.StatusOK] != 3 || statuses[http.StatusAccepted] != 5 || len(statuses) != 2 {
		t.Fatalf("8 concurrent refunds: statuses %v; want exactly 3 sent (200) and 5 held (202)", statuses)
	}
	held := 0
	for _, r := range g.AuditEvent("hold_created", "") {
		f := r["fields"].(map[string]any)
		if f["rule"] == "refunds_per_day" {
			held++
			in := f["input"].(map[string]any)
			n := in["usage"].(map[string]any)["user"].(map[string]any)["day"].(map[string]any)["count"].(float64)
			if n < 4 || n > 8 {
				t.Errorf("a held refund's recorded input.usage.user.day.count is %v; want 4..8", n)
			}
		}
	}
	if held == 0 {
		t.Fatal("no hold_created record under rule refunds_per_day")
	}

	// Restart: the counters are in the store, not in the process.
	g.Stop()
	g = e.Start(d, path)
	if r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":10,"reason":"after restart"}}`); r.Status != http.StatusAccepted {
		t.Fatalf("the 9th refund after a restart: %d %s; want 202 held", r.Status, r.Body)
	}
	r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":950,"reason":"big"}}`)
	expect(t, r, http.StatusForbidden, "policy_block")
	rec := g.AwaitAuditFields("decision", map[string]any{"rule": "refund_sum_per_day"})
	in := rec["fields"].(map[string]any)["input"].(map[string]any)
	if sum := in["usage"].(map[string]any)["user"].(map[string]any)["day"].(map[string]any)["sum"].(float64); sum != 1040 {
		t.Fatalf("the blocked refund's input.usage.user.day.sum is %v; want 1040 (8×10 + 10 + 950)", sum)
	}
	c.Observef("statuses %v; after restart 202, then 403 policy_block with input.usage.user.day.sum 1040", statuses)
	// A tool that is not counted has no input.usage and is decided as before.
	if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
		t.Fatalf("an uncounted tool: %d %s", r.Status, r.Body)
	}
}

// usageConfig is "the 4th refund today asks": a module reading
// input.usage asks once the user's refunds today pass three and blocks
// once their amounts pass 1000.
func usageConfig(t *testing.T, e *gwenv.Env) gwenv.Doc {
	d := e.BaseConfig("usage")
	d["policies"] = []map[string]any{
		{"match": "tickets.list_tickets", "action": "allow"},
		{"match": "tickets.create_refund", "action": "allow"},
		{"match": "*", "action": "block"},
	}
	d["usage"] = map[string]any{"sum": map[string]string{"tickets.create_refund": "amount"}}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "refunds.rego"), `package sluice.policies.refunds

decisions contains {"action": "ask", "reason": "more than 3 refunds today", "rule": "refunds_per_day", "approvers": ["group:finance"]} if {
	input.tool == "tickets.create_refund"
	input.usage.user.day.count > 3
}

decisions contains {"action": "block", "reason": "over 1000 refunded today", "rule": "refund_sum_per_day"} if {
	input.tool == "tickets.create_refund"
	input.usage.user.day.sum > 1000
}
`)
	d["rego"] = []string{dir}
	return d
}
