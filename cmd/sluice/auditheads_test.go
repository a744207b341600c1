package main

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// replicaLog writes n records to the log at path as replica id would, the
// hold records given among them, and records its durable head in st as the
// gateway's head loop does.
func replicaLog(t *testing.T, st *store.Store, path, id string, n int, holds ...audit.Record) {
	t.Helper()
	ctx := context.Background()
	l, err := audit.OpenWith(path, audit.Options{Replica: id})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range n {
		if _, err := l.Append(ctx, audit.Record{RequestID: id + "-req", Event: "decision", Fields: map[string]any{"n": i}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range holds {
		if _, err := l.Append(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if st == nil {
		return
	}
	h, err := l.DurableHead()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetAuditHead(ctx, h.Seq, h.Hash); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	if err := os.WriteFile(to, []byte(readFile(t, from)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAuditVerifyHeadsReplicas is issue 20 item 5 on a real PostgreSQL:
// two replicas write their own files and record their heads in the shared
// store; verify --heads passes on both files, and fails naming the file
// when one was cut or replaced (with a valid chain of its own) behind its
// recorded head, or when a replica's file is not given. The connection
// string's password appears in no output or error.
func TestAuditVerifyHeadsReplicas(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.StartT(t, pgtest.Options{})
	dsn := srv.SuperURL(srv.NewDatabaseT(t))
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	for _, r := range []struct {
		id, path string
		n        int
		hold     audit.Record
	}{
		{"gw-a", a, 4, audit.Record{Event: "hold_created", Fields: map[string]any{"hold": "h_1", "tool": "billing.refund"}}},
		{"gw-b", b, 2, audit.Record{Event: "hold_executed", Fields: map[string]any{"hold": "h_1", "status": 200}}},
	} {
		st, err := store.OpenWith(ctx, dsn, store.Options{AuditLog: r.path, Replica: r.id})
		if err != nil {
			t.Fatal(err)
		}
		replicaLog(t, st, r.path, r.id, r.n, r.hold)
		st.Close()
	}
	cut := filepath.Join(dir, "b-cut.log")
	copyFile(t, b, cut)
	cutLines(t, cut, 2) // b's head is seq 3
	longer := filepath.Join(dir, "b-longer.log")
	replicaLog(t, nil, longer, "gw-b", 5) // another chain: seq 3 has another hash
	shorter := filepath.Join(dir, "b-shorter.log")
	replicaLog(t, nil, shorter, "gw-b", 1)
	// A replica's file replaced by one claiming another id leaves its own
	// head without a file.
	renamed := filepath.Join(dir, "b-renamed.log")
	replicaLog(t, nil, renamed, "gw-z", 3)

	for _, tc := range []struct {
		name  string
		files []string
		want  []string
	}{
		{"both hold their heads", []string{a, b}, []string{"ok: replica gw-a: 5 records", "ok: replica gw-b: 3 records"}},
		{"truncated", []string{a, cut}, []string{"ok: replica gw-a", "FAIL: " + cut + " (replica gw-b): ends at seq 2, before the recorded head's seq 3"}},
		{"replaced, longer", []string{a, longer}, []string{"FAIL: " + longer + " (replica gw-b): the record at seq 3 has hash", "replaced or rewritten"}},
		{"replaced, shorter", []string{a, shorter}, []string{"FAIL: " + shorter + " (replica gw-b): ends at seq 1, before the recorded head's seq 3"}},
		{"a replica's file missing", []string{a}, []string{"FAIL: replica gw-b: its recorded head 3:", "in none of the files given"}},
		{"replaced under another id", []string{a, renamed}, []string{
			"FAIL: " + renamed + " (replica gw-z): no head recorded in the store", "FAIL: replica gw-b: its recorded head 3:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"audit", "verify", "--heads", dsn}
			for _, f := range tc.files {
				args = append(args, "--file", f)
			}
			out, _, err := cli(t, "", args...)
			wantOK := tc.name == "both hold their heads"
			if (err == nil) != wantOK {
				t.Fatalf("err %v, want ok %v; output:\n%s", err, wantOK, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if !wantOK && strings.Count(out, "FAIL: ") != strings.Count(strings.Join(tc.want, "\n"), "FAIL: ") {
				t.Errorf("want exactly the FAIL lines %q:\n%s", tc.want, out)
			}
			if strings.Contains(out, srv.Password) || (err != nil && strings.Contains(err.Error(), srv.Password)) {
				t.Fatalf("the password is shown: %v\n%s", err, out)
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		out, _, err := cli(t, "", "audit", "verify", "--json", "--heads", dsn, "--file", a, "--file", cut)
		var rep headsReport
		if err == nil || json.Unmarshal([]byte(out), &rep) != nil {
			t.Fatalf("err %v; output:\n%s", err, out)
		}
		if rep.OK || len(rep.Replicas) != 2 || !rep.Replicas[0].OK || rep.Replicas[1].OK || rep.Replicas[1].RecordedHead == "" ||
			len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], cut) {
			t.Fatalf("report %+v", rep)
		}
	})

	t.Run("wrong password", func(t *testing.T) {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		const secret = "not-the-password-7f3a"
		u.User = url.UserPassword(u.User.Username(), secret)
		out, _, err := cli(t, "", "audit", "verify", "--heads", u.String(), "--file", a)
		if err == nil || strings.Contains(err.Error(), secret) || strings.Contains(out, secret) {
			t.Fatalf("err %v, output %q: want a refusal without the password", err, out)
		}
	})

	t.Run("hold across replicas", func(t *testing.T) {
		out, _, err := cli(t, "", "audit", "hold", "h_1", "--file", b, "--file", a)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], " gw-a "+a+" seq 5 hold_created hold=h_1") ||
			!strings.Contains(lines[1], " gw-b "+b+" seq 3 hold_executed hold=h_1 status=200") {
			t.Fatalf("want a's hold_created then b's hold_executed:\n%s", out)
		}
		if _, _, err := cli(t, "", "audit", "hold", "h_2", "--file", a, "--file", b); err == nil {
			t.Fatal("a hold no record names: no error")
		}
	})
}

// TestAuditVerifyHeadsSQLite: a single gateway on SQLite has one head (the
// empty key), held by its file, whatever its replica id; a cut file fails.
func TestAuditVerifyHeadsSQLite(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := filepath.Join(dir, "sluice.db")
	st, err := store.OpenWith(ctx, "sqlite:"+db, store.Options{Replica: "gw-1"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "audit.log")
	replicaLog(t, st, path, "gw-1", 4)
	st.Close()
	out, _, err := cli(t, "", "audit", "verify", "--heads", db, "--file", path)
	if err != nil || !strings.Contains(out, "ok: the log without a replica id") || !strings.Contains(out, "holds the recorded head 4:") {
		t.Fatalf("err %v\n%s", err, out)
	}
	cutLines(t, path, 3)
	out, _, err = cli(t, "", "audit", "verify", "--heads", "sqlite:"+db, "--file", path)
	if err == nil || !strings.Contains(out, "FAIL: "+path+" (the log without a replica id") || !strings.Contains(out, "ends at seq 3, before the recorded head's seq 4") {
		t.Fatalf("cut: err %v\n%s", err, out)
	}
}
