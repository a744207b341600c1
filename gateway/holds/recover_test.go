package holds

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/store"
)

// auditRec is one record a test's Audit hook received.
type auditRec struct {
	event, hold string
	fields      map[string]any
}

type auditLog struct {
	mu   sync.Mutex
	recs []auditRec
}

func (a *auditLog) add(_ context.Context, ev string, h Hold, f map[string]any) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recs = append(a.recs, auditRec{ev, h.ID, f})
	return nil
}

// of returns the events recorded for hold id, in order, and their fields.
func (a *auditLog) of(id string) ([]string, []map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var evs []string
	var fs []map[string]any
	for _, r := range a.recs {
		if r.hold == id {
			evs, fs = append(evs, r.event), append(fs, r.fields)
		}
	}
	return evs, fs
}

// crashed stores a hold that was approved and executing when "the last
// process" stopped, and returns it with a fresh Manager over the same
// sqlite store: the next process, which has not recovered yet.
func crashed(t *testing.T, h Hold, exec func(context.Context, Hold) (Result, bool)) (*Manager, Hold, *auditLog) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	before := New(Options{Store: st, Execute: func(context.Context, Hold) (Result, bool) {
		t.Error("the crashed process executed")
		return Result{}, false
	}})
	h, _, err = before.Create(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := st.DecideHold(ctx, h.ID, string(Running), "bob", "", time.Now()); !ok || err != nil {
		t.Fatalf("simulate a crash mid-execution: %v %v", ok, err)
	}
	al := &auditLog{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	return New(Options{Store: st, Execute: exec, Audit: al.add, Logger: quiet}), h, al
}

func keyed(amount string) Hold {
	h := sample(amount)
	h.IdempotencyHeader = "Idempotency-Key"
	return h
}

// TestRecover covers Recover's two branches (THREATS G2): a hold left
// executing whose operation is not idempotency-keyed becomes
// outcome_unknown and is never sent; a keyed one is audited
// hold_reconciling, not sent during Recover, then re-sent once by Run
// through Execute and finished by the upstream's answer (reconciled=true),
// or outcome_unknown when the re-send got no answer.
func TestRecover(t *testing.T) {
	answer := Result{HTTPStatus: 200, Body: []byte(`{"charge":"ch_1"}`), Answered: true}
	cases := []struct {
		name      string
		hold      Hold
		reply     Result
		ok        bool
		wantSends int32
		want      Status
		wantEvs   []string
		keyFrom   string // hold_reconciling's idempotency_key_from
	}{
		{"not keyed: outcome unknown, never re-sent", sample("1"), answer, true, 0, Unknown,
			[]string{"hold_outcome_unknown"}, ""},
		{"keyed: re-sent once with the hold id as key, executed", keyed("1"), answer, true, 1, Done,
			[]string{"hold_reconciling", "hold_executed"}, "hold_id"},
		{"keyed with the agent's own key", func() Hold {
			h := keyed("1")
			h.Request.Headers["Idempotency-Key"] = []string{"agent-key-1"}
			return h
		}(), answer, true, 1, Done, []string{"hold_reconciling", "hold_executed"}, "arguments"},
		{"keyed, upstream answered with a failure: failed", keyed("1"),
			Result{HTTPStatus: 502, Body: []byte(`{"error":{"code":"upstream_error"}}`), Answered: true}, false, 1, Failed,
			[]string{"hold_reconciling", "hold_executed"}, "hold_id"},
		{"keyed, no answer to the re-send: outcome unknown, not retried", keyed("1"),
			Result{HTTPStatus: 502, Body: []byte(`{"error":{"code":"upstream_error"}}`)}, false, 1, Unknown,
			[]string{"hold_reconciling", "hold_outcome_unknown"}, "hold_id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var sends atomic.Int32
			var mu sync.Mutex
			var sent Hold
			m, h, al := crashed(t, tc.hold, func(_ context.Context, h Hold) (Result, bool) {
				mu.Lock()
				sent = h
				mu.Unlock()
				sends.Add(1)
				return tc.reply, tc.ok
			})
			if err := m.Recover(ctx); err != nil {
				t.Fatal(err)
			}
			if n := sends.Load(); n != 0 {
				t.Fatalf("Recover sent %d times; it must not wait for any upstream", n)
			}
			got, _ := m.Get(ctx, h.ID)
			if keyedHold := tc.hold.IdempotencyHeader != ""; keyedHold && got.Status != Running || !keyedHold && got.Status != Unknown {
				t.Fatalf("status right after Recover: %s", got.Status)
			}
			go m.Run(ctx)
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			got, err := m.Wait(wctx, h.ID)
			wcancel()
			if err != nil || got.Status != tc.want {
				t.Fatalf("after Run: %s %v, want %s", got.Status, err, tc.want)
			}
			m.startReconcile(ctx, m.takeReconcile()) // a second start has nothing left to send
			time.Sleep(50 * time.Millisecond)
			if n := sends.Load(); n != tc.wantSends {
				t.Fatalf("%d sends, want %d", n, tc.wantSends)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.wantSends > 0 && (sent.ID != h.ID || sent.IdempotencyHeader != "Idempotency-Key" || sent.SHA256 != h.SHA256) {
				t.Errorf("re-sent %+v, want the stored hold with its key header", sent)
			}
			if tc.want == Done && (got.Result == nil || string(got.Result.Body) != string(tc.reply.Body)) {
				t.Errorf("result %+v, want the upstream's reply", got.Result)
			}
			evs, fields := al.of(h.ID)
			if !slices.Equal(evs, tc.wantEvs) {
				t.Fatalf("audit %v, want %v", evs, tc.wantEvs)
			}
			if tc.keyFrom != "" {
				if f := fields[0]; f["idempotency_header"] != "Idempotency-Key" || f["idempotency_key_from"] != tc.keyFrom {
					t.Errorf("hold_reconciling fields %v, want the header name and key_from %s", f, tc.keyFrom)
				}
				if f := fields[1]; f["reconciled"] != true {
					t.Errorf("%s fields %v, want reconciled=true", evs[1], f)
				}
			}
			if _, err := m.Approve(ctx, h.ID, Person{Name: "bob"}, "again"); err != ErrConflict {
				t.Errorf("approve after recovery: %v, want ErrConflict", err)
			}
		})
	}
}

// TestReconcileOneInFlight: within one process a hold is re-sent at most
// once at a time, however often recovery and the re-send start run while
// the first re-send waits for its upstream; and Recover never waits for it.
func TestReconcileOneInFlight(t *testing.T) {
	ctx := context.Background()
	release := make(chan struct{})
	var sends, inflight, maxInflight atomic.Int32
	m, h, al := crashed(t, keyed("1"), func(context.Context, Hold) (Result, bool) {
		sends.Add(1)
		n := inflight.Add(1)
		for {
			old := maxInflight.Load()
			if n <= old || maxInflight.CompareAndSwap(old, n) {
				break
			}
		}
		<-release
		inflight.Add(-1)
		return Result{HTTPStatus: 200, Body: []byte(`{"ok":true}`), Answered: true}, true
	})
	if err := m.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	m.startReconcile(ctx, m.takeReconcile())
	deadline := time.Now().Add(10 * time.Second)
	for sends.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// The hold is still executing: recovering again finds it claimed by
	// the re-send in flight (no second hold_reconciling), and concurrent
	// starts have nothing to send.
	done := make(chan error, 1)
	go func() { done <- m.Recover(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Recover blocked on an in-flight re-send")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); m.startReconcile(ctx, m.takeReconcile()) }()
	}
	wg.Wait()
	time.Sleep(100 * time.Millisecond)
	if n := sends.Load(); n != 1 {
		t.Fatalf("%d re-sends in flight for one hold, want 1", n)
	}
	close(release)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := m.Wait(wctx, h.ID)
	if err != nil || got.Status != Done {
		t.Fatalf("after the re-send: %s %v, want executed", got.Status, err)
	}
	m.startReconcile(ctx, m.takeReconcile())
	time.Sleep(50 * time.Millisecond)
	if n, mx := sends.Load(), maxInflight.Load(); n != 1 || mx != 1 {
		t.Fatalf("%d sends (at most %d at once), want exactly 1", n, mx)
	}
	evs, _ := al.of(h.ID)
	if want := []string{"hold_reconciling", "hold_executed"}; !slices.Equal(evs, want) {
		t.Fatalf("audit %v, want %v", evs, want)
	}
}
