package store

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fillForExport stores, through the Store's own API, a pending hold, an
// approved hold with a grant, a denied hold, an ended session (that cut a
// hold) and usage counters.
func fillForExport(t *testing.T, s *Store, now time.Time) {
	t.Helper()
	ctx := context.Background()
	caps := HoldCaps{Statuses: []string{"pending"}, Pending: "pending", PerAgent: 10, PerSandbox: 10}
	for _, h := range []HoldRow{
		{ID: "h-pend", Status: "pending", Agent: "a", Sandbox: "sb", Session: "s1", User: "u", Tool: "github", SHA256: "aa", Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{"k":"pending"}`)},
		{ID: "h-grant", Status: "pending", Agent: "a", Sandbox: "sb", Session: "s1", User: "u", Tool: "github", SHA256: "bb", Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{"k":"grant"}`)},
		{ID: "h-deny", Status: "pending", Agent: "a", Session: "s1", User: "u", Tool: "slack", SHA256: "cc", Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{}`)},
		{ID: "h-cut", Status: "pending", Agent: "b", Session: "s-ended", User: "v", Tool: "slack", SHA256: "dd", Created: now, Expires: now.Add(time.Hour), Doc: []byte(`{}`)},
	} {
		if _, created, err := s.CreateHold(ctx, h, caps); err != nil || !created {
			t.Fatalf("CreateHold %s: %v, %v", h.ID, created, err)
		}
	}
	g := GrantRow{ID: "g1", Agent: "a", User: "u", Tool: "github", SHA256: "bb", Hold: "h-grant", GrantedBy: "alice",
		Created: now, Expires: now.Add(24 * time.Hour), Doc: []byte(`{"note":"ok"}`)}
	if ok, err := s.DecideHoldGrant(ctx, "h-grant", "approved", "alice", "fine", now, g); err != nil || !ok {
		t.Fatalf("DecideHoldGrant: %v, %v", ok, err)
	}
	if ok, err := s.DecideHold(ctx, "h-deny", "denied", "bob", "no", now); err != nil || !ok {
		t.Fatalf("DecideHold: %v, %v", ok, err)
	}
	if _, created, err := s.EndSession(ctx, "s-ended", "carol", now); err != nil || !created {
		t.Fatalf("EndSession: %v, %v", created, err)
	}
	ids, err := s.CutSessionHolds(ctx, "s-ended", now)
	if err != nil || len(ids) != 1 {
		t.Fatalf("CutSessionHolds: %v, %v", ids, err)
	}
	if _, err := s.AddSessionHolds(ctx, "s-ended", ids); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.CountCall(ctx, "a", "github", "allow"); err != nil {
			t.Fatal(err)
		}
	}
	// An OAuth connection's row, with a refresh lease (not moved), and a
	// started connect (not moved: it belongs to one database's gateways).
	if _, err := s.PutOAuthConnection(ctx, OAuthConnection{Connector: "docs", User: "u", Status: "connected", Scopes: []string{"openid", "offline_access"}, ConnectedAt: now, Updated: now}, false); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.LeaseOAuthRefresh(ctx, "docs", "u", "r0", now, now.Add(time.Minute)); err != nil || !ok {
		t.Fatalf("lease: %v %v", ok, err)
	}
	if err := s.PutOAuthPending(ctx, OAuthPending{ID: "p1", Connector: "docs", User: "u", Bind: "b", Verifier: "v", Created: now, Expires: now.Add(time.Minute)}, 8); err != nil {
		t.Fatal(err)
	}
}

// TestExportSQLiteImportPostgres moves a SQLite store's state into a real
// PostgreSQL one and uses it there: the pending hold can be approved (once),
// the grant matches, the session is ended, the decided holds keep their
// decisions and the usage counts.
func TestExportSQLiteImportPostgres(t *testing.T) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	src, err := Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "src.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	fillForExport(t, src, now)
	var buf bytes.Buffer
	n, err := src.Export(ctx, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if n["holds"] != 4 || n["grants"] != 1 || n["ended_sessions"] != 1 || n["usage"] != 1 || n["oauth_connections"] != 1 {
		t.Fatalf("export counts %v", n)
	}
	if first, _, _ := strings.Cut(buf.String(), "\n"); !strings.Contains(first, `"sluice_store_export":1`) || !strings.Contains(first, `"kind":"sqlite"`) {
		t.Fatalf("header %s", first)
	}
	srv := server(t)
	dst, err := Open(ctx, srv.SuperURL(srv.NewDatabaseT(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	exported := buf.String()
	m, err := dst.Import(ctx, strings.NewReader(exported), false)
	if err != nil {
		t.Fatal(err)
	}
	if m.String() != n.String() {
		t.Fatalf("imported %v, exported %v", m, n)
	}
	// the same rows, byte for byte, exported again from PostgreSQL
	var again bytes.Buffer
	if _, err := dst.Export(ctx, &again); err != nil {
		t.Fatal(err)
	}
	_, a, _ := strings.Cut(exported, "\n")
	_, b, _ := strings.Cut(again.String(), "\n")
	if a != b {
		t.Fatalf("rows differ after the move:\nsqlite:   %s\npostgres: %s", a, b)
	}
	if ended, err := dst.SessionEnded(ctx, "s-ended"); err != nil || !ended {
		t.Fatalf("SessionEnded(s-ended) = %v, %v", ended, err)
	}
	if h, err := dst.GetHold(ctx, "h-deny"); err != nil || h.Status != "denied" || h.DecidedBy != "bob" || !h.Decided.Equal(now) {
		t.Fatalf("denied hold after the move: %+v, %v", h, err)
	}
	if h, err := dst.GetHold(ctx, "h-cut"); err != nil || !h.Expires.Equal(now) {
		t.Fatalf("cut hold after the move: %+v, %v", h, err)
	}
	gs, err := dst.MatchGrants(ctx, "a", "u", "github", "bb", now.Add(time.Minute))
	if err != nil || len(gs) != 1 || gs[0].ID != "g1" || string(gs[0].Doc) != `{"note":"ok"}` {
		t.Fatalf("MatchGrants after the move: %+v, %v", gs, err)
	}
	if ok, err := dst.DecideHold(ctx, "h-pend", "approved", "alice", "", now.Add(time.Minute)); err != nil || !ok {
		t.Fatalf("approving the moved pending hold: %v, %v", ok, err)
	}
	if ok, err := dst.DecideHold(ctx, "h-pend", "denied", "bob", "", now.Add(time.Minute)); err != nil || ok {
		t.Fatalf("a second decision on the moved hold: %v, %v (want refused)", ok, err)
	}
	if us, err := dst.Usage(ctx, 10); err != nil || len(us) != 1 || us[0].Count != 3 {
		t.Fatalf("usage after the move: %+v, %v", us, err)
	}
	if c, err := dst.GetOAuthConnection(ctx, "docs", "u"); err != nil || c.Status != "connected" || strings.Join(c.Scopes, " ") != "openid offline_access" || !c.ConnectedAt.Equal(now) {
		t.Fatalf("OAuth connection after the move: %+v, %v", c, err)
	}
	if ok, err := dst.LeaseOAuthRefresh(ctx, "docs", "u", "r9", now, now.Add(time.Minute)); err != nil || !ok {
		t.Fatalf("the source's refresh lease moved with the row: %v %v", ok, err)
	}
	if n, _ := dst.CountOAuthPending(ctx, "u"); n != 0 {
		t.Fatalf("%d started connects moved", n)
	}

	// a non-empty target is refused without merge, and nothing changes
	if _, err := dst.Import(ctx, strings.NewReader(exported), false); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("import into a non-empty store: %v, want ErrNotEmpty", err)
	}
	// with merge, a hold already there is refused by line, all-or-nothing:
	// the usage row (last) is not added either
	_, err = dst.Import(ctx, strings.NewReader(exported), true)
	var ie *ImportError
	if !errors.As(err, &ie) || ie.Line != 2 || !strings.Contains(err.Error(), "h-cut") || !strings.Contains(err.Error(), "already in the target") {
		t.Fatalf("merge of present holds: %v", err)
	}
	if us, _ := dst.Usage(ctx, 10); len(us) != 1 || us[0].Count != 3 {
		t.Fatalf("usage after a refused merge: %+v (want 3: nothing written)", us)
	}
}

// TestImportBadLines checks that a bad line is named (line and key path)
// and that nothing of the file is written, on both engines.
func TestImportBadLines(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s := openTemp(t)
		const hdr = `{"sluice_store_export":1,"kind":"sqlite","schema":9}` + "\n"
		const usage = `{"table":"usage","row":{"hour":"2026-12-02T06","agent":"a","tool":"t","action":"allow","count":2}}` + "\n"
		hold := func(field, val string) string {
			r := map[string]string{"id": `"h1"`, "status": `"pending"`, "agent": `"a"`, "sandbox": `""`, "session": `"s"`, "user": `"u"`,
				"tool": `"t"`, "sha256": `"aa"`, "created": `1`, "expires": `2`, "doc": `"e30="`, "decided_by": `""`,
				"decision_reason": `""`, "decided": `0`, "result": `null`, "version": `0`}
			if val == "" {
				delete(r, field)
			} else {
				r[field] = val
			}
			var parts []string
			for k, v := range r {
				parts = append(parts, `"`+k+`":`+v)
			}
			return `{"table":"holds","row":{` + strings.Join(parts, ",") + `}}` + "\n"
		}
		for _, tc := range []struct {
			name, in string
			line     int
			want     string
		}{
			{"no header", usage, 1, "no sluice_store_export header"},
			{"future version", `{"sluice_store_export":2,"kind":"sqlite","schema":9}` + "\n" + usage, 1, "version 2"},
			{"bad status", hdr + usage + hold("status", `"maybe"`), 3, "row.status"},
			{"missing column", hdr + usage + hold("sha256", ""), 3, "row.sha256: missing"},
			{"unknown column", hdr + usage + hold("extra", `1`), 3, "row.extra: not a column of holds"},
			{"string time", hdr + usage + hold("created", `"yesterday"`), 3, "row.created: not an integer"},
			{"doc not JSON", hdr + usage + hold("doc", `"bm9wZQ=="`), 3, "row.doc: not JSON"},
			{"unknown table", hdr + usage + `{"table":"secrets","row":{}}` + "\n", 3, `table: "secrets"`},
			{"repeated key", hdr + hold("id", `"h1"`) + usage + hold("id", `"h1"`), 4, "repeats line 2"},
			{"not JSON", hdr + usage + "{\n", 3, "not a JSON row"},
		} {
			_, err := s.Import(ctx, strings.NewReader(tc.in), false)
			var ie *ImportError
			if !errors.As(err, &ie) || ie.Line != tc.line || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v; want line %d naming %q", tc.name, err, tc.line, tc.want)
			}
		}
		if us, err := s.Usage(ctx, 10); err != nil || len(us) != 0 {
			t.Fatalf("usage after refused imports: %+v, %v (want nothing written)", us, err)
		}
		if _, err := s.Import(ctx, strings.NewReader(hdr+usage+hold("id", `"h1"`)), false); err != nil {
			t.Fatal(err)
		}
		if h, err := s.GetHold(ctx, "h1"); err != nil || h.Status != "pending" || h.Result != nil {
			t.Fatalf("imported hold: %+v, %v", h, err)
		}
	})
}
