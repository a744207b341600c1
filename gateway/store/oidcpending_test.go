package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestUIOIDCPending: a pending sign-in is taken once however many
// callbacks race for it (on one store, as replicas would); expired rows
// go at the next put, and the table keeps at most max.
func TestUIOIDCPending(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		s := openTemp(t)
		ctx := context.Background()
		t0 := time.Unix(1_800_000_000, 0).UTC()
		put := func(id string, at time.Time, max int) {
			t.Helper()
			if err := s.PutUIOIDCPending(ctx, UIOIDCPending{IDHash: uiHash(id), Sealed: "sealed-" + id, Created: at, Expires: at.Add(10 * time.Minute)}, max); err != nil {
				t.Fatal(err)
			}
		}
		put("a", t0, 0)
		var got atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				p, err := s.TakeUIOIDCPending(ctx, uiHash("a"))
				switch {
				case err == nil && p.Sealed == "sealed-a" && p.Expires.Equal(t0.Add(10*time.Minute)):
					got.Add(1)
				case !errors.Is(err, ErrNotFound):
					t.Errorf("take: %+v %v", p, err)
				}
			})
		}
		wg.Wait()
		if got.Load() != 1 {
			t.Fatalf("8 racing takes got the pending sign-in %d times, want 1", got.Load())
		}
		// b expires; c, d, e are put with max 2: b is swept, then the
		// oldest beyond one.
		put("b", t0, 0)
		put("c", t0.Add(11*time.Minute), 0)
		put("d", t0.Add(12*time.Minute), 0)
		put("e", t0.Add(13*time.Minute), 2)
		for id, want := range map[string]bool{"b": false, "c": false, "d": true, "e": true} {
			_, err := s.TakeUIOIDCPending(ctx, uiHash(id))
			if (err == nil) != want || (err != nil && !errors.Is(err, ErrNotFound)) {
				t.Errorf("take %s: %v, want found %v", id, err, want)
			}
		}
		if err := s.PutUIOIDCPending(ctx, UIOIDCPending{IDHash: "short", Sealed: "x", Created: t0, Expires: t0.Add(time.Minute)}, 0); err == nil {
			t.Fatal("a malformed id hash was stored")
		}
	})
}
