package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// docsSpec is an API whose operations need an oauth2 token; the flow's
// URLs are the test's authorization server, so the gateway takes them from
// the spec.
const docsSpec = `openapi: 3.0.3
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
  /docs/{id}:
    get:
      operationId: getDoc
      parameters: [ { name: id, in: path, required: true, schema: { type: string, maxLength: 20 } } ]
      responses: { "200": { description: ok } }
  /status:
    get:
      operationId: getStatus
      responses: { "200": { description: ok } }
`

const oauthYAML = `
gateway:
  sandbox_socket: %[1]s/relay.sock
  trusted_relay_uids: [%[2]d]
  admin_listen: %[3]s
store: sqlite:%[1]s/sluice.db
audit: { path: %[1]s/audit.log }
secrets: { backend: local, local: { path: %[1]s/secrets.json, key_file: %[1]s/secrets.key } }
approvals: { public_url: "http://%[3]s" }
connectors:
  - slug: docs
    spec: %[1]s/docs.yaml
    base_url: %[4]s
    allow_private: [127.0.0.0/8]
    credential:
      oauth2:
        flow: authorization_code
        client_id: sluice-docs
        client_secret: docs-client-secret
        scopes: [openid, offline_access]
        revocation_url: %[5]s/revoke
  - slug: held-docs
    spec: %[1]s/docs.yaml
    base_url: %[4]s
    allow_private: [127.0.0.0/8]
    credential:
      oauth2: { flow: authorization_code, client_id: sluice-docs, client_secret: docs-client-secret, scopes: [openid, offline_access], on_missing: hold }
  - slug: svc
    spec: %[1]s/docs.yaml
    base_url: %[4]s
    allow_private: [127.0.0.0/8]
    credential:
      oauth2: { flow: client_credentials, client_id: sid1, client_secret: svc-client-secret, token_url: %[5]s/oauth/token, scopes: [openid] }
agents:
  - { name: triage, connectors: [docs, held-docs, svc] }
policies:
  - { match: "*", action: allow }
approvers:
  users:
    - { name: alice, groups: [eng], password_hash: "%[6]s" }
`

// oauthRig is the real `sluice serve` binary (oauthYAML's docs,
// held-docs and svc connectors, or mcp_oauth_test.go's remotes),
// zitadel's authorization server and a recording upstream on loopback,
// and a Chromium.
type oauthRig struct {
	t       *testing.T
	as      *oauthtest.Server
	gw      *serveProc
	cfg     *config.Config
	base    string
	browser context.Context

	mu    sync.Mutex
	auths []string // Authorization headers the upstream received
	log   bytes.Buffer
}

// Write collects the gateway's log lines, to search them for tokens.
func (r *oauthRig) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.Write(b)
}

func (r *oauthRig) logHas(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Contains(r.log.String(), s)
}

var alice = wire.Identity{Sandbox: "sb-9", Agent: "triage", Session: "s-9", User: "alice", Host: "h1"}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func newOAuthRig(t *testing.T) *oauthRig {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		t.Skipf("skipping: %s is missing (install Debian's chromium; test.sh does)", chromium)
	}
	r := &oauthRig{t: t}
	admin := freeAddr(t)
	r.as = oauthtest.Start(t, "http://"+admin+"/connections/callback", "sluice-docs")
	// The upstream records the Authorization it got and reflects it in
	// its reply, as a careless echo endpoint would (THREATS D18).
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		a := req.Header.Get("Authorization")
		r.mu.Lock()
		r.auths = append(r.auths, a)
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Echo", a)
		json.NewEncoder(w).Encode(map[string]string{"path": req.URL.Path, "you_sent": a})
	}))
	t.Cleanup(up.Close)

	dir, err := os.MkdirTemp("", "sluice-oa-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "docs.yaml"), fmt.Appendf(nil, docsSpec, r.as.URL), 0o644); err != nil {
		t.Fatal(err)
	}
	y := fmt.Sprintf(oauthYAML, dir, os.Getuid(), admin, up.URL, r.as.URL, pwHash(t, "alice-pw"))
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(y), dir)
	if err != nil {
		t.Fatal(err)
	}
	r.cfg = cfg
	st, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"docs-client-secret": oauthtest.WebSecret, "svc-client-secret": oauthtest.ServiceSecret} {
		if err := st.Set(context.Background(), name, vault.ScopeProject, vault.NewSecret([]byte(v))); err != nil {
			t.Fatal(err)
		}
	}
	r.gw = startServe(t, path, admin, r)
	r.base, r.browser = "http://"+admin, startBrowser(t)
	return r
}

// call makes alice's sandbox's tool call over the sandbox socket.
func (r *oauthRig) call(tool, args string) (int, string, http.Header) {
	r.t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return wire.Dial(ctx, r.cfg.Gateway.SandboxSocket, alice)
	}}}
	resp, err := c.Post("http://sluice/v1/tools/"+tool, "application/json", strings.NewReader(args))
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func (r *oauthRig) upstreamAuths() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.auths...)
}

func (r *oauthRig) signIn() *person {
	rg := &rig{t: r.t, base: r.base, browser: r.browser}
	return rg.signIn("alice", "alice-pw")
}

// connect clicks Connect for docs and signs in at the provider.
func (r *oauthRig) connect(p *person) { r.connectSlug(p, "docs") }

func (r *oauthRig) connectSlug(p *person, slug string) {
	r.t.Helper()
	connectAs(p, r.base, slug, r.as.Username())
}

// connectAs clicks Connect for slug on the Connections page at base and
// signs in at the provider as username, until the page says connected.
func connectAs(p *person, base, slug, username string) {
	p.r.t.Helper()
	p.do(chromedp.Navigate(base+"/connections"), chromedp.WaitVisible(chromedp.CSS("#connect-"+slug)),
		chromedp.Click(chromedp.CSS("#connect-"+slug)),
		chromedp.WaitVisible(chromedp.CSS("#username")),
		chromedp.SendKeys(chromedp.CSS("#username"), username),
		chromedp.SendKeys(chromedp.CSS("#password"), oauthtest.Password),
		chromedp.Submit(chromedp.CSS("#password")),
		chromedp.WaitVisible(chromedp.CSS(`#conn-`+slug+` [data-status="connected"]`)),
	)
}

// storedConnection is alice's docs tokens as the gateway stored them, in
// the local secret store (its row is in the gateway's SQLite store, which
// the page shows); an error wrapping vault.ErrNotFound when there are none.
func (r *oauthRig) storedConnection() (oauth.Connection, error) {
	rec, err := r.storedTokens()
	if err != nil {
		return oauth.Connection{}, err
	}
	c := oauth.Connection{Connector: "docs", User: "alice"}
	c.Access, _ = rec["access"].(string)
	c.Refresh, _ = rec["refresh"].(string)
	return c, nil
}

func (r *oauthRig) localStore() *vault.Local {
	r.t.Helper()
	st, err := vault.OpenLocal(r.cfg.Secrets.Local.Path, r.cfg.Secrets.Local.KeyFile)
	if err != nil {
		r.t.Fatal(err)
	}
	return st
}

// storedTokens is alice's tokens secret (oauth2.docs at user:alice).
func (r *oauthRig) storedTokens() (map[string]any, error) {
	v, err := r.localStore().Get(context.Background(), "oauth2.docs", vault.UserScope("alice"))
	if err != nil {
		return nil, err
	}
	var rec map[string]any
	if err := json.Unmarshal(v.Reveal(), &rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// expireStored makes the stored access token expired and restarts the
// gateway (its token cache is its memory), so the next call must refresh.
func (r *oauthRig) expireStored() {
	r.t.Helper()
	r.gw.stop()
	r.writeExpired()
	r.gw.start()
}

// writeExpired makes alice's stored docs access token expired.
func (r *oauthRig) writeExpired() {
	r.t.Helper()
	rec, err := r.storedTokens()
	if err != nil {
		r.t.Fatal(err)
	}
	rec["expiry"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(rec)
	if err := r.localStore().Set(context.Background(), "oauth2.docs", vault.UserScope("alice"), vault.NewSecret(b)); err != nil {
		r.t.Fatal(err)
	}
}

func refusalCode(t *testing.T, body string) refusal.Code {
	var b refusal.Body
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		t.Fatalf("not a refusal: %s", body)
	}
	return b.Error.Code
}

func auditHas(t *testing.T, path string, want ...string) bool {
	return auditFind(t, path, want...) != nil
}

// auditFind is the first of the last 400 audit records that contains
// every string of want (nil: none does).
func auditFind(t *testing.T, path string, want ...string) json.RawMessage {
	t.Helper()
	recs, err := tailAudit(path, 400)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		ok := true
		for _, w := range want {
			ok = ok && bytes.Contains(rec, []byte(w))
		}
		if ok {
			return rec
		}
	}
	return nil
}

func TestOAuthConnectCallRefreshRevokeDisconnect(t *testing.T) {
	r := newOAuthRig(t)

	// Not connected: 403 connection_required with the page to connect on;
	// nothing sent.
	st, body, _ := r.call("docs.get_doc", `{"path":{"id":"d1"}}`)
	if st != 403 || refusalCode(t, body) != refusal.ConnectionRequired || !strings.Contains(body, r.cfg.Approvals.PublicURL+"/connections?connector=docs") {
		t.Fatalf("before connecting: %d %s", st, body)
	}
	if n := len(r.upstreamAuths()); n != 0 {
		t.Fatalf("upstream reached %d times without a connection", n)
	}
	if !auditHas(t, r.cfg.Audit.Path, `"connection_required"`, `"docs.get_doc"`) {
		t.Fatal("the refusal is not in the audit log with its code")
	}

	p := r.signIn()
	p.do(chromedp.Navigate(r.base+"/connections"), chromedp.WaitVisible(chromedp.CSS(`#conn-docs [data-status="not_connected"]`)))
	p.shot("oauth-01-connections-not-connected")
	r.connect(p)
	page := eval[string](p, `document.querySelector("#conn-docs").innerText`)
	if !strings.Contains(page, "offline_access") || !strings.Contains(page, "connected") {
		t.Fatalf("connections page after connecting: %q", page)
	}
	p.shot("oauth-02-connected")

	conn, err := r.storedConnection()
	if err != nil || conn.Access == "" || conn.Refresh == "" {
		t.Fatalf("stored connection: %v %v", conn, err)
	}

	// The authorization request carried a PKCE S256 challenge, a state
	// and the gateway's callback (the provider checked the verifier at the
	// code exchange).
	if ar := r.as.AuthRequests(); len(ar) != 1 || ar[0].Get("code_challenge_method") != "S256" || len(ar[0].Get("code_challenge")) < 43 ||
		len(ar[0].Get("state")) < 32 || ar[0].Get("redirect_uri") != r.cfg.Approvals.PublicURL+"/connections/callback" {
		t.Fatalf("authorization requests: %v", ar)
	}

	// E14: the callback that connected, replayed; and a forged state.
	redirects := r.as.Redirects()
	if len(redirects) != 1 {
		t.Fatalf("provider redirected back %d times", len(redirects))
	}
	for _, c := range []struct{ name, url string }{
		{"replayed callback (state and code already used)", redirects[0]},
		{"forged state with the used code", r.base + "/connections/callback?state=forged&code=" + strings.SplitN(strings.SplitN(redirects[0], "code=", 2)[1], "&", 2)[0]},
	} {
		t.Run(c.name, func(t *testing.T) {
			cb := casebook.Expect(t, "E14", "OAuth connect: "+c.name+" on the Connections callback (Chromium, signed in)", "400 page, state refused before any code exchange, audited connection_refused reason state; the connection unchanged")
			before := r.as.Grants("authorization_code")
			target := strings.Replace(c.url, "http://"+r.cfg.Gateway.AdminListen, r.base, 1)
			p.do(chromedp.Navigate(target), chromedp.WaitVisible(chromedp.CSS("#error-message")))
			msg := eval[string](p, `document.querySelector("#error-message").innerText`)
			exchanged := r.as.Grants("authorization_code") - before
			audited := auditHas(t, r.cfg.Audit.Path, `"connection_refused"`, `"state"`)
			cb.Observef("page %q, %d code exchanges, audited %v", msg, exchanged, audited)
			if !strings.Contains(msg, "not valid for your session") || exchanged != 0 || !audited {
				t.Fatalf("page %q, %d exchanges, audited %v", msg, exchanged, audited)
			}
		})
	}

	t.Run("used code under a fresh state", func(t *testing.T) {
		cb := casebook.Expect(t, "E14", "OAuth connect: the used code replayed under a fresh state this browser started (Chromium, signed in)",
			"the state passes, the provider refuses the used code: 400 page, audited connection_refused reason exchange; the stored connection unchanged")
		// Connect again, up to the provider's sign-in page, whose auth
		// request holds the state the gateway issued for this browser.
		p.do(chromedp.Navigate(r.base+"/connections"), chromedp.WaitVisible(chromedp.CSS("#disconnect-docs")))
		csrf := eval[string](p, `document.querySelector("#conn-docs input[name=csrf]").value`)
		p.do(chromedp.Navigate(r.base+"/connections/docs/connect?csrf="+url.QueryEscape(csrf)), chromedp.WaitVisible(chromedp.CSS("#username")))
		u, err := url.Parse(eval[string](p, `location.href`))
		if err != nil {
			t.Fatal(err)
		}
		ar, err := r.as.Storage.AuthRequestByID(context.Background(), u.Query().Get("authRequestID"))
		if err != nil {
			t.Fatal(err)
		}
		used := strings.SplitN(strings.SplitN(redirects[0], "code=", 2)[1], "&", 2)[0]
		before := r.as.Grants("authorization_code")
		p.do(chromedp.Navigate(r.base+"/connections/callback?state="+url.QueryEscape(ar.GetState())+"&code="+used), chromedp.WaitVisible(chromedp.CSS("#error-message")))
		msg := eval[string](p, `document.querySelector("#error-message").innerText`)
		exchanged := r.as.Grants("authorization_code") - before
		audited := auditHas(t, r.cfg.Audit.Path, `"connection_refused"`, `"reason":"exchange"`)
		now, err := r.storedConnection()
		cb.Observef("page %q, %d code exchanges refused, audited %v, connection unchanged %v", msg, exchanged, audited, err == nil && now.Access == conn.Access && now.Refresh == conn.Refresh)
		if !strings.Contains(msg, "did not accept") || exchanged != 1 || !audited || err != nil || now.Access != conn.Access || now.Refresh != conn.Refresh {
			t.Fatalf("page %q, %d exchanges, audited %v, stored %v %v", msg, exchanged, audited, now.Access == conn.Access, err)
		}
	})

	// A call carries alice's token; the reply that reflects it is scrubbed
	// (D18) and the audit record names the connection, not the token.
	st, body, hdr := r.call("docs.get_doc", `{"path":{"id":"d1"}}`)
	auths := r.upstreamAuths()
	t.Run("D18 reflected OAuth token", func(t *testing.T) {
		cb := casebook.Expect(t, "D18", "upstream echoes the OAuth access token the gateway attached (body and header)", "the sandbox's reply carries no token; audit and the agent's answer name the connection only")
		inAudit, _ := os.ReadFile(r.cfg.Audit.Path)
		leaked := strings.Contains(body, conn.Access) || strings.Contains(fmt.Sprint(hdr), conn.Access) || bytes.Contains(inAudit, []byte(conn.Access)) || bytes.Contains(inAudit, []byte(conn.Refresh)) ||
			r.logHas(conn.Access) || r.logHas(conn.Refresh)
		named := auditHas(t, r.cfg.Audit.Path, `oauth2 docs/alice scopes=`)
		cb.Observef("status %d, token in reply/audit %v, record names the connection %v", st, leaked, named)
		if st != 200 || len(auths) != 1 || auths[0] != "Bearer "+conn.Access || leaked || !named {
			t.Fatalf("status %d body %s; upstream got a bearer %v; leaked %v; named %v", st, body, len(auths) == 1 && auths[0] == "Bearer "+conn.Access, leaked, named)
		}
	})

	// 50 concurrent calls with an expired token: one refresh.
	r.expireStored()
	var wg sync.WaitGroup
	codes := make([]int, 50)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _, _ = r.call("docs.get_doc", `{"path":{"id":"d2"}}`)
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Fatalf("concurrent call %d: %d", i, c)
		}
	}
	if n := r.as.Grants("refresh_token"); n != 1 {
		t.Fatalf("50 concurrent calls with an expired token made %d refreshes, want 1", n)
	}
	fresh, _ := r.storedConnection()
	for _, a := range r.upstreamAuths()[1:] {
		if a != "Bearer "+fresh.Access || fresh.Access == conn.Access || fresh.Refresh == conn.Refresh {
			t.Fatal("a call after the refresh carried a stale token, or the rotated refresh token was not stored")
		}
	}

	// Consent revoked at the provider: the refresh is refused, the
	// connection needs reconnecting, nothing is sent.
	r.as.RevokeConsent(t, "sluice-docs")
	r.expireStored()
	sent := len(r.upstreamAuths())
	st, body, _ = r.call("docs.get_doc", `{"path":{"id":"d3"}}`)
	if st != 403 || refusalCode(t, body) != refusal.ConnectionRequired || !strings.Contains(body, "reconnect") {
		t.Fatalf("after revoked consent: %d %s", st, body)
	}
	if len(r.upstreamAuths()) != sent {
		t.Fatal("a call was sent with a stale token")
	}
	p.do(chromedp.Navigate(r.base+"/connections"), chromedp.WaitVisible(chromedp.CSS(`#conn-docs [data-status="needs_reconnect"]`)))
	p.shot("oauth-03-needs-reconnect")

	// Reconnect, then disconnect: revoked at the provider, deleted here (D20).
	r.connect(p)
	conn, _ = r.storedConnection()
	t.Run("D20 disconnect revokes", func(t *testing.T) {
		cb := casebook.Expect(t, "D20", "a person disconnects an OAuth connection on the Connections page", "tokens revoked at the provider (refresh token no longer accepted), deleted from the store, next call 403 connection_required; audited connection_disconnected revoked true")
		revBefore := r.as.Revocations.Load()
		p.do(chromedp.Click(chromedp.CSS("#disconnect-docs")), chromedp.WaitVisible(chromedp.CSS(`#conn-docs [data-status="not_connected"]`)))
		_, stErr := r.storedConnection()
		_, provErr := r.as.Storage.TokenRequestByRefreshToken(context.Background(), conn.Refresh)
		st, body, _ := r.call("docs.get_doc", `{"path":{"id":"d4"}}`)
		audited := auditHas(t, r.cfg.Audit.Path, `"connection_disconnected"`, `"revoked":true`)
		cb.Observef("revocation requests %d, deleted %v, provider refuses the refresh token %v, next call %d %s, audited %v",
			r.as.Revocations.Load()-revBefore, errors.Is(stErr, vault.ErrNotFound), provErr != nil, st, refusalCode(t, body), audited)
		if r.as.Revocations.Load() == revBefore || !errors.Is(stErr, vault.ErrNotFound) || provErr == nil || st != 403 || refusalCode(t, body) != refusal.ConnectionRequired || !audited {
			t.Fatal("disconnect did not revoke and delete")
		}
	})
	p.shot("oauth-04-disconnected")

	// No token of any connection this test made is in the gateway's log
	// or the audit log (THREATS D9, for OAuth tokens).
	audit, _ := os.ReadFile(r.cfg.Audit.Path)
	if !r.logHas("docs.get_doc") {
		t.Fatal("the gateway's log was not captured")
	}
	for _, tok := range []string{conn.Access, conn.Refresh, fresh.Access, fresh.Refresh} {
		if tok != "" && (r.logHas(tok) || bytes.Contains(audit, []byte(tok))) {
			t.Fatal("a token is in the gateway's log or the audit log")
		}
	}
}

func TestOAuthClientCredentials(t *testing.T) {
	r := newOAuthRig(t)
	for i := range 3 {
		st, body, _ := r.call("svc.get_status", `{}`)
		if st != 200 {
			t.Fatalf("call %d: %d %s", i, st, body)
		}
	}
	auths := r.upstreamAuths()
	if len(auths) != 3 || !strings.HasPrefix(auths[0], "Bearer ") || auths[1] != auths[0] {
		t.Fatalf("upstream saw %d calls; bearer %v", len(auths), len(auths) > 0 && strings.HasPrefix(auths[0], "Bearer "))
	}
	if n := r.as.Grants("client_credentials"); n != 1 {
		t.Fatalf("client_credentials grants = %d, want 1 (cached)", n)
	}
}

func TestOAuthHeldUntilConnected(t *testing.T) {
	r := newOAuthRig(t)
	type res struct {
		st   int
		body string
	}
	ch := make(chan res, 1)
	go func() {
		st, body, _ := r.call("held-docs.get_doc", `{"path":{"id":"h1"}}`)
		ch <- res{st, body}
	}()
	var created struct {
		Fields struct{ Hold, Tool, User, Reason string }
	}
	for end := time.Now().Add(20 * time.Second); created.Fields.Hold == ""; time.Sleep(50 * time.Millisecond) {
		if rec := auditFind(t, r.cfg.Audit.Path, `"hold_created"`); rec != nil {
			if err := json.Unmarshal(rec, &created); err != nil {
				t.Fatal(err)
			}
		}
		if time.Now().After(end) {
			t.Fatal("the call for a person without a connection was not held")
		}
	}
	if h := created.Fields; h.Tool != "held-docs.get_doc" || h.User != "alice" || !strings.Contains(h.Reason, "connect held-docs") {
		t.Fatalf("hold %+v", h)
	}
	if n := len(r.upstreamAuths()); n != 0 {
		t.Fatalf("upstream reached %d times before the connect", n)
	}
	p := r.signIn()
	r.connectSlug(p, "held-docs")
	select {
	case got := <-ch:
		if got.st != 200 || !strings.Contains(got.body, `"status":200`) {
			t.Fatalf("held call after the connect: %d %s", got.st, got.body)
		}
	case <-time.After(50 * time.Second):
		t.Fatal("the held call did not run after the connect")
	}
	conn, err := vault.OpenLocal(r.cfg.Secrets.Local.Path, r.cfg.Secrets.Local.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := oauth.LocalStore{Local: conn}.Load(context.Background(), "held-docs", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if a := r.upstreamAuths(); len(a) != 1 || a[0] != "Bearer "+c.Access {
		t.Fatalf("upstream saw %d calls (want 1, with alice's token)", len(a))
	}
	hold := fmt.Sprintf(`"hold":%q`, created.Fields.Hold)
	if !auditHas(t, r.cfg.Audit.Path, `"hold_approved"`, hold, `"by":"connection:held-docs"`) || !auditHas(t, r.cfg.Audit.Path, `"hold_executed"`, hold) {
		t.Fatal("the hold was not approved by the connect and executed (audit)")
	}
}
