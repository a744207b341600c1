package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// TestStoreVerbs: `sluice store status` on an empty PostgreSQL database
// shows every migration pending and changes nothing; `store migrate`
// applies them; status then shows them applied. The password is never
// printed. The same verbs work on SQLite.
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
			if err != nil || !strings.Contains(out, fmt.Sprintf("schema version 0 of %d", latest)) || strings.Count(out, "pending") != latest {
				t.Fatalf("status before: %v\n%s", err, out)
			}
			if out, _, _ := cli(t, "", "store", "status", "--store", dsn); strings.Contains(out, "applied ") {
				t.Fatalf("status changed the database:\n%s", out)
			}
			out, _, err = cli(t, "", "store", "migrate", "--store", dsn)
			if err != nil || !strings.Contains(out, fmt.Sprintf("schema version %d of %d", latest, latest)) || strings.Contains(out, "pending") {
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
