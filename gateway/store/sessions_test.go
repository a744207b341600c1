package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSessionQueries(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s := openTemp(t)
		now := time.Now().UTC()
		for _, h := range []HoldRow{
			{ID: "p1", Status: "pending", Agent: "a", Session: "s1", Tool: "t", SHA256: "x", Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{}`)},
			{ID: "p2", Status: "pending", Agent: "a", Session: "s2", Tool: "t", SHA256: "x", Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{}`)},
			{ID: "d1", Status: "denied", Agent: "a", Session: "s1", Tool: "t", SHA256: "y", Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{}`)},
		} {
			if err := s.InsertHold(ctx, h); err != nil {
				t.Fatal(err)
			}
		}
		e, created, err := s.EndSession(ctx, "s1", "bob", now)
		if err != nil || !created || e.EndedBy != "bob" || !e.Ended.Equal(now) || len(e.Holds) != 0 {
			t.Fatalf("EndSession = %+v, %v, %v", e, created, err)
		}
		t.Run("a repeat keeps the first end", func(t *testing.T) {
			e2, created, err := s.EndSession(ctx, "s1", "carol", now.Add(time.Minute))
			if err != nil || created || e2.EndedBy != "bob" || !e2.Ended.Equal(now) {
				t.Fatalf("repeat = %+v, %v, %v", e2, created, err)
			}
		})
		t.Run("ended or not", func(t *testing.T) {
			for _, tc := range []struct {
				session string
				want    bool
			}{{"s1", true}, {"s2", false}, {"", false}} {
				if got, err := s.SessionEnded(ctx, tc.session); err != nil || got != tc.want {
					t.Errorf("SessionEnded(%q) = %v, %v; want %v", tc.session, got, err, tc.want)
				}
			}
		})
		t.Run("cut holds only the session's pending ones, once", func(t *testing.T) {
			ids, err := s.CutSessionHolds(ctx, "s1", now)
			if err != nil || !slices.Equal(ids, []string{"p1"}) {
				t.Fatalf("cut = %v, %v; want [p1]", ids, err)
			}
			// The cut hold can no longer be decided (DecideHold wants expires > now).
			if ok, err := s.DecideHold(ctx, "p1", "executing", "bob", "", now); err != nil || ok {
				t.Fatalf("decide after cut = %v, %v; want false", ok, err)
			}
			if ids, err := s.CutSessionHolds(ctx, "s1", now); err != nil || len(ids) != 0 {
				t.Fatalf("second cut = %v, %v; want none", ids, err)
			}
			if h, _ := s.GetHold(ctx, "p2"); !h.Expires.Equal(now.Add(time.Hour)) {
				t.Fatalf("another session's hold was cut: %+v", h)
			}
		})
		t.Run("holds are recorded once", func(t *testing.T) {
			for range 2 {
				e, err := s.AddSessionHolds(ctx, "s1", []string{"p1"})
				if err != nil || !slices.Equal(e.Holds, []string{"p1"}) {
					t.Fatalf("AddSessionHolds = %+v, %v", e, err)
				}
			}
			if _, err := s.AddSessionHolds(ctx, "nope", []string{"x"}); !errors.Is(err, ErrNotFound) {
				t.Fatalf("unknown session: %v, want ErrNotFound", err)
			}
		})
	})
}

// BenchmarkSessionEnded is the lookup every tool call and proxy request of
// a session makes.
func BenchmarkSessionEnded(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, "sqlite:"+b.TempDir()+"/s.db")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := range 1000 {
		if _, _, err := s.EndSession(ctx, fmt.Sprintf("s-%d", i), "bob", time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if ended, err := s.SessionEnded(ctx, "live"); err != nil || ended {
				b.Fatal(ended, err)
			}
		}
	})
}

func TestSessionEndedCache(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s := openTemp(t)
		t.Run("an end is seen at once", func(t *testing.T) {
			if got, err := s.SessionEnded(ctx, "c1"); err != nil || got {
				t.Fatalf("before the end: %v, %v; want false", got, err)
			}
			if _, _, err := s.EndSession(ctx, "c1", "bob", time.Now()); err != nil {
				t.Fatal(err)
			}
			if got, err := s.SessionEnded(ctx, "c1"); err != nil || !got {
				t.Fatalf("after the end: %v, %v; want true", got, err)
			}
		})
		t.Run("a warm answer does not ask the database", func(t *testing.T) {
			if got, _ := s.SessionEnded(ctx, "c1"); !got {
				t.Fatal("c1 not ended")
			}
			// Removed behind the store's back (nothing in sluice deletes ends):
			// the cached answer stands, which shows the lookup was not re-run.
			if _, err := s.db.sql.ExecContext(ctx, `DELETE FROM ended_sessions WHERE session = 'c1'`); err != nil {
				t.Fatal(err)
			}
			if got, err := s.SessionEnded(ctx, "c1"); err != nil || !got {
				t.Fatalf("cached answer = %v, %v; want true", got, err)
			}
		})
		t.Run("a lookup that raced an end keeps nothing", func(t *testing.T) {
			var c endedCache
			_, _, gen := c.get("x") // a lookup starts and reads "not ended" …
			c.ended("x", true)      // … an end commits meanwhile …
			c.put("x", false, gen)  // … and the stale answer must not land
			if ended, ok, _ := c.get("x"); !ok || !ended {
				t.Fatalf("get = %v, %v; want ended", ended, ok)
			}
		})
		t.Run("a failed end drops the entry", func(t *testing.T) {
			var c endedCache
			_, _, gen := c.get("y")
			c.put("y", false, gen)
			c.ended("y", false)
			if _, ok, _ := c.get("y"); ok {
				t.Fatal("entry kept after an end whose outcome is unknown")
			}
		})
		t.Run("bounded", func(t *testing.T) {
			var c endedCache
			for i := range endedCacheMax + 10 {
				_, _, gen := c.get("")
				c.put(fmt.Sprint(i), false, gen)
			}
			if len(c.m) > endedCacheMax {
				t.Fatalf("%d entries, max %d", len(c.m), endedCacheMax)
			}
		})
	})
}

// The cache is sound only if no other process ends sessions in the same
// file, so a second store on it is refused until the first closes.
func TestStoreFileIsExclusive(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := Open(ctx, "sqlite:"+path)
	must(t, err)
	if _, err := Open(ctx, "sqlite:"+path); err == nil || !strings.Contains(err.Error(), "in use by another gateway process") {
		t.Fatalf("second Open: err = %v; want in use", err)
	}
	must(t, s.Close())
	s, err = Open(ctx, "sqlite:"+path)
	must(t, err)
	must(t, s.Close())
}
