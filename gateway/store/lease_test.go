package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestHoldLeases: a hold decided to executing is leased to the deciding
// store; renewing keeps it; a lease that passed is taken over by exactly
// one of several stores racing for it, naming the owner it was taken
// from; a hold being renewed is never taken.
func TestHoldLeases(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		dsn := newDSN(t)
		open := func(replica string) *Store {
			s, err := OpenWith(ctx, dsn, Options{Replica: replica})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		a := open("ra")
		if !strings.HasPrefix(a.LeaseOwner(), "ra/") {
			t.Fatalf("lease owner %q, want ra/<token>", a.LeaseOwner())
		}
		now := time.Now().UTC()
		for _, id := range []string{"short", "long"} {
			if err := a.InsertHold(ctx, HoldRow{ID: id, Status: "pending", Agent: "a", Session: "s", User: "u", Tool: "t", SHA256: id,
				Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		const short = time.Second
		lease := map[string]time.Duration{"short": short, "long": time.Hour}
		for id, d := range lease {
			if ok, err := a.Decide(ctx, Decision{ID: id, Version: AnyVersion, To: "executing", By: "x", Now: now, Lease: d}); !ok || err != nil {
				t.Fatalf("decide %s: %v %v", id, ok, err)
			}
			owner, exp, err := a.HoldLease(ctx, id)
			if err != nil || owner != a.LeaseOwner() || exp.IsZero() {
				t.Fatalf("lease of %s: %q %v %v, want %q", id, owner, exp, err, a.LeaseOwner())
			}
		}
		if a.Kind() == SQLite {
			// One gateway per file: a restart takes every executing hold,
			// lease or not; nothing else may.
			if _, err := a.TakeOverHolds(ctx, time.Minute, false, 10); err != nil {
				t.Fatal(err)
			}
			got, err := a.TakeOverHolds(ctx, time.Minute, true, 10)
			if err != nil || len(got) != 2 {
				t.Fatalf("take over all (SQLite start): %d, %v; want 2", len(got), err)
			}
			return
		}
		if _, err := a.TakeOverHolds(ctx, time.Minute, true, 10); err == nil {
			t.Fatal("taking every hold of a shared store whatever its lease was allowed")
		}
		// Renewed, the short lease outlives its first term.
		b := open("rb")
		time.Sleep(short * 6 / 10)
		if lost, err := a.RenewLeases(ctx, []string{"short"}, short); err != nil || len(lost) != 0 {
			t.Fatalf("renew: lost %v, %v", lost, err)
		}
		time.Sleep(short * 6 / 10)
		if got, err := b.TakeOverHolds(ctx, time.Minute, false, 10); err != nil || len(got) != 0 {
			t.Fatalf("took %d holds whose leases are being renewed (%v)", len(got), err)
		}
		// Not renewed: it passes, and of 5 stores racing one takes it.
		time.Sleep(short * 6 / 10)
		var (
			mu    sync.Mutex
			taken []TakenHold
			by    []string
			wg    sync.WaitGroup
		)
		racers := []*Store{b, open("rc"), open("rd"), open("re"), open("rf")}
		for _, s := range racers {
			wg.Go(func() {
				got, err := s.TakeOverHolds(ctx, time.Minute, false, 10)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				defer mu.Unlock()
				for _, h := range got {
					taken, by = append(taken, h), append(by, s.LeaseOwner())
				}
			})
		}
		wg.Wait()
		if len(taken) != 1 || taken[0].ID != "short" || taken[0].From != a.LeaseOwner() || taken[0].Expired.IsZero() || taken[0].Status != "executing" {
			t.Fatalf("taken %+v, want the short hold once, from %s", taken, a.LeaseOwner())
		}
		if owner, _, _ := a.HoldLease(ctx, "short"); owner != by[0] {
			t.Fatalf("lease owner after takeover %q, want the taker %q", owner, by[0])
		}
		// The old owner's renewal now reports it lost; the long one stays.
		if lost, err := a.RenewLeases(ctx, []string{"short", "long"}, time.Hour); err != nil || len(lost) != 1 || lost[0] != "short" {
			t.Fatalf("renew after takeover: lost %v, %v; want [short]", lost, err)
		}
	})
}

// TestClaimReplica (THREATS G21): a second store claiming a replica id
// another holds is refused with ErrReplicaInUse, naming the id and the
// holder; once the holder closes, the id is free.
func TestClaimReplica(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		dsn := newDSN(t)
		if strings.HasPrefix(dsn, "sqlite:") {
			s := openTemp(t)
			if err := s.ClaimReplica(ctx, nil); err != nil {
				t.Fatalf("SQLite claim: %v (the file lock admits one gateway; nothing to claim)", err)
			}
			return
		}
		first, err := OpenWith(ctx, dsn, Options{Replica: "r1"})
		if err != nil {
			t.Fatal(err)
		}
		if err := first.ClaimReplica(ctx, nil); err != nil {
			t.Fatal(err)
		}
		second, err := OpenWith(ctx, dsn, Options{Replica: "r1"})
		if err != nil {
			t.Fatal(err)
		}
		defer second.Close()
		err = second.ClaimReplica(ctx, nil)
		if !errors.Is(err, ErrReplicaInUse) || !strings.Contains(err.Error(), `"r1"`) || !strings.Contains(err.Error(), "sluice-replica ") {
			t.Fatalf("second claim of r1: %v; want ErrReplicaInUse naming r1 and the holder", err)
		}
		other, err := OpenWith(ctx, dsn, Options{Replica: "r2"})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		if err := other.ClaimReplica(ctx, nil); err != nil {
			t.Fatalf("claim of another id: %v", err)
		}
		first.Close()
		deadline := time.Now().Add(5 * time.Second)
		for {
			err = second.ClaimReplica(ctx, nil)
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("claim after the holder closed: %v", err)
		}

		// The holder's lock connection is cut (a server restart, a
		// network cut) and another gateway takes the id meanwhile: the
		// holder's keeper finds it taken and says so (lost, ReplicaErr,
		// hence /readyz) until it holds the id again.
		lostc := make(chan error, 8)
		holder, err := OpenWith(ctx, dsn, Options{Replica: "r3"})
		must(t, err)
		defer holder.Close()
		must(t, holder.ClaimReplica(ctx, func(err error) {
			select {
			case lostc <- err:
			default:
			}
		}))
		if _, err := holder.db.sql.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'sluice-replica %' AND pid IN
			(SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid::bigint = $1)`, int64(uint64(replicaKey("r3"))&0xffffffff)); err != nil {
			t.Fatal(err)
		}
		thief, err := OpenWith(ctx, dsn, Options{Replica: "r3"})
		must(t, err)
		deadline = time.Now().Add(5 * time.Second)
		for err = thief.ClaimReplica(ctx, nil); err != nil && time.Now().Before(deadline); err = thief.ClaimReplica(ctx, nil) {
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("claim of the id whose holder's connection was cut: %v", err)
		}
		select {
		case err := <-lostc:
			if !errors.Is(err, ErrReplicaInUse) || !errors.Is(holder.ReplicaErr(), ErrReplicaInUse) {
				t.Fatalf("lost %v, ReplicaErr %v; want ErrReplicaInUse", err, holder.ReplicaErr())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the holder never noticed another gateway took its id")
		}
		thief.Close()
		deadline = time.Now().Add(10 * time.Second)
		for holder.ReplicaErr() != nil && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if err := holder.ReplicaErr(); err != nil {
			t.Fatalf("the holder did not take its id back once free: %v", err)
		}
	})
}
