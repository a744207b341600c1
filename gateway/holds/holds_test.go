package holds

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/store"
)

func newManager(t *testing.T, exec func(context.Context, Hold) (Result, bool)) (*Manager, *store.Store, *[]string) {
	t.Helper()
	st, err := store.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var mu sync.Mutex
	events := &[]string{}
	m := New(Options{Store: st, Execute: exec, MaxPendingPerAgent: 3, MaxPendingPerSandbox: 3,
		Audit: func(_ context.Context, ev string, h Hold, _ map[string]any) error {
			mu.Lock()
			*events = append(*events, ev)
			mu.Unlock()
			return nil
		}})
	return m, st, events
}

func sample(amount string) Hold {
	return Hold{Tool: "t.refund", Args: []byte(`{"body":{"amount":` + amount + `}}`),
		Request:   Request{Method: "POST", URL: "http://up/refunds", Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"amount":` + amount + `}`)},
		Caller:    Caller{Sandbox: "sb", Agent: "a", Session: "s", User: "alice"},
		Approvers: []string{"bob", "group:finance"}, Rule: "policies[0]", Expires: time.Now().Add(time.Hour), RequestID: "r1"}
}

func TestCanApprove(t *testing.T) {
	m := New(Options{})
	h := sample("1")
	for _, tc := range []struct {
		name string
		p    Person
		want error
	}{
		{"named user", Person{Name: "bob"}, nil},
		{"group member", Person{Name: "erin", Groups: []string{"finance"}}, nil},
		{"requester named via group", Person{Name: "alice", Groups: []string{"finance", "admins"}}, ErrSelfApproval},
		{"other group", Person{Name: "carol", Groups: []string{"support"}}, ErrNotApprover},
		{"empty name", Person{Groups: []string{"finance"}}, ErrNotApprover},
		{"group named like a user", Person{Name: "group:finance"}, ErrNotApprover},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := m.CanApprove(h, tc.p); !errors.Is(err, tc.want) {
				t.Fatalf("CanApprove = %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("requester named by user name", func(t *testing.T) {
		h := sample("1")
		h.Approvers = []string{"alice"}
		if err := m.CanApprove(h, Person{Name: "alice"}); !errors.Is(err, ErrSelfApproval) {
			t.Fatalf("CanApprove = %v, want ErrSelfApproval", err)
		}
	})
}

func TestRequestHash(t *testing.T) {
	a, b := sample("1").Request, sample("1").Request
	if a.Hash() != b.Hash() || len(a.Hash()) != 64 {
		t.Fatal("equal requests hash differently")
	}
	b.Body = []byte(`{"amount":2}`)
	c := a
	c.Headers = map[string][]string{"Content-Type": {"text/plain"}}
	if a.Hash() == b.Hash() || a.Hash() == c.Hash() {
		t.Fatal("different requests hash the same")
	}
}

// TestPerSandbox (THREATS B9): a sandbox gets its share of its agent's
// pending holds and no more, concurrent asks included, while another
// sandbox of the agent is still held; an identical ask from another
// sandbox gets a hold of its own, never the first sandbox's.
func TestPerSandbox(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if n := New(Options{Store: st, MaxPendingPerAgent: 100}).MaxPendingPerSandbox(); n != 25 {
		t.Errorf("default per-sandbox cap of 100 per agent: %d, want 25", n)
	}
	if n := New(Options{Store: st, MaxPendingPerAgent: 3}).MaxPendingPerSandbox(); n != 1 {
		t.Errorf("default per-sandbox cap of 3 per agent: %d, want 1", n)
	}
	if n := New(Options{Store: st, MaxPendingPerAgent: 3, MaxPendingPerSandbox: 9}).MaxPendingPerSandbox(); n != 3 {
		t.Errorf("per-sandbox cap 9 under an agent cap of 3: %d, want 3", n)
	}
	m := New(Options{Store: st, MaxPendingPerAgent: 6, MaxPendingPerSandbox: 2})
	in := func(sb, amount string) Hold {
		h := sample(amount)
		h.Caller.Sandbox = sb
		return h
	}
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := m.Create(ctx, in("sb-1", string(rune('a'+i))))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	var ok, capped int
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrTooManyForSandbox):
			capped++
		default:
			t.Errorf("Create: %v", err)
		}
	}
	if ok != 2 || capped != 8 {
		t.Errorf("10 concurrent asks from one sandbox: %d held, %d capped; want 2 and 8", ok, capped)
	}
	a, created, err := m.Create(ctx, in("sb-2", "7"))
	if err != nil || !created {
		t.Fatalf("another sandbox: %v %v, want a new hold", created, err)
	}
	b, created, err := m.Create(ctx, in("sb-3", "7"))
	if err != nil || !created || b.ID == a.ID {
		t.Fatalf("identical ask from a third sandbox: hold %s created %v %v; want a hold of its own (not %s)", b.ID, created, err, a.ID)
	}
	again, created, err := m.Create(ctx, in("sb-2", "7"))
	if err != nil || created || again.ID != a.ID {
		t.Fatalf("the same sandbox's re-send: hold %s created %v %v; want its own %s", again.ID, created, err, a.ID)
	}
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	var runs atomic.Int32
	m, st, events := newManager(t, func(context.Context, Hold) (Result, bool) {
		runs.Add(1)
		return Result{HTTPStatus: 200, Body: []byte(`{"ok":true}`)}, true
	})
	h, created, err := m.Create(ctx, sample("1"))
	if err != nil || !created || h.Status != Pending {
		t.Fatalf("Create = %+v %v %v", h, created, err)
	}
	t.Run("idempotent create", func(t *testing.T) {
		h2, created, err := m.Create(ctx, sample("1"))
		if err != nil || created || h2.ID != h.ID {
			t.Fatalf("second Create = %s %v %v, want the same hold", h2.ID, created, err)
		}
	})
	t.Run("cap per agent", func(t *testing.T) {
		for _, a := range []string{"2", "3"} {
			if _, _, err := m.Create(ctx, sample(a)); err != nil {
				t.Fatal(err)
			}
		}
		other := sample("4") // another sandbox: the agent's cap, not the sandbox's
		other.Caller.Sandbox = "sb-other"
		if _, _, err := m.Create(ctx, other); !errors.Is(err, ErrTooMany) {
			t.Fatalf("fourth pending hold: %v, want ErrTooMany", err)
		}
	})
	t.Run("wait sees the approval", func(t *testing.T) {
		sub, cancel := context.WithCancel(ctx)
		defer cancel()
		evs := m.Subscribe(sub)
		done := make(chan Hold, 1)
		go func() { w, _ := m.Wait(ctx, h.ID); done <- w }()
		time.Sleep(20 * time.Millisecond)
		if _, err := m.Approve(ctx, h.ID, Person{Name: "bob"}, "fine"); err != nil {
			t.Fatal(err)
		}
		w := <-done
		if w.Status != Done || w.Result == nil || string(w.Result.Body) != `{"ok":true}` || w.DecidedBy != "bob" {
			t.Fatalf("Wait = %+v", w)
		}
		if e := <-evs; e.Kind != "approved" || e.Hold.ID != h.ID {
			t.Fatalf("first event %s", e.Kind)
		}
		if _, err := m.Deny(ctx, h.ID, Person{Name: "bob"}, "late"); !errors.Is(err, ErrConflict) {
			t.Fatalf("deny after approve: %v, want ErrConflict", err)
		}
		if runs.Load() != 1 {
			t.Fatalf("%d executions", runs.Load())
		}
	})
	t.Run("recover marks executing as outcome unknown", func(t *testing.T) {
		hs, _ := m.List(ctx, Filter{Status: []Status{Pending}})
		if len(hs) == 0 {
			t.Fatal("no pending holds")
		}
		if ok, err := st.DecideHold(ctx, hs[0].ID, string(Running), "bob", "", time.Now()); !ok || err != nil {
			t.Fatal("could not simulate a crash mid-execution")
		}
		if err := m.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		got, _ := m.Get(ctx, hs[0].ID)
		if got.Status != Unknown {
			t.Fatalf("status after recovery %s, want %s", got.Status, Unknown)
		}
		if _, err := m.Approve(ctx, got.ID, Person{Name: "bob"}, ""); !errors.Is(err, ErrConflict) {
			t.Fatalf("approve an outcome-unknown hold: %v, want ErrConflict", err)
		}
		if runs.Load() != 1 {
			t.Fatal("a recovered hold was executed")
		}
	})
	want := map[string]bool{"hold_created": true, "hold_approved": true, "hold_executed": true, "hold_outcome_unknown": true}
	for _, e := range *events {
		delete(want, e)
	}
	if len(want) != 0 {
		t.Fatalf("audit events missing: %v (got %v)", want, *events)
	}
}

func TestExpiry(t *testing.T) {
	ctx := context.Background()
	m, _, _ := newManager(t, func(context.Context, Hold) (Result, bool) { t.Error("executed"); return Result{}, false })
	h := sample("1")
	h.Expires = time.Now().Add(100 * time.Millisecond)
	h, _, err := m.Create(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	w, err := m.Wait(ctx, h.ID)
	if err != nil || w.Status != Expired {
		t.Fatalf("Wait = %s %v, want expired", w.Status, err)
	}
	if _, err := m.Approve(ctx, h.ID, Person{Name: "bob"}, ""); !errors.Is(err, ErrExpired) {
		t.Fatalf("approve expired: %v, want ErrExpired", err)
	}
}
