package gateway

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// TestStoreMoveSQLiteToPostgres is the move README "Running several
// gateways" describes, through real gateways: a gateway on SQLite holds a
// call and grants "always allow" on another; its store is exported and
// imported into a real PostgreSQL; a gateway on that database then
// approves the moved pending hold (the upstream gets it once) and lets the
// granted call through without a hold, audited as the moved grant's use.
func TestStoreMoveSQLiteToPostgres(t *testing.T) {
	ctx := context.Background()
	up := newUpstream(t)
	g1 := startHolds(t, up, "", nil)
	c1 := g1.client(agentA)
	pending := doCall(t, c1, "tickets.create_refund", refund)
	h1, st := holdOf(t, pending)
	if pending.status != 202 || st != "pending" {
		t.Fatalf("ask on SQLite: %d %s", pending.status, pending.raw)
	}
	const granted = `{"body":{"amount":12,"reason":"weekly"}}`
	ask := doCall(t, c1, "tickets.create_refund", granted)
	h2, _ := holdOf(t, ask)
	ar := g1.admin(t, "tok-bob", "POST", "/api/v1/holds/"+h2+"/approve", `{"always":true,"ttl":"1h"}`)
	gr, _ := ar.body["grant"].(map[string]any)
	grant, _ := gr["id"].(string)
	if ar.status != 200 || grant == "" {
		t.Fatalf("approve always on SQLite: %d %s", ar.status, ar.raw)
	}
	if n := up.requests.Load(); n != 1 {
		t.Fatalf("upstream got %d requests on SQLite, want 1", n)
	}

	// Export beside the running gateway (read-only, without its lock: the
	// file lock is per process and this test is the same process).
	src, err := store.OpenWith(ctx, "sqlite:"+filepath.Join(g1.dir, "sluice.db"), store.Options{NoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := src.Export(ctx, &buf)
	src.Close()
	if err != nil || n["holds"] != 2 || n["grants"] != 1 {
		t.Fatalf("export: %v, %v", n, err)
	}
	srv := pgtest.StartT(t, pgtest.Options{})
	dsn := srv.SuperURL(srv.NewDatabaseT(t))
	dst, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Import(ctx, &buf, false); err != nil {
		t.Fatal(err)
	}
	dst.Close()

	g2 := startHolds(t, up, "", func(c *config.Config) { c.Store = dsn })
	c2 := g2.client(agentA)
	if r := poll(t, c2, h1, ""); r.status != 202 {
		t.Fatalf("the moved pending hold on PostgreSQL: %d %s", r.status, r.raw)
	}
	ap := g2.admin(t, "tok-bob", "POST", "/api/v1/holds/"+h1+"/approve", `{"reason":"after the move"}`)
	if _, st := holdOf(t, ap); ap.status != 200 || st != "executed" {
		t.Fatalf("approving the moved hold: %d %s", ap.status, ap.raw)
	}
	if n := up.requests.Load(); n != 2 {
		t.Fatalf("upstream got %d requests after approving the moved hold, want 2", n)
	}
	if again := g2.admin(t, "tok-bob", "POST", "/api/v1/holds/"+h1+"/approve", `{}`); again.status != 409 {
		t.Fatalf("a second approval of the moved hold: %d %s, want 409", again.status, again.raw)
	}
	r := doCall(t, c2, "tickets.create_refund", granted)
	if r.status != 200 || up.requests.Load() != 3 {
		t.Fatalf("the granted call on PostgreSQL: %d %s (upstream %d), want 200 without a hold", r.status, r.raw, up.requests.Load())
	}
	rid, _ := r.body["request_id"].(string)
	used := recsOf(auditEvents(t, g2), "grant_used", "grant", grant)
	if len(used) != 1 || used[0].RequestID != rid || used[0].Fields["hold"] != h2 {
		t.Fatalf("grant_used records on PostgreSQL: %+v (request %s)", used, rid)
	}
}
