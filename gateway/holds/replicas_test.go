package holds

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// replicas opens n stores on one fresh PostgreSQL database (n gateway
// replicas) and a Manager over each, all executing through exec.
func replicas(t *testing.T, srv *pgtest.Server, n int, exec func(context.Context, Hold) (Result, bool), audit func(string, Hold)) []*Manager {
	t.Helper()
	dsn := srv.SuperURL(srv.NewDatabaseT(t))
	ms := make([]*Manager, n)
	for i := range ms {
		st, err := store.Open(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		ms[i] = New(Options{Store: st, Execute: exec, MaxPendingPerAgent: 8, MaxPendingPerSandbox: 8,
			Audit: func(_ context.Context, ev string, h Hold, _ map[string]any) error {
				if audit != nil {
					audit(ev, h)
				}
				return nil
			}})
	}
	return ms
}

// TestApprovalRaceAcrossReplicas (THREATS B12): 50 approvals of one hold,
// spread over 3 replicas sharing PostgreSQL, execute it exactly once: one
// approval wins the conditional update (status and version), the 49
// others get ErrConflict, the upstream is called once and one
// hold_approved / hold_executed pair is audited.
func TestApprovalRaceAcrossReplicas(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	var sends atomic.Int32
	var mu sync.Mutex
	audited := map[string]int{}
	ms := replicas(t, srv, 3, func(context.Context, Hold) (Result, bool) {
		sends.Add(1)
		time.Sleep(5 * time.Millisecond) // a send takes a while: the racers overlap it
		return Result{HTTPStatus: 201, Answered: true}, true
	}, func(ev string, _ Hold) { mu.Lock(); audited[ev]++; mu.Unlock() })
	ctx := context.Background()
	for round := range 3 {
		h, created, err := ms[round].Create(ctx, sample(fmt.Sprint(round+1)))
		if err != nil || !created {
			t.Fatalf("Create on replica %d: %v %v", round, created, err)
		}
		sends.Store(0)
		mu.Lock()
		clear(audited)
		mu.Unlock()
		var wins, conflicts atomic.Int32
		var other sync.Map
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 50 {
			wg.Go(func() {
				<-start
				_, err := ms[i%3].Approve(ctx, h.ID, Person{Name: fmt.Sprint("approver", i), Groups: []string{"finance"}}, "ok")
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, ErrConflict):
					conflicts.Add(1)
				default:
					other.Store(i, err)
				}
			})
		}
		close(start)
		wg.Wait()
		other.Range(func(k, v any) bool { t.Errorf("approval %v: %v", k, v); return true })
		if wins.Load() != 1 || conflicts.Load() != 49 || sends.Load() != 1 {
			t.Fatalf("round %d: %d won, %d conflicts, %d sends; want 1, 49, 1", round, wins.Load(), conflicts.Load(), sends.Load())
		}
		mu.Lock()
		if audited["hold_approved"] != 1 || audited["hold_executed"] != 1 {
			t.Fatalf("round %d: audited %v; want one hold_approved and one hold_executed", round, audited)
		}
		mu.Unlock()
		for i, m := range ms {
			got, err := m.Get(ctx, h.ID)
			if err != nil || got.Status != Done || got.Version != 2 {
				t.Fatalf("round %d: replica %d sees %s version %d, %v; want done at version 2", round, i, got.Status, got.Version, err)
			}
		}
	}
}

// TestPendingCapAcrossReplicas: the per-agent cap on pending holds is one
// cap over every replica: 40 distinct asks racing on 3 replicas leave
// exactly MaxPendingPerAgent (8) pending; the rest get ErrTooMany. And
// the same ask re-sent on every replica makes one hold.
func TestPendingCapAcrossReplicas(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	ms := replicas(t, srv, 3, nil, nil)
	ctx := context.Background()
	var made, capped atomic.Int32
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			_, created, err := ms[i%3].Create(ctx, sample(fmt.Sprint(100+i)))
			switch {
			case err == nil && created:
				made.Add(1)
			case errors.Is(err, ErrTooMany):
				capped.Add(1)
			default:
				t.Errorf("Create %d: %v %v", i, created, err)
			}
		})
	}
	wg.Wait()
	if made.Load() != 8 || capped.Load() != 32 {
		t.Fatalf("%d made, %d capped; want 8 and 32", made.Load(), capped.Load())
	}
	// The same request, re-sent on every replica at once: one hold.
	srv2 := replicas(t, srv, 3, nil, nil)
	ids := make([]string, 9)
	for i := range ids {
		wg.Go(func() {
			h, _, err := srv2[i%3].Create(ctx, sample("7"))
			if err != nil {
				t.Errorf("Create: %v", err)
			}
			ids[i] = h.ID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] || id == "" {
			t.Fatalf("one request made several holds: %v", ids)
		}
	}
}
