package holds

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// TestLeaseTakeover (THREATS G20): replica A approves a hold and dies
// while sending it (its Execute never returns; nothing renews its lease).
// Once the lease has passed, replica B takes the hold over: a keyed hold
// is audited hold_reconciling naming A's lease, re-sent by B exactly once
// with the stored hold (same key) and finished reconciled; an unkeyed one
// becomes outcome_unknown with the reason and is never sent by B. A third
// replica racing B takes nothing. And a hold whose sender lives (renewing
// its lease) past several leases is never taken over.
func TestLeaseTakeover(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	dsn := srv.SuperURL(srv.NewDatabaseT(t))
	const lease = 400 * time.Millisecond
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	type replica struct {
		m     *Manager
		st    *store.Store
		al    *auditLog
		sends atomic.Int32
	}
	open := func(id string, exec func(r *replica, h Hold) (Result, bool)) *replica {
		st, err := store.OpenWith(context.Background(), dsn, store.Options{Replica: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		r := &replica{st: st, al: &auditLog{}}
		r.m = New(Options{Store: st, Audit: r.al.add, Logger: quiet, Lease: lease, MaxPendingPerAgent: 8, MaxPendingPerSandbox: 8,
			Execute: func(_ context.Context, h Hold) (Result, bool) { r.sends.Add(1); return exec(r, h) }})
		return r
	}
	hang := make(chan struct{})
	defer close(hang)
	a := open("ra", func(*replica, Hold) (Result, bool) { <-hang; return Result{}, false })
	answer := func(*replica, Hold) (Result, bool) {
		return Result{HTTPStatus: 201, Body: []byte(`{"charge":"ch_1"}`), Answered: true}, true
	}
	b, c := open("rb", answer), open("rc", answer)
	ctx := context.Background()
	for _, r := range []*replica{b, c} {
		if err := r.m.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		go r.m.Run(rctx)
	}

	kh, _, err := a.m.Create(ctx, keyed("1"))
	if err != nil {
		t.Fatal(err)
	}
	uh, _, err := a.m.Create(ctx, sample("2"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{kh.ID, uh.ID} {
		go func() { _, _ = a.m.Approve(ctx, id, Person{Name: "bob"}, "ok") }() // A "dies" inside Execute
	}
	waitFor(t, func() bool { return a.sends.Load() == 2 })
	owner, _, err := a.st.HoldLease(ctx, kh.ID)
	if err != nil || owner != a.st.LeaseOwner() {
		t.Fatalf("lease of the executing hold: %q %v, want A's %q", owner, err, a.st.LeaseOwner())
	}

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	gotK, err := b.m.Wait(wctx, kh.ID)
	if err != nil || gotK.Status != Done || gotK.Result == nil || !strings.Contains(string(gotK.Result.Body), "ch_1") {
		t.Fatalf("keyed hold after takeover: %s %+v %v, want executed with the re-send's answer", gotK.Status, gotK.Result, err)
	}
	gotU, err := b.m.Wait(wctx, uh.ID)
	if err != nil || gotU.Status != Unknown {
		t.Fatalf("unkeyed hold after takeover: %s %v, want outcome_unknown", gotU.Status, err)
	}
	time.Sleep(3 * lease) // a second taker or a retry would have sent by now
	if n := b.sends.Load() + c.sends.Load(); n != 1 {
		t.Fatalf("%d re-sends across B and C, want 1 (the keyed hold, once)", n)
	}
	// Who took each: one of B and C, with A's lease named.
	var kEvs, uEvs []string
	var kF, uF []map[string]any
	for _, r := range []*replica{b, c} {
		e, f := r.al.of(kh.ID)
		kEvs, kF = append(kEvs, e...), append(kF, f...)
		e, f = r.al.of(uh.ID)
		uEvs, uF = append(uEvs, e...), append(uF, f...)
	}
	if !slices.Equal(kEvs, []string{"hold_reconciling", "hold_executed"}) || kF[0]["taken_over_from"] != a.st.LeaseOwner() ||
		kF[0]["idempotency_header"] != "Idempotency-Key" || kF[1]["reconciled"] != true {
		t.Fatalf("keyed hold's records on the takers: %v %v", kEvs, kF)
	}
	if !slices.Equal(uEvs, []string{"hold_outcome_unknown"}) || uF[0]["taken_over_from"] != a.st.LeaseOwner() ||
		!strings.Contains(uF[0]["reason"].(string), "no idempotency key") {
		t.Fatalf("unkeyed hold's records on the takers: %v %v", uEvs, uF)
	}

	// A live sender keeps its lease: D sends for 5 leases, renewing.
	slow := make(chan struct{})
	d := open("rd", func(*replica, Hold) (Result, bool) {
		<-slow
		return Result{HTTPStatus: 201, Body: []byte(`{}`), Answered: true}, true
	})
	dctx, dcancel := context.WithCancel(ctx)
	defer dcancel()
	go d.m.Run(dctx)
	lh, _, err := d.m.Create(ctx, keyed("3"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan Hold, 1)
	go func() { h, _ := d.m.Approve(ctx, lh.ID, Person{Name: "bob"}, "ok"); done <- h }()
	time.Sleep(5 * lease)
	close(slow)
	got := <-done
	if got.Status != Done || b.sends.Load()+c.sends.Load() != 1 {
		t.Fatalf("a renewed hold: %s, takers sent %d; want executed by its sender, no takeover", got.Status, b.sends.Load()+c.sends.Load())
	}
	for _, r := range []*replica{b, c} {
		if e, _ := r.al.of(lh.ID); len(e) != 0 {
			t.Fatalf("a taker recorded %v for a hold whose sender renews its lease", e)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
