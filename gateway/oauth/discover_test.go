package oauth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
	"github.com/sluice-gw/sluice/vault"
)

func loopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// mcpManager is a Manager with one connector, "remote", whose endpoints
// and client come from srv's MCP authorization metadata.
func mcpManager(t *testing.T, srv *oauthtest.MCPAuth, store oauth.LocalStore, clientID string, early time.Duration) (*oauth.Manager, *oauth.Discovery) {
	t.Helper()
	d := &oauth.Discovery{PlainOK: loopback, Registered: store}
	c := oauth.Client{Connector: "remote", Flow: oauth.AuthorizationCode, ClientID: clientID, Resource: srv.MCPURL,
		Scopes: []string{"openid", "offline_access"}, Discovery: d, HTTP: &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	if clientID != "" {
		c.Secret = func(context.Context) ([]byte, error) { return []byte(oauthtest.WebSecret), nil }
	}
	m, err := oauth.New(oauth.Options{Store: store, RedirectURL: redirect, Clients: []oauth.Client{c}, Early: early})
	if err != nil {
		t.Fatal(err)
	}
	return m, d
}

func localStore(t *testing.T) oauth.LocalStore {
	t.Helper()
	dir := t.TempDir()
	local, err := vault.OpenLocal(filepath.Join(dir, "secrets.json"), filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	return oauth.LocalStore{Local: local}
}

// TestMCPAuthorizationConnect: a person connects a remote MCP server that
// speaks MCP authorization (the Go SDK's server behind its bearer-token
// middleware, zitadel's op as the authorization server): the metadata is
// discovered from the 401 challenge, a client registered once and kept
// (encrypted), the flow carries PKCE, state and resource=, and the token
// then opens an MCP session whose user is the person.
func TestMCPAuthorizationConnect(t *testing.T) {
	srv := oauthtest.StartMCP(t, redirect)
	store := localStore(t)
	m, _ := mcpManager(t, srv, store, "", 0)
	ctx := context.Background()

	u, err := m.Begin(ctx, "remote", "alice", "sess-a")
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	for _, want := range []string{"client_id=" + oauthtest.RegisteredID(1), "code_challenge_method=S256", "state=", "resource="} {
		if !strings.Contains(u, want) {
			t.Errorf("authorization URL lacks %s: %s", want, u)
		}
	}
	if n := srv.Registrations.Load(); n != 1 {
		t.Fatalf("registrations = %d, want 1", n)
	}
	back, err := srv.AS.Consent(u)
	if err != nil {
		t.Fatal(err)
	}
	q := back.Query()
	conn, err := m.Complete(ctx, "sess-a", q.Get("state"), q.Get("code"))
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if conn.Status != oauth.Connected || conn.Access != "" {
		t.Fatalf("connection = %+v, want connected without its token", conn)
	}
	// RFC 8707: the authorization request and the code exchange named the
	// server.
	if got := srv.AuthResources(); len(got) == 0 || got[0] != srv.MCPURL {
		t.Errorf("authorization requests' resource = %q, want %q", got, srv.MCPURL)
	}
	if got := srv.TokenResources(); len(got) != 1 || got[0] != srv.MCPURL {
		t.Errorf("token requests' resource = %q, want [%q]", got, srv.MCPURL)
	}

	tok, err := m.Token(ctx, "remote", "alice")
	if err != nil {
		t.Fatalf("Token: %v", err)
	}
	// The token opens a session at the MCP server, as the person.
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint: srv.MCPURL, HTTPClient: &http.Client{Transport: bearer{string(tok.Value)}}}, nil)
	if err != nil {
		t.Fatalf("connect with the token: %v", err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "whoami"})
	if err != nil || res.IsError {
		t.Fatalf("whoami: %v %+v", err, res)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if !strings.Contains(string(b), oauthtest.UserID) {
		t.Fatalf("whoami = %s, want subject %s", b, oauthtest.UserID)
	}

	// The registered client is kept, encrypted at the connector's scope: a
	// new gateway process (a new Manager and Discovery) does not register
	// again.
	reg, err := store.LoadRegistered(ctx, "remote")
	if err != nil || reg.ClientID != oauthtest.RegisteredID(1) || reg.Resource != srv.MCPURL {
		t.Fatalf("kept client = %v, %v", reg, err)
	}
	m2, _ := mcpManager(t, srv, store, "", 0)
	if _, err := m2.Begin(ctx, "remote", "bob", "sess-b"); err != nil {
		t.Fatal(err)
	}
	if n := srv.Registrations.Load(); n != 1 {
		t.Fatalf("after a restart: registrations = %d, want still 1", n)
	}
	if fmtd := strings.Join([]string{reg.String(), strings.TrimSpace(reg.GoString())}, " "); strings.Contains(fmtd, oauthtest.WebSecret) {
		t.Fatalf("a registered client prints its secret: %s", fmtd)
	}
	// A refresh names the resource too: a Manager that deems every token
	// about to expire refreshes alice's, through the discovered client.
	m3, _ := mcpManager(t, srv, store, "", 1000*time.Hour)
	if _, err := m3.Token(ctx, "remote", "alice"); err != nil {
		t.Fatalf("Token with a refresh: %v", err)
	}
	if n := srv.AS.Grants("refresh_token"); n != 1 {
		t.Fatalf("refresh grants = %d, want 1", n)
	}
	if got := srv.TokenResources(); len(got) != 2 || got[1] != srv.MCPURL {
		t.Errorf("token requests' resource = %q, want the refresh to name %q", got, srv.MCPURL)
	}
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPAuthorizationRefused: each metadata the gateway does not accept
// is refused at its step, with the reason, and nothing is registered or
// sent to the authorization server.
func TestMCPAuthorizationRefused(t *testing.T) {
	for _, tc := range []struct {
		name     string
		setup    func(srv *oauthtest.MCPAuth)
		plain    func(string) bool
		clientID string
		store    bool
		step     string
		reason   string
	}{
		// RFC 9728 3.3: the resource in the metadata must be the URL the
		// client asked about; otherwise a server could send the person to
		// consent to, and the gateway to use tokens of, another resource.
		{name: "metadata names another resource", setup: func(s *oauthtest.MCPAuth) { s.SetResource("https://other.example/mcp") },
			store: true, step: oauth.StepResourceMeta, reason: `names the resource "https://other.example/mcp", not this server's URL`},
		// RFC 8414 3.3: the issuer in the document must be the one asked for
		// (a mix-up attack otherwise).
		{name: "issuer mismatch", setup: func(s *oauthtest.MCPAuth) { s.SetIssuer("https://evil.example") },
			store: true, step: oauth.StepServerMeta, reason: `says its issuer is "https://evil.example"`},
		// Tokens and client secrets never cross plain http to a host the
		// connector's allow_private does not cover.
		{name: "plain http authorization server", plain: func(string) bool { return false },
			store: true, step: oauth.StepProbe, reason: "plain http"},
		// Without a client id and nowhere to keep a registered client, no
		// registration is made (it would be repeated per process).
		{name: "no client id and no store", store: false, step: oauth.StepRegistration, reason: "set credential.oauth2.client_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := oauthtest.StartMCP(t, redirect)
			if tc.setup != nil {
				tc.setup(srv)
			}
			d := &oauth.Discovery{PlainOK: loopback}
			if tc.plain != nil {
				d.PlainOK = tc.plain
			}
			if tc.store {
				d.Registered = localStore(t)
			}
			m, err := oauth.New(oauth.Options{Store: localStore(t), RedirectURL: redirect, Clients: []oauth.Client{{
				Connector: "remote", Flow: oauth.AuthorizationCode, ClientID: tc.clientID, Resource: srv.MCPURL, Discovery: d, HTTP: http.DefaultClient}}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = m.Begin(context.Background(), "remote", "alice", "sess-a")
			var de *oauth.DiscoveryError
			if !errors.As(err, &de) || de.Step != tc.step || !strings.Contains(de.Reason, tc.reason) || de.Connector != "remote" {
				t.Fatalf("err = %v, want a DiscoveryError at %q saying %q", err, tc.step, tc.reason)
			}
			if !strings.Contains(err.Error(), "remote") || !strings.Contains(err.Error(), tc.step) {
				t.Errorf("the error does not name the remote and the step: %v", err)
			}
			if d.Status() == nil {
				t.Error("Status() is nil after a failed discovery")
			}
			if n := srv.Registrations.Load(); n != 0 {
				t.Errorf("registrations = %d, want 0", n)
			}
			if n := len(srv.AuthResources()) + len(srv.TokenResources()); n != 0 {
				t.Errorf("%d requests reached the authorization server's authorize/token endpoints", n)
			}
			// A call for the person is refused with the same reason.
			if _, err := m.Token(context.Background(), "remote", "alice"); !errors.As(err, &de) {
				t.Errorf("Token: err = %v, want the DiscoveryError", err)
			}
		})
	}
}

// TestMCPAuthorizationWellKnown: a 401 without a resource_metadata
// challenge sends discovery to the well-known URL (RFC 9728 3.1, the
// path inserted), and the flow goes on from there.
func TestMCPAuthorizationWellKnown(t *testing.T) {
	srv := oauthtest.StartMCP(t, redirect)
	srv.NoChallenge.Store(true)
	m, _ := mcpManager(t, srv, localStore(t), "", 0)
	u, err := m.Begin(context.Background(), "remote", "alice", "sess-a")
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if !strings.HasPrefix(u, srv.AS.URL+"/") || !strings.Contains(u, "client_id="+oauthtest.RegisteredID(1)) {
		t.Fatalf("authorization URL %s", u)
	}
	// A URL the server does not serve is not an MCP endpoint that asks
	// for authorization: refused at the probe, with the status.
	d := &oauth.Discovery{PlainOK: loopback}
	_, err = d.ResourceMetadata(context.Background(), http.DefaultClient, "remote", srv.MCPURL+"x")
	var de *oauth.DiscoveryError
	if !errors.As(err, &de) || de.Step != oauth.StepProbe || !strings.Contains(de.Reason, "got HTTP 404, not 401") {
		t.Fatalf("err = %v", err)
	}
}

// TestMCPAuthorizationRediscovered: what was discovered is used for
// Valid; after that the metadata is read again, so a server whose metadata
// now names another resource is refused (fail closed), not trusted on the
// strength of an old answer; the kept client is not registered again.
func TestMCPAuthorizationRediscovered(t *testing.T) {
	srv := oauthtest.StartMCP(t, redirect)
	now := time.Now()
	clock := func() time.Time { return now }
	store := localStore(t)
	d := &oauth.Discovery{PlainOK: loopback, Registered: store, Now: clock, Valid: time.Hour}
	m, err := oauth.New(oauth.Options{Store: store, RedirectURL: redirect, Clients: []oauth.Client{{
		Connector: "remote", Flow: oauth.AuthorizationCode, Resource: srv.MCPURL, Discovery: d, HTTP: http.DefaultClient}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := m.Begin(ctx, "remote", "alice", "s"); err != nil {
		t.Fatal(err)
	}
	srv.SetResource("https://elsewhere.example/mcp")
	if _, err := m.Begin(ctx, "remote", "alice", "s"); err != nil {
		t.Fatalf("within Valid the discovery is kept: %v", err)
	}
	now = now.Add(61 * time.Minute)
	var de *oauth.DiscoveryError
	if _, err := m.Begin(ctx, "remote", "alice", "s"); !errors.As(err, &de) || de.Step != oauth.StepResourceMeta {
		t.Fatalf("after Valid: err = %v, want the metadata refused", err)
	}
	srv.SetResource("")
	now = now.Add(time.Minute) // past Retry
	if _, err := m.Begin(ctx, "remote", "alice", "s"); err != nil {
		t.Fatalf("metadata good again: %v", err)
	}
	if n := srv.Registrations.Load(); n != 1 {
		t.Fatalf("registrations = %d, want 1", n)
	}
}

// TestMCPAuthorizationNoChallenge: a server that does not answer 401 does
// not speak MCP authorization: refused at the probe.
func TestMCPAuthorizationNoChallenge(t *testing.T) {
	open := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	defer open.Close()
	d := &oauth.Discovery{PlainOK: loopback}
	_, err := d.ResourceMetadata(context.Background(), http.DefaultClient, "remote", open.URL+"/mcp")
	var de *oauth.DiscoveryError
	if !errors.As(err, &de) || de.Step != oauth.StepProbe || !strings.Contains(de.Reason, "not 401") {
		t.Fatalf("err = %v, want refused at the probe", err)
	}
	// 401 without a challenge, and nothing at either well-known URL:
	// refused at the metadata step, naming both URLs tried.
	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/mcp" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		http.NotFound(w, r)
	}))
	defer bare.Close()
	_, err = d.ResourceMetadata(context.Background(), http.DefaultClient, "remote", bare.URL+"/mcp")
	if !errors.As(err, &de) || de.Step != oauth.StepResourceMeta ||
		!strings.Contains(de.Reason, "/.well-known/oauth-protected-resource/mcp: HTTP 404") || !strings.Contains(de.Reason, "/.well-known/oauth-protected-resource: HTTP 404") {
		t.Fatalf("err = %v, want not found at both well-known URLs", err)
	}
}

// TestCheckAudience: RFC 8707 / RFC 9068 4: a JWT access token is sent
// only to a resource its aud names; an opaque token cannot be read and is
// the server's to judge.
func TestCheckAudience(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	jwt := func(claims map[string]any) string {
		b, _ := json.Marshal(claims)
		o, err := sig.Sign(b)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := o.CompactSerialize()
		return s
	}
	const res = "https://mcp.example.com/mcp"
	for _, tc := range []struct {
		name  string
		token string
		ok    bool
	}{
		{"aud is the resource", jwt(map[string]any{"aud": res, "sub": "a"}), true},
		{"aud list holds the resource (trailing slash, default port)", jwt(map[string]any{"aud": []string{"x", "https://MCP.example.com:443/mcp/"}}), true},
		{"aud is another resource", jwt(map[string]any{"aud": "https://other.example.com/mcp"}), false},
		{"aud is a client id", jwt(map[string]any{"aud": []string{"sluice-web"}}), false},
		{"no aud", jwt(map[string]any{"sub": "a"}), false},
		{"aud of another type", jwt(map[string]any{"aud": 7}), false},
		{"opaque token", "2YotnFZFEjr1zCsicMWpAA", true},
		{"three dots but not a JWS", "a.b.c", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := oauth.CheckAudience("remote", tc.token, res)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			var de *oauth.DiscoveryError
			if err != nil && (!errors.As(err, &de) || de.Step != oauth.StepAudience || strings.Contains(err.Error(), tc.token)) {
				t.Fatalf("err = %v: want a token-audience DiscoveryError without the token", err)
			}
		})
	}
}

func TestSameResource(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"https://h/mcp", "https://h/mcp", true},
		{"https://H:443/mcp/", "https://h/mcp", true},
		{"https://h/mcp", "http://h/mcp", false},
		{"https://h/mcp", "https://h/mcp2", false},
		{"https://h:8443/mcp", "https://h/mcp", false},
		{"https://h/mcp", "https://h/mcp?x=1", false},
		{"https://h/mcp#f", "https://h/mcp", false},
		{"mcp", "mcp", false},
	} {
		if got := oauth.SameResource(tc.a, tc.b); got != tc.same {
			t.Errorf("SameResource(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

// TestMCPAuthorizationClientEnded: the authorization server ends the
// client the gateway registered (RFC 7591; its token endpoint answers
// invalid_client). Alice's and Bob's refreshes, at once, are refused:
// each connection needs reconnecting (nothing is returned to send), the
// kept client is forgotten, and the next connect registers a new client
// once — not one per refusal, and the dead one is never tried again —
// with which Alice's tokens then refresh.
func TestMCPAuthorizationClientEnded(t *testing.T) {
	srv := oauthtest.StartMCP(t, redirect)
	store := localStore(t)
	m, _ := mcpManager(t, srv, store, "", 1000*time.Hour) // every Token refreshes
	ctx := context.Background()
	connect := func(user string) {
		t.Helper()
		u, err := m.Begin(ctx, "remote", user, "sess-"+user)
		if err != nil {
			t.Fatal(err)
		}
		back, err := srv.AS.Consent(u)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Complete(ctx, "sess-"+user, back.Query().Get("state"), back.Query().Get("code")); err != nil {
			t.Fatalf("Complete for %s: %v", user, err)
		}
	}
	connect("alice")
	connect("bob")
	if n := srv.Registrations.Load(); n != 1 {
		t.Fatalf("registrations = %d, want 1", n)
	}
	srv.RevokeClient(oauthtest.RegisteredID(1))
	errs := make(chan error, 2)
	for _, user := range []string{"alice", "bob"} {
		go func() { _, err := m.Token(ctx, "remote", user); errs <- err }()
	}
	for range 2 {
		var re *oauth.RequiredError
		if err := <-errs; !errors.As(err, &re) || re.Status != oauth.NeedsReconnect {
			t.Fatalf("a refresh with the ended client: %v, want needs_reconnect", err)
		}
	}
	if reg, err := store.LoadRegistered(ctx, "remote"); err != nil || reg.ClientID != "" {
		t.Fatalf("kept client after invalid_client: %v %v, want none", reg, err)
	}
	refreshes := srv.AS.Grants("refresh_token")
	connect("alice")
	u, err := m.Begin(ctx, "remote", "bob", "sess-bob")
	if err != nil || !strings.Contains(u, "client_id="+oauthtest.RegisteredID(2)+"&") {
		t.Fatalf("bob's connect after the new registration: %v (client %v)", err, strings.Contains(u, oauthtest.RegisteredID(2)))
	}
	if n := srv.Registrations.Load(); n != 2 {
		t.Fatalf("registrations = %d, want 2 (one new client for every connection)", n)
	}
	if _, err := m.Token(ctx, "remote", "alice"); err != nil {
		t.Fatalf("alice's refresh with the new client: %v", err)
	}
	if got := srv.AS.Grants("refresh_token") - refreshes; got != 1 {
		t.Fatalf("%d refreshes after reconnecting, want 1", got)
	}
}
