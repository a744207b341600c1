//go:build linux

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// benchStore is the store section: the same allowed tool call through
// two real gateways that differ only in their store, an SQLite file and
// a real PostgreSQL server (Debian's, started for the run, reached over
// its Unix socket from the namespace).
func benchStore(t *testing.T, w *world) []*section {
	s := &section{Title: "Store: an allowed tool call on PostgreSQL vs SQLite", Baseline: "sluice, SQLite store",
		Intro: "The full allowed pipeline of row 1.7 (strict schema, user Rego, cached credential, audit on /dev/shm) through two `sluice serve` processes " +
			"that differ only in `store:`. The allowed path reads the store only for the session check, whose answer is cached (on PostgreSQL a \"not ended\" answer for 0.5 s, since another replica may end the session), so the goal is that the shared store costs the call almost nothing. The rows take turns as in section 1."}
	n := iterations(2000)
	args := `{"body":` + itemBody + `}`
	ps := []*probe{}
	pgDSN := ""
	var srv *pgtest.Server
	add := func(name, note string, o gwOpts) {
		g, err := w.startGateway(t, o)
		if err != nil {
			ps = append(ps, &probe{name: name, err: err})
			return
		}
		t.Cleanup(g.p.stop)
		c := sandboxClient(g.sock, benchAgent)
		ps = append(ps, &probe{name: name, note: note, fn: func() error { _, err := toolCall(c, "bench.create_item", args, 200); return err }})
	}
	add("sluice, SQLite store", "store: sqlite:… (WAL, one gateway per file)", gwOpts{Name: "store-sqlite", Rego: benchRego, Credential: true})
	if err := pgtest.Available(); err != nil {
		ps = append(ps, &probe{name: "sluice, PostgreSQL store", err: err})
	} else if srv, err = pgtest.Start(pgtest.Options{}); err != nil {
		ps = append(ps, &probe{name: "sluice, PostgreSQL store", err: err})
		srv = nil
	} else {
		t.Cleanup(srv.Remove)
		db, err := srv.NewDatabase(t.Context())
		if err != nil {
			ps = append(ps, &probe{name: "sluice, PostgreSQL store", err: err})
		} else {
			pgDSN = srv.SocketURL(db)
			add("sluice, PostgreSQL store", "store: postgres://…?host=<socket dir> (Unix socket, pgx pool)",
				gwOpts{Name: "store-pg", Rego: benchRego, Credential: true, Store: pgDSN})
		}
	}
	interleave(ps, n, 20)
	s.addProbes(ps)
	s.Verdicts = append(s.Verdicts, verdictLat("issue 20: an allowed call with the PostgreSQL store ≤ 1.1× the same with SQLite (p50)",
		s.find("sluice, PostgreSQL store"), s.find("sluice, SQLite store"), 1.1))

	// Approve on one replica, the agent's result on another.
	wake := &section{Title: "Store: approve on replica B → the agent's result on replica A", Baseline: "one gateway (SQLite)",
		Intro: "The agent long-polls its held call (`GET …?wait=30s`) on one gateway; the approver approves it with the admin API; each row is the time from sending the approval to the agent's poll returning with the result (the upstream call included). " +
			"Baseline: approver and agent on the same gateway with an SQLite store. Row 2: two gateways on one PostgreSQL database, the agent on A and the approver on B, so the poll wakes through `LISTEN/NOTIFY`."}
	m := iterations(300)
	one, err := w.startGateway(t, gwOpts{Name: "wake-sqlite", Approvers: true, HoldWait: "10ms", MaxHolds: 100000})
	if err != nil {
		wake.skip("one gateway (SQLite)", err.Error())
	} else {
		t.Cleanup(one.p.stop)
		l, err := approveToResult(one, one, m)
		wake.lat("one gateway (SQLite)", l, err, "approve and poll on the same gateway")
	}
	if pgDSN == "" {
		wake.skip("approve on B, agent on A (PostgreSQL)", "no PostgreSQL server for the run")
	} else {
		a, errA := w.startGateway(t, gwOpts{Name: "wake-a", Approvers: true, HoldWait: "10ms", MaxHolds: 100000, Store: pgDSN})
		b, errB := w.startGateway(t, gwOpts{Name: "wake-b", Approvers: true, HoldWait: "10ms", MaxHolds: 100000, Store: pgDSN})
		switch {
		case errA != nil:
			wake.skip("approve on B, agent on A (PostgreSQL)", errA.Error())
		case errB != nil:
			wake.skip("approve on B, agent on A (PostgreSQL)", errB.Error())
		default:
			t.Cleanup(a.p.stop)
			t.Cleanup(b.p.stop)
			l, err := approveToResult(a, b, m)
			wake.lat("approve on B, agent on A (PostgreSQL)", l, err, "two gateways, one database; the poll wakes on a notification")
		}
	}
	if r := wake.find("approve on B, agent on A (PostgreSQL)"); r != nil && len(r.Lat) > 0 {
		p50, p99 := pct(r.Lat, 50), pct(r.Lat, 99)
		v := "**met**"
		if p50 > 20*time.Millisecond || p99 > 100*time.Millisecond {
			v = "**not met**"
		}
		wake.Verdicts = append(wake.Verdicts, fmt.Sprintf("issue 20: approve on B → result on A p50 ≤ 20 ms, p99 ≤ 100 ms: %s (p50 %s, p99 %s)", v, fmtDur(p50), fmtDur(p99)))
	}
	return []*section{s, wake, benchPGHolds(t, w, srv)} // pgholds_test.go
}

// holdThenApprove makes one held bench.create_item call through c,
// starts a long poll for its result through poller, approves it on
// approver and returns the time from sending the approval until the
// poll returned 200.
func holdThenApprove(c, poller *http.Client, approver *gw, name string, amount int) (time.Duration, error) {
	b, err := toolCall(c, "bench.create_item", fmt.Sprintf(`{"body":{"name":%q,"amount":%d,"currency":"EUR"}}`, name, amount), 202)
	if err != nil {
		return 0, err
	}
	var held struct {
		Hold struct{ ID, Poll string } `json:"hold"`
	}
	if err := json.Unmarshal(b, &held); err != nil || held.Hold.ID == "" {
		return 0, fmt.Errorf("hold reply: %v: %s", err, oneLine(string(b)))
	}
	got := make(chan error, 1)
	go func() {
		resp, err := poller.Get("http://sluice" + held.Hold.Poll + "?wait=30s")
		if err != nil {
			got <- err
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("poll: %d %s", resp.StatusCode, oneLine(string(body)))
		}
		got <- err
	}()
	time.Sleep(5 * time.Millisecond) // let the poll reach its wait
	t0 := time.Now()
	st, body, err := approver.adminDo(http.MethodPost, "/api/v1/holds/"+held.Hold.ID+"/approve", `{"reason":"bench"}`)
	if err != nil || st != http.StatusOK {
		return 0, fmt.Errorf("approve: %d %v %s", st, err, oneLine(string(body)))
	}
	if err := <-got; err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// approveToResult makes n holds on agentGW, and for each times sending
// the approval to approverGW until the agent's long poll on agentGW
// returns 200.
func approveToResult(agentGW, approverGW *gw, n int) ([]time.Duration, error) {
	c := sandboxClient(agentGW.sock, benchAgent)
	poller := sandboxClient(agentGW.sock, benchAgent)
	var out []time.Duration
	for i := range n + 2 {
		d, err := holdThenApprove(c, poller, approverGW, fmt.Sprintf("wake-%d", i), i+1)
		if err != nil {
			return nil, err
		}
		if i >= 2 { // two warm-up rounds
			out = append(out, d)
		}
	}
	return sortDur(out), nil
}
