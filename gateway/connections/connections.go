// Package connections is the OAuth connections of credential.oauth2
// connectors: the manager's construction (New) over the gateway's store
// (Rows, Pending, Lease: any replica takes a callback, one refreshes) and
// the secret store (tokens), the review UI's Connections page over it
// (Page), and an egress placeholder's token (PlaceholderToken). The calls
// held for a connection are the root's hold path.
package connections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/review"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/vault"
)

// Client is a connector's OAuth client as New takes it: the client as
// configured, the transport its provider is reached through (the
// connector's own guarded one; a remote MCP server's plain one, not its
// tools/call) and the name of its client secret ("": none).
type Client struct {
	Slug         string
	OAuth        *oauth.Client
	Transport    http.RoundTripper
	ClientSecret string
}

// New builds the OAuth manager for the connectors' clients (nil when
// there are none). Client secrets are read from the credential source per
// exchange. Connections' rows, started connects and refresh leases are in
// the gateway's store, read through st at each use (store.go): any
// replica takes the callback, and one refreshes.
func New(cfg *config.Config, cs []Client, src creds.Source, st func() *store.Store, log *slog.Logger) (*oauth.Manager, error) {
	var clients []oauth.Client
	person := false
	for _, u := range cs {
		slug := u.Slug
		c := *u.OAuth
		c.HTTP = &http.Client{Transport: u.Transport, Timeout: cfg.Gateway.UpstreamTimeout.Std(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		if name := u.ClientSecret; name != "" {
			c.Secret = func(ctx context.Context) ([]byte, error) {
				sec, err := src.Credential(ctx, creds.Ref{Connector: slug, Secret: name})
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
		// takes the callback, and one refreshes (store.go).
		Pending: Pending{st}, Lease: Lease{st}, Replica: cfg.Gateway.ReplicaID}
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
		opt.Store = oauth.SplitStore{Rows: Rows{st}, Secrets: kv}
		registered(clients, opt.Store) // MCP authorization keeps registered clients there
	}
	return oauth.New(opt)
}

// URL is the review UI's Connections page (under
// approvals.public_url), where a person connects connector: what an agent
// shows its user.
func URL(publicURL string) func(connector string) string {
	return func(connector string) string {
		return strings.TrimRight(publicURL, "/") + "/connections?connector=" + url.QueryEscape(connector)
	}
}

// Page adapts the OAuth manager M to the review UI's Connections page.
type Page struct {
	M *oauth.Manager
	// OnConnect runs after a connect (the server releases the calls held
	// for it); nil: nothing.
	OnConnect func(connector, user string)
}

func (oc Page) List(ctx context.Context, user string) ([]review.Connection, error) {
	var out []review.Connection
	for _, c := range oc.M.PersonClients() {
		conn, err := oc.M.Get(ctx, c.Connector, user)
		if err != nil {
			return nil, err
		}
		out = append(out, review.Connection{Connector: c.Connector, Status: string(conn.Status), Scopes: conn.Scopes, ConnectedAt: conn.ConnectedAt,
			Problem: connectionProblem(c)})
	}
	return out, nil
}

func (oc Page) Begin(ctx context.Context, connector, user, bind string) (string, error) {
	u, err := oc.M.Begin(ctx, connector, user, bind)
	if de := new(oauth.DiscoveryError); errors.As(err, &de) {
		return "", fmt.Errorf("%s %w: %w", connector, review.ErrConnectUnavailable, err) // MCP authorization: shown with its step
	}
	return u, err
}

func (oc Page) Complete(ctx context.Context, bind, state, code string) (review.Connection, error) {
	c, err := oc.M.Complete(ctx, bind, state, code)
	rc := review.Connection{Connector: c.Connector, User: c.User, Status: string(c.Status), Scopes: c.Scopes, ConnectedAt: c.ConnectedAt}
	if errors.Is(err, oauth.ErrBadState) {
		return rc, fmt.Errorf("%w: %w", review.ErrConnectState, err)
	}
	return rc, err
}

func (oc Page) Connected(connector, user string) {
	if oc.OnConnect != nil {
		go oc.OnConnect(connector, user) // the held calls run after the page answers
	}
}

func (oc Page) Disconnect(ctx context.Context, connector, user string) (bool, error) {
	return oc.M.Disconnect(ctx, connector, user)
}

// PlaceholderToken is the secret of an egress placeholder bound to an
// OAuth connection (egress.placeholders[].connection; its name is
// oauth2.SLUG): the calling person's access token for SLUG, or the
// connector's own for client credentials. ok is false for any other name,
// which is a secret's. A person without a usable connection gets the
// error the tool call would (connection_required's cause); nothing is
// substituted. m is the OAuth manager (nil without any OAuth connector).
func PlaceholderToken(ctx context.Context, m *oauth.Manager, name string, c policy.Caller) (sec vault.Secret, ok bool, err error) {
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

// registered gives the discovering clients the store their
// registered clients are kept in (New: the secret store tokens are kept in, local or Vault KV).
func registered(clients []oauth.Client, st oauth.Store) {
	ls, ok := st.(oauth.RegisteredStore)
	if !ok {
		return
	}
	for i := range clients {
		if clients[i].Discovery != nil {
			clients[i].Discovery.Registered = ls
		}
	}
}

// connectionProblem is why connector cannot be connected now (its MCP
// authorization could not be discovered), for the Connections page; "".
func connectionProblem(c *oauth.Client) string {
	if c.Discovery == nil {
		return ""
	}
	if err := c.Discovery.Status(); err != nil {
		return err.Error()
	}
	return ""
}
