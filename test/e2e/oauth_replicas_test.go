//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/bcrypt"

	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

const docsOAuthSpec = `openapi: 3.0.3
info: { title: docs, version: "1" }
components:
  securitySchemes:
    docsAuth:
      type: oauth2
      flows:
        authorizationCode:
          authorizationUrl: %[1]s/auth
          tokenUrl: %[1]s/oauth/token
          scopes: { openid: sign in, offline_access: stay connected }
security: [ { docsAuth: [openid] } ]
paths:
  /tickets:
    get:
      operationId: listTickets
      responses: { "200": { description: ok } }
`

// vaultOAuthPolicy is what the README says the gateway's Vault role needs
// for people's OAuth tokens, beside reading its other secrets.
const vaultOAuthPolicy = `
path "secret/data/*" { capabilities = ["read"] }
path "secret/data/sluice/user/*" { capabilities = ["create", "update", "read"] }
path "secret/metadata/sluice/user/*" { capabilities = ["delete"] }
`

var connectCSRF = regexp.MustCompile(`/connections/docs/connect\?csrf=([A-Za-z0-9_-]+)`)

// TestOAuthTwoProcessesOnePostgres: two `sluice serve` processes (r0, r1)
// on one real PostgreSQL and one real Vault (AppRole with the README's
// policy), zitadel's authorization server in the namespace, one public
// URL for both (as behind a load balancer):
//   - alice signs in to r0's review UI and clicks Connect; after her
//     consent the provider's redirect reaches r1, where she has no session:
//     connected (the started connect is in the store, her browser proven
//     by the connect cookie); the same callback again on r0 is refused;
//   - her tokens are in Vault KV, in no PostgreSQL row;
//   - with the access token expired, 40 concurrent calls through both
//     processes make exactly one refresh at the provider (the refresh
//     lease), every call carrying the new token.
func TestOAuthTwoProcessesOnePostgres(t *testing.T) {
	requireHost(t)
	e := newEnv(t)
	in := vaulttest.Net(e.NS.Do)
	vs := vaulttest.StartIn(t, in)
	vs.Write(t, "secret/data/sluice/project/docs-client-secret", map[string]any{"data": map[string]any{"value": oauthtest.WebSecret}})
	rid, sid := vs.AppRole(t, t.TempDir(), "gateway", vaultOAuthPolicy, "1h")
	pg := pgtest.StartT(t, pgtest.Options{})
	db := pg.NewDatabaseT(t)
	dsn := pg.SocketURL(db)
	const public = "http://sluice.test"
	as := oauthtest.StartOn(t, e.NS.Listen(t, "127.0.0.1:0"), public+"/connections/callback", "sluice-docs")
	as.Transport = in.HTTPClient(10 * time.Second).Transport
	spec := filepath.Join(e.Dir, "docs.yaml")
	if err := os.WriteFile(spec, fmt.Appendf(nil, docsOAuthSpec, as.URL), 0o644); err != nil {
		t.Fatal(err)
	}
	pw, _ := bcrypt.GenerateFromPassword([]byte("alice-pw"), bcrypt.MinCost)

	var gs [2]*gwenv.Gateway
	for i := range gs {
		d := e.CoreConfig(fmt.Sprintf("or%d", i))
		d["store"] = dsn
		d.Gateway()["replica_id"] = fmt.Sprintf("r%d", i)
		d["secrets"] = map[string]any{"backend": "vault", "vault": map[string]any{
			"address": vs.Addr, "timeout": "5s", "auth": map[string]any{"method": "approle", "role_id_file": rid, "secret_id_file": sid}}}
		d["approvals"] = map[string]any{"public_url": public}
		d["connectors"] = []map[string]any{{
			"slug": "docs", "spec": spec, "base_url": fmt.Sprintf("http://127.0.0.1:%d", e.Up.Port), "allow_private": []string{"127.0.0.0/8"},
			"credential": map[string]any{"oauth2": map[string]any{"flow": "authorization_code", "client_id": "sluice-docs",
				"client_secret": "docs-client-secret", "scopes": []string{"openid", "offline_access"}}},
		}}
		d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{"docs"}}}
		d["policies"] = []map[string]any{{"match": "*", "action": "allow"}}
		d["approvers"] = map[string]any{"users": []map[string]any{{"name": "alice", "password_hash": string(pw)}}}
		path := e.Write(d)
		gs[i] = e.Launch(d, path)
	}
	for _, g := range gs {
		g.AwaitSocket()
		g.AwaitReady()
	}
	r0, r1 := gs[0], gs[1]

	// alice's browser: one cookie jar for the public name, whichever
	// process answers.
	jar, _ := cookiejar.New(nil)
	pub, _ := url.Parse(public + "/")
	at := func(path string) *url.URL { u, _ := url.Parse(public + pathOnly(path)); return u }
	browser := func(g *gwenv.Gateway) *http.Client {
		c := g.AdminClient()
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		return c
	}
	// get sends a request to g as if to the public URL (same cookies).
	get := func(g *gwenv.Gateway, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+g.Admin+path, nil)
		for _, ck := range jar.Cookies(at(path)) {
			req.AddCookie(ck)
		}
		resp, err := browser(g).Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		jar.SetCookies(at(path), resp.Cookies())
		return resp, string(b)
	}
	_, login := get(r0, "/login")
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(login)
	if csrf == nil {
		t.Fatal("no CSRF token on the login page")
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+r0.Admin+"/login", strings.NewReader(url.Values{"csrf": {csrf[1]}, "username": {"alice"}, "password": {"alice-pw"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, ck := range jar.Cookies(pub) {
		req.AddCookie(ck)
	}
	resp, err := browser(r0).Do(req)
	if err != nil || resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("sign in on r0: %v %v", resp, err)
	}
	resp.Body.Close()
	jar.SetCookies(pub, resp.Cookies())
	_, page := get(r0, "/connections")
	m := connectCSRF.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no Connect link on r0's Connections page: %.500s (cookies %v)", page, jar.Cookies(at("/connections")))
	}
	resp, _ = get(r0, "/connections/docs/connect?csrf="+m[1])
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("connect on r0: %d", resp.StatusCode)
	}
	back, err := as.Consent(resp.Header.Get("Location"))
	if err != nil || back.Host != "sluice.test" {
		t.Fatalf("consent: %v %v", back, err)
	}
	// The provider's redirect reaches r1, where alice never signed in.
	resp, body := get(r1, back.RequestURI())
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/connections?connected=docs" {
		t.Fatalf("callback on r1: %d %s %.300s\n%s", resp.StatusCode, resp.Header.Get("Location"), body, r1.Stderr())
	}
	r1.AwaitAuditFields("connection_connected", map[string]any{"user": "alice", "connector": "docs"})
	resp, body = get(r0, back.RequestURI())
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "not valid for your session") {
		t.Fatalf("the same callback again on r0: %d", resp.StatusCode)
	}
	if n := as.Grants("authorization_code"); n != 1 {
		t.Fatalf("%d code exchanges, want 1", n)
	}

	t.Run("D22 callback from another browser", func(t *testing.T) {
		cb := casebook.Expect(t, "D22", "an OAuth connect's callback URL (state and code) opened in a browser other than the one that started the connect, on another replica",
			"400 page, refused for the state before any code exchange, audited connection_refused reason state; no connection stored for anyone")
		// Connect again (the session's CSRF token, as the page had it).
		resp, _ := get(r0, "/connections/docs/connect?csrf="+m[1])
		back, err := as.Consent(resp.Header.Get("Location"))
		if err != nil {
			t.Fatal(err)
		}
		// Another browser: no cookie at all (not alice's connect cookie).
		req, _ := http.NewRequest(http.MethodGet, "http://"+r1.Admin+back.RequestURI(), nil)
		other, err := browser(r1).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(other.Body)
		other.Body.Close()
		rec := r1.For(t).AwaitAuditFields("connection_refused", map[string]any{"reason": "state"})
		exchanged := as.Grants("authorization_code") - 1
		cb.Observef("%d, %d code exchanges, audited %v", other.StatusCode, exchanged, rec != nil)
		if other.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "not valid for your session") || exchanged != 0 {
			t.Fatalf("%d, %d exchanges", other.StatusCode, exchanged)
		}
	})

	// The tokens: in Vault KV, in no PostgreSQL row.
	vc := vs.Client(t)
	readTokens := func() map[string]any {
		t.Helper()
		sec, err := vc.Logical().Read("secret/data/sluice/user/alice/oauth2.docs")
		if err != nil || sec == nil {
			t.Fatalf("no tokens in Vault KV: %v", err)
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(sec.Data["data"].(map[string]any)["value"].(string)), &rec); err != nil {
			t.Fatal(err)
		}
		return rec
	}
	first := readTokens()
	access, refresh := first["access"].(string), first["refresh"].(string)
	rows := pgDump(t, pg, db)
	if !strings.Contains(rows, `"status":"connected"`) || strings.Contains(rows, access) || strings.Contains(rows, refresh) {
		t.Fatalf("PostgreSQL (a connected row, no token): %s", rows)
	}

	// Expired: both processes' next calls go to the store.
	first["expiry"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(first)
	vs.Write(t, "secret/data/sluice/user/alice/oauth2.docs", map[string]any{"data": map[string]any{"value": string(b)}})
	before := len(e.Up.Requests())
	const n = 40
	var wg sync.WaitGroup
	var bad atomic.Int64
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			r := gs[i%2].For(t).Call(agentA, "docs.list_tickets", `{}`)
			if r.Status != http.StatusOK {
				bad.Add(1)
				t.Errorf("call %d on r%d: %d %s", i, i%2, r.Status, r.Body)
			}
		})
	}
	d21 := casebook.Expect(t, "D21", "a person's OAuth access token expired; 40 concurrent calls spread over 2 gateway processes on one PostgreSQL (a refresh token used twice is revoked by many providers)",
		"exactly one refresh at the provider (the store's refresh lease); every call 200 with the new token; the rotated refresh token stored")
	close(start)
	wg.Wait()
	d21.Observef("%d calls failed, %d refreshes at the provider", bad.Load(), as.Grants("refresh_token"))
	if bad.Load() > 0 {
		t.FailNow()
	}
	if got := as.Grants("refresh_token"); got != 1 {
		t.Fatalf("%d calls through 2 processes made %d refreshes at the provider, want 1", n, got)
	}
	now := readTokens()
	if now["refresh"] == refresh || now["access"] == access {
		t.Fatal("the stored tokens were not rotated")
	}
	seen := e.Up.Requests()[before:]
	if len(seen) != n {
		t.Fatalf("upstream got %d requests, want %d", len(seen), n)
	}
	for _, s := range seen {
		if s.Header.Get("Authorization") != "Bearer "+now["access"].(string) {
			t.Fatal("a call carried a token other than the refreshed one")
		}
	}
}

func pathOnly(p string) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		return p[:i]
	}
	return p
}

// pgDump returns the OAuth tables' rows as JSON lines.
func pgDump(t *testing.T, pg *pgtest.Server, db string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.SuperURL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var sb strings.Builder
	for _, tbl := range []string{"oauth_connections", "oauth_pending"} {
		rows, err := conn.Query(ctx, `SELECT row_to_json(x)::text FROM `+tbl+` x`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			sb.WriteString(s + "\n")
		}
		rows.Close()
	}
	return sb.String()
}
