package oauth

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/oauth2"
)

// Which client a connection's token requests use (a discovered MCP
// authorization's registered client), and how a connection, or that
// client, ends at the provider's word: the connection then needs
// reconnecting.

// Discover resolves connector's MCP authorization now, if it has one (the
// remote's listing does it first, so that a failure is reported by step
// before anyone connects).
func (m *Manager) Discover(ctx context.Context, connector string) error {
	c, ok := m.clients[connector]
	if !ok {
		return fmt.Errorf("bug(): oauth: connector %q has no OAuth client", connector)
	}
	_, err := m.resolve(ctx, c)
	return err
}

// resolve returns c made concrete (c itself when it has no Discovery),
// registering a client when none is kept.
func (m *Manager) resolve(ctx context.Context, c *Client) (*Client, error) {
	return m.resolveFor(ctx, c, true)
}

// errNoClient: the kept registered client is gone (the provider ended it)
// and this use may not register a new one — a person's tokens were issued
// to the old client, so only a new connect, which registers, can help.
var errNoClient = errors.New("oauth: the registered client was ended; a new one is registered at the next connect")

// resolveFor is resolve; with register false, a missing registered client
// is errNoClient instead of a new registration (the refresh and the
// disconnect of a person's connection: a client registered then could
// never use that connection's refresh token).
func (m *Manager) resolveFor(ctx context.Context, c *Client, register bool) (*Client, error) {
	if c.Discovery == nil {
		return c, nil
	}
	return c.Discovery.resolve(ctx, c, m.opt.RedirectURL, register)
}

// registrationEnded says whether err is the token endpoint refusing rc's
// client (invalid_client) when the gateway registered that client: the
// server ended the registration (revoked, expired). The client is then
// forgotten, here and in the RegisteredStore, so the next use registers
// a new one instead of sending the dead one forever; only the client that
// was refused is forgotten, so however many calls saw the refusal, one
// new registration follows. A configured client id is never forgotten.
func (m *Manager) registrationEnded(ctx context.Context, rc *Client, err error) bool {
	var re *oauth2.RetrieveError
	c := m.clients[rc.Connector]
	if !errors.As(err, &re) || re.ErrorCode != "invalid_client" || c == nil || c.Discovery == nil || c.ClientID != "" {
		return false
	}
	d := c.Discovery
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done != nil && d.done.ClientID == rc.ClientID {
		d.done = nil
	}
	if d.Registered != nil {
		if kept, lerr := d.Registered.LoadRegistered(ctx, c.Connector); lerr == nil && kept.ClientID == rc.ClientID {
			if serr := d.Registered.SaveRegistered(ctx, c.Connector, Registered{}); serr != nil {
				m.opt.Log.Error("oauth: the ended registered client is still kept; it is refused again at its next use", "connector", c.Connector, "err", serr.Error())
			}
		}
	}
	m.opt.Log.Warn("oauth: the authorization server ended the registered client; a new one is registered at the next use", "connector", c.Connector, "client", rc.ClientID)
	return true
}

// clientEnded answers a person's token request when the registered client
// their connection was made with is gone: the connection needs reconnecting
// (its tokens cannot be refreshed by any other client).
func (m *Manager) clientEnded(ctx context.Context, c *Client, user string) error {
	conn, err := m.opt.Store.Load(ctx, c.Connector, user)
	switch {
	case errors.Is(err, ErrNoConnection):
		return &RequiredError{Connector: c.Connector, User: user, Status: NotConnected}
	case err != nil:
		return fmt.Errorf("oauth: %s: load connection: %w", c.Connector, err)
	case conn.Status != Connected:
		return &RequiredError{Connector: c.Connector, User: user, Status: NeedsReconnect}
	}
	return m.needsReconnect(ctx, conn, "the provider ended the registered client: invalid_client")
}

func (m *Manager) needsReconnect(ctx context.Context, conn Connection, why string) error {
	conn.Status, conn.Access, conn.Refresh, conn.Expiry = NeedsReconnect, "", "", time.Time{}
	if err := m.opt.Store.Save(ctx, conn); err != nil {
		return fmt.Errorf("oauth: %s: mark user %q needs_reconnect: %w", conn.Connector, conn.User, err)
	}
	m.opt.Log.Warn("oauth: connection needs reconnecting", "connection", conn, "reason", why)
	return &RequiredError{Connector: conn.Connector, User: conn.User, Status: NeedsReconnect}
}
