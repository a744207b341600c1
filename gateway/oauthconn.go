package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/review"
)

// The OAuth connections of credential.oauth2 connectors: the manager's
// construction and the review UI's Connections page over it. The calls
// held for a connection are the hold path's (holdcall.go).

// newOAuth builds the OAuth manager for the connectors of cat that have
// credential.oauth2 (nil when none does). The provider is reached through
// each connector's own guarded transport; client secrets are read from
// the credential source per exchange.
func newOAuth(cfg *config.Config, cat *catalog, src CredentialSource, log *slog.Logger) (*oauth.Manager, error) {
	var clients []oauth.Client
	person := false
	for _, slug := range slices.Sorted(maps.Keys(cat.connectors)) {
		u := cat.connectors[slug]
		if u.oauth == nil {
			continue
		}
		c := *u.oauth
		c.HTTP = &http.Client{Transport: u.transport, Timeout: cfg.Gateway.UpstreamTimeout.Std(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		if name := u.cfg.Credential.OAuth2.ClientSecret; name != "" {
			c.Secret = func(ctx context.Context) ([]byte, error) {
				sec, err := src.Credential(ctx, CredentialRef{Connector: slug, Secret: name})
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
		return nil, nil
	}
	opt := oauth.Options{Clients: clients, Log: log,
		RedirectURL: strings.TrimRight(cfg.Approvals.PublicURL, "/") + "/connections/callback"}
	if person {
		ls, ok := src.(creds.Local)
		if !ok {
			return nil, errors.New("credential.oauth2: flow authorization_code keeps tokens in the local store; it needs secrets.backend: local")
		}
		opt.Store = oauth.LocalStore{Local: ls.Store}
	}
	return oauth.New(opt)
}

// connectionsURL is the review UI's Connections page (under
// approvals.public_url), where a person connects connector: what an agent
// shows its user.
func connectionsURL(publicURL string) func(connector string) string {
	return func(connector string) string {
		return strings.TrimRight(publicURL, "/") + "/connections?connector=" + url.QueryEscape(connector)
	}
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
