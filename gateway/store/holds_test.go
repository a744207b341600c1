package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestHoldQueries(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s := openTemp(t)
		now := time.Now().UTC()
		mk := func(id, user, sha string, exp time.Duration) HoldRow {
			return HoldRow{ID: id, Status: "pending", Agent: "a", Sandbox: "sb", Session: "s", User: user, Tool: "t", SHA256: sha,
				Created: now, Expires: now.Add(exp), Doc: []byte(`{"x":1}`)}
		}
		for _, h := range []HoldRow{mk("h1", "alice", "aa", time.Hour), mk("h2", "bob", "bb", time.Hour), mk("h3", "alice", "cc", -time.Second)} {
			if err := s.InsertHold(ctx, h); err != nil {
				t.Fatal(err)
			}
		}
		t.Run("get", func(t *testing.T) {
			h, err := s.GetHold(ctx, "h1")
			if err != nil || h.User != "alice" || string(h.Doc) != `{"x":1}` || !h.Expires.Equal(now.Add(time.Hour)) {
				t.Fatalf("GetHold = %+v, %v", h, err)
			}
			if _, err := s.GetHold(ctx, "nope"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("missing hold: err = %v, want ErrNotFound", err)
			}
		})
		t.Run("find and count", func(t *testing.T) {
			if h, ok, err := s.FindHold(ctx, "a", "sb", "s", "bob", "t", "bb", []string{"pending"}); !ok || err != nil || h.ID != "h2" {
				t.Fatalf("FindHold = %v %v %v", h.ID, ok, err)
			}
			if _, ok, _ := s.FindHold(ctx, "a", "sb", "s", "alice", "t", "bb", []string{"pending"}); ok {
				t.Fatal("FindHold matched another user's hash")
			}
			if _, ok, _ := s.FindHold(ctx, "a", "sb-other", "s", "bob", "t", "bb", []string{"pending"}); ok {
				t.Fatal("FindHold matched another sandbox's hold (THREATS B9)")
			}
			if n, err := s.CountSandboxHolds(ctx, "a", "sb", []string{"pending"}); n != 3 || err != nil {
				t.Fatalf("CountSandboxHolds(sb) = %d, %v; want 3", n, err)
			}
			if n, err := s.CountSandboxHolds(ctx, "a", "sb-other", []string{"pending"}); n != 0 || err != nil {
				t.Fatalf("CountSandboxHolds(sb-other) = %d, %v; want 0", n, err)
			}
			if n, err := s.CountHolds(ctx, "a", []string{"pending"}); n != 3 || err != nil {
				t.Fatalf("CountHolds = %d, %v; want 3", n, err)
			}
		})
		t.Run("list by user", func(t *testing.T) {
			l, err := s.ListHolds(ctx, HoldQuery{User: "alice"})
			if err != nil || len(l) != 2 {
				t.Fatalf("ListHolds(alice) = %d rows, %v; want 2", len(l), err)
			}
		})
		t.Run("decide is conditional", func(t *testing.T) {
			var wins atomic.Int32
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					to := "executing"
					if i%2 == 1 {
						to = "denied"
					}
					ok, err := s.DecideHold(ctx, "h1", to, fmt.Sprint("p", i), "r", time.Now())
					if err != nil {
						t.Error(err)
					}
					if ok {
						wins.Add(1)
					}
				}()
			}
			wg.Wait()
			if wins.Load() != 1 {
				t.Fatalf("%d deciders won, want exactly 1", wins.Load())
			}
			if ok, _ := s.DecideHold(ctx, "h3", "executing", "p", "", time.Now()); ok {
				t.Fatal("an expired hold was decided")
			}
		})
		t.Run("finish, expire and mark", func(t *testing.T) {
			h, _ := s.GetHold(ctx, "h1")
			if h.Status == "executing" {
				if ok, err := s.FinishHold(ctx, "h1", "executing", "executed", []byte("r")); !ok || err != nil {
					t.Fatalf("FinishHold = %v, %v", ok, err)
				}
			}
			if ok, _ := s.FinishHold(ctx, "h1", "executing", "executed", nil); ok {
				t.Fatal("FinishHold moved a hold that was not in the from status")
			}
			ids, err := s.ExpireHolds(ctx, time.Now())
			if err != nil || len(ids) != 1 || ids[0] != "h3" {
				t.Fatalf("ExpireHolds = %v, %v; want [h3]", ids, err)
			}
			if ok, _ := s.DecideHold(ctx, "h2", "executing", "p", "", time.Now()); !ok {
				t.Fatal("h2 not decided")
			}
			ids, err = s.MarkHolds(ctx, "executing", "outcome_unknown")
			if err != nil || len(ids) != 1 || ids[0] != "h2" {
				t.Fatalf("MarkHolds = %v, %v; want [h2]", ids, err)
			}
		})
	})
}
