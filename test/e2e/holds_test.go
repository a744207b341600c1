//go:build linux

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// withApprovers makes the refund rule ask group:finance, gives carol (in
// finance) the API token and makes calls wait only briefly before 202.
func withApprovers(d gwenv.Doc, token string) {
	d.Rule("tickets.create_refund")["approvers"] = []string{"group:finance"}
	d.Gateway()["hold_wait"] = "100ms"
	sum := sha256.Sum256([]byte(token))
	d["approvers"] = map[string]any{"users": []map[string]any{{"name": "carol", "groups": []string{"finance"}, "token_sha256": hex.EncodeToString(sum[:])}}}
}

// TestHoldSurvivesKill9: a held call survives `kill -9` of the gateway
// (THREATS G1); approved after the restart it is sent exactly once, with
// the credential, and the agent's poll gets the result.
func TestHoldSurvivesKill9(t *testing.T) {
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	const token = gwenv.CarolToken
	withApprovers(d, token)
	cfg := e.Write(d)
	g := e.Start(d, cfg)
	// adminDo calls the admin API of the gateway running now as carol; the
	// answer must be a JSON object.
	adminDo := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		st, _, m := g.AdminDo(method, path, token, body)
		if m == nil {
			t.Fatalf("admin %s %s: %d, the answer is not a JSON object", method, path, st)
		}
		return st, m
	}
	g1 := casebook.Expect(t, "G1", "kill -9 of the gateway with a held Ask call, then restart and approve",
		"after restart the poll is still 202 pending, nothing upstream; approval executes exactly once with the credential")
	e3 := casebook.Expect(t, "E3", "approve the same hold twice (after a restart)",
		"first approve executes, second 409, exactly one upstream request")
	var obs []string
	defer func() {
		g1.Observe(strings.Join(obs, "; "))
		e3.Observef("%s; upstream requests %d", strings.Join(obs[min(len(obs), 1):], "; "), len(e.Up.Requests()))
	}()

	r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":5,"reason":"dup"}}`)
	var held struct {
		Hold struct{ ID, Status, Poll string } `json:"hold"`
	}
	if err := json.Unmarshal(r.Body, &held); err != nil || r.Status != http.StatusAccepted || held.Hold.Status != "pending" {
		t.Fatalf("ask: %d %s, want 202 pending", r.Status, r.Body)
	}
	g.Kill9()

	g = e.Start(d, cfg)
	if n := len(e.Up.Requests()); n != 0 {
		t.Fatalf("%d upstream requests before approval", n)
	}
	p := g.Do(agentA, http.MethodGet, held.Hold.Poll, "", nil)
	obs = append(obs, fmt.Sprintf("ask %d, after kill -9 and restart poll %d with %d upstream requests", r.Status, p.Status, len(e.Up.Requests())))
	if p.Status != http.StatusAccepted {
		t.Fatalf("poll after restart: %d %s, want 202 (still pending)", p.Status, p.Body)
	}
	st, body := adminDo(http.MethodPost, "/api/v1/holds/"+held.Hold.ID+"/approve", `{"reason":"ok"}`)
	hold, _ := body["hold"].(map[string]any)
	obs = append(obs, fmt.Sprintf("approve %d %v", st, hold["status"]))
	if st != http.StatusOK || body["hold"].(map[string]any)["status"] != "executed" {
		t.Fatalf("approve after restart: %d %v", st, body)
	}
	st2, _ := adminDo(http.MethodPost, "/api/v1/holds/"+held.Hold.ID+"/approve", "")
	obs = append(obs, fmt.Sprintf("second approve %d", st2))
	if st2 != http.StatusConflict {
		t.Fatalf("second approve: %d, want 409", st2)
	}
	p = g.Do(agentA, http.MethodGet, held.Hold.Poll+"?wait=5s", "", nil)
	obs = append(obs, fmt.Sprintf("poll %d with upstream status %d", p.Status, p.Result.Status))
	if p.Status != http.StatusOK || p.Result.Status != 200 || !strings.Contains(string(p.Result.Body), `"refund":"ok"`) {
		t.Fatalf("poll after approval: %d %s", p.Status, p.Body)
	}
	reqs := e.Up.Requests()
	if len(reqs) != 1 || reqs[0].Path != "/refunds" || reqs[0].Header.Get("X-Api-Key") != e.Secret {
		t.Fatalf("upstream saw %d requests (%+v); want exactly one POST /refunds with the credential", len(reqs), reqs)
	}
}

// TestHoldConcurrentDecisions is THREATS E3 through the real binary: six
// approvals and six denials of one hold sent at once. Exactly one wins;
// the other eleven are 409; the call is executed once if an approval
// won and never if a denial did, and the agent's poll agrees.
func TestHoldConcurrentDecisions(t *testing.T) {
	e := newEnv(t)
	d := mainConfig(e, "race")
	withApprovers(d, gwenv.CarolToken)
	g := e.Start(d, e.Write(d))
	c := casebook.Expect(t, "E3", "6 approvals and 6 denials of one hold sent concurrently through the admin API",
		"exactly one 200, eleven 409; one upstream request if an approval won, none if a denial did; the poll matches the winner")
	r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":5,"reason":"dup"}}`)
	var held struct {
		Hold struct{ ID, Poll string } `json:"hold"`
	}
	if err := json.Unmarshal(r.Body, &held); err != nil || r.Status != http.StatusAccepted {
		t.Fatalf("ask: %d %s, want 202", r.Status, r.Body)
	}
	type answer struct {
		action string
		status int
	}
	answers := make(chan answer, 12)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 12 {
		action := "approve"
		if i%2 == 1 {
			action = "deny"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			st, _, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+held.Hold.ID+"/"+action, gwenv.CarolToken, `{"reason":"race"}`)
			answers <- answer{action, st}
		}()
	}
	close(start)
	wg.Wait()
	close(answers)
	var won []string
	conflicts, other := 0, 0
	for a := range answers {
		switch a.status {
		case http.StatusOK:
			won = append(won, a.action)
		case http.StatusConflict:
			conflicts++
		default:
			other++
		}
	}
	p := g.Do(agentA, http.MethodGet, held.Hold.Poll+"?wait=5s", "", nil)
	sent := len(e.Up.Requests())
	c.Observef("winners %v, 409s %d, other answers %d, upstream requests %d, poll %d %s", won, conflicts, other, sent, p.Status, p.Code)
	if len(won) != 1 || conflicts != 11 || other != 0 {
		t.Fatalf("winners %v, %d conflicts, %d other answers; want exactly one winner and 11 conflicts", won, conflicts, other)
	}
	switch won[0] {
	case "approve":
		if sent != 1 || p.Status != http.StatusOK {
			t.Errorf("approval won: %d upstream requests, poll %d; want 1 and 200", sent, p.Status)
		}
	case "deny":
		if sent != 0 || p.Status != http.StatusForbidden || p.Code != "approval_denied" {
			t.Errorf("denial won: %d upstream requests, poll %d %s; want 0 and 403 approval_denied", sent, p.Status, p.Code)
		}
	}
}
