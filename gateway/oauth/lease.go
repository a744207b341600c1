package oauth

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Lease serialises token refreshes across the gateway replicas that share
// a Store (the store's refresh lease on the connection's row): a refresh
// token used twice is revoked by many providers, so two replicas must
// never refresh one connection at once. Take reports whether owner now
// holds the lease of (connector, user) until until; another owner's lease
// stands until it is released or its until has passed at now.
type Lease interface {
	Take(ctx context.Context, connector, user, owner string, now, until time.Time) (bool, error)
	Release(ctx context.Context, connector, user, owner string) error
}

// leasePoll is how often a replica waiting for another's refresh looks
// again.
const leasePoll = 25 * time.Millisecond

// lease waits until this replica holds the refresh lease of user's
// connection, or until another replica's refresh has stored a usable
// token. With the lease it returns the connection as stored now (read
// under the lease, so never a refresh token another replica has spent)
// and the release; otherwise the token to use (t) or the error that ends
// the call.
func (m *Manager) lease(ctx context.Context, c *Client, user string) (conn Connection, t *cached, release func(), err error) {
	fail := func(err error) (Connection, *cached, func(), error) { return Connection{}, &cached{}, nil, err }
	for {
		now := m.opt.Now()
		held, err := m.opt.Lease.Take(ctx, c.Connector, user, m.opt.Replica, now, now.Add(m.opt.LeaseTTL))
		if err != nil {
			return fail(fmt.Errorf("oauth: %s: refresh lease for user %q: %w", c.Connector, user, err))
		}
		release := func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := m.opt.Lease.Release(rctx, c.Connector, user, m.opt.Replica); err != nil {
				// It ends at its until: the others wait that long at most.
				m.opt.Log.Warn("oauth: refresh lease not released", "connector", c.Connector, "user", user, "err", err)
			}
		}
		conn, err := m.opt.Store.Load(ctx, c.Connector, user)
		switch {
		case err != nil && held:
			release()
		case err == nil && held && (conn.Status != Connected || conn.Access != "" && m.usable(conn.Expiry)):
			release()
		}
		switch {
		case errors.Is(err, ErrNoConnection):
			return fail(&RequiredError{Connector: c.Connector, User: user, Status: NotConnected})
		case err != nil:
			return fail(fmt.Errorf("oauth: %s: load connection: %w", c.Connector, err))
		case conn.Status != Connected:
			return fail(&RequiredError{Connector: c.Connector, User: user, Status: NeedsReconnect})
		case conn.Access != "" && m.usable(conn.Expiry):
			return Connection{}, &cached{access: conn.Access, expiry: conn.Expiry, scopes: conn.Scopes}, nil, nil
		case held:
			return conn, nil, release, nil
		}
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("oauth: %s: waiting for another replica's refresh for user %q: %w", c.Connector, user, ctx.Err()))
		case <-time.After(leasePoll):
		}
	}
}
