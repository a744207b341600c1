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
	"github.com/sluice-gw/sluice/gateway/mcpremote"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/review"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/vault"
)

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
		tr := u.transport
		if r, ok := tr.(*mcpremote.Remote); ok {
			tr = r.Transport() // a remote MCP server's send is a tools/call; its authorization server is reached plainly
		}
		c.HTTP = &http.Client{Transport: tr, Timeout: s.cfg.Gateway.UpstreamTimeout.Std(),
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
		RedirectURL: strings.TrimRight(s.cfg.Approvals.PublicURL, "/") + "/connections/callback",
		// Started connects and refresh leases in the store: any replica
		// takes the callback, and one refreshes (oauthstore.go).
		Pending: oauthPending{s}, Lease: oauthLease{s}, Replica: s.cfg.Gateway.ReplicaID}
	if person {
		// Each person's tokens in the secret store (the local store, or
		// Vault KV v2), the connection's row in the gateway's store.
		var kv oauth.SecretKV
		switch src := s.creds.(type) {
		case creds.Local:
			kv = src.Store
		case *creds.Vault:
			kv = vault.NamedKV{V: src.Client()}
		default:
			return fmt.Errorf("credential.oauth2: flow authorization_code keeps tokens in the secret store; the credential source %T cannot store them", s.creds)
		}
		opt.Store = oauth.SplitStore{Rows: oauthRows{s}, Secrets: kv}
		mcpOAuthRegistered(clients, opt.Store) // MCP authorization keeps registered clients there (mcp_oauth.go)
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
		out = append(out, review.Connection{Connector: c.Connector, Status: string(conn.Status), Scopes: conn.Scopes, ConnectedAt: conn.ConnectedAt,
			Problem: connectionProblem(c)})
	}
	return out, nil
}

func (oc oauthConnections) Begin(ctx context.Context, connector, user, bind string) (string, error) {
	u, err := oc.m.Begin(ctx, connector, user, bind)
	if de := new(oauth.DiscoveryError); errors.As(err, &de) {
		return "", fmt.Errorf("%s %w: %w", connector, review.ErrConnectUnavailable, err) // MCP authorization: shown with its step
	}
	return u, err
}

func (oc oauthConnections) Complete(ctx context.Context, bind, state, code string) (review.Connection, error) {
	c, err := oc.m.Complete(ctx, bind, state, code)
	rc := review.Connection{Connector: c.Connector, User: c.User, Status: string(c.Status), Scopes: c.Scopes, ConnectedAt: c.ConnectedAt}
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
	s.kickRemote(connector) // a remote MCP server's listing may have waited for a connection (mcp_oauth.go)
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

// placeholderToken is the secret of an egress placeholder bound to an
// OAuth connection (egress.placeholders[].connection; its name is
// oauth2.SLUG): the calling person's access token for SLUG, or the
// connector's own for client credentials. ok is false for any other name,
// which is a secret's. A person without a usable connection gets the
// error the tool call would (connection_required's cause); nothing is
// substituted.
func (s *Server) placeholderToken(ctx context.Context, name string, c policy.Caller) (sec vault.Secret, ok bool, err error) {
	slug, isOAuth := strings.CutPrefix(name, config.OAuthTokenPrefix)
	if !isOAuth {
		return vault.Secret{}, false, nil
	}
	if s.oauth == nil {
		return vault.Secret{}, true, fmt.Errorf("bug(): egress placeholder %s: no OAuth client", name)
	}
	if _, known := s.oauth.Client(slug); !known {
		return vault.Secret{}, true, fmt.Errorf("bug(): egress placeholder %s: connector has no OAuth client", name)
	}
	tok, err := s.oauth.Token(ctx, slug, c.User)
	if err != nil {
		return vault.Secret{}, true, err
	}
	return vault.NewSecret(tok.Value), true, nil
}
