//go:build linux

package fault

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-gw/sluice/gateway/store/pgtest"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// pgReplicas writes the configs of n replicas r0… on one fresh database
// of a real PostgreSQL server: tickets.create_charge (idempotency-keyed)
// and create_refund (not keyed) held for group:finance, hold_lease 2s.
func pgReplicas(t *testing.T, e *gwenv.Env, srv *pgtest.Server, n int) (dsn, super string, docs []gwenv.Doc, paths []string) {
	db := srv.NewDatabaseT(t)
	dsn = srv.SocketURL(db) + "&statement_timeout=1s"
	for i := range n {
		d := e.BaseConfig(fmt.Sprintf("r%d", i))
		d["store"] = dsn
		d.Gateway()["replica_id"] = fmt.Sprintf("r%d", i)
		d.Gateway()["hold_wait"] = "50ms"
		d.Gateway()["hold_lease"] = "2s"
		d["policies"] = append([]map[string]any{
			{"match": "tickets.create_charge", "action": "ask", "approvers": []string{"group:finance"}},
		}, d["policies"].([]map[string]any)...)
		docs, paths = append(docs, d), append(paths, e.Write(d))
	}
	return dsn, srv.SuperURL(db), docs, paths
}

// TestReplicaKilledMidSend (G20): replica A is killed with SIGKILL while
// it sends two approved holds asked on replica B (the upstream applied
// them, their replies are lost): an idempotency-keyed charge and an
// unkeyed refund. A's lease on them passes (hold_lease 2s) and B, still
// running, takes them over without any restart of A: the charge is re-sent
// once with the same key (the upstream replays its first reply: one
// charge), the refund becomes outcome_unknown with the reason and A's
// lease named, and is never sent again. The agent's polls on B get the
// results.
func TestReplicaKilledMidSend(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	e := newEnv(t)
	_, _, docs, paths := pgReplicas(t, e, srv, 2)
	a, b := e.Start(docs[0], paths[0]), e.Start(docs[1], paths[1])
	c := casebook.Expect(t, "G20", "replica A (of 2 on PostgreSQL) kill -9'd while sending an approved idempotency-keyed charge and an unkeyed refund asked on B; A is not restarted",
		"after A's hold_lease (2s) B takes both over: charge re-sent once with the same key (hold_reconciling taken_over_from=A's lease, hold_executed reconciled=true), 1 charge applied, agent's poll on B 200 replayed; refund hold_outcome_unknown naming A's lease and 'no idempotency key', exactly 1 upstream request, poll 502")

	charge := b.Call(agentA, "tickets.create_charge", `{"body":{"amount":71}}`)
	refund := b.Call(agentA, "tickets.create_refund", `{"body":{"amount":72}}`)
	for _, r := range []gwenv.Reply{charge, refund} {
		if r.Status != http.StatusAccepted || r.HoldID == "" {
			t.Fatalf("ask on B: %d %s, want 202 pending", r.Status, r.Body)
		}
	}
	e.Up.SetMode(gwenv.ModeHang)
	for _, id := range []string{charge.HoldID, refund.HoldID} {
		go func() {
			// Through A's admin API: A sends it, and dies under it.
			req, _ := http.NewRequest(http.MethodPost, "http://"+a.Admin+"/api/v1/holds/"+id+"/approve", strings.NewReader(`{"reason":"ok"}`))
			req.Header.Set("Authorization", "Bearer "+gwenv.CarolToken)
			if resp, err := a.AdminClient().Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	e.Up.AwaitRequest(t, 30*time.Second)
	e.Up.AwaitRequest(t, 30*time.Second)
	if n := e.Up.Charges(); n != 1 {
		t.Fatalf("before the kill the upstream applied %d charges, want 1", n)
	}
	a.Kill9()
	killed := time.Now()
	e.Up.SetMode(gwenv.ModeOK)

	p := b.Do(agentA, http.MethodGet, "/v1/holds/"+charge.HoldID+"?wait=30s", "", nil)
	took := time.Since(killed)
	recon := b.AwaitAuditFields("hold_reconciling", map[string]any{"hold": charge.HoldID})
	exec := b.AwaitAuditFields("hold_executed", map[string]any{"hold": charge.HoldID, "reconciled": true})
	unk := b.AwaitAuditFields("hold_outcome_unknown", map[string]any{"hold": refund.HoldID})
	pr := b.Do(agentA, http.MethodGet, "/v1/holds/"+refund.HoldID+"?wait=5s", "", nil)
	time.Sleep(3 * time.Second) // a second taker, or a retry, would have sent by now

	rf, _ := recon["fields"].(map[string]any)
	uf, _ := unk["fields"].(map[string]any)
	ef, _ := exec["fields"].(map[string]any)
	var chargeKeys []string
	refunds := 0
	for _, r := range e.Up.Requests() {
		switch {
		case r.Path == "/charges" && strings.Contains(r.Body, `"amount":71`):
			chargeKeys = append(chargeKeys, r.Header.Get("Idempotency-Key"))
		case r.Path == "/refunds" && strings.Contains(r.Body, `"amount":72`):
			refunds++
		}
	}
	replayed := p.Result.Headers["Idempotent-Replayed"]
	c.Observef("taken over %s after the kill; charge: %v from %v, %v reconciled=%v, upstream keys %d (all the hold id: %v), charges %d, poll %d replayed=%v; refund: %v from %v reason %q, upstream requests %d, poll %d %s",
		took.Round(100*time.Millisecond), recon["event"], rf["taken_over_from"], exec["event"], ef["reconciled"], len(chargeKeys),
		len(chargeKeys) == 2 && chargeKeys[0] == charge.HoldID && chargeKeys[1] == charge.HoldID, e.Up.Charges(), p.Status, replayed,
		unk["event"], uf["taken_over_from"], uf["reason"], refunds, pr.Status, pr.Code)

	for name, f := range map[string]map[string]any{"hold_reconciling": rf, "hold_outcome_unknown": uf} {
		if from, _ := f["taken_over_from"].(string); !strings.HasPrefix(from, "r0/") || f["lease_expired"] == nil {
			t.Errorf("%s fields %v: want taken_over_from A's lease (r0/…) and lease_expired", name, f)
		}
	}
	if rf["idempotency_header"] != "Idempotency-Key" || ef["outcome"] != "executed" {
		t.Errorf("charge records %v / %v", rf, ef)
	}
	if len(chargeKeys) != 2 || chargeKeys[0] != charge.HoldID || chargeKeys[1] != charge.HoldID {
		t.Errorf("upstream saw Idempotency-Key %q for the charge, want exactly 2 requests with the hold id", chargeKeys)
	}
	if n := e.Up.Charges(); n != 1 {
		t.Errorf("%d charges applied, want 1", n)
	}
	if p.Status != http.StatusOK || p.Result.Status != http.StatusOK || len(replayed) != 1 || replayed[0] != "true" {
		t.Errorf("charge poll on B: %d %s, want 200 with the replayed first reply", p.Status, p.Body)
	}
	if reason, _ := uf["reason"].(string); !strings.Contains(reason, "no idempotency key") || !strings.Contains(reason, "r0/") {
		t.Errorf("refund's hold_outcome_unknown reason %q: want it to name A's lease and the missing key", reason)
	}
	if refunds != 1 {
		t.Errorf("the refund reached the upstream %d times, want 1 (never re-sent)", refunds)
	}
	if pr.Status != http.StatusBadGateway || pr.Code != "upstream_error" {
		t.Errorf("refund poll on B: %d %s, want 502 upstream_error (outcome unknown)", pr.Status, pr.Body)
	}
	if n := len(b.AuditEvent("hold_executed", refund.HoldID)); n != 0 {
		t.Errorf("%d hold_executed records for the refund", n)
	}
	if took > 20*time.Second {
		t.Errorf("taken over %s after the kill, want within the 2s lease and a few seconds", took)
	}
}

// TestDuplicateReplicaID (G21): a second gateway started with the
// replica_id of a running one, on the same PostgreSQL store, refuses to
// start, naming the id and the running holder; it writes nothing to the
// id's audit head. Once the holder is killed (-9) the id is free at once:
// the holder restarts under it without waiting for any expiry (the lock
// is the server's session lock, gone with the dead process's connection).
func TestDuplicateReplicaID(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	e := newEnv(t)
	_, super, docs, paths := pgReplicas(t, e, srv, 2)
	first := e.Start(docs[0], paths[0])
	docs[1].Gateway()["replica_id"] = "r0"
	paths[1] = e.Write(docs[1])
	c := casebook.Expect(t, "G21", "a second gateway started with the replica_id (r0) of one running on the same PostgreSQL store",
		"start refused, exit non-zero, the error names gateway.replica_id \"r0\" and the holder (sluice-replica host pid); r0's audit head untouched; the holder kill -9'd restarts under r0 at once")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, super)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	head := func() string {
		var seq int64
		var hash string
		if err := conn.QueryRow(ctx, `SELECT seq, hash FROM audit_heads WHERE log = 'r0'`).Scan(&seq, &hash); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(seq, " ", hash)
	}
	// The holder has records, and their head is recorded under r0.
	if r := first.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
		t.Fatalf("list on the holder: %d %s", r.Status, r.Body)
	}
	deadline := time.Now().Add(20 * time.Second)
	before := head()
	for strings.HasPrefix(before, "0 ") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		before = head()
	}
	if strings.HasPrefix(before, "0 ") {
		t.Fatalf("r0's head not recorded: %s", before)
	}
	out, exitErr := refusedStart(t, e, docs[1], paths[1], "the second gateway with a replica id in use")
	after := head()
	if r := first.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
		t.Errorf("the holder after the refused start: %d %s", r.Status, r.Body)
	}
	first.Kill9()
	killed := time.Now()
	restarted := e.Start(docs[0], paths[0])
	restart := time.Since(killed)
	st, _, _ := restarted.AdminGet("/readyz")
	c.Observef("exit %v; stderr names the id: %v, the holder: %v, pid %d: %v; r0 head before %q after %q; the holder kill -9'd and restarted: readyz %d after %s",
		exitErr, strings.Contains(out, `gateway.replica_id "r0" is held by another running gateway`), strings.Contains(out, "sluice-replica "),
		first.Pid(), strings.Contains(out, fmt.Sprintf("pid %d", first.Pid())), before, after, st, restart.Round(100*time.Millisecond))
	if exitErr == nil || !strings.Contains(out, `gateway.replica_id "r0" is held by another running gateway`) ||
		!strings.Contains(out, fmt.Sprintf("pid %d", first.Pid())) {
		t.Errorf("second start: exit %v, stderr:\n%s\nwant a non-zero exit naming the id and the holder's pid %d", exitErr, out, first.Pid())
	}
	if before != after {
		t.Errorf("r0's audit head moved from %s to %s during the refused start", before, after)
	}
	if st != http.StatusOK || restart > 30*time.Second {
		t.Errorf("the holder restarted under r0 after a kill -9: /readyz %d after %s, want 200 without waiting for any expiry", st, restart)
	}
}

// TestLegacyHeadRekeyed (G22): a gateway on PostgreSQL from before
// replica ids recorded its audit head under "host:path". After the
// upgrade, `audit verify --heads` names that row as such and says how it
// is resolved; the gateway's next start re-keys it to its replica id and
// checks its file against it, so a file cut behind the legacy head is
// refused at start (without the re-key it would have been checked against
// no head at all); with the file whole it starts and verify passes.
func TestLegacyHeadRekeyed(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	e := newEnv(t)
	dsn, super, docs, paths := pgReplicas(t, e, srv, 1)
	c := casebook.Expect(t, "G22", "an audit head recorded under host:path by a gateway from before replica ids; its file then cut behind that head before the upgraded gateway's first start",
		"audit verify --heads names the legacy row and how it is resolved (exit non-zero); the start re-keys the head to the replica id and refuses the cut file (G9 message); with the file whole it starts, and verify --heads passes")
	g := e.Start(docs[0], paths[0])
	for range 3 {
		if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
			t.Fatalf("list: %d %s", r.Status, r.Body)
		}
	}
	g.Stop() // records the final head
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, super)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	host, _ := os.Hostname()
	legacy := host + ":" + g.Audit
	var seq int64
	if err := conn.QueryRow(ctx, `UPDATE audit_heads SET log = $1 WHERE log = 'r0' RETURNING seq`, legacy).Scan(&seq); err != nil || seq < 3 {
		t.Fatalf("make r0's head a legacy one: seq %d, %v", seq, err)
	}
	verify, verr := e.CLI("", "audit", "verify", "--heads", dsn, "--file", g.Audit)

	whole, err := os.ReadFile(g.Audit)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(whole), "\n")
	at := -1
	for i := len(lines) - 1; i > 0; i-- {
		if lineSeq(lines[i]) == seq {
			at = i
			break
		}
	}
	if at < 0 {
		t.Fatalf("no record at the head's seq %d", seq)
	}
	if err := os.WriteFile(g.Audit, []byte(strings.Join(lines[:at], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	cutOut, cutErr := refusedStart(t, e, docs[0], paths[0], "the gateway on a file cut behind its legacy head")
	var rekeyed string
	if err := conn.QueryRow(ctx, `SELECT log FROM audit_heads WHERE seq = $1`, seq).Scan(&rekeyed); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g.Audit, whole, 0o600); err != nil {
		t.Fatal(err)
	}
	g2 := e.Start(docs[0], paths[0])
	g2.Stop()
	after, aerr := e.CLI("", "audit", "verify", "--heads", dsn, "--file", g.Audit)
	c.Observef("verify before the start: exit %v, names the legacy row: %v; start on the cut file: exit %v, G9 refusal: %v, head now keyed %q; start on the whole file ok; verify after: %v %q",
		verr, strings.Contains(verify, "a head recorded before replica ids"), cutErr, strings.Contains(cutOut, "does not match the head the store recorded"), rekeyed, aerr, firstLine(after, "replica r0"))
	if verr == nil || !strings.Contains(verify, "FAIL: "+legacy+": a head recorded before replica ids") || !strings.Contains(verify, "re-keys it to its replica_id") {
		t.Errorf("verify --heads before the upgraded start: %v\n%s\nwant a FAIL naming the legacy row and how it is resolved", verr, verify)
	}
	if cutErr == nil || !strings.Contains(cutOut, "does not match the head the store recorded") || !strings.Contains(cutOut, "truncated") {
		t.Errorf("start on a file cut behind the legacy head: exit %v\n%s\nwant the G9 refusal", cutErr, cutOut)
	}
	if rekeyed != "r0" {
		t.Errorf("the legacy head is keyed %q after the start, want r0", rekeyed)
	}
	if aerr != nil || !strings.Contains(after, "ok: replica r0") {
		t.Errorf("verify --heads after the start: %v\n%s", aerr, after)
	}
}

// refusedStart launches a gateway that must refuse to start and returns
// how it exited and what it logged.
func refusedStart(t *testing.T, e *gwenv.Env, d gwenv.Doc, path, what string) (stderr string, exit error) {
	t.Helper()
	g := e.Launch(d, path)
	select {
	case <-g.Exited():
		exit = g.ExitErr()
		return string(g.Stderr()), exit
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not exit", what)
		return "", nil
	}
}
