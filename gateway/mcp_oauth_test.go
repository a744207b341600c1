package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/connections"
	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
	"github.com/sluice-gw/sluice/gateway/remotes"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

const mcpOAuthPublic = "https://review.example"

// withMCPOAuth adds a remote MCP server with MCP authorization as
// connector slug (each person connects; no client id: registered),
// granted to agent-a with its tools allowed.
func withMCPOAuth(slug, url string) func(*config.Config) {
	return func(c *config.Config) {
		c.Connectors = append(c.Connectors, config.Connector{Slug: slug, Provider: "mcp", URL: url, AllowPrivate: []string{"127.0.0.0/8"},
			Credential: &config.Credential{OAuth2: &config.OAuth2{Flow: "authorization_code", Scopes: []string{"openid", "offline_access"}}}})
		for i := range c.Agents {
			if c.Agents[i].Name == "agent-a" {
				c.Agents[i].Connectors = append(c.Agents[i].Connectors, slug)
			}
		}
		c.Policies = append([]config.Policy{{Match: slug + ".*", Action: "allow"}}, c.Policies...)
	}
}

var agentBob = wire.Identity{Sandbox: "sb-2", Agent: "agent-a", Session: "s-2", User: "bob", Host: "h1"}

type toolsList struct {
	Tools       []struct{ Name string } `json:"tools"`
	Unavailable []map[string]string     `json:"unavailable"`
}

func listTools(t *testing.T, g *testGateway, id wire.Identity) toolsList {
	t.Helper()
	resp, err := g.client(id).Get("http://sluice/v1/tools")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l toolsList
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l toolsList) has(name string) bool {
	for _, tl := range l.Tools {
		if tl.Name == name {
			return true
		}
	}
	return false
}

func (l toolsList) reason(slug string) string {
	for _, u := range l.Unavailable {
		if u["connector"] == slug {
			return u["reason"]
		}
	}
	return ""
}

// connectPerson runs the gateway's own connect flow (PKCE, state) for
// user at the remote's authorization server, then what the Connections
// page's callback does after it (Connected: held calls, the listing).
func connectPerson(t *testing.T, g *testGateway, srv *oauthtest.MCPAuth, slug, user string) {
	t.Helper()
	connectAs(t, g, srv, slug, user, srv.AS.Username())
}

// connectAs is connectPerson signing in at the provider as login.
func connectAs(t *testing.T, g *testGateway, srv *oauthtest.MCPAuth, slug, user, login string) {
	t.Helper()
	ctx := context.Background()
	u, err := g.Server.OAuth().Begin(ctx, slug, user, "browser-"+user)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	back, err := srv.AS.ConsentAs(u, login)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(back.String(), mcpOAuthPublic+"/connections/callback?") {
		t.Fatalf("the provider sent the browser to %s", back.Redacted())
	}
	q := back.Query()
	if _, err := g.Server.OAuth().Complete(ctx, "browser-"+user, q.Get("state"), q.Get("code")); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	g.Server.connectHeld(slug, user)
}

func waitListed(t *testing.T, g *testGateway, tool string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !listTools(t, g, agentA).has(tool) {
		if time.Now().After(deadline) {
			t.Fatalf("%s is not listed: %v", tool, listTools(t, g, agentA).Unavailable)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMCPOAuthRemote: remote MCP servers that speak MCP authorization as
// connectors, through the gateway: the authorization server is
// discovered from the server's metadata and a client registered once;
// until a person connects, the remote is listed unavailable with why;
// after alice connects, her call carries her token (the sandbox never
// sees it, an echo of it is scrubbed and audited), bob's call is 403
// connection_required with nothing sent, a token is never sent to
// another connector's server, and a remote whose metadata names another
// resource is unavailable with the step and the reason while the rest
// serves.
func TestMCPOAuthRemote(t *testing.T) {
	up := newUpstream(t)
	redirect := mcpOAuthPublic + "/connections/callback"
	docs := oauthtest.StartMCP(t, redirect)
	other := oauthtest.StartMCP(t, redirect)
	evil := oauthtest.StartMCP(t, redirect)
	evil.SetResource("https://elsewhere.example/mcp")
	held := oauthtest.StartMCP(t, redirect)
	g := startHolds(t, up, "approvals: { public_url: "+mcpOAuthPublic+" }", func(c *config.Config) {
		withMCPOAuth("docs", docs.MCPURL)(c)
		withMCPOAuth("other", other.MCPURL)(c)
		withMCPOAuth("evil", evil.MCPURL)(c)
		withMCPOAuth("held", held.MCPURL)(c)
		c.Connectors[len(c.Connectors)-1].Credential.OAuth2.OnMissing = "hold"
	})

	l := listTools(t, g, agentA)
	t.Logf("unavailable: %v", l.Unavailable)
	if r := l.reason("docs"); !strings.Contains(r, "no person has a working connection to docs") || !strings.Contains(r, mcpOAuthPublic+"/connections?connector=docs") {
		t.Fatalf("docs before anyone connected: reason %q", r)
	}
	if n := docs.Registrations.Load(); n != 1 {
		t.Fatalf("registrations at docs' authorization server = %d, want 1 (discovered at the first listing)", n)
	}
	// A metadata document naming another resource: unavailable, by step.
	if r := l.reason("evil"); !strings.Contains(r, "protected-resource metadata") || !strings.Contains(r, `names the resource "https://elsewhere.example/mcp"`) {
		t.Fatalf("evil's reason: %q", r)
	}
	if n := evil.Registrations.Load(); n != 0 {
		t.Fatalf("evil's authorization server got %d registrations", n)
	}
	// Audited once, by step, however often the listing retries.
	refused := 0
	for _, rec := range auditEvents(t, g) {
		if rec.Event == remotes.EventAuthorizationRefused && rec.Fields["connector"] == "evil" {
			refused++
			if rec.Fields["step"] != "protected-resource metadata" || !strings.Contains(rec.Fields["reason"].(string), "names the resource") {
				t.Fatalf("the refusal record: %v", rec.Fields)
			}
		}
	}
	if refused != 1 {
		t.Fatalf("%d mcp_authorization_refused records for evil, want 1", refused)
	}
	for _, r := range g.Server.catalog.RemoteServers() {
		if r.Connector.Slug == "evil" {
			r.Remote.Refresh(context.Background())
		}
	}
	for _, rec := range auditEvents(t, g) {
		if rec.Event == remotes.EventAuthorizationRefused && rec.Fields["connector"] == "evil" {
			refused--
		}
	}
	if refused != 0 {
		t.Fatal("a repeated refusal was audited again")
	}
	// The Connections page says the same beside it; the rest serves.
	conns, err := connections.Page{M: g.Server.OAuth()}.List(context.Background(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	problems := map[string]string{}
	for _, c := range conns {
		problems[c.Connector] = c.Problem
	}
	if !strings.Contains(problems["evil"], "names the resource") || problems["docs"] != "" {
		t.Fatalf("Connections page problems: %v", problems)
	}
	if _, err := (connections.Page{M: g.Server.OAuth()}).Begin(context.Background(), "evil", "alice", "b"); err == nil || !strings.Contains(err.Error(), "cannot be connected now") {
		t.Fatalf("connecting evil: %v", err)
	}
	if r := doCall(t, g.client(agentA), "tickets.list_tickets", `{"query":{"limit":5}}`); r.status != 200 {
		t.Fatalf("the rest of the gateway: %d %s", r.status, r.raw)
	}

	// validate says it, per remote, as warnings: serve runs.
	f := Check(context.Background(), g.cfg, CheckOptions{})
	var said []string
	for _, w := range f.Warnings {
		said = append(said, w.Error())
	}
	all := strings.Join(said, "\n")
	if !strings.Contains(all, "speaks MCP authorization (authorization server "+docs.AS.URL+")") ||
		!strings.Contains(all, "credential.oauth2: the remote MCP server's authorization cannot be discovered: oauth: evil: MCP authorization: protected-resource metadata") {
		t.Fatalf("validate's warnings:\n%s", all)
	}
	if n := docs.Registrations.Load(); n != 1 {
		t.Fatalf("validate registered a client (%d registrations)", n)
	}

	connectPerson(t, g, docs, "docs", "alice")
	waitListed(t, g, "docs.whoami")
	if n := docs.Registrations.Load(); n != 1 {
		t.Fatalf("registrations = %d after a connect, want still 1", n)
	}
	for _, res := range docs.TokenResources() {
		if res != docs.MCPURL {
			t.Fatalf("a token request named resource %q, want %q", res, docs.MCPURL)
		}
	}

	t.Run("alice's call carries her token; the sandbox never sees it", func(t *testing.T) {
		seen := len(docs.Seen())
		r := doCall(t, g.client(agentA), "docs.whoami", `{"body":{}}`)
		if r.status != 200 || !strings.Contains(r.raw, oauthtest.UserID) {
			t.Fatalf("docs.whoami: %d %s", r.status, r.raw)
		}
		tokens := docs.Seen()
		if len(tokens) <= seen {
			t.Fatal("the remote got no token with the call")
		}
		for _, tok := range tokens {
			if strings.Contains(r.raw, tok) {
				t.Fatal("the reply carries the token")
			}
		}
		// The remote echoes the token: scrubbed, and audited.
		r = doCall(t, g.client(agentA), "docs.echo_auth", `{"body":{}}`)
		if r.status != 200 || !strings.Contains(r.raw, "you sent ") {
			t.Fatalf("docs.echo_auth: %d %s", r.status, r.raw)
		}
		for _, tok := range docs.Seen() {
			if strings.Contains(r.raw, tok) {
				t.Fatalf("the echoed token reached the sandbox: %s", r.raw)
			}
		}
		recs := auditEvents(t, g)
		if !hasToolEvent(recs, "secret_reflected", "docs.echo_auth") {
			t.Fatal("no secret_reflected record for docs.echo_auth")
		}
		for _, rec := range recs {
			b, _ := json.Marshal(rec)
			for _, tok := range docs.Seen() {
				if strings.Contains(string(b), tok) {
					t.Fatalf("an audit record holds the token: %s", rec.Event)
				}
			}
		}
	})

	t.Run("bob has not connected: connection_required, nothing sent", func(t *testing.T) {
		seen := len(docs.Seen())
		r := doCall(t, g.client(agentBob), "docs.whoami", `{"body":{}}`)
		if r.status != 403 || r.code() != "connection_required" || !strings.Contains(r.raw, "/connections?connector=docs") {
			t.Fatalf("bob's call: %d %s", r.status, r.raw)
		}
		if n := len(docs.Seen()); n != seen {
			t.Fatalf("the remote got %d requests for bob's refused call", n-seen)
		}
	})

	t.Run("two people's calls each go in a session of their own", func(t *testing.T) {
		// The SDK's server binds a session to its token's user: one
		// session shared by alice's and bob's calls would be refused (403
		// session user mismatch), or worse, act for the wrong person.
		connectAs(t, g, docs, "docs", "bob", "test-user2")
		for i := 0; i < 3; i++ {
			for _, c := range []struct {
				id      wire.Identity
				subject string
			}{{agentA, `"subject":"` + oauthtest.UserID + `"`}, {agentBob, `"subject":"id2"`}} {
				r := doCall(t, g.client(c.id), "docs.whoami", `{"body":{}}`)
				if r.status != 200 || !strings.Contains(r.raw, c.subject) {
					t.Fatalf("%s's call %d: %d %s, want %s", c.id.User, i, r.status, r.raw, c.subject)
				}
			}
		}
	})

	t.Run("on_missing hold: held until the person connects, then sent once with their token", func(t *testing.T) {
		connectPerson(t, g, held, "held", "alice") // someone connected: the tools are listed
		waitListed(t, g, "held.whoami")
		bc := g.client(agentBob)
		r := doCall(t, bc, "held.whoami", `{"body":{}}`)
		id, status := holdOf(t, r)
		if r.status != 202 || status != "pending" {
			t.Fatalf("bob's call before connecting: %d %s", r.status, r.raw)
		}
		seen := len(held.Seen())
		connectAs(t, g, held, "held", "bob", "test-user2")
		p := poll(t, bc, id, "10s")
		if p.status != 200 || !strings.Contains(p.raw, `"structuredContent":{"subject":"id2"}`) {
			t.Fatalf("the held call after bob connected: %d %s", p.status, p.raw)
		}
		if len(held.Seen()) == seen {
			t.Fatal("the released call sent no token")
		}
	})

	t.Run("a token is never sent to another connector's server", func(t *testing.T) {
		connectPerson(t, g, other, "other", "alice")
		waitListed(t, g, "other.whoami")
		if r := doCall(t, g.client(agentA), "other.whoami", `{"body":{}}`); r.status != 200 {
			t.Fatalf("other.whoami: %d %s", r.status, r.raw)
		}
		if r := doCall(t, g.client(agentA), "docs.whoami", `{"body":{}}`); r.status != 200 {
			t.Fatalf("docs.whoami: %d %s", r.status, r.raw)
		}
		mine := map[string]bool{}
		for _, tok := range docs.Seen() {
			mine[tok] = true
		}
		for _, tok := range other.Seen() {
			if mine[tok] {
				t.Fatal("docs' token was sent to other's server")
			}
		}
		if len(other.Seen()) == 0 {
			t.Fatal("other's server got no token")
		}
	})
}
