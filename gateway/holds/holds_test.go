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
	m := New(Options{Store: st, Execute: exec, MaxPendingPerAgent: 3,
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
		if _, _, err := m.Create(ctx, sample("4")); !errors.Is(err, ErrTooMany) {
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
