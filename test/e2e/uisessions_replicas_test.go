//go:build linux

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/bcrypt"

	"github.com/sluice-gw/sluice/gateway/store/pgtest"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestUISessionsTwoProcesses is THREATS E19 through two real `sluice
// serve` processes (r0, r1) on one real PostgreSQL, as behind a load
// balancer without sticky routing: carol signs in on r0 and approves a
// hold on r1 with the same cookie; after she signs out on r1, or once her
// session is idle past its timeout, the cookie is refused on both
// (pages send her to /login, a decision POST with the session's CSRF
// token is 401, the admin API 401), the sign-out audited on r1.
func TestUISessionsTwoProcesses(t *testing.T) {
	requireHost(t)
	e := newEnv(t)
	pg := pgtest.StartT(t, pgtest.Options{})
	dsn := pg.SocketURL(pg.NewDatabaseT(t))
	pw, _ := bcrypt.GenerateFromPassword([]byte("carol-pw"), bcrypt.MinCost)
	var gs [2]*gwenv.Gateway
	for i := range gs {
		d := e.BaseConfig(fmt.Sprintf("ui%d", i))
		d["store"] = dsn
		d.Gateway()["replica_id"] = fmt.Sprintf("r%d", i)
		d["approvers"] = map[string]any{"users": []map[string]any{
			{"name": "carol", "groups": []string{"finance"}, "password_hash": string(pw)}}}
		gs[i] = e.Launch(d, e.Write(d))
	}
	for _, g := range gs {
		g.AwaitSocket()
		g.AwaitReady()
	}
	r0, r1 := gs[0], gs[1]
	csrfRE := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	do := func(g *gwenv.Gateway, method, path string, form url.Values, cks ...*http.Cookie) (*http.Response, string) {
		t.Helper()
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, _ := http.NewRequest(method, "http://"+g.Admin+path, body)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		for _, c := range cks {
			req.AddCookie(c)
		}
		cl := g.AdminClient()
		cl.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	named := func(resp *http.Response, name string) *http.Cookie {
		for _, c := range resp.Cookies() {
			if c.Name == name {
				return c
			}
		}
		return nil
	}
	csrfOf := func(page string) string {
		t.Helper()
		m := csrfRE.FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no csrf field in %.300s", page)
		}
		return m[1]
	}
	login := func(g *gwenv.Gateway) *http.Cookie {
		t.Helper()
		resp, page := do(g, http.MethodGet, "/login", nil)
		resp, _ = do(g, http.MethodPost, "/login", url.Values{"csrf": {csrfOf(page)}, "username": {"carol"}, "password": {"carol-pw"}}, named(resp, "sluice_login"))
		c := named(resp, "sluice_session")
		if resp.StatusCode != http.StatusSeeOther || c == nil {
			t.Fatalf("sign in: %d", resp.StatusCode)
		}
		return c
	}
	refusedOn := func(g *gwenv.Gateway, c *http.Cookie, hold, csrf string) string {
		t.Helper()
		resp, _ := do(g, http.MethodGet, "/", nil, c)
		post, body := do(g, http.MethodPost, "/holds/"+hold+"/deny", url.Values{"csrf": {csrf}}, c)
		api, _ := do(g, http.MethodGet, "/api/v1/holds/"+hold, nil, c)
		got := fmt.Sprintf("GET / %d → %s, POST deny %d, admin API %d", resp.StatusCode, resp.Header.Get("Location"), post.StatusCode, api.StatusCode)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" || post.StatusCode != http.StatusUnauthorized ||
			!strings.Contains(body, "Not signed in") || api.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %s; want 303 /login, 401, 401", g.Admin, got)
		}
		return got
	}

	ask := r0.Call(agentA, "tickets.create_refund", `{"body":{"amount":5,"reason":"dup"}}`)
	if ask.Status != http.StatusAccepted || ask.HoldID == "" {
		t.Fatalf("ask: %d %s", ask.Status, ask.Body)
	}
	c := login(r0)

	t.Run("signed in on r0, approves on r1", func(t *testing.T) {
		cb := casebook.Expect(t, "E19", "control: a review UI session made on replica r0 used on r1 (no sticky routing) to approve a hold",
			"r1 serves the hold page with r0's CSRF token for the session; the approval 303, audited hold_approved by carol")
		_, p0 := do(r0, http.MethodGet, "/holds/"+ask.HoldID, nil, c)
		resp, p1 := do(r1, http.MethodGet, "/holds/"+ask.HoldID, nil, c)
		if resp.StatusCode != http.StatusOK || csrfOf(p1) != csrfOf(p0) {
			t.Fatalf("hold page on r1: %d (same csrf as r0: %v)", resp.StatusCode, csrfOf(p1) == csrfOf(p0))
		}
		resp, _ = do(r1, http.MethodPost, "/holds/"+ask.HoldID+"/approve", url.Values{"csrf": {csrfOf(p1)}}, c)
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("approve on r1: %d", resp.StatusCode)
		}
		r1.AwaitAuditFields("hold_approved", map[string]any{"hold": ask.HoldID, "by": "carol"})
		cb.Observe("approve on r1: 303; hold_approved by carol in r1's audit")
	})

	t.Run("signed out on r1, replayed on r0", func(t *testing.T) {
		cb := casebook.Expect(t, "E19", "a review UI session cookie replayed to replica r0 after its person signed out on r1",
			"refused on r0 and r1: GET / 303 to /login, a decision POST with the session's CSRF token 401 not signed in, the admin API 401; ui.logout audited on r1; the row gone")
		_, page := do(r1, http.MethodGet, "/", nil, c)
		csrf := csrfOf(page)
		if resp, _ := do(r1, http.MethodPost, "/logout", url.Values{"csrf": {csrf}}, c); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("logout on r1: %d", resp.StatusCode)
		}
		r1.AwaitAuditFields("ui.logout", map[string]any{"user": "carol"})
		got := refusedOn(r0, c, ask.HoldID, csrf)
		refusedOn(r1, c, ask.HoldID, csrf)
		cb.Observe("r0: " + got + "; ui.logout on r1")
	})

	t.Run("idle on r0, refused on both", func(t *testing.T) {
		cb := casebook.Expect(t, "E19", "a review UI session idle past its timeout (its row's last use moved back 31 min) presented to r1 and r0",
			"refused on both as signed out (303 /login, 401, 401), its row deleted; no row holds the session id")
		c := login(r0)
		_, page := do(r1, http.MethodGet, "/", nil, c) // live on r1 before
		csrf := csrfOf(page)
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		h := sha256.Sum256([]byte(c.Value))
		var raw int
		if err := conn.QueryRow(context.Background(), `SELECT COUNT(*) FROM ui_sessions WHERE strpos(id_hash || person || member_of, $1) > 0`, c.Value).Scan(&raw); err != nil || raw != 0 {
			t.Fatalf("%d rows hold the raw session id (%v)", raw, err)
		}
		tag, err := conn.Exec(context.Background(), `UPDATE ui_sessions SET last_seen = last_seen - 31*60*1000000000::bigint WHERE id_hash = $1`, hex.EncodeToString(h[:]))
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("age the row: %v %v", tag, err)
		}
		got := refusedOn(r1, c, ask.HoldID, csrf)
		refusedOn(r0, c, ask.HoldID, csrf)
		var n int
		if err := conn.QueryRow(context.Background(), `SELECT COUNT(*) FROM ui_sessions WHERE id_hash = $1`, hex.EncodeToString(h[:])).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d rows for the idle session (%v)", n, err)
		}
		cb.Observe("r1: " + got + "; row deleted")
	})
}
