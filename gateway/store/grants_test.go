package store

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestMigrationFourFromThree opens a database that a sluice with three
// migrations wrote (a pending hold in it) and checks that migration 4 adds
// the grants table and keeps the hold.
// TestMigrationFromThree opens a version-3 store (a hold in it, written as
// that version wrote it) with every later migration: 4 adds grants, 5 the
// hold's sandbox (” for the old hold).
func TestMigrationFromThree(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	testMaxVersion = 3
	old, err := Open(ctx, "sqlite:"+path)
	testMaxVersion = 0
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if _, err := old.db.sql.ExecContext(ctx, `INSERT INTO holds (id, status, agent, session, user, tool, sha256, created, expires, doc)
		VALUES ('h1', 'pending', 'a', '', 'u', 't', 'aa', ?, ?, '{}')`, now.UnixNano(), now.Add(time.Hour).UnixNano()); err != nil {
		t.Fatal(err)
	}
	if v, _ := old.SchemaVersion(ctx); v != 3 {
		t.Fatalf("old schema version %d", v)
	}
	old.Close()
	s, err := Open(ctx, "sqlite:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := s.SchemaVersion(ctx); err != nil || v != len(Migrations(SQLite)) {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, len(Migrations(SQLite)))
	}
	if h, err := s.GetHold(ctx, "h1"); err != nil || h.Status != "pending" || h.Sandbox != "" {
		t.Fatalf("hold after migration: %+v, %v", h, err)
	}
	if gs, err := s.ListGrants(ctx, true, now, 0); err != nil || len(gs) != 0 {
		t.Fatalf("grants after migration: %v, %v", gs, err)
	}
}

func TestGrantQueries(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		dsn := newDSN(t)
		s, err := Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		hold := func(id string) {
			t.Helper()
			if err := s.InsertHold(ctx, HoldRow{ID: id, Status: "pending", Agent: "a", User: "u", Tool: "t", SHA256: "aa",
				Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		grant := func(id, hold string, exp time.Duration) GrantRow {
			return GrantRow{ID: id, Agent: "a", User: "u", Tool: "t", SHA256: "aa", Hold: hold, GrantedBy: "bob",
				Created: now, Expires: now.Add(exp), Doc: []byte(`{"by_groups":["finance"]}`)}
		}

		t.Run("only the winning decision stores its grant", func(t *testing.T) {
			hold("h1")
			var wins atomic.Int32
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ok, err := s.DecideHoldGrant(ctx, "h1", "executing", "bob", "", now, grant("g"+string(rune('0'+i)), "h1", time.Hour))
					if err != nil {
						t.Error(err)
					}
					if ok {
						wins.Add(1)
					}
				}()
			}
			wg.Wait()
			gs, err := s.ListGrants(ctx, true, now, 0)
			if wins.Load() != 1 || err != nil || len(gs) != 1 || gs[0].Hold != "h1" || string(gs[0].Doc) != `{"by_groups":["finance"]}` {
				t.Fatalf("wins %d, grants %+v, %v", wins.Load(), gs, err)
			}
		})
		t.Run("a decided hold gets no grant", func(t *testing.T) {
			if ok, err := s.DecideHoldGrant(ctx, "h1", "executing", "carol", "", now, grant("late", "h1", time.Hour)); ok || err != nil {
				t.Fatalf("DecideHoldGrant = %v, %v", ok, err)
			}
			if _, err := s.GetGrant(ctx, "late"); err != ErrNotFound {
				t.Fatalf("GetGrant(late) = %v, want ErrNotFound", err)
			}
		})
		hold("h2")
		hold("h3")
		if ok, err := s.DecideHoldGrant(ctx, "h2", "executing", "bob", "", now, grant("short", "h2", time.Minute)); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if ok, err := s.DecideHoldGrant(ctx, "h3", "executing", "bob", "", now, grant("revoked", "h3", time.Hour)); !ok || err != nil {
			t.Fatal(ok, err)
		}
		t.Run("revoke once", func(t *testing.T) {
			if ok, err := s.RevokeGrant(ctx, "revoked", "carol", now); !ok || err != nil {
				t.Fatalf("RevokeGrant = %v, %v", ok, err)
			}
			if ok, err := s.RevokeGrant(ctx, "revoked", "dave", now); ok || err != nil {
				t.Fatalf("second RevokeGrant = %v, %v", ok, err)
			}
			g, err := s.GetGrant(ctx, "revoked")
			if err != nil || g.RevokedBy != "carol" || g.Revoked.IsZero() {
				t.Fatalf("GetGrant = %+v, %v", g, err)
			}
		})
		// The store survives a restart: reopen before matching.
		s.Close()
		if s, err = Open(ctx, dsn); err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for _, tc := range []struct {
			name                   string
			agent, user, tool, sha string
			at                     time.Time
			want                   []string
		}{
			{"exact key, now", "a", "u", "t", "aa", now, []string{"g?", "short"}},
			{"exact key, after the short one expired", "a", "u", "t", "aa", now.Add(2 * time.Minute), []string{"g?"}},
			{"other request hash", "a", "u", "t", "ab", now, nil},
			{"other user", "a", "v", "t", "aa", now, nil},
			{"other agent", "b", "u", "t", "aa", now, nil},
			{"other tool", "a", "u", "t2", "aa", now, nil},
			{"all expired", "a", "u", "t", "aa", now.Add(2 * time.Hour), nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				gs, err := s.MatchGrants(ctx, tc.agent, tc.user, tc.tool, tc.sha, tc.at)
				if err != nil || len(gs) != len(tc.want) {
					t.Fatalf("MatchGrants = %+v, %v; want %v", gs, err, tc.want)
				}
				for _, g := range gs {
					if g.ID == "revoked" || (g.ID == "short" && !tc.at.Before(g.Expires)) {
						t.Fatalf("matched %s", g.ID)
					}
				}
			})
		}
		t.Run("list active and all", func(t *testing.T) {
			active, err := s.ListGrants(ctx, false, now, 0)
			all, err2 := s.ListGrants(ctx, true, now, 0)
			if err != nil || err2 != nil || len(active) != 2 || len(all) != 3 {
				t.Fatalf("active %d (%v), all %d (%v)", len(active), err, len(all), err2)
			}
		})
		t.Run("delete", func(t *testing.T) {
			if err := s.DeleteGrant(ctx, "short"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.GetGrant(ctx, "short"); err != ErrNotFound {
				t.Fatalf("GetGrant after delete = %v", err)
			}
		})
	})
}
