//go:build linux

package bench

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// benchPGHolds is the store section's memory row (issue 20): the RSS of
// one replica on a PostgreSQL store holding many pending holds, against
// the same replica before any hold was made. Holds live in the database,
// not in the replica; this checks that nothing in the replica grows with
// them (the live queue, waiters, the pending-holds gauge, the lease
// takeover scan).
func benchPGHolds(t *testing.T, w *world, srv *pgtest.Server) *section {
	pending := 10000
	if smoke() {
		pending = 200
	}
	full := fmt.Sprintf("replica with %d pending holds", pending)
	s := &section{Title: fmt.Sprintf("Store: one replica's RSS with %d pending holds in PostgreSQL", pending), Baseline: "replica idle (PostgreSQL)",
		Intro: "The resident set of one real `sluice serve` on a PostgreSQL store (a database of its own on the run's server, over its Unix socket; from /proc/PID/status), " +
			fmt.Sprintf("first after a warm-up of 100 allowed calls, then with %d calls held for approval, made through the socket by 8 sessions at once (as in the holds section).", pending)}
	if srv == nil {
		s.skip("replica idle (PostgreSQL)", "no PostgreSQL server for the run")
		return s
	}
	db, err := srv.NewDatabase(t.Context())
	if err != nil {
		s.skip("replica idle (PostgreSQL)", err.Error())
		return s
	}
	g, err := w.startGateway(t, gwOpts{Name: "pg-holds", Approvers: true, HoldWait: "1ms", MaxHolds: pending + 1000, Store: srv.SocketURL(db)})
	if err != nil {
		s.skip("replica idle (PostgreSQL)", err.Error())
		return s
	}
	defer g.p.stop()
	c := sandboxClient(g.sock, benchAgent)
	args := `{"body":` + itemBody + `}`
	for range 100 {
		if _, err := toolCall(c, "bench.echo", args, 200); err != nil {
			s.skip("replica idle (PostgreSQL)", err.Error())
			return s
		}
	}
	runtime.GC()
	idle, err := rssBytes(g.pid())
	if err != nil {
		s.skip("replica idle (PostgreSQL)", err.Error())
		return s
	}
	s.add(&row{Name: "replica idle (PostgreSQL)", Bytes: idle, Note: "after 100 allowed calls, no hold"})
	fill, err := fillHolds(g, pending)
	if err != nil {
		s.skip(full, "filling: "+err.Error())
		return s
	}
	rss, err := rssBytes(g.pid())
	if err != nil {
		s.skip(full, err.Error())
		return s
	}
	s.add(&row{Name: full, Bytes: rss, Note: fmt.Sprintf("filled in %s (%.2f ms per hold, 8 callers)", fill.Round(1e6), float64(fill.Microseconds())/1000/float64(pending))})
	v := "**met**"
	if rss > 200<<20 {
		v = "**not met**"
	}
	if pending < 10000 {
		v = "not judged (smoke run holds fewer)"
	}
	s.Verdicts = append(s.Verdicts, fmt.Sprintf("issue 20: one replica's RSS with 10,000 pending holds in PostgreSQL ≤ 200 MB: %s (%.1f MiB with %d, %.2f× idle)",
		v, float64(rss)/(1<<20), pending, float64(rss)/float64(idle)))
	return s
}
