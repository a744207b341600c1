package oauth_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
	"github.com/sluice-gw/sluice/vault"
)

const redirect = "http://127.0.0.1:1/connections/callback"

type fixture struct {
	as    *oauthtest.Server
	m     *oauth.Manager
	store oauth.LocalStore
	dir   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	as := oauthtest.Start(t, redirect, "sluice-web")
	dir := t.TempDir()
	local, err := vault.OpenLocal(filepath.Join(dir, "secrets.json"), filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	st := oauth.LocalStore{Local: local}
	secret := func(v string) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) { return []byte(v), nil }
	}
	m, err := oauth.New(oauth.Options{Store: st, RedirectURL: redirect, Clients: []oauth.Client{
		{Connector: "docs", Flow: oauth.AuthorizationCode, ClientID: "sluice-web", Secret: secret(oauthtest.WebSecret),
			Scopes: []string{"openid", "offline_access"}, AuthURL: as.AuthURL(), TokenURL: as.TokenURL(), RevocationURL: as.RevocationURL(), HTTP: http.DefaultClient},
		{Connector: "svc", Flow: oauth.ClientCredentials, ClientID: oauthtest.ServiceID, Secret: secret(oauthtest.ServiceSecret),
			Scopes: []string{"openid"}, TokenURL: as.TokenURL(), HTTP: http.DefaultClient},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{as: as, m: m, store: st, dir: dir}
}

// connect runs the whole authorization-code flow for alice in browser
// session "sess-a".
func (f *fixture) connect(t *testing.T) oauth.Connection {
	t.Helper()
	u, err := f.m.Begin(context.Background(), "docs", "alice", "sess-a")
	if err != nil {
		t.Fatal(err)
	}
	back, err := f.as.Consent(u)
	if err != nil {
		t.Fatal(err)
	}
	q := back.Query()
	c, err := f.m.Complete(context.Background(), "sess-a", q.Get("state"), q.Get("code"))
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return c
}

func TestAuthorizationCodePKCEAndState(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.m.Token(ctx, "docs", "alice"); !isRequired(err, oauth.NotConnected) {
		t.Fatalf("before connecting: err = %v, want connection required (not_connected)", err)
	}
	u, err := f.m.Begin(ctx, "docs", "alice", "sess-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"code_challenge_method=S256", "code_challenge=", "state="} {
		if !bytes.Contains([]byte(u), []byte(want)) {
			t.Errorf("authorization URL %s lacks %s", u, want)
		}
	}
	back, err := f.as.Consent(u)
	if err != nil {
		t.Fatal(err)
	}
	q := back.Query()
	state, code := q.Get("state"), q.Get("code")
	if code == "" {
		t.Fatalf("provider redirected back without a code: %s", back)
	}

	// A forged state, another browser (another bind, or none): refused
	// for the state, before the code is exchanged (RFC 6749 10.12). The
	// forged ones first: they do not spend the real state.
	for _, c := range []struct{ name, bind, state string }{
		{"forged state", "sess-a", "forged-" + state},
		{"empty state", "sess-a", ""},
		{"other browser", "sess-b", state},
		{"no browser binding", "", state},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := f.m.Complete(ctx, c.bind, c.state, code); !errors.Is(err, oauth.ErrBadState) {
				t.Fatalf("err = %v, want ErrBadState", err)
			}
		})
	}
	// The state was spent by the refusal of "other browser" above: the
	// legitimate callback now fails too, and a fresh flow is needed.
	if _, err := f.m.Complete(ctx, "sess-a", state, code); !errors.Is(err, oauth.ErrBadState) {
		t.Fatalf("spent state: err = %v, want ErrBadState", err)
	}
	if n := f.as.Grants("authorization_code"); n != 0 {
		t.Fatalf("a refused state reached the token endpoint %d times", n)
	}

	c := f.connect(t)
	if c.Status != oauth.Connected || !slices.Contains(c.Scopes, "offline_access") || c.ConnectedAt.IsZero() || c.Access != "" || c.Refresh != "" {
		t.Fatalf("connection = %+v", c)
	}
	tok, err := f.m.Token(ctx, "docs", "alice")
	if err != nil || len(tok.Value) == 0 || tok.Connection != "docs/alice" {
		t.Fatalf("Token = %v, %v", tok, err)
	}
	if _, err := f.m.Token(ctx, "docs", "bob"); !isRequired(err, oauth.NotConnected) {
		t.Fatalf("bob is not connected: err = %v", err)
	}
	// The stored file holds no token in clear.
	raw, err := os.ReadFile(filepath.Join(f.dir, "secrets.json"))
	if err != nil || bytes.Contains(raw, tok.Value) {
		t.Fatalf("the local store holds the access token in clear (err %v)", err)
	}
}

func TestReplayedCodeRefusedByProvider(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	u, _ := f.m.Begin(ctx, "docs", "alice", "sess-a")
	back, err := f.as.Consent(u)
	if err != nil {
		t.Fatal(err)
	}
	code := back.Query().Get("code")
	if _, err := f.m.Complete(ctx, "sess-a", back.Query().Get("state"), code); err != nil {
		t.Fatal(err)
	}
	// The same code under a new, valid state (an attacker who saw the
	// redirect starts their own flow): the provider refuses it, both as
	// used and because this state's PKCE verifier is not the code's.
	u2, _ := f.m.Begin(ctx, "docs", "alice", "sess-a")
	state2 := mustQuery(t, u2, "state")
	before := f.as.Grants("authorization_code")
	if _, err := f.m.Complete(ctx, "sess-a", state2, code); !errors.Is(err, oauth.ErrExchange) {
		t.Fatalf("replayed code: err = %v, want ErrExchange", err)
	}
	if f.as.Grants("authorization_code") != before+1 {
		t.Fatalf("the replayed code was not refused at the provider")
	}
}

func TestConcurrentRefreshSingleFlight(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.connect(t)
	first, err := f.m.Token(ctx, "docs", "alice")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := f.store.Load(ctx, "docs", "alice")
	if err != nil {
		t.Fatal(err)
	}
	oldRefresh := stored.Refresh
	// The access token expires: the stored one, and the cache.
	stored.Expiry = time.Now().Add(-time.Minute)
	if err := f.store.Save(ctx, stored); err != nil {
		t.Fatal(err)
	}
	f.m.Expire()

	const n = 50
	var wg sync.WaitGroup
	toks := make([]oauth.Token, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			toks[i], errs[i] = f.m.Token(ctx, "docs", "alice")
		}()
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if bytes.Equal(toks[i].Value, first.Value) || !bytes.Equal(toks[i].Value, toks[0].Value) {
			t.Fatalf("call %d got a stale or different token", i)
		}
	}
	if got := f.as.Grants("refresh_token"); got != 1 {
		t.Fatalf("%d concurrent calls made %d refreshes at the token endpoint, want 1", n, got)
	}
	// The rotated refresh token was stored back with its access token.
	now, err := f.store.Load(ctx, "docs", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if now.Refresh == oldRefresh || now.Refresh == "" || now.Access != string(toks[0].Value) {
		t.Fatalf("stored after refresh: rotated=%v access matches=%v", now.Refresh != oldRefresh, now.Access == string(toks[0].Value))
	}
}

func TestRevokedRefreshNeedsReconnect(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.connect(t)
	stored, _ := f.store.Load(ctx, "docs", "alice")
	stored.Expiry = time.Now().Add(-time.Minute)
	_ = f.store.Save(ctx, stored)
	f.m.Expire()
	f.as.RevokeConsent(t, "sluice-web")

	_, err := f.m.Token(ctx, "docs", "alice")
	if !isRequired(err, oauth.NeedsReconnect) {
		t.Fatalf("err = %v, want connection required (needs_reconnect)", err)
	}
	if bytes.Contains([]byte(err.Error()), []byte(stored.Refresh)) || bytes.Contains([]byte(err.Error()), []byte(stored.Access)) {
		t.Fatal("the error carries a token")
	}
	c, err := f.m.Get(ctx, "docs", "alice")
	if err != nil || c.Status != oauth.NeedsReconnect {
		t.Fatalf("Get = %+v, %v", c, err)
	}
	raw, _ := f.store.Load(ctx, "docs", "alice")
	if raw.Access != "" || raw.Refresh != "" {
		t.Fatal("the refused tokens are still stored")
	}
	// No retry: the next call is refused without asking the provider.
	before := f.as.Grants("refresh_token")
	if _, err := f.m.Token(ctx, "docs", "alice"); !isRequired(err, oauth.NeedsReconnect) {
		t.Fatalf("second call: %v", err)
	}
	if f.as.Grants("refresh_token") != before {
		t.Fatal("a needs_reconnect connection was refreshed again")
	}
	// Reconnecting restores it.
	f.connect(t)
	if _, err := f.m.Token(ctx, "docs", "alice"); err != nil {
		t.Fatalf("after reconnect: %v", err)
	}
}

func TestDisconnectRevokesAndDeletes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.connect(t)
	stored, _ := f.store.Load(ctx, "docs", "alice")
	revoked, err := f.m.Disconnect(ctx, "docs", "alice")
	if err != nil || !revoked {
		t.Fatalf("Disconnect = %v, %v", revoked, err)
	}
	if f.as.Revocations.Load() == 0 {
		t.Fatal("nothing reached the revocation endpoint")
	}
	if _, err := f.store.Load(ctx, "docs", "alice"); !errors.Is(err, oauth.ErrNoConnection) {
		t.Fatalf("after disconnect the store still has it: %v", err)
	}
	if _, err := f.m.Token(ctx, "docs", "alice"); !isRequired(err, oauth.NotConnected) {
		t.Fatalf("after disconnect: %v", err)
	}
	// The provider no longer honours the refresh token.
	if _, err := f.as.Storage.TokenRequestByRefreshToken(ctx, stored.Refresh); err == nil {
		t.Fatal("the refresh token is still valid at the provider")
	}
}

func TestClientCredentials(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tok, err := f.m.Token(ctx, "svc", "anyone")
	if err != nil || len(tok.Value) == 0 || tok.Connection != "svc" {
		t.Fatalf("Token = %v, %v", tok, err)
	}
	for range 5 {
		if t2, err := f.m.Token(ctx, "svc", ""); err != nil || !bytes.Equal(t2.Value, tok.Value) {
			t.Fatalf("cached token: %v", err)
		}
	}
	if n := f.as.Grants("client_credentials"); n != 1 {
		t.Fatalf("client_credentials grants = %d, want 1 (cached)", n)
	}
}

func isRequired(err error, s oauth.Status) bool {
	var re *oauth.RequiredError
	return errors.As(err, &re) && re.Status == s
}

func mustQuery(t *testing.T, raw, key string) string {
	t.Helper()
	u, err := urlParse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query().Get(key)
}

var urlParse = url.Parse

// TestRefreshRotatedByAnotherProcess: two gateway processes share one
// store; the second to refresh finds its refresh token spent by the
// first's rotation, and uses the first's stored result instead of
// marking the connection needs_reconnect.
func TestRefreshRotatedByAnotherProcess(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.connect(t)
	stale, _ := f.store.Load(ctx, "docs", "alice")
	stale.Expiry = time.Now().Add(-time.Minute)
	_ = f.store.Save(ctx, stale)
	f.m.Expire()
	// "Process one" refreshes (rotating the refresh token) ...
	tok, err := f.m.Token(ctx, "docs", "alice")
	if err != nil {
		t.Fatal(err)
	}
	// ... and "process two", whose view is still the stale record, tries
	// the spent refresh token.
	other, err := oauth.New(oauth.Options{Store: staleFirst{f.store, stale, &sync.Once{}}, RedirectURL: redirect, Clients: []oauth.Client{
		{Connector: "docs", Flow: oauth.AuthorizationCode, ClientID: "sluice-web",
			Secret:  func(context.Context) ([]byte, error) { return []byte(oauthtest.WebSecret), nil },
			AuthURL: f.as.AuthURL(), TokenURL: f.as.TokenURL(), HTTP: http.DefaultClient},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := other.Token(ctx, "docs", "alice")
	if err != nil || !bytes.Equal(got.Value, tok.Value) {
		t.Fatalf("second process: %v (same token %v)", err, bytes.Equal(got.Value, tok.Value))
	}
	if c, _ := f.m.Get(ctx, "docs", "alice"); c.Status != oauth.Connected {
		t.Fatalf("status %s after a lost refresh race", c.Status)
	}
}

// staleFirst answers the first Load with a stale record, then reads the
// real store: a process that read before another one's refresh landed.
type staleFirst struct {
	oauth.LocalStore
	stale oauth.Connection
	once  *sync.Once
}

func (s staleFirst) Load(ctx context.Context, connector, user string) (oauth.Connection, error) {
	var c oauth.Connection
	served := false
	s.once.Do(func() { c, served = s.stale, true })
	if served {
		return c, nil
	}
	return s.LocalStore.Load(ctx, connector, user)
}
