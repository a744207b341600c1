package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/bcrypt"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

var uiCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// uiDo sends one request to g's review UI with the given cookies (no
// redirects followed) and returns the answer and its body.
func uiDo(t *testing.T, g *testGateway, method, path string, form url.Values, cookies ...*http.Cookie) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, "http://"+g.AdminAddr()+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func cookieNamed(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func csrfIn(t *testing.T, page string) string {
	t.Helper()
	m := uiCSRF.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no csrf field in the page:\n%.400s", page)
	}
	return m[1]
}

// uiLogin signs name in on g and returns the session cookie.
func uiLogin(t *testing.T, g *testGateway, name, pw string) *http.Cookie {
	t.Helper()
	resp, page := uiDo(t, g, http.MethodGet, "/login", nil)
	pre := cookieNamed(resp, "sluice_login")
	if pre == nil {
		t.Fatalf("GET /login: %d, no sluice_login cookie", resp.StatusCode)
	}
	resp, page = uiDo(t, g, http.MethodPost, "/login", url.Values{"csrf": {csrfIn(t, page)}, "username": {name}, "password": {pw}}, pre)
	c := cookieNamed(resp, "sluice_session")
	if resp.StatusCode != http.StatusSeeOther || c == nil || c.Value == "" {
		t.Fatalf("POST /login: %d, session cookie %v\n%.400s", resp.StatusCode, c, page)
	}
	return c
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestUISessionsAcrossReplicas: two gateways on one real PostgreSQL, as
// behind a load balancer without sticky routing. bob signs in to A's
// review UI and, with the same cookie, opens and approves a hold on B
// (the CSRF token B's page carries is A's: bound to the session, not the
// replica); he signs out on B and the cookie is refused on A (pages send
// him to /login, a POST and the admin API are 401), B's audit log saying
// ui.logout. A session idle past its timeout, or past its absolute end,
// is refused on both and its row deleted. No row holds a session id or a
// CSRF token: the table has the id's SHA-256 only.
func TestUISessionsAcrossReplicas(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	dsn := srv.SuperURL(srv.NewDatabaseT(t))
	up := newUpstream(t)
	pwh, err := bcrypt.GenerateFromPassword([]byte("bob-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	var gs [2]*testGateway
	for i := range gs {
		gs[i] = startHolds(t, up, "", func(c *config.Config) {
			c.Store = dsn
			c.Gateway.ReplicaID = fmt.Sprintf("r%d", i)
			for j := range c.Approvers.Users {
				if c.Approvers.Users[j].Name == "bob" {
					c.Approvers.Users[j].PasswordHash = string(pwh)
				}
			}
		})
	}
	a, b := gs[0], gs[1]
	ctx := context.Background()
	pg, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	rowCount := func(idHash string) int {
		t.Helper()
		var n int
		if err := pg.QueryRow(ctx, `SELECT COUNT(*) FROM ui_sessions WHERE id_hash = $1`, idHash).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// refused says the cookie is not signed in on g, for the designed
	// reason: no live session (a page sends to /login, a POST and the
	// admin API answer 401).
	refused := func(t *testing.T, g *testGateway, name string, c *http.Cookie, holdID, csrf string) {
		t.Helper()
		if resp, _ := uiDo(t, g, http.MethodGet, "/", nil, c); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
			t.Errorf("%s: GET / with the cookie: %d → %q; want 303 to /login", name, resp.StatusCode, resp.Header.Get("Location"))
		}
		if resp, body := uiDo(t, g, http.MethodPost, "/holds/"+holdID+"/deny", url.Values{"csrf": {csrf}}, c); resp.StatusCode != http.StatusUnauthorized ||
			!strings.Contains(body, "Not signed in") {
			t.Errorf("%s: POST deny with the cookie and its csrf: %d; want 401 not signed in", name, resp.StatusCode)
		}
		if resp, _ := uiDo(t, g, http.MethodGet, "/api/v1/holds/"+holdID, nil, c); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: admin API with the cookie: %d; want 401", name, resp.StatusCode)
		}
	}

	// A held call, made through A.
	r := doCall(t, a.client(agentA), "tickets.create_refund", refund)
	id, st := holdOf(t, r)
	if r.status != http.StatusAccepted || st != "pending" {
		t.Fatalf("ask: %d %s", r.status, r.raw)
	}

	c := uiLogin(t, a, "bob", "bob-pw")
	t.Run("no raw id in any row", func(t *testing.T) {
		resp, page := uiDo(t, a, http.MethodGet, "/", nil, c)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET / on A: %d", resp.StatusCode)
		}
		csrf := csrfIn(t, page)
		rows, err := pg.Query(ctx, `SELECT id_hash, person, member_of, method, created::text, last_seen::text, expires::text, idle::text FROM ui_sessions`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			n++
			row := fmt.Sprint(vals...)
			if strings.Contains(row, c.Value) || strings.Contains(row, csrf) {
				t.Fatalf("a ui_sessions row holds the session id or its CSRF token: %v", vals)
			}
			if vals[0] != sha256Hex(c.Value) || vals[1] != "bob" || vals[2] != `["finance"]` || vals[3] != "password" {
				t.Fatalf("row %v; want keyed by the cookie's SHA-256, bob in finance by password", vals)
			}
		}
		if err := rows.Err(); err != nil || n != 1 {
			t.Fatalf("%d rows (%v); want bob's one", n, err)
		}
	})

	t.Run("signed in on A, approves on B", func(t *testing.T) {
		_, pageA := uiDo(t, a, http.MethodGet, "/holds/"+id, nil, c)
		resp, pageB := uiDo(t, b, http.MethodGet, "/holds/"+id, nil, c)
		if resp.StatusCode != http.StatusOK || !strings.Contains(pageB, "bob") {
			t.Fatalf("GET the hold on B with A's cookie: %d\n%.400s", resp.StatusCode, pageB)
		}
		csrf := csrfIn(t, pageB)
		if csrf != csrfIn(t, pageA) {
			t.Fatal("B's page carries another CSRF token than A's for the same session")
		}
		// The token is the session's: another's is refused on B.
		if resp, _ := uiDo(t, b, http.MethodPost, "/holds/"+id+"/approve", url.Values{"csrf": {csrf[1:] + "x"}}, c); resp.StatusCode != http.StatusForbidden {
			t.Fatalf("approve on B with a wrong token: %d; want 403", resp.StatusCode)
		}
		resp, _ = uiDo(t, b, http.MethodPost, "/holds/"+id+"/approve", url.Values{"csrf": {csrf}, "reason": {"ok from B"}}, c)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/holds/"+id {
			t.Fatalf("approve on B: %d → %q", resp.StatusCode, resp.Header.Get("Location"))
		}
		h, err := a.Holds().Get(ctx, id)
		if err != nil || h.DecidedBy != "bob" || h.Status == holds.Pending || h.Status == holds.Denied {
			t.Fatalf("the hold as A reads it: %+v, %v; want approved by bob", h, err)
		}
	})

	t.Run("signed out on B, refused on A", func(t *testing.T) {
		_, page := uiDo(t, b, http.MethodGet, "/", nil, c)
		csrf := csrfIn(t, page)
		resp, _ := uiDo(t, b, http.MethodPost, "/logout", url.Values{"csrf": {csrf}}, c)
		if cl := cookieNamed(resp, "sluice_session"); resp.StatusCode != http.StatusSeeOther || cl == nil || cl.MaxAge >= 0 {
			t.Fatalf("logout on B: %d, cookie %v; want 303 clearing it", resp.StatusCode, cl)
		}
		if n := rowCount(sha256Hex(c.Value)); n != 0 {
			t.Fatalf("%d rows for the signed-out session", n)
		}
		refused(t, a, "A", c, id, csrf)
		refused(t, b, "B", c, id, csrf)
		log, err := os.ReadFile(b.cfg.Audit.Path)
		if err != nil || !regexp.MustCompile(`"event":"ui.logout".*"user":"bob"`).Match(log) {
			t.Fatalf("B's audit log has no ui.logout for bob (%v)", err)
		}
	})

	// ended signs bob in on A, moves his row's times back by the SQL
	// given (as if the time had passed), and checks both refuse it.
	ended := func(name, update string, arg int64) {
		t.Run(name, func(t *testing.T) {
			c := uiLogin(t, a, "bob", "bob-pw")
			_, page := uiDo(t, b, http.MethodGet, "/", nil, c)
			csrf := csrfIn(t, page) // live on B before
			tag, err := pg.Exec(ctx, update, sha256Hex(c.Value), arg)
			if err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("update the row: %v %v", tag, err)
			}
			refused(t, b, "B", c, id, csrf)
			if n := rowCount(sha256Hex(c.Value)); n != 0 {
				t.Fatalf("%d rows for the ended session after B refused it; want it deleted", n)
			}
			refused(t, a, "A", c, id, csrf)
		})
	}
	// Used a minute ago at most, but its absolute end a minute past.
	ended("past its absolute end", `UPDATE ui_sessions SET expires = $2 WHERE id_hash = $1`, time.Now().Add(-time.Minute).UnixNano())
	// Its last use the idle timeout and a minute ago.
	ended("idle past the timeout", `UPDATE ui_sessions SET last_seen = last_seen - idle - $2 WHERE id_hash = $1`, time.Minute.Nanoseconds())
}
