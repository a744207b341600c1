// Package oauth makes the gateway an OAuth 2.0 client of the APIs its
// connectors front: per person (the authorization-code flow with PKCE and
// state, which a person starts on the review UI's Connections page) or per
// connector (client credentials). Access tokens are cached until shortly
// before they expire and refreshed by the gateway, once for any number of
// concurrent calls (single flight per connection); a rotated refresh token
// is stored back in the same write as its access token.
//
// Tokens live only in this process and in a Store: a gateway's is a
// SplitStore, each connection's row in the gateway's store (shared by its
// replicas) and its tokens in the secret store (the local store,
// encrypted at rest, or Vault KV v2; name oauth2.CONNECTOR, scope
// user:NAME). Started connects (Pending) and refresh leases (Lease) are
// in the gateway's store too, so a callback may reach any replica and one
// replica refreshes a connection at a time. Tokens never appear in an
// error, a log line or an audit record: Connection and Token redact
// themselves, and errors name the connector, the person and the provider's
// error code only. A provider that refuses a refresh (invalid_grant:
// consent revoked) turns the connection to needs_reconnect, and nothing is
// sent with the stale token.
package oauth

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
	"golang.org/x/sync/singleflight"
)

// Flow is how a connector's tokens are obtained.
type Flow int

const (
	AuthorizationCode Flow = iota + 1 // per person, after their consent
	ClientCredentials                 // per connector, the gateway's own
)

// String returns the flow's config name.
func (f Flow) String() string {
	switch f {
	case AuthorizationCode:
		return "authorization_code"
	case ClientCredentials:
		return "client_credentials"
	}
	return fmt.Sprintf("Flow(%d)", int(f))
}

// Status is a person's connection to a connector.
type Status string

const (
	NotConnected   Status = "not_connected"
	Connected      Status = "connected"
	NeedsReconnect Status = "needs_reconnect" // the provider refused a refresh
)

// Client is one connector's OAuth client.
type Client struct {
	Connector string
	Flow      Flow
	ClientID  string
	// Secret returns the client secret when it is needed (nil: a public
	// client, PKCE only). It is not kept.
	Secret        func(ctx context.Context) ([]byte, error)
	Scopes        []string
	AuthURL       string
	TokenURL      string
	RevocationURL string // RFC 7009; empty: Disconnect only deletes
	// HTTP talks to the provider: the connector's guarded transport.
	HTTP *http.Client
	// Resource is the server the tokens are for (RFC 8707), a remote MCP
	// server's URL; Discovery finds the endpoints (and registers a client)
	// from its metadata on first use (discover.go). Issuer is the
	// discovered authorization server.
	Resource  string
	Issuer    string
	Discovery *Discovery
}

// Connection is a person's stored tokens for one connector.
type Connection struct {
	Connector   string    `json:"connector"`
	User        string    `json:"user"`
	Status      Status    `json:"status"`
	Scopes      []string  `json:"scopes"`
	ConnectedAt time.Time `json:"connected_at"`
	Access      string    `json:"access,omitempty"`
	Refresh     string    `json:"refresh,omitempty"`
	Expiry      time.Time `json:"expiry"`
}

// LogValue keeps tokens out of logs.
func (c Connection) LogValue() slog.Value {
	return slog.GroupValue(slog.String("connector", c.Connector), slog.String("user", c.User),
		slog.String("status", string(c.Status)), slog.String("scopes", strings.Join(c.Scopes, " ")))
}

// Store keeps connections. Save replaces the whole record in one atomic
// write (a rotated refresh token is never stored apart from its access
// token). Load returns ErrNoConnection when there is none.
type Store interface {
	Load(ctx context.Context, connector, user string) (Connection, error)
	Save(ctx context.Context, c Connection) error
	Delete(ctx context.Context, connector, user string) error
}

// ErrNoConnection is what a Store's Load wraps when nothing is stored.
var ErrNoConnection = errors.New("oauth: no connection")

// Errors a call or a callback is refused with.
var (
	// ErrBadState is a callback whose state this gateway did not issue, or
	// issued to another person or browser session, or already used, or
	// issued too long ago.
	ErrBadState = errors.New("oauth: state unknown, used, expired or not this session's")
	// ErrExchange is a code the provider would not exchange (replayed,
	// expired, or a PKCE verifier that does not match).
	ErrExchange = errors.New("oauth: the provider refused the authorization code")
)

// RequiredError says a call needs the person to connect (or reconnect)
// first. It carries no token.
type RequiredError struct {
	Connector string
	User      string
	Status    Status // NotConnected or NeedsReconnect
}

func (e *RequiredError) Error() string {
	return fmt.Sprintf("oauth: %s: %s for user %q", e.Connector, e.Status, e.User)
}

// Token is an access token for one call. Value is the secret; the rest may
// be logged and audited.
type Token struct {
	Value      []byte
	Connection string // "connector/user", or "connector" for client credentials
	Scopes     []string
	Expiry     time.Time
}

// LogValue keeps the token out of logs.
func (t Token) LogValue() slog.Value {
	return slog.GroupValue(slog.String("connection", t.Connection), slog.String("scopes", strings.Join(t.Scopes, " ")))
}

// Options configures New.
type Options struct {
	Clients []Client
	Store   Store
	// RedirectURL is the callback the provider sends the person back to
	// (approvals.public_url + "/connections/callback").
	RedirectURL string
	// Early is how long before its expiry a token is refreshed (default 60s).
	Early time.Duration
	// StateTTL bounds a started connect (default 10m).
	StateTTL time.Duration
	// Pending keeps started connects (nil: this process's memory, so the
	// provider's redirect must come back to the replica that started it).
	Pending Pending
	// MaxPending bounds one person's started connects (default 8; the
	// oldest beyond it are dropped).
	MaxPending int
	// Lease serialises refreshes across replicas sharing Store (nil:
	// within this process only).
	Lease Lease
	// LeaseTTL bounds a refresh lease (default 45s: longer than a
	// refresh's own 30s deadline, so a lease ends only after its refresh
	// has given up).
	LeaseTTL time.Duration
	// Replica names this process in refresh leases (a random suffix is
	// added).
	Replica string
	Now     func() time.Time
	Log     *slog.Logger
}

// Manager hands out access tokens and runs the connect flow.
type Manager struct {
	opt     Options
	clients map[string]*Client
	flight  singleflight.Group

	mu    sync.Mutex
	cache map[string]cached // by key(connector, user)
}

type cached struct {
	access string
	expiry time.Time
	scopes []string
}

// New builds a Manager.
func New(opt Options) (*Manager, error) {
	if opt.Early <= 0 {
		opt.Early = 60 * time.Second
	}
	if opt.StateTTL <= 0 {
		opt.StateTTL = 10 * time.Minute
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.Pending == nil {
		opt.Pending = &memPending{m: map[string]PendingConnect{}}
	}
	if opt.MaxPending <= 0 {
		opt.MaxPending = 8
	}
	if opt.LeaseTTL <= 0 {
		opt.LeaseTTL = 45 * time.Second
	}
	// Unique per process even when two share a replica name: a lease
	// held by one must not pass for the other's.
	opt.Replica += "/" + random()[:16]
	m := &Manager{opt: opt, clients: map[string]*Client{}, cache: map[string]cached{}}
	for i := range opt.Clients {
		c := &opt.Clients[i]
		if c.TokenURL == "" && c.Discovery == nil {
			return nil, fmt.Errorf("oauth: %s: no token URL", c.Connector)
		}
		if c.Flow == AuthorizationCode {
			if c.AuthURL == "" && c.Discovery == nil {
				return nil, fmt.Errorf("oauth: %s: no authorization URL", c.Connector)
			}
			if opt.Store == nil || opt.RedirectURL == "" {
				return nil, fmt.Errorf("bug(): oauth: %s: authorization_code needs a store and a redirect URL", c.Connector)
			}
		}
		if c.HTTP == nil {
			return nil, fmt.Errorf("bug(): oauth: %s: no HTTP client", c.Connector)
		}
		m.clients[c.Connector] = c
	}
	return m, nil
}

// Client returns the connector's client, if it has one.
func (m *Manager) Client(connector string) (*Client, bool) {
	c, ok := m.clients[connector]
	return c, ok
}

// PersonClients are the connectors a person connects to themselves, sorted.
func (m *Manager) PersonClients() []*Client {
	var out []*Client
	for _, c := range m.clients {
		if c.Flow == AuthorizationCode {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *Client) int { return strings.Compare(a.Connector, b.Connector) })
	return out
}

func key(connector, user string) string { return connector + "\x00" + user }

// Token returns an access token for a call to connector on behalf of user
// (ignored for client credentials). A person with no usable connection
// gets a *RequiredError; nothing is ever returned that expires within
// Early.
func (m *Manager) Token(ctx context.Context, connector, user string) (Token, error) {
	c, ok := m.clients[connector]
	if !ok {
		return Token{}, fmt.Errorf("bug(): oauth: connector %q has no OAuth client", connector)
	}
	if c.Flow == ClientCredentials {
		user = ""
	} else if user == "" {
		// A session acting for nobody cannot use a person's consent.
		return Token{}, &RequiredError{Connector: connector, Status: NotConnected}
	}
	k := key(connector, user)
	if t, ok := m.fresh(k); ok {
		return m.token(c, user, t)
	}
	// One fetch per connection, however many calls wait for it. The fetch
	// runs on its own deadline: one caller giving up must not fail the
	// others that share it.
	v, err, _ := m.flight.Do(k, func() (any, error) {
		if t, ok := m.fresh(k); ok { // a flight that just landed
			return t, nil
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		// MCP authorization: the discovered endpoints. Only a service
		// connector (client credentials) registers a client here; a
		// person's tokens belong to the client their connect registered.
		rc, err := m.resolveFor(fctx, c, c.Flow == ClientCredentials)
		if errors.Is(err, errNoClient) {
			return nil, m.clientEnded(fctx, c, user)
		}
		if err != nil {
			return nil, err
		}
		c := rc
		var t cached
		if c.Flow == ClientCredentials {
			t, err = m.clientToken(fctx, c)
		} else {
			t, err = m.personToken(fctx, c, user)
		}
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		m.cache[k] = t
		m.mu.Unlock()
		return t, nil
	})
	if err != nil {
		return Token{}, err
	}
	return m.token(c, user, v.(cached))
}

func (m *Manager) token(c *Client, user string, t cached) (Token, error) {
	if c.Resource != "" {
		if err := CheckAudience(c.Connector, t.access, c.Resource); err != nil {
			return Token{}, err // RFC 8707: never sent to a server it was not minted for
		}
	}
	name := c.Connector
	if user != "" {
		name += "/" + user
	}
	return Token{Value: []byte(t.access), Connection: name, Scopes: t.scopes, Expiry: t.expiry}, nil
}

func (m *Manager) fresh(k string) (cached, bool) {
	m.mu.Lock()
	t, ok := m.cache[k]
	m.mu.Unlock()
	return t, ok && m.usable(t.expiry)
}

// usable says whether a token expiring at exp may still be sent.
func (m *Manager) usable(exp time.Time) bool {
	return exp.IsZero() || m.opt.Now().Add(m.opt.Early).Before(exp)
}

func (m *Manager) forget(connector, user string) {
	m.mu.Lock()
	delete(m.cache, key(connector, user))
	m.mu.Unlock()
}

// Expire drops every cached token, so the next call reads the store and
// refreshes what has expired (tests, and a reload).
func (m *Manager) Expire() {
	m.mu.Lock()
	clear(m.cache)
	m.mu.Unlock()
}

func (c *Client) config(ctx context.Context, redirect string) (*oauth2.Config, error) {
	cfg := &oauth2.Config{ClientID: c.ClientID, Scopes: c.Scopes, RedirectURL: redirect,
		Endpoint: oauth2.Endpoint{AuthURL: c.AuthURL, TokenURL: c.TokenURL, AuthStyle: oauth2.AuthStyleInHeader}}
	if c.Secret != nil {
		s, err := c.Secret(ctx)
		if err != nil {
			return nil, fmt.Errorf("oauth: %s: client secret: %w", c.Connector, err)
		}
		cfg.ClientSecret = string(s)
	}
	return cfg, nil
}

func (c *Client) ctx(ctx context.Context) context.Context {
	return context.WithValue(ctx, oauth2.HTTPClient, c.HTTP)
}

func (m *Manager) clientToken(ctx context.Context, c *Client) (cached, error) {
	cfg, err := c.config(ctx, "")
	if err != nil {
		return cached{}, err
	}
	cc := clientcredentials.Config{ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, TokenURL: c.TokenURL, Scopes: c.Scopes, AuthStyle: oauth2.AuthStyleInHeader}
	tok, err := cc.Token(c.ctx(ctx))
	if err != nil {
		return cached{}, fmt.Errorf("oauth: %s: client credentials: %s", c.Connector, providerError(err))
	}
	return cached{access: tok.AccessToken, expiry: tok.Expiry, scopes: grantedScopes(tok, c.Scopes)}, nil
}

// personToken reads the person's connection and refreshes it when its
// access token is (nearly) expired, storing the result back.
func (m *Manager) personToken(ctx context.Context, c *Client, user string) (cached, error) {
	conn, err := m.opt.Store.Load(ctx, c.Connector, user)
	switch {
	case errors.Is(err, ErrNoConnection):
		return cached{}, &RequiredError{Connector: c.Connector, User: user, Status: NotConnected}
	case err != nil:
		return cached{}, fmt.Errorf("oauth: %s: load connection: %w", c.Connector, err)
	case conn.Status != Connected:
		return cached{}, &RequiredError{Connector: c.Connector, User: user, Status: NeedsReconnect}
	case conn.Access != "" && m.usable(conn.Expiry):
		return cached{access: conn.Access, expiry: conn.Expiry, scopes: conn.Scopes}, nil
	case conn.Refresh == "":
		return cached{}, m.needsReconnect(ctx, conn, "the access token expired and there is no refresh token")
	}
	if m.opt.Lease != nil {
		// One refresh across replicas: the lease's holder refreshes, the
		// others wait and then read what it stored.
		again, t, release, err := m.lease(ctx, c, user)
		if err != nil || t != nil {
			return *t, err
		}
		defer release()
		if again.Refresh == "" {
			return cached{}, m.needsReconnect(ctx, again, "the access token expired and there is no refresh token")
		}
		conn = again
	}
	cfg, err := c.config(ctx, m.opt.RedirectURL)
	if err != nil {
		return cached{}, err
	}
	tok, err := cfg.TokenSource(c.ctx(ctx), &oauth2.Token{RefreshToken: conn.Refresh}).Token()
	if m.registrationEnded(ctx, c, err) { // the refresh token was the ended client's
		return cached{}, m.needsReconnect(ctx, conn, "the provider ended the registered client: invalid_client")
	}
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && (re.ErrorCode == "invalid_grant" || re.ErrorCode == "unauthorized_client") {
			// Another gateway process sharing the store may have rotated
			// the refresh token first: then its stored result stands.
			if again, lerr := m.opt.Store.Load(ctx, c.Connector, user); lerr == nil && again.Status == Connected &&
				again.Refresh != conn.Refresh && again.Access != "" && m.usable(again.Expiry) {
				return cached{access: again.Access, expiry: again.Expiry, scopes: again.Scopes}, nil
			}
			return cached{}, m.needsReconnect(ctx, conn, "the provider refused the refresh: "+re.ErrorCode)
		}
		return cached{}, fmt.Errorf("oauth: %s: refresh for user %q: %s", c.Connector, user, providerError(err))
	}
	conn.Access, conn.Expiry = tok.AccessToken, tok.Expiry
	if tok.RefreshToken != "" {
		conn.Refresh = tok.RefreshToken // rotated: the old one is spent
	}
	conn.Scopes = grantedScopes(tok, conn.Scopes)
	if err := m.opt.Store.Save(ctx, conn); err != nil {
		// The provider may have spent the old refresh token: the new one
		// is lost with this error, and the person will have to reconnect.
		return cached{}, fmt.Errorf("oauth: %s: store refreshed tokens for user %q: %w", c.Connector, user, err)
	}
	m.opt.Log.Info("oauth: refreshed", "connection", conn)
	return cached{access: conn.Access, expiry: conn.Expiry, scopes: conn.Scopes}, nil
}

// providerError is what may be said of a token endpoint's refusal: its
// error code, never its body (which may echo what was sent).
func providerError(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		if re.ErrorCode != "" {
			return "the provider answered " + re.ErrorCode
		}
		if re.Response != nil {
			return "the provider answered HTTP " + re.Response.Status
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "the provider did not answer in time"
	}
	return "the token endpoint could not be reached"
}

// grantedScopes are the scopes the provider says it granted (RFC 6749
// 5.1: absent means those requested).
func grantedScopes(tok *oauth2.Token, asked []string) []string {
	if s, ok := tok.Extra("scope").(string); ok && s != "" {
		return strings.Fields(s)
	}
	return slices.Clone(asked)
}

// Begin starts connecting user to connector from the browser whose secret
// is bind, and returns the provider's authorization URL:
// with a fresh state (one use, bound to the person and that session) and a
// PKCE S256 challenge whose verifier never leaves the gateway.
func (m *Manager) Begin(ctx context.Context, connector, user, bind string) (string, error) {
	c, ok := m.clients[connector]
	if !ok || c.Flow != AuthorizationCode {
		return "", fmt.Errorf("oauth: connector %q is not connected per person", connector)
	}
	if user == "" || bind == "" {
		return "", fmt.Errorf("bug(): oauth: Begin without a person or a session")
	}
	c, err := m.resolve(ctx, c)
	if err != nil {
		return "", err
	}
	cfg := &oauth2.Config{ClientID: c.ClientID, Scopes: c.Scopes, RedirectURL: m.opt.RedirectURL,
		Endpoint: oauth2.Endpoint{AuthURL: c.AuthURL, TokenURL: c.TokenURL}}
	state := random()
	verifier := oauth2.GenerateVerifier()
	now := m.opt.Now()
	p := PendingConnect{ID: stateID(state), Connector: connector, User: user, Bind: bindHash(bind),
		Verifier: sealVerifier(state, verifier), Created: now, Expires: now.Add(m.opt.StateTTL)}
	if err := m.opt.Pending.Put(ctx, p, m.opt.MaxPending); err != nil {
		return "", fmt.Errorf("oauth: %s: keep the started connect: %w", connector, err)
	}
	return cfg.AuthCodeURL(state, oauth2.S256ChallengeOption(verifier)), nil
}

// Complete finishes a connect for the person who started it: state must
// be one Begin issued with this bind (the browser that started it),
// unused and unexpired (it is spent whatever happens next); the code is
// exchanged with the PKCE verifier and the tokens stored. It returns the
// connection (without its tokens). Started connects are kept in Pending,
// so with a shared one any replica completes what another began.
func (m *Manager) Complete(ctx context.Context, bind, state, code string) (Connection, error) {
	now := m.opt.Now()
	if state == "" {
		return Connection{}, ErrBadState
	}
	// One use, even when refused below: Take deletes it.
	p, err := m.opt.Pending.Take(ctx, stateID(state))
	if errors.Is(err, ErrBadState) {
		return Connection{}, ErrBadState
	}
	if err != nil {
		return Connection{}, fmt.Errorf("oauth: read the started connect: %w", err)
	}
	b := bindHash(bind)
	c, known := m.clients[p.Connector]
	user := p.User
	if bind == "" || !now.Before(p.Expires) || user == "" || subtle.ConstantTimeCompare([]byte(p.Bind), []byte(b)) != 1 || !known || c.Flow != AuthorizationCode {
		return Connection{}, ErrBadState
	}
	verifier, err := openVerifier(state, p)
	if err != nil {
		return Connection{}, ErrBadState
	}
	c, err = m.resolve(ctx, c)
	if err != nil {
		return Connection{Connector: p.Connector, User: user}, err
	}
	cfg, err := c.config(ctx, m.opt.RedirectURL)
	if err != nil {
		return Connection{}, err
	}
	tok, err := cfg.Exchange(c.ctx(ctx), code, oauth2.VerifierOption(verifier))
	if err != nil {
		m.registrationEnded(ctx, c, err) // the next connect registers anew
		return Connection{Connector: p.Connector, User: user}, fmt.Errorf("%w (%s: %s)", ErrExchange, p.Connector, providerError(err))
	}
	if c.Resource != "" {
		if err := CheckAudience(c.Connector, tok.AccessToken, c.Resource); err != nil {
			return Connection{Connector: p.Connector, User: user}, err // not stored: it could never be sent
		}
	}
	conn := Connection{Connector: p.Connector, User: user, Status: Connected, Scopes: grantedScopes(tok, c.Scopes),
		ConnectedAt: now.UTC(), Access: tok.AccessToken, Refresh: tok.RefreshToken, Expiry: tok.Expiry}
	if err := m.opt.Store.Save(ctx, conn); err != nil {
		return Connection{}, fmt.Errorf("oauth: %s: store tokens for user %q: %w", p.Connector, user, err)
	}
	m.forget(p.Connector, user)
	return conn.public(), nil
}

// public is c without its tokens.
func (c Connection) public() Connection {
	c.Access, c.Refresh = "", ""
	return c
}

// Get returns user's connection to connector, without its tokens; a
// connector never connected has Status NotConnected.
func (m *Manager) Get(ctx context.Context, connector, user string) (Connection, error) {
	conn, err := m.opt.Store.Load(ctx, connector, user)
	if errors.Is(err, ErrNoConnection) {
		return Connection{Connector: connector, User: user, Status: NotConnected}, nil
	}
	if err != nil {
		return Connection{}, fmt.Errorf("oauth: %s: load connection: %w", connector, err)
	}
	return conn.public(), nil
}

// Disconnect revokes user's tokens for connector at the provider (when it
// has a revocation endpoint) and deletes them here. The tokens are deleted
// even when the revocation fails; revoked then says whether it succeeded.
func (m *Manager) Disconnect(ctx context.Context, connector, user string) (revoked bool, err error) {
	c, ok := m.clients[connector]
	if !ok || c.Flow != AuthorizationCode {
		return false, fmt.Errorf("oauth: connector %q is not connected per person", connector)
	}
	conn, err := m.opt.Store.Load(ctx, connector, user)
	if errors.Is(err, ErrNoConnection) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("oauth: %s: load connection: %w", connector, err)
	}
	var rerr error
	if rc, err := m.resolveFor(ctx, c, false); err == nil {
		c = rc
	} // else: the provider cannot be found now; the tokens are still deleted here
	if c.RevocationURL != "" {
		// The refresh token first: revoking it ends the grant (RFC 7009
		// 2.1); the access token too, for providers that keep it alive.
		for _, t := range []struct{ v, hint string }{{conn.Refresh, "refresh_token"}, {conn.Access, "access_token"}} {
			if t.v != "" {
				rerr = errors.Join(rerr, m.revoke(ctx, c, t.v, t.hint))
			}
		}
	}
	m.forget(connector, user)
	if err := m.opt.Store.Delete(ctx, connector, user); err != nil {
		return false, fmt.Errorf("oauth: %s: delete connection of user %q: %w", connector, user, err)
	}
	if c.RevocationURL == "" {
		return false, nil
	}
	return rerr == nil, rerr
}

func (m *Manager) revoke(ctx context.Context, c *Client, token, hint string) error {
	form := url.Values{"token": {token}, "token_type_hint": {hint}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.RevocationURL, strings.NewReader(form.Encode()))
	if err != nil {
		return fmt.Errorf("oauth: %s: revocation URL: %w", c.Connector, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	secret := []byte(nil)
	if c.Secret != nil {
		if secret, err = c.Secret(ctx); err != nil {
			return fmt.Errorf("oauth: %s: client secret: %w", c.Connector, err)
		}
	}
	req.SetBasicAuth(url.QueryEscape(c.ClientID), url.QueryEscape(string(secret)))
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("oauth: %s: revoke %s: the revocation endpoint could not be reached", c.Connector, hint)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("oauth: %s: revoke %s: the provider answered HTTP %d", c.Connector, hint, resp.StatusCode)
	}
	return nil
}

func random() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Encode and Decode are a connection's stored form (a Store that keeps
// it as one secret value).
func Encode(c Connection) ([]byte, error) { return json.Marshal(c) }

// Decode reads what Encode wrote.
func Decode(b []byte) (Connection, error) {
	var c Connection
	if err := json.Unmarshal(b, &c); err != nil {
		return Connection{}, fmt.Errorf("oauth: stored connection is not readable: %w", err)
	}
	return c, nil
}

// String names the connection without its tokens (for %v in errors).
func (c Connection) String() string {
	return fmt.Sprintf("%s/%s (%s)", c.Connector, c.User, c.Status)
}

// GoString is String: %#v must not print tokens either.
func (c Connection) GoString() string { return c.String() }

// String names the token's connection, never its value.
func (t Token) String() string { return "oauth token for " + t.Connection }

// GoString is String.
func (t Token) GoString() string { return t.String() }
