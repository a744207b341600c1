package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// TestStoreVerbs: `sluice store status` on an empty PostgreSQL database
// shows every migration pending and changes nothing; `store migrate`
// applies them; status then shows them applied. The password is never
// printed. The same verbs work on SQLite.
// pendingLine is one "  pending  NNNN  name" line of store status (a
// migration's name may itself contain the word, as 0015 ui_oidc_pending).
var pendingLine = regexp.MustCompile(`(?m)^\s+pending\s+\d{4}\s`)

func TestStoreVerbs(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	pg := srv.SuperURL(srv.NewDatabaseT(t))
	latest := len(store.Migrations(store.Postgres))
	for _, dsn := range []string{pg, "sqlite:" + filepath.Join(t.TempDir(), "s.db")} {
		t.Run(strings.SplitN(dsn, ":", 2)[0], func(t *testing.T) {
			if strings.HasPrefix(dsn, "sqlite:") {
				// status needs an existing file: make it with migrate first
				// and check status after.
				out, _, err := cli(t, "", "store", "migrate", "--store", dsn)
				if err != nil || !strings.Contains(out, fmt.Sprintf("schema version %d of %d", latest, latest)) {
					t.Fatalf("migrate: %v\n%s", err, out)
				}
				return
			}
			out, _, err := cli(t, "", "store", "status", "--store", dsn)
			if err != nil || !strings.Contains(out, fmt.Sprintf("schema version 0 of %d", latest)) || len(pendingLine.FindAllString(out, -1)) != latest {
				t.Fatalf("status before: %v\n%s", err, out)
			}
			if out, _, _ := cli(t, "", "store", "status", "--store", dsn); strings.Contains(out, "applied ") {
				t.Fatalf("status changed the database:\n%s", out)
			}
			out, _, err = cli(t, "", "store", "migrate", "--store", dsn)
			if err != nil || !strings.Contains(out, fmt.Sprintf("schema version %d of %d", latest, latest)) || pendingLine.MatchString(out) {
				t.Fatalf("migrate: %v\n%s", err, out)
			}
			out, _, err = cli(t, "", "store", "status", "--json", "--store", dsn)
			var st struct {
				Kind    string `json:"kind"`
				Current int    `json:"current"`
				Latest  int    `json:"latest"`
			}
			if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.Current != latest || st.Latest != latest || st.Kind != "postgres" {
				t.Fatalf("status --json: %v\n%s", err, out)
			}
			if strings.Contains(out, srv.Password) {
				t.Fatalf("status shows the password:\n%s", out)
			}
		})
	}
}

// TestStoreExportImport: `store export` of a SQLite store with a pending
// hold, a grant and an ended session, `store import` of the file into a
// real PostgreSQL database (the PostgreSQL store then has them), a second
// import refused as the target is not empty, and a bad file refused by
// line with nothing written. The password is never printed.
func TestStoreExportImport(t *testing.T) {
	ctx := context.Background()
	now := time.Now().UTC()
	src := "sqlite:" + filepath.Join(t.TempDir(), "s.db")
	st, err := store.Open(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	caps := store.HoldCaps{Statuses: []string{"pending"}, Pending: "pending", PerAgent: 10, PerSandbox: 10}
	for _, id := range []string{"h1", "h2"} {
		h := store.HoldRow{ID: id, Status: "pending", Agent: "a", Session: "s", User: "u", Tool: "t", SHA256: id,
			Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{}`)}
		if _, _, err := st.CreateHold(ctx, h, caps); err != nil {
			t.Fatal(err)
		}
	}
	g := store.GrantRow{ID: "g1", Agent: "a", User: "u", Tool: "t", SHA256: "h2", Hold: "h2", GrantedBy: "alice",
		Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{}`)}
	if ok, err := st.DecideHoldGrant(ctx, "h2", "approved", "alice", "", now, g); err != nil || !ok {
		t.Fatalf("DecideHoldGrant: %v %v", ok, err)
	}
	if _, _, err := st.EndSession(ctx, "s-old", "bob", now); err != nil {
		t.Fatal(err)
	}
	st.Close()

	out, errOut, err := cli(t, "", "store", "export", "--store", src)
	if err != nil || !strings.Contains(errOut, "holds 2, grants 1, ended_sessions 1, usage 0") {
		t.Fatalf("export: %v\n%s", err, errOut)
	}
	file := filepath.Join(t.TempDir(), "state.jsonl")
	if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := pgtest.StartT(t, pgtest.Options{})
	pg := srv.SuperURL(srv.NewDatabaseT(t))
	out, _, err = cli(t, "", "store", "import", "--store", pg, file)
	if err != nil || !strings.Contains(out, "holds 2, grants 1, ended_sessions 1") || strings.Contains(out, srv.Password) {
		t.Fatalf("import: %v\n%s", err, out)
	}
	_, _, err = cli(t, "", "store", "import", "--store", pg, file)
	if err == nil || !strings.Contains(err.Error(), "not empty") || strings.Contains(err.Error(), srv.Password) {
		t.Fatalf("second import: %v (want refused: not empty)", err)
	}
	lines := strings.Split(strings.TrimSpace(mustRead(t, file)), "\n")
	lines[2] = strings.Replace(lines[2], `"status":"`, `"status":"x`, 1)
	pg2 := srv.SuperURL(srv.NewDatabaseT(t))
	_, _, err = cli(t, strings.Join(lines, "\n"), "store", "import", "--store", pg2, "-")
	if err == nil || !strings.Contains(err.Error(), "line 3: row.status") || !strings.Contains(err.Error(), "nothing was imported") {
		t.Fatalf("import of a bad line: %v", err)
	}

	dst, err := store.Open(ctx, pg)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if ok, err := dst.DecideHold(ctx, "h1", "approved", "alice", "", now); err != nil || !ok {
		t.Fatalf("approving the imported hold: %v %v", ok, err)
	}
	if gs, err := dst.MatchGrants(ctx, "a", "u", "t", "h2", now); err != nil || len(gs) != 1 {
		t.Fatalf("imported grant: %v %v", gs, err)
	}
	if ended, err := dst.SessionEnded(ctx, "s-old"); err != nil || !ended {
		t.Fatalf("imported ended session: %v %v", ended, err)
	}
	empty, err := store.Open(ctx, pg2)
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	if hs, err := empty.ListHolds(ctx, store.HoldQuery{}); err != nil || len(hs) != 0 {
		t.Fatalf("holds after a refused import: %v %v", hs, err)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
