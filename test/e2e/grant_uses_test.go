//go:build linux

package e2e

import (
	"net/http"
	"sync"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestGrantMaxUses is THREATS E11: an "always allow" grant with
// max_uses 2, raced by eight identical calls through the real binary,
// lets exactly two through (two grant_used records); the other six ask
// again, and the grant is listed used up.
func TestGrantMaxUses(t *testing.T) {
	requireHost(t)
	c := casebook.Expect(t, "E11", "a grant with max_uses 2 raced by 8 identical calls",
		"exactly 2 sent under the grant (2 grant_used), 6 held again (202); the grant shows uses 2 of 2 and is not active")
	e := newEnv(t)
	d := e.BaseConfig("grantuses")
	path := e.Write(d)
	g := e.Start(d, path)
	const args = `{"body":{"amount":7,"reason":"recurring"}}`
	r := g.Call(agentA, "tickets.create_refund", args)
	if r.Status != http.StatusAccepted || r.HoldID == "" {
		t.Fatalf("first refund: %d %s; want 202 held", r.Status, r.Body)
	}
	if st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/approve", gwenv.CarolToken, `{"reason":"ok","always":true,"max_uses":0.5}`); st != http.StatusBadRequest {
		t.Fatalf("a fractional max_uses: %d %s; want 400", st, code)
	}
	st, code, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/approve", gwenv.CarolToken, `{"reason":"ok","always":true,"max_uses":2}`)
	if st != http.StatusOK {
		t.Fatalf("approve always max_uses 2: %d %s %v", st, code, body)
	}
	grant := body["grant"].(map[string]any)
	if grant["max_uses"] != 2.0 || grant["uses_left"] != 2.0 {
		t.Fatalf("grant %v: want max_uses 2, uses_left 2", grant)
	}
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := g.Call(agentA, "tickets.create_refund", args)
			mu.Lock()
			statuses[r.Status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	used := 0
	for _, rec := range g.AuditEvent("grant_used", "") {
		if rec["fields"].(map[string]any)["grant"] == grant["id"] {
			used++
		}
	}
	c.Observef("statuses %v, %d grant_used records", statuses, used)
	if statuses[http.StatusOK] != 2 || statuses[http.StatusAccepted] != 6 || used != 2 {
		t.Fatalf("8 racing calls under a max_uses 2 grant: statuses %v, %d grant_used; want 2 sent, 6 held, 2 grant_used", statuses, used)
	}
	st, _, list := g.AdminDo(http.MethodGet, "/api/v1/grants?status=all", gwenv.CarolToken, "")
	if st != http.StatusOK {
		t.Fatalf("list grants: %d", st)
	}
	for _, x := range list["grants"].([]any) {
		if gr := x.(map[string]any); gr["id"] == grant["id"] && (gr["uses"] != 2.0 || gr["uses_left"] != 0.0) {
			t.Fatalf("listed grant %v: want uses 2, uses_left 0", gr)
		}
	}
	if _, _, active := g.AdminDo(http.MethodGet, "/api/v1/grants", gwenv.CarolToken, ""); len(active["grants"].([]any)) != 0 {
		t.Fatalf("a used-up grant is listed active: %v", active)
	}
}
