package connections

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/store"
)

// The OAuth manager's shared state lives in the gateway's store, so that
// every replica on one PostgreSQL sees the same connections, started
// connects and refresh leases: the rows of oauth_connections (the tokens
// stay in the secret store), oauth_pending, and the lease columns. The
// store is read through St at each call (it is opened after the manager
// is built).

// Rows are the oauth_connections rows (oauth.Rows).
type Rows struct{ St func() *store.Store }

func (r Rows) Get(ctx context.Context, connector, user string) (oauth.Row, error) {
	c, err := r.St().GetOAuthConnection(ctx, connector, user)
	if errors.Is(err, store.ErrNotFound) {
		return oauth.Row{}, oauth.ErrNoConnection
	}
	if err != nil {
		return oauth.Row{}, err
	}
	return oauth.Row{Connector: c.Connector, User: c.User, Status: oauth.Status(c.Status), Scopes: c.Scopes, ConnectedAt: c.ConnectedAt}, nil
}

func (r Rows) Put(ctx context.Context, row oauth.Row, onlyNew bool) (bool, error) {
	return r.St().PutOAuthConnection(ctx, store.OAuthConnection{Connector: row.Connector, User: row.User,
		Status: string(row.Status), Scopes: row.Scopes, ConnectedAt: row.ConnectedAt, Updated: time.Now()}, onlyNew)
}

func (r Rows) Delete(ctx context.Context, connector, user string) error {
	return r.St().DeleteOAuthConnection(ctx, connector, user)
}

// Lease is the refresh lease of a connection (oauth.Lease).
type Lease struct{ St func() *store.Store }

func (l Lease) Take(ctx context.Context, connector, user, owner string, now, until time.Time) (bool, error) {
	return l.St().LeaseOAuthRefresh(ctx, connector, user, owner, now, until)
}

func (l Lease) Release(ctx context.Context, connector, user, owner string) error {
	return l.St().ReleaseOAuthRefresh(ctx, connector, user, owner)
}

// Pending are the started connects (oauth.Pending).
type Pending struct{ St func() *store.Store }

func (p Pending) Put(ctx context.Context, c oauth.PendingConnect, max int) error {
	return p.St().PutOAuthPending(ctx, store.OAuthPending{ID: c.ID, Connector: c.Connector, User: c.User,
		Bind: c.Bind, Verifier: c.Verifier, Created: c.Created, Expires: c.Expires}, max)
}

func (p Pending) Take(ctx context.Context, id string) (oauth.PendingConnect, error) {
	c, err := p.St().TakeOAuthPending(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return oauth.PendingConnect{}, oauth.ErrBadState
	}
	if err != nil {
		return oauth.PendingConnect{}, err
	}
	return oauth.PendingConnect{ID: c.ID, Connector: c.Connector, User: c.User, Bind: c.Bind, Verifier: c.Verifier,
		Created: c.Created, Expires: c.Expires}, nil
}
