//go:build linux

package fault

import (
	"fmt"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestCallerHangsUpAtUpstream is THREATS G10 through the real binary: 20
// sandbox connections each send an allowed tool call and hang up while it
// is at the upstream (which holds it). Every call that was sent still gets
// its result record, and the chain verifies. Before the audit writes were
// detached from the caller's context, 20 of 20 had a decision record and no
// result (`audit_unavailable: context canceled` in the log).
func TestCallerHangsUpAtUpstream(t *testing.T) {
	e := newEnv(t)
	d := e.BaseConfig("hangup")
	path := e.Write(d)
	g := e.Start(d, path)
	c := casebook.Expect(t, "G10", "20 sandbox connections each send an allowed tool call and hang up while the upstream holds it",
		"every call has its decision and its result record (code upstream_error), none is lost to the cancelled request; `sluice audit verify` passes")
	e.Up.SetMode(gwenv.ModeHang)
	const n = 20
	body := `{}`
	req := fmt.Sprintf("POST /v1/tools/tickets.list_tickets HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	for i := range n {
		conn, err := g.Dial(agentA)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		e.Up.AwaitRequest(t, 30*time.Second) // call i is at the upstream
		if got := len(e.Up.Requests()); got != i+1 {
			t.Fatalf("%d upstream requests after call %d", got, i+1)
		}
		conn.Close() // the caller hangs up
	}
	// Each result is written when the gateway notices the hang-up and
	// cancels the upstream request.
	deadline := time.Now().Add(30 * time.Second)
	var decisions, results map[string]map[string]any
	for {
		decisions, results = map[string]map[string]any{}, map[string]map[string]any{}
		for _, r := range g.AuditRecords() {
			f, _ := r["fields"].(map[string]any)
			if f["tool"] != "tickets.list_tickets" {
				continue
			}
			rid, _ := r["request_id"].(string)
			switch r["event"] {
			case "decision":
				decisions[rid] = f
			case "result":
				results[rid] = f
			}
		}
		if len(results) >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	lost := 0
	for rid := range decisions {
		if _, ok := results[rid]; !ok {
			lost++
		}
	}
	codes := map[any]int{}
	for _, f := range results {
		codes[f["code"]]++
	}
	out, verr := exec.Command(e.Bin, "audit", "verify", "--file", g.Audit).CombinedOutput()
	c.Observef("%d upstream requests, %d decision records, %d result records (codes %v), %d decisions without a result; verify err=%v",
		len(e.Up.Requests()), len(decisions), len(results), codes, lost, verr)
	if len(decisions) != n || len(results) != n || lost != 0 {
		t.Errorf("%d decisions, %d results, %d lost; want %d of each and none lost\nstderr:\n%s", len(decisions), len(results), lost, n, g.Stderr())
	}
	for rid, f := range results {
		if f["decision"] != "allow" || f["code"] == nil {
			t.Errorf("result %s: %v, want decision allow with the refusal's code", rid, f)
		}
	}
	if verr != nil {
		t.Errorf("sluice audit verify: %v: %s", verr, out)
	}
	// The gateway still serves.
	e.Up.SetMode(gwenv.ModeOK)
	if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
		t.Errorf("after the hang-ups: %d %s, want 200", r.Status, r.Body)
	}
}
