package store

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestAuditHead: the head the gateway records survives a reopen, and a
// later record replaces it (one row).
func TestAuditHead(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		dsn := newDSN(t)
		s, err := Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, _, ok, err := s.AuditHead(ctx); err != nil || ok {
			t.Fatalf("new store: AuditHead ok=%v err=%v, want none", ok, err)
		}
		a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
		if err := s.SetAuditHead(ctx, 3, a); err != nil {
			t.Fatal(err)
		}
		if err := s.SetAuditHead(ctx, 9, b); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if s, err = Open(ctx, dsn); err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		seq, hash, updated, ok, err := s.AuditHead(ctx)
		if err != nil || !ok || seq != 9 || hash != b || updated.IsZero() {
			t.Fatalf("after reopen: AuditHead = %d, %s, %v, %v, %v; want 9, %s", seq, hash, updated, ok, err, b)
		}
		var rows int
		if err := s.db.sql.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_heads`).Scan(&rows); err != nil || rows != 1 {
			t.Fatalf("audit_head has %d rows (%v), want 1", rows, err)
		}
	})
}

// TestAuditHeadPerReplica: on a shared store each gateway's audit log has
// its own head (two replicas with different logs never check against each
// other's), and the same log reopened finds its own.
func TestAuditHeadPerReplica(t *testing.T) {
	ctx := context.Background()
	srv := server(t)
	dsn := srv.SuperURL(srv.NewDatabaseT(t))
	a, err := OpenWith(ctx, dsn, Options{AuditLog: "/var/lib/sluice/a.log"})
	must(t, err)
	defer a.Close()
	b, err := OpenWith(ctx, dsn, Options{AuditLog: "/var/lib/sluice/b.log"})
	must(t, err)
	defer b.Close()
	must(t, a.SetAuditHead(ctx, 7, "aa"))
	if _, _, _, ok, err := b.AuditHead(ctx); err != nil || ok {
		t.Fatalf("replica b sees a head (%v, %v) it never recorded", ok, err)
	}
	must(t, b.SetAuditHead(ctx, 2, "bb"))
	a2, err := OpenWith(ctx, dsn, Options{AuditLog: "/var/lib/sluice/a.log"})
	must(t, err)
	defer a2.Close()
	if seq, hash, _, ok, err := a2.AuditHead(ctx); err != nil || !ok || seq != 7 || hash != "aa" {
		t.Fatalf("replica a reopened: %d %s %v %v; want 7 aa", seq, hash, ok, err)
	}
}

// TestAuditHeadsByReplica: with a replica id the head is the row of that
// name, and AuditHeads lists every replica's.
func TestAuditHeadsByReplica(t *testing.T) {
	ctx := context.Background()
	srv := server(t)
	dsn := srv.SuperURL(srv.NewDatabaseT(t))
	a, err := OpenWith(ctx, dsn, Options{AuditLog: "/var/lib/sluice/audit.log", Replica: "gw-a"})
	must(t, err)
	defer a.Close()
	b, err := OpenWith(ctx, dsn, Options{AuditLog: "/var/lib/sluice/audit.log", Replica: "gw-b"})
	must(t, err)
	defer b.Close()
	must(t, a.SetAuditHead(ctx, 7, "aa"))
	must(t, b.SetAuditHead(ctx, 2, "bb"))
	must(t, b.SetAuditHead(ctx, 3, "cc"))
	heads, err := a.AuditHeads(ctx)
	must(t, err)
	if len(heads) != 2 || heads[0].Log != "gw-a" || heads[0].Seq != 7 || heads[0].Hash != "aa" ||
		heads[1].Log != "gw-b" || heads[1].Seq != 3 || heads[1].Hash != "cc" || heads[1].Updated.IsZero() {
		t.Fatalf("AuditHeads = %+v, want gw-a 7:aa and gw-b 3:cc", heads)
	}
}

// TestRekeyLegacyAuditHead (THREATS G22): a head a gateway recorded
// before replica ids (host:path) is moved to its replica id at its next
// open, so that it is checked and found by `audit verify --heads`; not
// when the id already has a head, nor another host's or path's.
func TestRekeyLegacyAuditHead(t *testing.T) {
	ctx := context.Background()
	srv := server(t)
	dsn := srv.SuperURL(srv.NewDatabaseT(t))
	const path = "/var/lib/sluice/audit.log"
	old, err := OpenWith(ctx, dsn, Options{AuditLog: path}) // a gateway from before replica ids
	must(t, err)
	must(t, old.SetAuditHead(ctx, 41, "41hash"))
	other, err := OpenWith(ctx, dsn, Options{AuditLog: "/srv/other.log"})
	must(t, err)
	must(t, other.SetAuditHead(ctx, 5, "5hash"))
	old.Close()
	other.Close()
	host, _ := os.Hostname()

	s, err := OpenWith(ctx, dsn, Options{AuditLog: path, Replica: "r0"})
	must(t, err)
	defer s.Close()
	from, err := s.RekeyLegacyAuditHead(ctx)
	if err != nil || from != host+":"+path {
		t.Fatalf("re-key: %q %v, want from %q", from, err, host+":"+path)
	}
	seq, hash, _, ok, err := s.AuditHead(ctx)
	if err != nil || !ok || seq != 41 || hash != "41hash" {
		t.Fatalf("r0's head after re-key: %d %s %v %v, want the legacy 41", seq, hash, ok, err)
	}
	if from, err := s.RekeyLegacyAuditHead(ctx); err != nil || from != "" {
		t.Fatalf("second re-key: %q %v, want nothing", from, err)
	}
	rows, err := s.AuditHeads(ctx)
	must(t, err)
	var keys []string
	for _, r := range rows {
		keys = append(keys, r.Log)
	}
	want := []string{host + ":/srv/other.log", "r0"}
	slices.Sort(want)
	if strings.Join(keys, ",") != strings.Join(want, ",") {
		t.Fatalf("heads %q, want %q (another path's legacy head left alone)", keys, want)
	}
	// An id that already has a head keeps it; the legacy row stays for
	// verify to report.
	l2, err := OpenWith(ctx, dsn, Options{AuditLog: "/srv/other.log"})
	must(t, err)
	l2.Close()
	r1, err := OpenWith(ctx, dsn, Options{AuditLog: "/srv/other.log", Replica: "r0"})
	must(t, err)
	defer r1.Close()
	if from, err := r1.RekeyLegacyAuditHead(ctx); err != nil || from != "" {
		t.Fatalf("re-key onto an id with a head: %q %v, want nothing moved", from, err)
	}
}
