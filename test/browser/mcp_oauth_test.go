package browser

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/go-jose/go-jose/v4"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// mcpOAuthYAML: three remote MCP servers that speak MCP authorization,
// each person connecting their own account (no client id: the gateway
// registers one): docs is honest; wrongres's protected-resource metadata
// names another resource; mixup's authorization server says another
// issuer.
const mcpOAuthYAML = `
gateway:
  sandbox_socket: %[1]s/relay.sock
  trusted_relay_uids: [%[2]d]
  admin_listen: %[3]s
store: sqlite:%[1]s/sluice.db
audit: { path: %[1]s/audit.log }
secrets: { backend: local, local: { path: %[1]s/secrets.json, key_file: %[1]s/secrets.key } }
approvals: { public_url: "http://%[3]s" }
connectors:
  - { slug: docs, provider: mcp, url: "%[4]s", allow_private: [127.0.0.0/8], credential: { oauth2: { flow: authorization_code, scopes: [openid, offline_access] } } }
  - { slug: wrongres, provider: mcp, url: "%[5]s", allow_private: [127.0.0.0/8], credential: { oauth2: { flow: authorization_code } } }
  - { slug: mixup, provider: mcp, url: "%[6]s", allow_private: [127.0.0.0/8], credential: { oauth2: { flow: authorization_code } } }
agents:
  - { name: triage, connectors: [docs, wrongres, mixup] }
policies:
  - { match: "*", action: allow }
approvers:
  users:
    - { name: alice, groups: [eng], password_hash: "%[7]s" }
`

// TestMCPAuthorizationRemote is issue 25's MCP authorization through the
// real binary and Chromium: alice connects a remote MCP server whose
// authorization server the gateway discovered (RFC 9728, RFC 8414) and
// registered with (RFC 7591) — PKCE, state and resource= — then a
// sandbox's tools/call carries her token to the server, and its echo of
// the token never reaches the sandbox (D23). A server whose metadata
// names another resource, and one whose authorization server says
// another issuer, are refused at discovery: unavailable with the step and
// reason, shown on the Connections page, audited, and nothing registered,
// authorized or sent (D24). The authorization server then ends the
// client the gateway registered: after a restart with her token expired
// nothing is sent, and her reconnect registers one new client (D25).
func TestMCPAuthorizationRemote(t *testing.T) {
	if _, err := os.Stat(chromium); err != nil {
		t.Skipf("skipping: %s is missing (install Debian's chromium; test.sh does)", chromium)
	}
	admin := freeAddr(t)
	redirect := "http://" + admin + "/connections/callback"
	docs := oauthtest.StartMCP(t, redirect)
	wrongres := oauthtest.StartMCP(t, redirect)
	wrongres.SetResource("https://elsewhere.example/mcp")
	mixup := oauthtest.StartMCP(t, redirect)
	mixup.SetIssuer("https://idp.elsewhere.example")

	dir, err := os.MkdirTemp("", "sluice-mo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	y := fmt.Sprintf(mcpOAuthYAML, dir, os.Getuid(), admin, docs.MCPURL, wrongres.MCPURL, mixup.MCPURL, pwHash(t, "alice-pw"))
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(y), dir)
	if err != nil {
		t.Fatal(err)
	}
	r := &oauthRig{t: t, cfg: cfg}
	r.gw = startServe(t, path, admin, r) // the real binary
	r.base, r.browser = "http://"+admin, startBrowser(t)
	sandbox := wire.Identity{Sandbox: "sb-7", Agent: "triage", Session: "s-7", User: "alice", Host: "h1"}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return wire.Dial(ctx, cfg.Gateway.SandboxSocket, sandbox)
	}}}
	unavailable := func() map[string]string {
		resp, err := hc.Get("http://sluice/v1/tools")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l struct {
			Unavailable []map[string]string `json:"unavailable"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, u := range l.Unavailable {
			out[u["connector"]] = u["reason"]
		}
		return out
	}

	before := unavailable()
	if !strings.Contains(before["docs"], "no person has a working connection to docs") {
		t.Fatalf("docs before anyone connected: %q", before["docs"])
	}
	rg := &rig{t: t, base: r.base, browser: r.browser}
	p := rg.signIn("alice", "alice-pw")

	for _, c := range []struct {
		slug, variant, step, reason string
		srv                         *oauthtest.MCPAuth
	}{
		{"wrongres", "the MCP server's protected-resource metadata (RFC 9728) names another resource (https://elsewhere.example/mcp)", "protected-resource metadata", `names the resource "https://elsewhere.example/mcp"`, wrongres},
		{"mixup", "the authorization server's metadata (RFC 8414) says another issuer than the one the MCP server named (mix-up)", "authorization-server metadata", `says its issuer is "https://idp.elsewhere.example"`, mixup},
	} {
		t.Run("D24 "+c.slug, func(t *testing.T) {
			cb := casebook.Expect(t, "D24", c.variant,
				"refused at discovery: the remote listed unavailable with the step and reason (GET /v1/tools), shown on the Connections page, Connect refused with it; audited mcp_authorization_refused; no registration, authorization or token request, nothing sent to the MCP server")
			reason := unavailable()[c.slug]
			p.do(chromedp.Navigate(r.base+"/connections"), chromedp.WaitVisible(chromedp.CSS("#problem-"+c.slug)))
			shown := eval[string](p, `document.querySelector("#problem-`+c.slug+`").innerText`)
			p.do(chromedp.Click(chromedp.CSS("#connect-"+c.slug)), chromedp.WaitVisible(chromedp.CSS("#error-message")))
			connect := eval[string](p, `document.querySelector("#error-message").innerText`)
			audited := auditHas(t, cfg.Audit.Path, `"mcp_authorization_refused"`, `"connector":"`+c.slug+`"`, `"step":"`+c.step+`"`)
			reqs := c.srv.Registrations.Load() + int64(len(c.srv.AuthResources())+len(c.srv.TokenResources())+len(c.srv.Seen()))
			cb.Observef("GET /v1/tools reason %q; page %q; Connect %q; audited %v; requests to the AS and tokens to the server %d", reason, shown, connect, audited, reqs)
			for what, s := range map[string]string{"GET /v1/tools": reason, "Connections page": shown, "Connect": connect} {
				if !strings.Contains(s, c.step) || !strings.Contains(s, c.reason) || !strings.Contains(s, c.slug) {
					t.Errorf("%s: %q lacks the remote, the step or the reason", what, s)
				}
			}
			if !audited || reqs != 0 {
				t.Fatalf("audited %v, %d requests reached the authorization server or tokens the server", audited, reqs)
			}
		})
	}

	// alice connects docs on the Connections page (PKCE, state, resource=).
	connectAs(p, r.base, "docs", docs.AS.Username())
	p.shot("mcp-oauth-01-connected")
	if n := docs.Registrations.Load(); n != 1 {
		t.Fatalf("registrations = %d, want 1", n)
	}
	for _, res := range append(docs.AuthResources(), docs.TokenResources()...) {
		if res != docs.MCPURL {
			t.Fatalf("a request to the authorization server named resource %q, want %q", res, docs.MCPURL)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for unavailable()["docs"] != "" {
		if time.Now().After(deadline) {
			t.Fatalf("docs still unavailable after alice connected: %q", unavailable()["docs"])
		}
		time.Sleep(50 * time.Millisecond)
	}

	t.Run("D24 a stored token minted for another audience", func(t *testing.T) {
		cb := casebook.Expect(t, "D24", "bob's stored connection to docs holds a JWT access token whose aud is another resource (https://other.example/mcp); bob's sandbox calls docs.whoami",
			"503 credential_unavailable naming the step token audience; nothing sent to the MCP server (no token reaches it); the refusal audited with its code; the token in no reply, audit record or log line")
		tok := jwtFor(t, "https://other.example/mcp")
		st, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := (oauth.LocalStore{Local: st}).Save(context.Background(), oauth.Connection{Connector: "docs", User: "bob", Status: oauth.Connected,
			Scopes: []string{"openid"}, ConnectedAt: time.Now(), Access: tok, Expiry: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		bob := wire.Identity{Sandbox: "sb-8", Agent: "triage", Session: "s-8", User: "bob", Host: "h1"}
		bc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, cfg.Gateway.SandboxSocket, bob)
		}}}
		seen := len(docs.Seen())
		resp, err := bc.Post("http://sluice/v1/tools/docs.whoami", "application/json", strings.NewReader(`{"body":{}}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		sent := false
		for _, s := range docs.Seen()[seen:] {
			sent = sent || s == tok
		}
		audit, _ := os.ReadFile(cfg.Audit.Path)
		audited := auditHas(t, cfg.Audit.Path, `"credential_unavailable"`, `"docs.whoami"`, `"bob"`)
		leaked := strings.Contains(string(body), tok) || strings.Contains(string(audit), tok) || r.logHas(tok)
		cb.Observef("status %d code %s message %.160q; token sent to the server %v; audited %v; leaked %v", resp.StatusCode, refusalCode(t, string(body)), string(body), sent, audited, leaked)
		if resp.StatusCode != 503 || refusalCode(t, string(body)) != refusal.CredentialUnavailable || !strings.Contains(string(body), "token audience") ||
			!strings.Contains(string(body), "not this server") || sent || !audited || leaked {
			t.Fatalf("bob's call: %d %s; sent %v audited %v leaked %v", resp.StatusCode, body, sent, audited, leaked)
		}
	})

	t.Run("D23 the remote MCP server echoes the person's token", func(t *testing.T) {
		cb := casebook.Expect(t, "D23", "a remote MCP server with MCP authorization (provider: mcp, credential.oauth2) answers tools/call with the Authorization header it got (alice's OAuth token); the sandbox calls it over the MCP door",
			"the server got alice's token; the sandbox's result carries no token; audited secret_reflected naming the tool; the record names the connection (oauth2 docs/alice), the token in no audit record or log line")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cs, err := sdk.NewClient(&sdk.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, &sdk.StreamableClientTransport{Endpoint: "http://sluice/mcp", HTTPClient: hc}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		who, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "docs.whoami", Arguments: map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "docs.echo_auth", Arguments: map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(res)
		wb, _ := json.Marshal(who)
		tokens := docs.Seen()
		audit, _ := os.ReadFile(cfg.Audit.Path)
		leaked := false
		for _, tok := range tokens {
			leaked = leaked || strings.Contains(string(b), tok) || strings.Contains(string(wb), tok) || strings.Contains(string(audit), tok) || r.logHas(tok)
		}
		reflected := auditHas(t, cfg.Audit.Path, `"secret_reflected"`, `"docs.echo_auth"`)
		named := auditHas(t, cfg.Audit.Path, `oauth2 docs/alice scopes=`)
		cb.Observef("whoami subject is alice's (%v); the server got %d token(s); echo result isError=%v %.40q…; token leaked to sandbox/audit/log %v; secret_reflected %v; connection named %v",
			strings.Contains(string(wb), oauthtest.UserID), len(tokens), res.IsError, strings.Join(textOf(res), ""), leaked, reflected, named)
		if who.IsError || !strings.Contains(string(wb), oauthtest.UserID) || len(tokens) == 0 {
			t.Fatalf("whoami: %s; tokens at the server %d", wb, len(tokens))
		}
		if leaked || !reflected || !named || !strings.Contains(string(b), "you sent ") {
			t.Fatalf("echo: %s; leaked %v reflected %v named %v", b, leaked, reflected, named)
		}
	})

	t.Run("D25 the registered client ended", func(t *testing.T) {
		cb := casebook.Expect(t, "D25", "the authorization server ends the client the gateway registered for docs (its token endpoint answers invalid_client); the gateway restarts with alice's access token expired; her sandbox calls docs.whoami, then she reconnects on the Connections page",
			"the refresh refused: no working connection, docs unavailable (its tools listed with a person's token) and the call refused 404 unknown_tool, nothing sent to the MCP server; the Connections page says needs_reconnect; the reconnect registers one new client, and the call then runs with her new token")
		call := func() (int, string) {
			resp, err := hc.Post("http://sluice/v1/tools/docs.whoami", "application/json", strings.NewReader(`{"body":{}}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		// A restart, with the stored token expired: the token cache is
		// the process's memory. (Stopping, it closes its MCP sessions,
		// with the token it had.)
		docs.RevokeClient(oauthtest.RegisteredID(1))
		r.gw.stop()
		seen := len(docs.Seen())
		r.writeExpired()
		r.gw.start()
		reason := unavailable()["docs"]
		st, body := call()
		sent := len(docs.Seen()) - seen
		p.do(chromedp.Navigate(r.base+"/connections"), chromedp.WaitVisible(chromedp.CSS(`#conn-docs [data-status="needs_reconnect"]`)))
		connectAs(p, r.base, "docs", docs.AS.Username())
		for end := time.Now().Add(15 * time.Second); unavailable()["docs"] != "" && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		}
		after, afterBody := call()
		cb.Observef("docs unavailable %q; first call %d %s, %d token(s) reached the MCP server; reconnect made %d registration(s) in all; next call %d",
			reason, st, refusalCode(t, body), sent, docs.Registrations.Load(), after)
		if !strings.Contains(reason, "no person has a working connection to docs") || st != 404 || refusalCode(t, body) != refusal.UnknownTool || sent != 0 ||
			docs.Registrations.Load() != 2 || after != 200 {
			t.Fatalf("unavailable %q; first call %d %s (sent %d); registrations %d; after the reconnect %d %s", reason, st, body, sent, docs.Registrations.Load(), after, afterBody)
		}
	})
}

func textOf(r *sdk.CallToolResult) []string {
	var out []string
	for _, c := range r.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			out = append(out, tc.Text)
		}
	}
	return out
}

// jwtFor is a signed JWT access token whose aud is audience (RFC 9068's
// shape), as an authorization server that ignored the resource indicator
// would mint.
func jwtFor(t *testing.T, audience string) string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("at+jwt"))
	if err != nil {
		t.Fatal(err)
	}
	claims, _ := json.Marshal(map[string]any{"iss": "https://idp.example", "sub": "id2", "aud": audience, "exp": time.Now().Add(time.Hour).Unix(), "client_id": "dcr-9"})
	o, err := sig.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	s, err := o.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
