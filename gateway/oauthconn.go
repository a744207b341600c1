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
	"github.com/sluice-gw/sluice/gateway/mcpremote"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/review"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/vault"
)

// The OAuth connections of credential.oauth2 connectors: the manager's
// construction and the review UI's Connections page over it. The calls
// held for a connection are the hold path's (holdcall.go).

// newOAuth builds the OAuth manager for the connectors of cat that have
// credential.oauth2 (nil when none does). The provider is reached through
// each connector's own guarded transport; client secrets are read from
// the credential source per exchange. Connections' rows, started connects
// and refresh leases are in the gateway's store, read through st at each
// use (oauthstore.go): any replica takes the callback, and one refreshes.
func newOAuth(cfg *config.Config, cat *catalog, src CredentialSource, st func() *store.Store, log *slog.Logger) (*oauth.Manager, error) {
	var clients []oauth.Client
	person := false
	for _, slug := range slices.Sorted(maps.Keys(cat.connectors)) {
		u := cat.connectors[slug]
		if u.oauth == nil {
			continue
		}
		c := *u.oauth
		tr := u.transport
		if r, ok := tr.(*mcpremote.Remote); ok {
			tr = r.Transport() // a remote MCP server's send is a tools/call; its authorization server is reached plainly
		}
		c.HTTP = &http.Client{Transport: tr, Timeout: cfg.Gateway.UpstreamTimeout.Std(),
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
		RedirectURL: strings.TrimRight(cfg.Approvals.PublicURL, "/") + "/connections/callback",
		// Started connects and refresh leases in the store: any replica
		// takes the callback, and one refreshes (oauthstore.go).
		Pending: oauthPending{st}, Lease: oauthLease{st}, Replica: cfg.Gateway.ReplicaID}
	if person {
		// Each person's tokens in the secret store (the local store, or
		// Vault KV v2), the connection's row in the gateway's store.
		var kv oauth.SecretKV
		switch src := src.(type) {
		case creds.Local:
			kv = src.Store
		case *creds.Vault:
			kv = vault.NamedKV{V: src.Client()}
		default:
			return nil, fmt.Errorf("credential.oauth2: flow authorization_code keeps tokens in the secret store; the credential source %T cannot store them", src)
		}
		opt.Store = oauth.SplitStore{Rows: oauthRows{st}, Secrets: kv}
		mcpOAuthRegistered(clients, opt.Store) // MCP authorization keeps registered clients there (mcp_oauth.go)
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

// placeholderToken is the secret of an egress placeholder bound to an
// OAuth connection (egress.placeholders[].connection; its name is
// oauth2.SLUG): the calling person's access token for SLUG, or the
// connector's own for client credentials. ok is false for any other name,
// which is a secret's. A person without a usable connection gets the
// error the tool call would (connection_required's cause); nothing is
// substituted. m is the OAuth manager (nil without any OAuth connector).
func placeholderToken(ctx context.Context, m *oauth.Manager, name string, c policy.Caller) (sec vault.Secret, ok bool, err error) {
	slug, isOAuth := strings.CutPrefix(name, config.OAuthTokenPrefix)
	if !isOAuth {
		return vault.Secret{}, false, nil
	}
	if m == nil {
		return vault.Secret{}, true, fmt.Errorf("bug(): egress placeholder %s: no OAuth client", name)
	}
	if _, known := m.Client(slug); !known {
		return vault.Secret{}, true, fmt.Errorf("bug(): egress placeholder %s: connector has no OAuth client", name)
	}
	tok, err := m.Token(ctx, slug, c.User)
	if err != nil {
		return vault.Secret{}, true, err
	}
	return vault.NewSecret(tok.Value), true, nil
}
