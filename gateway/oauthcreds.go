package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/review"
	"github.com/sluice-gw/sluice/vault"
)

// oauthClient resolves connector cc's credential.oauth2 against its spec:
// the URLs the config leaves empty come from the spec's oauth2
// securityScheme (credential.oauth2.scheme, or the one scheme with this
// flow), and a URL with a plain-http scheme is accepted only for an
// address inside allow_private (it would carry the client secret and the
// tokens). The client's Secret and HTTP are set by the server.
func oauthClient(key string, cc config.Connector, conn *connectors.Connector, u *upstream) (*oauth.Client, []error) {
	o := cc.Credential.OAuth2
	key += ".credential.oauth2"
	c := &oauth.Client{Connector: cc.Slug, ClientID: o.ClientID, Scopes: slices.Clone(o.Scopes),
		AuthURL: o.AuthorizationURL, TokenURL: o.TokenURL, RevocationURL: o.RevocationURL}
	flow := "clientCredentials"
	c.Flow = oauth.ClientCredentials
	if o.Flow == "authorization_code" {
		flow, c.Flow = "authorizationCode", oauth.AuthorizationCode
	}
	var errs []error
	var from *connectors.OAuthFlow
	if o.Scheme != "" {
		sc := conn.Schemes[o.Scheme]
		switch {
		case sc == nil || sc.Type != "oauth2":
			errs = append(errs, fmt.Errorf("%s.scheme: the spec has no oauth2 securityScheme %q", key, o.Scheme))
		default:
			if f, ok := sc.Flows[flow]; ok {
				from = &f
			} else {
				errs = append(errs, fmt.Errorf("%s.scheme: securityScheme %q has no %s flow", key, o.Scheme, flow))
			}
		}
	} else {
		var names []string
		for n, sc := range conn.Schemes {
			if f, ok := sc.Flows[flow]; ok && sc.Type == "oauth2" {
				names = append(names, n)
				from = &f
			}
		}
		if len(names) > 1 && (o.TokenURL == "" || (c.Flow == oauth.AuthorizationCode && o.AuthorizationURL == "")) {
			slices.Sort(names)
			errs = append(errs, fmt.Errorf("%s.scheme: the spec has several oauth2 schemes with a %s flow (%s); name one, or set the URLs", key, flow, strings.Join(names, ", ")))
		}
	}
	if from != nil {
		if c.TokenURL == "" {
			c.TokenURL = from.TokenURL
		}
		if c.AuthURL == "" && c.Flow == oauth.AuthorizationCode {
			c.AuthURL = from.AuthorizationURL
		}
		if len(c.Scopes) == 0 {
			c.Scopes = slices.Clone(from.Scopes)
		}
	}
	check := func(k, v string) {
		if v == "" {
			return
		}
		pu, err := url.Parse(v)
		switch {
		case err != nil || pu.Host == "" || (pu.Scheme != "https" && pu.Scheme != "http"):
			errs = append(errs, fmt.Errorf("%s.%s: want an absolute http(s) URL, got %q", key, k, config.RedactURL(v)))
		case pu.Scheme == "http" && !plaintextOK(pu.Hostname(), u.allow):
			errs = append(errs, fmt.Errorf("%s.%s: tokens and the client secret cross plain http only to an address inside allow_private; use https", key, k))
		}
	}
	if c.TokenURL == "" {
		errs = append(errs, fmt.Errorf("%s.token_url: must be set: the spec has no oauth2 %s flow to take it from", key, flow))
	}
	if c.Flow == oauth.AuthorizationCode && c.AuthURL == "" {
		errs = append(errs, fmt.Errorf("%s.authorization_url: must be set: the spec has no oauth2 %s flow to take it from", key, flow))
	}
	check("token_url", c.TokenURL)
	check("revocation_url", c.RevocationURL)
	if c.Flow == oauth.AuthorizationCode && c.AuthURL != "" {
		// The person's browser goes here, not the gateway: any http(s) URL.
		if pu, err := url.Parse(c.AuthURL); err != nil || pu.Host == "" || (pu.Scheme != "https" && pu.Scheme != "http") {
			errs = append(errs, fmt.Errorf("%s.authorization_url: want an absolute http(s) URL, got %q", key, config.RedactURL(c.AuthURL)))
		}
	}
	return c, errs
}

// newOAuth builds the OAuth manager for the connectors that have
// credential.oauth2 (nil when none does). The provider is reached through
// each connector's own guarded transport; client secrets are read from
// the credential source per exchange.
func (s *Server) newOAuth() error {
	var clients []oauth.Client
	person := false
	for _, slug := range slices.Sorted(maps.Keys(s.catalog.connectors)) {
		u := s.catalog.connectors[slug]
		if u.oauth == nil {
			continue
		}
		c := *u.oauth
		c.HTTP = &http.Client{Transport: u.transport, Timeout: s.cfg.Gateway.UpstreamTimeout.Std(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		if name := u.cfg.Credential.OAuth2.ClientSecret; name != "" {
			c.Secret = func(ctx context.Context) ([]byte, error) {
				sec, err := s.creds.Credential(ctx, CredentialRef{Connector: slug, Secret: name})
				if err != nil {
					return nil, err
				}
				return sec.Reveal(), nil
			}
		}
		person = person || c.Flow == oauth.AuthorizationCode
		clients = append(clients, c)
	}
	if len(clients) == 0 {
		return nil
	}
	opt := oauth.Options{Clients: clients, Log: s.log,
		RedirectURL: strings.TrimRight(s.cfg.Approvals.PublicURL, "/") + "/connections/callback"}
	if person {
		ls, ok := s.creds.(creds.Local)
		if !ok {
			return errors.New("credential.oauth2: flow authorization_code keeps tokens in the local store; it needs secrets.backend: local")
		}
		opt.Store = oauth.LocalStore{Local: ls.Store}
	}
	m, err := oauth.New(opt)
	if err != nil {
		return err
	}
	s.oauth = m
	return nil
}

// connectionsURL is the review UI's Connections page, where a person
// connects connector: what an agent shows its user.
func (s *Server) connectionsURL(connector string) string {
	return strings.TrimRight(s.cfg.Approvals.PublicURL, "/") + "/connections?connector=" + url.QueryEscape(connector)
}

// oauthToken is the credential stage for a connector with
// credential.oauth2: the access token for the call's person (or the
// connector), or 403 connection_required naming where to connect. A
// connection the provider stopped honouring is never used.
func (s *Server) oauthToken(ctx context.Context, c *toolCall, tool *connectors.Tool) (vault.Secret, string, *refusal.Error) {
	if s.oauth == nil {
		return vault.Secret{}, "", refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "bug: this connector's OAuth client is not set up")
	}
	tok, err := s.oauth.Token(ctx, tool.Connector, c.rec.User)
	var re *oauth.RequiredError
	switch {
	case errors.As(err, &re):
		msg := fmt.Sprintf("connector %q acts with the account of the person this session runs for, who has not connected it", tool.Connector)
		switch {
		case c.rec.User == "":
			msg = fmt.Sprintf("connector %q acts with a person's own account, and this session runs for no person", tool.Connector)
		case re.Status == oauth.NeedsReconnect:
			msg = fmt.Sprintf("the provider no longer accepts %s's connection of connector %q (consent revoked or expired); they must reconnect", c.rec.User, tool.Connector)
		}
		if c.rec.User != "" {
			msg += "; connect at " + s.connectionsURL(tool.Connector) + " and retry"
		}
		return vault.Secret{}, "", refusal.New(http.StatusForbidden, refusal.ConnectionRequired, msg).Wrap(err)
	case err != nil:
		return vault.Secret{}, "", refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the OAuth token for this connector is unavailable").Wrap(err)
	}
	// The audit record names the connection and its scopes, never the token.
	return vault.NewSecret(tok.Value), fmt.Sprintf("oauth2 %s scopes=%s", tok.Connection, strings.Join(tok.Scopes, " ")), nil
}

// oauthConnections adapts the OAuth manager to the review UI's
// Connections page.
type oauthConnections struct {
	m *oauth.Manager
	// connected runs after a connect (the server releases the calls held
	// for it); nil: nothing.
	connected func(connector, user string)
}

func (oc oauthConnections) List(ctx context.Context, user string) ([]review.Connection, error) {
	var out []review.Connection
	for _, c := range oc.m.PersonClients() {
		conn, err := oc.m.Get(ctx, c.Connector, user)
		if err != nil {
			return nil, err
		}
		out = append(out, review.Connection{Connector: c.Connector, Status: string(conn.Status), Scopes: conn.Scopes, ConnectedAt: conn.ConnectedAt})
	}
	return out, nil
}

func (oc oauthConnections) Begin(ctx context.Context, connector, user, bind string) (string, error) {
	return oc.m.Begin(ctx, connector, user, bind)
}

func (oc oauthConnections) Complete(ctx context.Context, user, bind, state, code string) (review.Connection, error) {
	c, err := oc.m.Complete(ctx, user, bind, state, code)
	rc := review.Connection{Connector: c.Connector, Status: string(c.Status), Scopes: c.Scopes, ConnectedAt: c.ConnectedAt}
	if errors.Is(err, oauth.ErrBadState) {
		return rc, fmt.Errorf("%w: %w", review.ErrConnectState, err)
	}
	return rc, err
}

func (oc oauthConnections) Connected(connector, user string) {
	if oc.connected != nil {
		go oc.connected(connector, user) // the held calls run after the page answers
	}
}

func (oc oauthConnections) Disconnect(ctx context.Context, connector, user string) (bool, error) {
	return oc.m.Disconnect(ctx, connector, user)
}

// OAuth returns the OAuth manager of the credential.oauth2 connectors,
// nil without any (tests, and embedders that drop its cache on reload).
func (s *Server) OAuth() *oauth.Manager { return s.oauth }

// connectionApprover is the approver a call held for a connection names:
// only the connect of that connector by the call's person approves it.
func connectionApprover(connector string) string { return "connection:" + connector }

// holdForConnection holds a call to a credential.oauth2 connector with
// on_missing: hold whose person has no usable connection: like an ask,
// until they connect (connectHeld approves it then and it is sent once),
// or until the hold expires. held is false when the call goes on to the
// credential stage (connected, refuse mode, an approved hold's execution,
// a decided-only call, no person).
func (s *Server) holdForConnection(ctx context.Context, c *toolCall, tool *connectors.Tool, up *upstream, args *connectors.Args, req *http.Request) (o call.Outcome, e *refusal.Error, held bool) {
	if up.oauth == nil || up.cfg.Credential.OAuth2.OnMissing != "hold" || c.held != nil || c.req.Mode == call.Decide || c.rec.User == "" || s.oauth == nil {
		return call.Outcome{}, nil, false
	}
	conn, err := s.oauth.Get(ctx, tool.Connector, c.rec.User)
	if err != nil {
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the OAuth connection for this connector cannot be read").Wrap(err), true
	}
	if conn.Status == oauth.Connected {
		return call.Outcome{}, nil, false
	}
	c.decision.Approvers = []string{connectionApprover(tool.Connector)}
	c.decision.Reason = fmt.Sprintf("waiting for %s to connect %s at %s (%s)", c.rec.User, tool.Connector, s.connectionsURL(tool.Connector), conn.Status)
	o, e = s.holdCall(ctx, c, tool, args, req)
	return o, e, true
}

// connectHeld sends, once each, the calls held for user's connection of
// connector (approved as connectionApprover, through the same execution
// as any approval).
func (s *Server) connectHeld(connector, user string) {
	ctx := context.Background()
	hs, err := s.holds.List(ctx, holds.Filter{Status: []holds.Status{holds.Pending}, User: user, Limit: 1000})
	if err != nil {
		s.log.Error("oauth: held calls not released after a connect", "connector", connector, "user", user, "err", err)
		return
	}
	who := holds.Person{Name: connectionApprover(connector)}
	for _, h := range hs {
		if len(h.Approvers) != 1 || h.Approvers[0] != who.Name || !ident.Same(h.Caller.User, user) {
			continue
		}
		if _, err := s.holds.Approve(ctx, h.ID, who, user+" connected "+connector); err != nil {
			s.log.Warn("oauth: held call not released", "hold", h.ID, "err", err)
		}
	}
}
