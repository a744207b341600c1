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
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/review"
	"github.com/sluice-gw/sluice/vault"
)

// oauthScheme is how an OAuth access token is attached: the Authorization
// header, as every oauth2 securityScheme sends it (RFC 6750 2.1).
var oauthScheme = &connectors.SecurityScheme{Name: "credential.oauth2", Type: "http", Scheme: "bearer"}

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
		ls, ok := s.creds.(localSource)
		if !ok {
			return errors.New("credential.oauth2: flow authorization_code keeps tokens in the local store; it needs secrets.backend: local")
		}
		opt.Store = oauth.LocalStore{Local: ls.store}
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
type oauthConnections struct{ m *oauth.Manager }

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

func (oc oauthConnections) Disconnect(ctx context.Context, connector, user string) (bool, error) {
	return oc.m.Disconnect(ctx, connector, user)
}

// OAuth returns the OAuth manager of the credential.oauth2 connectors,
// nil without any (tests, and embedders that drop its cache on reload).
func (s *Server) OAuth() *oauth.Manager { return s.oauth }
