package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestOAuthConnections: a connection's row is stored, replaced, kept by
// onlyNew, refused when malformed (naming what), and deleted.
func TestOAuthConnections(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		s := openTemp(t)
		ctx := context.Background()
		if _, err := s.GetOAuthConnection(ctx, "docs", "alice"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("empty: %v", err)
		}
		at := time.Unix(1_700_000_000, 5).UTC()
		c := OAuthConnection{Connector: "docs", User: "alice", Status: "connected", Scopes: []string{"openid", "offline_access"}, ConnectedAt: at, Updated: at}
		if ok, err := s.PutOAuthConnection(ctx, c, true); err != nil || !ok {
			t.Fatalf("put new: %v %v", ok, err)
		}
		got, err := s.GetOAuthConnection(ctx, "docs", "alice")
		if err != nil || got.Status != "connected" || !slices.Equal(got.Scopes, c.Scopes) || !got.ConnectedAt.Equal(at) {
			t.Fatalf("get = %+v, %v", got, err)
		}
		// onlyNew keeps what is there (a second replica moving the same
		// old record).
		if ok, err := s.PutOAuthConnection(ctx, OAuthConnection{Connector: "docs", User: "alice", Status: "needs_reconnect", Updated: at}, true); err != nil || ok {
			t.Fatalf("put onlyNew over a row: %v %v", ok, err)
		}
		c.Status, c.Scopes = "needs_reconnect", nil
		if _, err := s.PutOAuthConnection(ctx, c, false); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetOAuthConnection(ctx, "docs", "alice"); got.Status != "needs_reconnect" || len(got.Scopes) != 0 {
			t.Fatalf("replaced = %+v", got)
		}
		for _, bad := range []struct {
			c    OAuthConnection
			want string
		}{
			{OAuthConnection{Connector: "docs", User: "alice", Status: "not_connected"}, `status "not_connected"`},
			{OAuthConnection{Connector: "docs", User: "alice", Status: "connected", Scopes: []string{"a b"}}, `scope "a b"`},
			{OAuthConnection{Connector: "", User: "alice", Status: "connected"}, "empty connector"},
		} {
			if _, err := s.PutOAuthConnection(ctx, bad.c, false); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("put %+v: %v, want an error naming %s", bad.c, err, bad.want)
			}
		}
		if err := s.DeleteOAuthConnection(ctx, "docs", "alice"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetOAuthConnection(ctx, "docs", "alice"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after delete: %v", err)
		}
	})
}

// TestOAuthRefreshLeaseOneOwner: replicas (one Store each on one
// database) asking together for a connection's refresh lease: exactly one
// gets it; the others get it only once it is released or has ended.
func TestOAuthRefreshLeaseOneOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		dsn := newDSN(t)
		ctx := context.Background()
		const replicas = 4
		stores := make([]*Store, replicas)
		for i := range stores {
			stores[i] = openReplica(t, dsn, stores[0])
		}
		now := time.Now()
		if ok, err := stores[0].LeaseOAuthRefresh(ctx, "docs", "alice", "r0", now, now.Add(time.Minute)); err != nil || ok {
			t.Fatalf("lease without a row: %v %v", ok, err)
		}
		if _, err := stores[0].PutOAuthConnection(ctx, OAuthConnection{Connector: "docs", User: "alice", Status: "connected", Updated: now}, false); err != nil {
			t.Fatal(err)
		}
		var won atomic.Int64
		winner := make(chan string, replicas*5)
		var wg sync.WaitGroup
		for i := range replicas * 5 {
			wg.Go(func() {
				owner := fmt.Sprintf("r%d", i%replicas) + fmt.Sprint("-", i)
				ok, err := stores[i%replicas].LeaseOAuthRefresh(ctx, "docs", "alice", owner, now, now.Add(time.Minute))
				if err != nil {
					t.Error(err)
				}
				if ok {
					won.Add(1)
					winner <- owner
				}
			})
		}
		wg.Wait()
		if won.Load() != 1 {
			t.Fatalf("%d owners got the lease, want 1", won.Load())
		}
		owner := <-winner
		if leased, err := stores[1].OAuthRefreshLeased(ctx, "docs", "alice", now); err != nil || !leased {
			t.Fatalf("leased = %v %v", leased, err)
		}
		// A replacing Put (the refreshed row) keeps the lease.
		if _, err := stores[2].PutOAuthConnection(ctx, OAuthConnection{Connector: "docs", User: "alice", Status: "connected", Updated: now}, false); err != nil {
			t.Fatal(err)
		}
		if ok, _ := stores[3].LeaseOAuthRefresh(ctx, "docs", "alice", "other", now, now.Add(time.Minute)); ok {
			t.Fatal("a second owner took a held lease")
		}
		// Another owner's release does not end it; the owner's does.
		if err := stores[3].ReleaseOAuthRefresh(ctx, "docs", "alice", "other"); err != nil {
			t.Fatal(err)
		}
		if ok, _ := stores[3].LeaseOAuthRefresh(ctx, "docs", "alice", "other", now, now.Add(time.Minute)); ok {
			t.Fatal("another owner's release ended the lease")
		}
		if err := stores[0].ReleaseOAuthRefresh(ctx, "docs", "alice", owner); err != nil {
			t.Fatal(err)
		}
		if ok, err := stores[3].LeaseOAuthRefresh(ctx, "docs", "alice", "other", now, now.Add(time.Minute)); err != nil || !ok {
			t.Fatalf("after release: %v %v", ok, err)
		}
		// A lease whose holder died ends at its until.
		if ok, _ := stores[1].LeaseOAuthRefresh(ctx, "docs", "alice", "late", now.Add(59*time.Second), now.Add(2*time.Minute)); ok {
			t.Fatal("took a lease before it ended")
		}
		if ok, err := stores[1].LeaseOAuthRefresh(ctx, "docs", "alice", "late", now.Add(time.Minute), now.Add(2*time.Minute)); err != nil || !ok {
			t.Fatalf("an ended lease was not taken: %v %v", ok, err)
		}
	})
}

// TestOAuthPendingTakenOnce: a started connect put by one replica is
// taken by exactly one of many concurrent callbacks on any replica; a
// person's started connects are bounded (the oldest dropped), and
// expired ones are dropped by the next Put.
func TestOAuthPendingTakenOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		dsn := newDSN(t)
		ctx := context.Background()
		a := openReplica(t, dsn, nil)
		b := openReplica(t, dsn, a)
		now := time.Now()
		p := OAuthPending{ID: "id-1", Connector: "docs", User: "alice", Bind: "b", Verifier: "sealed", Created: now, Expires: now.Add(10 * time.Minute)}
		if err := a.PutOAuthPending(ctx, p, 3); err != nil {
			t.Fatal(err)
		}
		var got atomic.Int64
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				s := a
				if i%2 == 1 {
					s = b
				}
				q, err := s.TakeOAuthPending(ctx, "id-1")
				switch {
				case err == nil:
					got.Add(1)
					if q.User != "alice" || q.Verifier != "sealed" || q.Expires.UnixNano() != p.Expires.UnixNano() {
						t.Errorf("taken = %+v", q)
					}
				case !errors.Is(err, ErrNotFound):
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if got.Load() != 1 {
			t.Fatalf("%d callbacks took one started connect, want 1", got.Load())
		}
		// Bounded per person: 5 started, the newest 3 remain.
		for i := range 5 {
			q := p
			q.ID, q.Created = fmt.Sprint("a-", i), now.Add(time.Duration(i)*time.Second)
			if err := a.PutOAuthPending(ctx, q, 3); err != nil {
				t.Fatal(err)
			}
		}
		bob := p
		bob.ID, bob.User = "bob-1", "bob"
		if err := b.PutOAuthPending(ctx, bob, 3); err != nil {
			t.Fatal(err)
		}
		if n, _ := a.CountOAuthPending(ctx, "alice"); n != 3 {
			t.Fatalf("alice has %d started connects, want 3", n)
		}
		for i, want := range []bool{false, false, true, true, true} {
			_, err := b.TakeOAuthPending(ctx, fmt.Sprint("a-", i))
			if (err == nil) != want {
				t.Errorf("a-%d kept = %v, want %v", i, err == nil, want)
			}
		}
		// Expired ones go at the next Put, anyone's.
		late := bob
		late.ID, late.User, late.Created = "carol-1", "carol", now.Add(11*time.Minute)
		late.Expires = late.Created.Add(time.Minute)
		if err := a.PutOAuthPending(ctx, late, 3); err != nil {
			t.Fatal(err)
		}
		if n, _ := a.CountOAuthPending(ctx, "bob"); n != 0 {
			t.Fatalf("bob's expired started connect is still there")
		}
	})
}

// openReplica opens dsn as another replica would; an SQLite file serves
// one gateway, so there the replicas share first.
func openReplica(t *testing.T, dsn string, first *Store) *Store {
	t.Helper()
	if first != nil && first.Kind() == SQLite {
		return first
	}
	s, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
