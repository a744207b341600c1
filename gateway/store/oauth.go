package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// OAuthConnection is a person's connection to a credential.oauth2
// connector as the table keeps it: never its tokens (gateway/oauth keeps
// those in the secret store).
type OAuthConnection struct {
	Connector   string
	User        string
	Status      string // connected | needs_reconnect
	Scopes      []string
	ConnectedAt time.Time
	Updated     time.Time
}

const oauthConnCols = `connector, "user", status, scopes, connected_at, updated`

func scanOAuthConnection(sc scanner) (OAuthConnection, error) {
	var c OAuthConnection
	var scopes string
	var connected, updated int64
	if err := sc.Scan(&c.Connector, &c.User, &c.Status, &scopes, &connected, &updated); err != nil {
		return OAuthConnection{}, err
	}
	c.Scopes = strings.Fields(scopes)
	c.ConnectedAt, c.Updated = time.Unix(0, connected).UTC(), time.Unix(0, updated).UTC()
	return c, nil
}

// checkOAuthConnection refuses what the table must never hold. Scopes are
// joined by spaces: RFC 6749 3.3 scope tokens have none.
func checkOAuthConnection(c OAuthConnection) error {
	if c.Connector == "" || c.User == "" {
		return errors.New("store: oauth connection: empty connector or user")
	}
	if c.Status != "connected" && c.Status != "needs_reconnect" {
		return fmt.Errorf("store: oauth connection: status %q is not connected or needs_reconnect", c.Status)
	}
	for _, s := range c.Scopes {
		if s == "" || strings.ContainsAny(s, " \t\r\n") {
			return fmt.Errorf("store: oauth connection: scope %q is not one scope token", s)
		}
	}
	return nil
}

// GetOAuthConnection returns user's connection to connector, or ErrNotFound.
func (s *Store) GetOAuthConnection(ctx context.Context, connector, user string) (OAuthConnection, error) {
	c, err := scanOAuthConnection(s.db.queryRow(ctx, `SELECT `+oauthConnCols+` FROM oauth_connections WHERE connector = ? AND "user" = ?`, connector, user))
	if errors.Is(err, sql.ErrNoRows) {
		return OAuthConnection{}, ErrNotFound
	}
	if err != nil {
		return OAuthConnection{}, fmt.Errorf("store: get oauth connection: %w", err)
	}
	return c, nil
}

// PutOAuthConnection stores c, replacing the row of the same connector and
// user (a refresh lease on it stands). With onlyNew it stores c only when
// there is no such row, and reports whether it did.
func (s *Store) PutOAuthConnection(ctx context.Context, c OAuthConnection, onlyNew bool) (bool, error) {
	if err := checkOAuthConnection(c); err != nil {
		return false, err
	}
	conflict := `DO UPDATE SET status = excluded.status, scopes = excluded.scopes, connected_at = excluded.connected_at, updated = excluded.updated`
	if onlyNew {
		conflict = `DO NOTHING`
	}
	n, err := s.db.exec(ctx, `INSERT INTO oauth_connections (`+oauthConnCols+`) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (connector, "user") `+conflict,
		c.Connector, c.User, c.Status, strings.Join(c.Scopes, " "), c.ConnectedAt.UnixNano(), c.Updated.UnixNano())
	if err != nil {
		return false, fmt.Errorf("store: put oauth connection: %w", err)
	}
	return n == 1, nil
}

// DeleteOAuthConnection deletes user's connection to connector (none is
// not an error).
func (s *Store) DeleteOAuthConnection(ctx context.Context, connector, user string) error {
	if _, err := s.db.exec(ctx, `DELETE FROM oauth_connections WHERE connector = ? AND "user" = ?`, connector, user); err != nil {
		return fmt.Errorf("store: delete oauth connection: %w", err)
	}
	return nil
}

// LeaseOAuthRefresh takes the refresh lease of user's connection to
// connector for owner until until, unless another owner holds one that
// has not ended at now. One conditional UPDATE: of any number of
// replicas asking together, exactly one gets it. It reports whether owner
// holds the lease; a connection with no row gets none.
func (s *Store) LeaseOAuthRefresh(ctx context.Context, connector, user, owner string, now, until time.Time) (bool, error) {
	if owner == "" {
		return false, errors.New("bug(): store: oauth refresh lease without an owner")
	}
	n, err := s.db.exec(ctx, `UPDATE oauth_connections SET lease_owner = ?, lease_until = ?
		WHERE connector = ? AND "user" = ? AND (lease_owner = '' OR lease_owner = ? OR lease_until <= ?)`,
		owner, until.UnixNano(), connector, user, owner, now.UnixNano())
	if err != nil {
		return false, fmt.Errorf("store: lease oauth refresh: %w", err)
	}
	return n == 1, nil
}

// ReleaseOAuthRefresh ends owner's refresh lease (another owner's stands).
func (s *Store) ReleaseOAuthRefresh(ctx context.Context, connector, user, owner string) error {
	if _, err := s.db.exec(ctx, `UPDATE oauth_connections SET lease_owner = '', lease_until = 0
		WHERE connector = ? AND "user" = ? AND lease_owner = ?`, connector, user, owner); err != nil {
		return fmt.Errorf("store: release oauth refresh: %w", err)
	}
	return nil
}

// OAuthRefreshLeased says whether someone holds an unexpired refresh lease
// on user's connection to connector at now.
func (s *Store) OAuthRefreshLeased(ctx context.Context, connector, user string, now time.Time) (bool, error) {
	var n int
	if err := s.db.queryRow(ctx, `SELECT COUNT(*) FROM oauth_connections WHERE connector = ? AND "user" = ?
		AND lease_owner <> '' AND lease_until > ?`, connector, user, now.UnixNano()).Scan(&n); err != nil {
		return false, fmt.Errorf("store: oauth refresh lease: %w", err)
	}
	return n > 0, nil
}

// OAuthPending is a started connect (see the oauth_pending table).
type OAuthPending struct {
	ID        string // SHA-256 of the state, hex
	Connector string
	User      string
	Bind      string // SHA-256 of the review UI session, hex
	Verifier  string // the PKCE verifier, sealed by the caller
	Created   time.Time
	Expires   time.Time
}

// PutOAuthPending stores p in one transaction that also drops every
// started connect expired at p.Created, and p.User's oldest beyond max-1,
// so that a person has at most max (max <= 0: no bound) and the table
// stays small.
func (s *Store) PutOAuthPending(ctx context.Context, p OAuthPending, max int) error {
	if p.ID == "" || p.Connector == "" || p.User == "" || p.Bind == "" || p.Verifier == "" {
		return errors.New("bug(): store: oauth pending: a field is empty")
	}
	err := s.db.inTx(ctx, func(tx *txn) error {
		if _, err := tx.exec(`DELETE FROM oauth_pending WHERE expires <= ?`, p.Created.UnixNano()); err != nil {
			return err
		}
		if max > 0 {
			if _, err := tx.exec(`DELETE FROM oauth_pending WHERE "user" = ? AND id NOT IN
				(SELECT id FROM oauth_pending WHERE "user" = ? ORDER BY created DESC, id LIMIT ?)`, p.User, p.User, max-1); err != nil {
				return err
			}
		}
		_, err := tx.exec(`INSERT INTO oauth_pending (id, connector, "user", bind, verifier, created, expires) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			p.ID, p.Connector, p.User, p.Bind, p.Verifier, p.Created.UnixNano(), p.Expires.UnixNano())
		return err
	})
	if err != nil {
		return fmt.Errorf("store: put oauth pending: %w", err)
	}
	return nil
}

// TakeOAuthPending deletes the started connect id and returns it, or
// ErrNotFound: one DELETE … RETURNING, so of two callbacks with one state
// (on any replicas) exactly one gets it. Expiry is the caller's to check.
func (s *Store) TakeOAuthPending(ctx context.Context, id string) (OAuthPending, error) {
	var p OAuthPending
	var created, expires int64
	err := s.db.queryRow(ctx, `DELETE FROM oauth_pending WHERE id = ? RETURNING id, connector, "user", bind, verifier, created, expires`, id).
		Scan(&p.ID, &p.Connector, &p.User, &p.Bind, &p.Verifier, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return OAuthPending{}, ErrNotFound
	}
	if err != nil {
		return OAuthPending{}, fmt.Errorf("store: take oauth pending: %w", err)
	}
	p.Created, p.Expires = time.Unix(0, created).UTC(), time.Unix(0, expires).UTC()
	return p, nil
}

// CountOAuthPending counts user's started connects (tests, status).
func (s *Store) CountOAuthPending(ctx context.Context, user string) (int, error) {
	var n int
	if err := s.db.queryRow(ctx, `SELECT COUNT(*) FROM oauth_pending WHERE "user" = ?`, user).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count oauth pending: %w", err)
	}
	return n, nil
}
