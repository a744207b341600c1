//go:build linux

package fault

import (
	"testing"

	"github.com/sluice-gw/sluice/gateway/store/pgtest"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// storeKind is the store a crash/store case runs on: the embedded SQLite
// file (BaseConfig's) or a fresh database of a real PostgreSQL server.
type storeKind struct {
	name string
	t    *testing.T
	srv  *pgtest.Server // nil for SQLite
}

// eachStore runs body once on SQLite and once on PostgreSQL, as subtests
// named for the store: the G cases where the store matters (a crash with
// held calls, reconciliation, the audit head kept in the store) hold on
// both engines (issue 20). PostgreSQL is Debian's, started for the
// subtest (pgtest: skipped with the reason when absent, failed under
// $SLUICE_REQUIRE_POSTGRES).
func eachStore(t *testing.T, body func(t *testing.T, sk storeKind)) {
	t.Run("sqlite", func(t *testing.T) { body(t, storeKind{name: "sqlite", t: t}) })
	t.Run("postgres", func(t *testing.T) {
		body(t, storeKind{name: "postgres", t: t, srv: pgtest.StartT(t, pgtest.Options{})})
	})
}

// apply points d at the store: on PostgreSQL a database of its own (each
// env has its own SQLite file too). On PostgreSQL the gateway is replica r0
// with a 2s hold lease: a restart after a kill -9 takes over the
// executing holds its predecessor leased once that lease has passed
// (THREATS G20), not at once as on SQLite, whose file one gateway owns.
func (sk storeKind) apply(d gwenv.Doc) {
	if sk.srv == nil {
		return
	}
	d["store"] = sk.srv.SocketURL(sk.srv.NewDatabaseT(sk.t)) + "&statement_timeout=1s"
	d.Gateway()["replica_id"] = "r0"
	d.Gateway()["hold_lease"] = "2s"
}

// threat is a casebook threat line naming the store.
func (sk storeKind) threat(s string) string { return s + " [store: " + sk.name + "]" }
