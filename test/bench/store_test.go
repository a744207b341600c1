//go:build linux

package bench

import (
	"fmt"
	"testing"

	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// benchStore is the store section: the same allowed tool call through
// two real gateways that differ only in their store, an SQLite file and
// a real PostgreSQL server (Debian's, started for the run, reached over
// its Unix socket from the namespace).
func benchStore(t *testing.T, w *world) []*section {
	s := &section{Title: "Store: an allowed tool call on PostgreSQL vs SQLite", Baseline: "sluice, SQLite store",
		Intro: "The full allowed pipeline of row 1.7 (strict schema, user Rego, cached credential, audit on /dev/shm) through two `sluice serve` processes " +
			"that differ only in `store:`. The allowed path reads the store only for the session check, whose answer is cached (on PostgreSQL a \"not ended\" answer for 0.5 s, since another replica may end the session), so the goal is that the shared store costs the call almost nothing. The rows take turns as in section 1."}
	n := iterations(2000)
	args := `{"body":` + itemBody + `}`
	ps := []*probe{}
	add := func(name, note string, o gwOpts) {
		g, err := w.startGateway(t, o)
		if err != nil {
			ps = append(ps, &probe{name: name, err: err})
			return
		}
		t.Cleanup(g.p.stop)
		c := sandboxClient(g.sock, benchAgent)
		ps = append(ps, &probe{name: name, note: note, fn: func() error { _, err := toolCall(c, "bench.create_item", args, 200); return err }})
	}
	add("sluice, SQLite store", "store: sqlite:… (WAL, one gateway per file)", gwOpts{Name: "store-sqlite", Rego: benchRego, Credential: true})
	if err := pgtest.Available(); err != nil {
		ps = append(ps, &probe{name: "sluice, PostgreSQL store", err: err})
	} else if srv, err := pgtest.Start(pgtest.Options{}); err != nil {
		ps = append(ps, &probe{name: "sluice, PostgreSQL store", err: err})
	} else {
		t.Cleanup(srv.Remove)
		db, err := srv.NewDatabase(t.Context())
		if err != nil {
			ps = append(ps, &probe{name: "sluice, PostgreSQL store", err: err})
		} else {
			add("sluice, PostgreSQL store", fmt.Sprintf("store: postgres://…?host=%s (Unix socket, pgx pool)", "<socket dir>"),
				gwOpts{Name: "store-pg", Rego: benchRego, Credential: true, Store: srv.SocketURL(db)})
		}
	}
	interleave(ps, n, 20)
	s.addProbes(ps)
	s.Verdicts = append(s.Verdicts, verdictLat("issue 20: an allowed call with the PostgreSQL store ≤ 1.1× the same with SQLite (p50)",
		s.find("sluice, PostgreSQL store"), s.find("sluice, SQLite store"), 1.1))
	return []*section{s}
}
