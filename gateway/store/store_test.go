package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCountAndUsage(t *testing.T) {
	ctx := context.Background()
	eachBackend(t, func(t *testing.T) {
		for _, dsn := range []string{"sqlite::memory:", newDSN(t)} {
			if strings.HasPrefix(dsn, "sqlite::memory:") && strings.Contains(t.Name(), "/postgres") {
				continue
			}
			s, err := Open(ctx, dsn)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			clock := time.Date(2026, 3, 1, 10, 59, 30, 0, time.UTC)
			s.now = func() time.Time { return clock }
			for range 3 {
				must(t, s.CountCall(ctx, "bot", "billing.list", "allow"))
			}
			must(t, s.CountCall(ctx, "bot", "billing.list", "block"))
			clock = clock.Add(time.Minute) // next hour
			must(t, s.CountCall(ctx, "bot", "billing.list", "allow"))

			got, err := s.Usage(ctx, 0)
			must(t, err)
			want := []Usage{
				{"2026-03-01T11:00:00Z", "bot", "billing.list", "allow", 1},
				{"2026-03-01T10:00:00Z", "bot", "billing.list", "allow", 3},
				{"2026-03-01T10:00:00Z", "bot", "billing.list", "block", 1},
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("Usage = %v\nwant    %v", got, want)
			}
			if got, _ := s.Usage(ctx, 1); len(got) != 1 || got[0].Hour != "2026-03-01T11:00:00Z" {
				t.Fatalf("Usage(limit 1) = %v", got)
			}
			if v, err := s.SchemaVersion(ctx); err != nil || v != len(Migrations(s.Kind())) {
				t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, len(Migrations(s.Kind())))
			}
		}
	})
}

func TestConcurrentCountCall(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, err := Open(ctx, newDSN(t))
		must(t, err)
		defer s.Close()
		const goroutines, each = 20, 25
		var wg sync.WaitGroup
		errs := make(chan error, goroutines*each)
		for range goroutines {
			wg.Go(func() {
				for range each {
					errs <- s.CountCall(ctx, "bot", "t", "allow")
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			must(t, err)
		}
		got, err := s.Usage(ctx, 10)
		must(t, err)
		if len(got) != 1 || got[0].Count != goroutines*each {
			t.Fatalf("Usage = %v, want one row counting %d", got, goroutines*each)
		}
	})
}

func TestReopenKeepsDataAndFileModes(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "sluice.db")
	s, err := Open(ctx, "sqlite:"+path)
	must(t, err)
	must(t, s.CountCall(ctx, "a", "t", "ask"))
	must(t, s.Close())

	s, err = Open(ctx, "sqlite:"+path)
	must(t, err)
	defer s.Close()
	got, err := s.Usage(ctx, 0)
	must(t, err)
	if len(got) != 1 || got[0].Count != 1 || got[0].Action != "ask" {
		t.Fatalf("Usage after reopen = %v", got)
	}
	var mode string
	must(t, s.db.sql.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode))
	if mode != "wal" {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
	var fk int
	must(t, s.db.sql.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk))
	if fk != 1 {
		t.Errorf("foreign_keys = %d, want 1", fk)
	}
	var n int
	must(t, s.db.sql.QueryRowContext(ctx, "SELECT COUNT(*) FROM schema_migrations").Scan(&n))
	if n != len(Migrations(SQLite)) {
		t.Errorf("schema_migrations has %d rows after reopen, want %d (a migration ran twice?)", n, len(Migrations(SQLite)))
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, path: 0o600, path + "-wal": 0o600} {
		fi, err := os.Stat(p)
		must(t, err)
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode = %#o, want %#o", filepath.Base(p), fi.Mode().Perm(), want)
		}
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		dsn := newDSN(t)
		s, err := Open(ctx, dsn)
		must(t, err)
		_, err = s.db.sql.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied) VALUES (99, 'x')`)
		must(t, err)
		must(t, s.Close())
		if _, err := Open(ctx, dsn); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
			t.Fatalf("Open of a newer schema: err = %v", err)
		}
	})
}

func TestBadDSN(t *testing.T) {
	cases := []struct{ name, dsn, want string }{
		// A server across a network without an explicit sslmode would get
		// pgx's "prefer": plaintext fallback, no certificate check.
		{"postgres remote without sslmode", "postgres://u:hunter2@db/sluice", "set sslmode"},
		{"postgresql remote without sslmode", "postgresql://u@db/sluice", "set sslmode"},
		{"postgres bad sslmode", "postgres://u:hunter2@127.0.0.1/sluice?sslmode=maybe", "sslmode"},
		{"postgres bad statement_timeout", "postgres://u:hunter2@127.0.0.1/sluice?sslmode=disable&statement_timeout=soon", "statement_timeout"},
		{"postgres bad pool size", "postgres://u:hunter2@127.0.0.1/sluice?sslmode=disable&pool_max_conns=many", "pool_max_conns"},
		{"mysql", "mysql://db", `scheme "mysql" is not supported`},
		{"no scheme", "/var/lib/sluice.db", "want sqlite:"},
		{"empty path", "sqlite:", "empty sqlite path"},
		{"driver options smuggled", "sqlite:/tmp/x.db?_pragma=journal_mode(DELETE)", "must not contain '?'"},
		{"file URI", "sqlite:file:/tmp/x.db", "not a file: URI"},
		{"empty", "", "want sqlite:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(context.Background(), tc.dsn)
			if err == nil {
				s.Close()
				t.Fatalf("Open(%q) succeeded", tc.dsn)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "store: ") {
				t.Fatalf("Open(%q) error = %q, want %q", tc.dsn, err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("Open(%q) error shows the password: %q", tc.dsn, err)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestAddUsageAggregates(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, "sqlite::memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.AddUsage(ctx, []Usage{{Agent: "a", Tool: "t", Action: "allow", Count: 40}, {Agent: "a", Tool: "t", Action: "block", Count: 2}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUsage(ctx, []Usage{{Agent: "a", Tool: "t", Action: "allow", Count: 2}}); err != nil {
		t.Fatal(err)
	}
	u, err := s.Usage(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, r := range u {
		got[r.Action] = r.Count
	}
	if got["allow"] != 42 || got["block"] != 2 || len(u) != 2 {
		t.Fatalf("usage = %+v, want allow 42 and block 2", u)
	}
}
