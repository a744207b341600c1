package gateway

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
// store is read through st at each call (it is opened after the manager
// is built).

type oauthRows struct{ st func() *store.Store }

func (r oauthRows) Get(ctx context.Context, connector, user string) (oauth.Row, error) {
	c, err := r.st().GetOAuthConnection(ctx, connector, user)
	if errors.Is(err, store.ErrNotFound) {
		return oauth.Row{}, oauth.ErrNoConnection
	}
	if err != nil {
		return oauth.Row{}, err
	}
	return oauth.Row{Connector: c.Connector, User: c.User, Status: oauth.Status(c.Status), Scopes: c.Scopes, ConnectedAt: c.ConnectedAt}, nil
}

func (r oauthRows) Put(ctx context.Context, row oauth.Row, onlyNew bool) (bool, error) {
	return r.st().PutOAuthConnection(ctx, store.OAuthConnection{Connector: row.Connector, User: row.User,
		Status: string(row.Status), Scopes: row.Scopes, ConnectedAt: row.ConnectedAt, Updated: time.Now()}, onlyNew)
}

func (r oauthRows) Delete(ctx context.Context, connector, user string) error {
	return r.st().DeleteOAuthConnection(ctx, connector, user)
}

type oauthLease struct{ st func() *store.Store }

func (l oauthLease) Take(ctx context.Context, connector, user, owner string, now, until time.Time) (bool, error) {
	return l.st().LeaseOAuthRefresh(ctx, connector, user, owner, now, until)
}

func (l oauthLease) Release(ctx context.Context, connector, user, owner string) error {
	return l.st().ReleaseOAuthRefresh(ctx, connector, user, owner)
}

type oauthPending struct{ st func() *store.Store }

func (p oauthPending) Put(ctx context.Context, c oauth.PendingConnect, max int) error {
	return p.st().PutOAuthPending(ctx, store.OAuthPending{ID: c.ID, Connector: c.Connector, User: c.User,
		Bind: c.Bind, Verifier: c.Verifier, Created: c.Created, Expires: c.Expires}, max)
}

func (p oauthPending) Take(ctx context.Context, id string) (oauth.PendingConnect, error) {
	c, err := p.st().TakeOAuthPending(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return oauth.PendingConnect{}, oauth.ErrBadState
	}
	if err != nil {
		return oauth.PendingConnect{}, err
	}
	return oauth.PendingConnect{ID: c.ID, Connector: c.Connector, User: c.User, Bind: c.Bind, Verifier: c.Verifier,
		Created: c.Created, Expires: c.Expires}, nil
}
