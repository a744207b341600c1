package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// TestPostgresOutage (THREATS G14): the gateway on a PostgreSQL store
// whose server stops mid-traffic. Every call that needs state (a session
// check once its cached answer is stale, an ask that must be held, a
// hold's poll) is refused 503 store_unavailable, the upstream receives
// nothing, the refusal is audited with that code, and /readyz is 503
// naming the store. When the server is back the same calls succeed, with
// no restart of the gateway and the hold made before the outage intact.
func TestPostgresOutage(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	dsn := srv.SuperURL(srv.NewDatabaseT(t)) + "&statement_timeout=1s"
	up := newUpstream(t)
	g := startHolds(t, up, "", func(c *config.Config) { c.Store = dsn })
	c := g.client(agentA)
	if r := doCall(t, c, "tickets.list_tickets", `{}`); r.status != 200 {
		t.Fatalf("before: %d %s", r.status, r.raw)
	}
	held := doCall(t, c, "tickets.create_refund", refund)
	holdID, st := holdOf(t, held)
	if held.status != 202 || st != "pending" {
		t.Fatalf("ask before: %d %s", held.status, held.raw)
	}
	if code, _ := ready(t, g); code != 200 {
		t.Fatalf("/readyz before: %d", code)
	}
	before := up.requests.Load()

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // past the cached "session not ended" answer
	var rids []string
	for _, tc := range []struct{ name, tool, args string }{
		{"allowed call", "tickets.list_tickets", `{}`},
		{"ask call", "tickets.create_refund", `{"body":{"amount":77}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := doCall(t, c, tc.tool, tc.args)
			if r.status != http.StatusServiceUnavailable || r.code() != string(refusal.StoreUnavailable) {
				t.Fatalf("%d %s, want 503 store_unavailable", r.status, r.raw)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the refusal took %s: the store's timeout does not bound it", d)
			}
			if strings.Contains(r.raw, srv.Password) {
				t.Fatalf("the refusal shows the database password: %s", r.raw)
			}
			rid, _ := r.body["error"].(map[string]any)["request_id"].(string)
			rids = append(rids, rid)
		})
	}
	t.Run("hold poll", func(t *testing.T) {
		r := poll(t, c, holdID, "")
		if r.status != http.StatusServiceUnavailable || r.code() != string(refusal.StoreUnavailable) {
			t.Fatalf("%d %s, want 503 store_unavailable", r.status, r.raw)
		}
	})
	t.Run("readyz", func(t *testing.T) {
		code, body := ready(t, g)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "store: unavailable") {
			t.Fatalf("/readyz: %d %s, want 503 naming the store", code, body)
		}
	})
	if n := up.requests.Load(); n != before {
		t.Fatalf("the upstream got %d requests while the store was down", n-before)
	}
	recs := auditEvents(t, g)
	for _, rid := range rids {
		found := false
		for _, rec := range recs {
			if rec.RequestID == rid && rec.Fields["code"] == string(refusal.StoreUnavailable) {
				found = true
			}
		}
		if !found {
			t.Errorf("no audit record of %s with code store_unavailable", rid)
		}
	}

	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := doCall(t, c, "tickets.list_tickets", `{}`)
		if r.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after the server came back: %d %s", r.status, r.raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code, body := ready(t, g); code != 200 {
		t.Fatalf("/readyz after: %d %s", code, body)
	}
	if r := poll(t, c, holdID, ""); r.status != 202 || !strings.Contains(r.raw, `"pending"`) {
		t.Fatalf("the hold made before the outage: %d %s, want still pending", r.status, r.raw)
	}
	// The store's errors were logged (each refusal's cause): never with
	// the password of the DSN.
	if log := g.logBuf.String(); !strings.Contains(log, "store: unavailable") || strings.Contains(log, srv.Password) {
		t.Fatalf("gateway log: store errors logged %v, password shown %v", strings.Contains(log, "store: unavailable"), strings.Contains(log, srv.Password))
	}
}

func ready(t *testing.T, g *testGateway) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + g.AdminAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b json.RawMessage
	_ = json.NewDecoder(resp.Body).Decode(&b)
	return resp.StatusCode, string(b)
}
