package store

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestCountUsageExact: 8 concurrent callers count the same tool for the
// same agent; each sees a different count, 1 to 8, and the sums follow.
// Buckets outside a window leave it. Both backends (conformance).
func TestCountUsageExact(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		s := openTemp(t)
		ctx := context.Background()
		now := time.Date(2026, 12, 2, 10, 30, 0, 0, time.UTC)
		scopes := []UsageScope{{"agent", "a"}, {"user", "alice"}, {"session", "s1"}}
		seen := make([]int64, 8)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w, err := s.CountUsage(ctx, "t.refund", scopes, 100, true, now)
				if err != nil {
					errs <- err
					return
				}
				seen[i] = w[0].Day.Count
				if w[0].Day.Sum != float64(w[0].Day.Count)*100 || w[1].Day.Count != w[0].Day.Count {
					errs <- &mismatch{w}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		got := map[int64]bool{}
		for _, n := range seen {
			got[n] = true
		}
		for n := int64(1); n <= 8; n++ {
			if !got[n] {
				t.Fatalf("counts seen %v: want each of 1..8 exactly once", seen)
			}
		}
		// Two hours later: out of the minute and hour windows, in the day.
		w, err := s.CountUsage(ctx, "t.refund", scopes[:1], 1, true, now.Add(2*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if w[0].Minute.Count != 1 || w[0].Hour.Count != 1 || w[0].Day.Count != 9 || w[0].Day.Sum != 801 {
			t.Fatalf("windows %+v: want minute 1, hour 1, day 9 (sum 801)", w[0])
		}
		// Another tool or agent is counted apart.
		if w, err = s.CountUsage(ctx, "t.other", scopes[:1], 0, true, now); err != nil || w[0].Day.Count != 1 {
			t.Fatalf("another tool: %+v %v", w, err)
		}
		// A day and more later, the old buckets are gone.
		if w, err = s.CountUsage(ctx, "t.refund", scopes[:1], 0, true, now.Add(26*time.Hour)); err != nil || w[0].Day.Count != 1 {
			t.Fatalf("a day later: %+v %v", w, err)
		}
	})
}

type mismatch struct{ w []UsageWindows }

func (m *mismatch) Error() string { return "windows disagree across scopes or sums" }

// TestUseGrantExact: a grant with max_uses 2 gives exactly two of eight
// concurrent callers a use (conformance).
func TestUseGrantExact(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		s := openTemp(t)
		ctx := context.Background()
		now := time.Now().UTC()
		h := HoldRow{ID: "h1", Status: "pending", Agent: "a", User: "alice", Tool: "t", SHA256: "x", Created: now, Expires: now.Add(time.Hour), Doc: []byte("{}")}
		if _, _, err := s.CreateHold(ctx, h, HoldCaps{Statuses: []string{"pending"}, Pending: "pending", PerAgent: 10, PerSandbox: 10}); err != nil {
			t.Fatal(err)
		}
		g := GrantRow{ID: "g1", Agent: "a", User: "alice", Tool: "t", SHA256: "x", Hold: "h1", GrantedBy: "bob", Created: now, Expires: now.Add(time.Hour), Doc: []byte("{}"), MaxUses: 2}
		if ok, err := s.DecideHoldGrant(ctx, "h1", "approved", "bob", "", now, g); err != nil || !ok {
			t.Fatalf("decide: %v %v", ok, err)
		}
		var mu sync.Mutex
		used := 0
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := s.UseGrant(ctx, "g1", now)
				if err != nil {
					t.Error(err)
				}
				if ok {
					mu.Lock()
					used++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if used != 2 {
			t.Fatalf("%d uses taken of a grant with max_uses 2", used)
		}
		if rows, err := s.MatchGrants(ctx, "a", "alice", "t", "x", now); err != nil || len(rows) != 0 {
			t.Fatalf("a used-up grant still matches: %v %v", rows, err)
		}
		if r, err := s.GetGrant(ctx, "g1"); err != nil || r.Uses != 2 || r.MaxUses != 2 {
			t.Fatalf("stored grant %+v %v: want uses 2 of 2", r, err)
		}
		if ok, err := s.ApprovedBefore(ctx, "", "t", "x"); err != nil || ok {
			t.Fatalf("no session: %v %v", ok, err)
		}
	})
}
