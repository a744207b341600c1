package holds

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/store"
)

func ok200(context.Context, Hold) (Result, bool) {
	return Result{HTTPStatus: 200, Body: []byte(`{"ok":true}`)}, true
}

// TestApproveAlways: who may grant, the lifetime bounds, and what the
// grant is bound to.
func TestApproveAlways(t *testing.T) {
	ctx := context.Background()
	m, _, events := newManager(t, ok200)
	for _, tc := range []struct {
		name string
		p    Person
		ttl  time.Duration
		want error
	}{
		{"requester grants own call (E1)", Person{Name: "alice", Groups: []string{"finance"}}, 0, ErrSelfApproval},
		{"not an approver", Person{Name: "carol"}, 0, ErrNotApprover},
		{"longer than 24h", Person{Name: "bob"}, 25 * time.Hour, ErrGrantTTL},
		{"negative", Person{Name: "bob"}, -time.Hour, ErrGrantTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _, err := m.Create(ctx, sample("1"))
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := m.ApproveAlways(ctx, h.ID, tc.p, "", tc.ttl); !errors.Is(err, tc.want) {
				t.Fatalf("ApproveAlways = %v, want %v", err, tc.want)
			}
			if got, _ := m.Get(ctx, h.ID); got.Status != Pending {
				t.Fatalf("hold became %s", got.Status)
			}
			if gs, _ := m.Grants(ctx, true, 0); len(gs) != 0 {
				t.Fatalf("grants made: %+v", gs)
			}
		})
	}
	t.Run("group member grants, default 8h", func(t *testing.T) {
		h, _, err := m.Create(ctx, sample("1"))
		if err != nil {
			t.Fatal(err)
		}
		done, g, err := m.ApproveAlways(ctx, h.ID, Person{Name: "erin", Groups: []string{"finance"}}, "recurring", 0)
		if err != nil || done.Status != Done {
			t.Fatalf("ApproveAlways = %s, %v", done.Status, err)
		}
		want := Grant{ID: g.ID, Agent: "a", User: "alice", Tool: "t.refund", SHA256: h.SHA256, Hold: h.ID, By: "erin",
			ByGroups: []string{"finance"}, Reason: "recurring", Created: g.Created, Expires: g.Created.Add(DefaultGrantTTL)}
		if g.ID == "" || !grantEqual(g, want) {
			t.Fatalf("grant %+v\nwant  %+v", g, want)
		}
		stored, err := m.Grant(ctx, g.ID)
		if err != nil || !grantEqual(stored, want) {
			t.Fatalf("stored grant %+v, %v", stored, err)
		}
		if !slices.Contains(*events, "hold_approved") {
			t.Fatalf("events %v", *events)
		}
	})
}

func grantEqual(a, b Grant) bool {
	return a.ID == b.ID && a.Agent == b.Agent && a.User == b.User && a.Tool == b.Tool && a.SHA256 == b.SHA256 &&
		a.Hold == b.Hold && a.By == b.By && slices.Equal(a.ByGroups, b.ByGroups) && a.Reason == b.Reason &&
		a.Created.Equal(b.Created) && a.Expires.Equal(b.Expires) && a.Revoked.Equal(b.Revoked) && a.RevokedBy == b.RevokedBy
}

// TestMatchGrant is THREATS E7 at the manager: only the exact key
// matches, only while the granter could still approve, never after
// revocation or expiry, and grants survive a restart.
func TestMatchGrant(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "g.db")
	st, err := store.Open(ctx, "sqlite:"+path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var now = time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var audited []map[string]any
	opts := Options{Store: st, Execute: ok200, Now: clock, Audit: func(_ context.Context, ev string, h Hold, f map[string]any) error {
		if ev == "grant_revoked" {
			audited = append(audited, f)
		}
		return nil
	}}
	m := New(opts)
	h, _, err := m.Create(ctx, sample("5"))
	if err != nil {
		t.Fatal(err)
	}
	_, g, err := m.ApproveAlways(ctx, h.ID, Person{Name: "bob"}, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Restart: a new store handle and manager on the same file.
	st.Close()
	if st, err = store.Open(ctx, "sqlite:"+path); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	opts.Store = st
	m = New(opts)

	key := GrantKey{Agent: "a", User: "alice", Tool: "t.refund", SHA256: h.SHA256}
	approvers := []string{"bob", "group:finance"}
	other := sample("6").Request.Hash()
	for _, tc := range []struct {
		name      string
		key       GrantKey
		approvers []string
		want      bool
	}{
		{"identical call", key, approvers, true},
		{"other arguments", GrantKey{Agent: "a", User: "alice", Tool: "t.refund", SHA256: other}, approvers, false},
		{"other user", GrantKey{Agent: "a", User: "mallory", Tool: "t.refund", SHA256: h.SHA256}, approvers, false},
		{"other agent", GrantKey{Agent: "b", User: "alice", Tool: "t.refund", SHA256: h.SHA256}, approvers, false},
		{"other tool", GrantKey{Agent: "a", User: "alice", Tool: "t.refund2", SHA256: h.SHA256}, approvers, false},
		{"granter no longer an approver of the rule", key, []string{"group:finance"}, false},
		{"rule names no approvers", key, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := m.MatchGrant(ctx, tc.key, tc.approvers)
			if err != nil || ok != tc.want || (ok && got.ID != g.ID) {
				t.Fatalf("MatchGrant = %+v, %v, %v; want %v", got, ok, err, tc.want)
			}
		})
	}
	t.Run("expired", func(t *testing.T) {
		mu.Lock()
		now = now.Add(61 * time.Minute)
		mu.Unlock()
		defer func() { mu.Lock(); now = now.Add(-61 * time.Minute); mu.Unlock() }()
		if _, ok, err := m.MatchGrant(ctx, key, approvers); ok || err != nil {
			t.Fatalf("expired grant matched: %v, %v", ok, err)
		}
	})
	t.Run("revoked", func(t *testing.T) {
		r, err := m.RevokeGrant(ctx, g.ID, Person{Name: "carol"})
		if err != nil || r.RevokedBy != "carol" || r.Revoked.IsZero() {
			t.Fatalf("RevokeGrant = %+v, %v", r, err)
		}
		if _, ok, err := m.MatchGrant(ctx, key, approvers); ok || err != nil {
			t.Fatalf("revoked grant matched: %v, %v", ok, err)
		}
		if _, err := m.RevokeGrant(ctx, g.ID, Person{Name: "carol"}); !errors.Is(err, ErrGrantRevoked) {
			t.Fatalf("second revoke: %v, want ErrGrantRevoked", err)
		}
		if _, err := m.RevokeGrant(ctx, "nope", Person{Name: "carol"}); !errors.Is(err, ErrGrantNotFound) {
			t.Fatalf("revoke unknown: %v, want ErrGrantNotFound", err)
		}
		if len(audited) != 1 || audited[0]["grant"] != g.ID || audited[0]["by"] != "carol" {
			t.Fatalf("grant_revoked records %v", audited)
		}
		if gs, _ := m.Grants(ctx, false, 0); len(gs) != 0 {
			t.Fatalf("active grants after revoke: %+v", gs)
		}
	})
}

// TestUnauditedGrantDoesNotStand: an approval whose audit record cannot
// be written is not executed, and its grant is removed.
func TestUnauditedGrantDoesNotStand(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := New(Options{Store: st, Execute: func(context.Context, Hold) (Result, bool) { t.Error("executed"); return Result{}, false },
		Audit: func(_ context.Context, ev string, _ Hold, _ map[string]any) error {
			if ev == "hold_approved" {
				return errors.New("disk full")
			}
			return nil
		}})
	h, _, err := m.Create(ctx, sample("1"))
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := m.ApproveAlways(ctx, h.ID, Person{Name: "bob"}, "", time.Hour)
	if err != nil || got.Status != Failed {
		t.Fatalf("ApproveAlways = %s, %v; want failed", got.Status, err)
	}
	if gs, _ := m.Grants(ctx, true, 0); len(gs) != 0 {
		t.Fatalf("an unaudited grant stands: %+v", gs)
	}
}

// BenchmarkMatchGrant is the lookup every ask decision makes before it is
// held, with 1000 grants for other requests in the store.
func BenchmarkMatchGrant(b *testing.B) {
	ctx := context.Background()
	st, err := store.Open(ctx, "sqlite:"+filepath.Join(b.TempDir(), "g.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	m := New(Options{Store: st, Execute: ok200, MaxPendingPerAgent: 2000})
	var key GrantKey
	for i := range 1000 {
		h, _, err := m.Create(ctx, sample(strconv.Itoa(i)))
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := m.ApproveAlways(ctx, h.ID, Person{Name: "bob"}, "", time.Hour); err != nil {
			b.Fatal(err)
		}
		key = GrantKey{Agent: "a", User: "alice", Tool: "t.refund", SHA256: h.SHA256}
	}
	miss := key
	miss.SHA256 = sample("x").Request.Hash()
	for _, bc := range []struct {
		name string
		key  GrantKey
		want bool
	}{{"hit", key, true}, {"miss", miss, false}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, ok, err := m.MatchGrant(ctx, bc.key, []string{"bob"}); err != nil || ok != bc.want {
					b.Fatal(ok, err)
				}
			}
		})
	}
}

// TestGrantMaxUses: a grant with max_uses 2 lets exactly two of eight
// concurrent calls through, counts them (uses, uses_left), and then
// matches no more: the policy decides again. A bad limit is refused.
func TestGrantMaxUses(t *testing.T) {
	ctx := context.Background()
	m, _, _ := newManager(t, ok200)
	h, _, err := m.Create(ctx, sample("7"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.ApproveGrant(ctx, h.ID, Person{Name: "bob"}, "", GrantTerms{MaxUses: MaxGrantUses + 1}); !errors.Is(err, ErrGrantUses) {
		t.Fatalf("max_uses over the bound: %v, want ErrGrantUses", err)
	}
	_, g, err := m.ApproveGrant(ctx, h.ID, Person{Name: "bob"}, "", GrantTerms{TTL: time.Hour, MaxUses: 2})
	if err != nil || g.MaxUses != 2 || g.UsesLeft == nil || *g.UsesLeft != 2 {
		t.Fatalf("ApproveGrant = %+v, %v; want max_uses 2, 2 left", g, err)
	}
	key := GrantKey{Agent: "a", User: "alice", Tool: "t.refund", SHA256: h.SHA256}
	var mu sync.Mutex
	var got []Grant
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, ok, err := m.MatchGrant(ctx, key, []string{"bob"})
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				got = append(got, u)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(got) != 2 {
		t.Fatalf("%d calls let through by a grant with max_uses 2", len(got))
	}
	stored, err := m.Grant(ctx, g.ID)
	if err != nil || stored.Uses != 2 || stored.UsesLeft == nil || *stored.UsesLeft != 0 || stored.Active(time.Now()) {
		t.Fatalf("stored %+v, %v: want 2 uses, 0 left, inactive", stored, err)
	}
	if active, err := m.Grants(ctx, false, 0); err != nil || len(active) != 0 {
		t.Fatalf("a used-up grant is listed as active: %v %v", active, err)
	}
}
