package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// GrantRow is one "always allow" grant as stored. Doc is the caller's
// immutable rest (JSON, opaque to the store).
type GrantRow struct {
	ID        string
	Agent     string
	User      string
	Tool      string
	SHA256    string
	Hold      string // the hold it was granted from
	GrantedBy string
	Created   time.Time
	Expires   time.Time
	Doc       []byte
	Revoked   time.Time // zero unless revoked
	RevokedBy string
	MaxUses   int // calls it may let through; 0 is no limit
	Uses      int // calls it let through
}

const grantCols = `id, agent, "user", tool, sha256, hold, granted_by, created, expires, doc, revoked, revoked_by, max_uses, uses`

func scanGrant(sc scanner) (GrantRow, error) {
	var g GrantRow
	var created, expires, revoked int64
	if err := sc.Scan(&g.ID, &g.Agent, &g.User, &g.Tool, &g.SHA256, &g.Hold, &g.GrantedBy, &created, &expires, &g.Doc,
		&revoked, &g.RevokedBy, &g.MaxUses, &g.Uses); err != nil {
		return GrantRow{}, err
	}
	g.Created, g.Expires = time.Unix(0, created).UTC(), time.Unix(0, expires).UTC()
	if revoked != 0 {
		g.Revoked = time.Unix(0, revoked).UTC()
	}
	return g, nil
}

// DecideHoldGrant is DecideHold that also stores g, in one transaction: the
// grant exists if and only if this call won the decision.
func (s *Store) DecideHoldGrant(ctx context.Context, id, to, by, reason string, now time.Time, g GrantRow) (bool, error) {
	return s.Decide(ctx, Decision{ID: id, Version: AnyVersion, To: to, By: by, Reason: reason, Now: now, Grant: &g})
}

// MatchGrants returns the grants for exactly this agent, user, tool and
// request hash that are neither revoked, expired at now nor used up,
// newest first.
func (s *Store) MatchGrants(ctx context.Context, agent, user, tool, sha string, now time.Time) ([]GrantRow, error) {
	return s.grants(ctx, `SELECT `+grantCols+` FROM grants WHERE agent = ? AND "user" = ? AND tool = ? AND sha256 = ?
		AND expires > ? AND revoked = 0 AND (max_uses = 0 OR uses < max_uses) ORDER BY created DESC LIMIT 100`, agent, user, tool, sha, now.UnixNano())
}

// UseGrant takes one use of grant id at now: it reports whether the grant
// was still active (unrevoked, unexpired, not used up) and counted this
// use. One conditional UPDATE, so of any number of concurrent calls, on
// any number of gateways, exactly max_uses get a use.
func (s *Store) UseGrant(ctx context.Context, id string, now time.Time) (bool, error) {
	n, err := s.db.exec(ctx, `UPDATE grants SET uses = uses + 1 WHERE id = ? AND revoked = 0 AND expires > ?
		AND (max_uses = 0 OR uses < max_uses)`, id, now.UnixNano())
	if err != nil {
		return false, fmt.Errorf("store: use grant: %w", err)
	}
	return n == 1, nil
}

// ListGrants lists grants, newest first: with all false only those
// neither revoked nor expired at now. limit <= 0 is 100.
func (s *Store) ListGrants(ctx context.Context, all bool, now time.Time, limit int) ([]GrantRow, error) {
	if limit <= 0 {
		limit = 100
	}
	if all {
		return s.grants(ctx, `SELECT `+grantCols+` FROM grants ORDER BY created DESC LIMIT ?`, limit)
	}
	return s.grants(ctx, `SELECT `+grantCols+` FROM grants WHERE expires > ? AND revoked = 0 AND (max_uses = 0 OR uses < max_uses) ORDER BY created DESC LIMIT ?`,
		now.UnixNano(), limit)
}

func (s *Store) grants(ctx context.Context, q string, args ...any) ([]GrantRow, error) {
	out := []GrantRow{}
	err := s.db.each(ctx, q, args, func(sc scanner) error {
		g, err := scanGrant(sc)
		if err != nil {
			return err
		}
		out = append(out, g)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: grants: %w", err)
	}
	return out, nil
}

// GetGrant returns one grant, or ErrNotFound.
func (s *Store) GetGrant(ctx context.Context, id string) (GrantRow, error) {
	g, err := scanGrant(s.db.queryRow(ctx, `SELECT `+grantCols+` FROM grants WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return GrantRow{}, ErrNotFound
	}
	if err != nil {
		return GrantRow{}, fmt.Errorf("store: get grant: %w", err)
	}
	return g, nil
}

// RevokeGrant marks a grant revoked by `by` at now unless it already is;
// it reports whether this call revoked it.
func (s *Store) RevokeGrant(ctx context.Context, id, by string, now time.Time) (bool, error) {
	n, err := s.db.exec(ctx, `UPDATE grants SET revoked = ?, revoked_by = ? WHERE id = ? AND revoked = 0`,
		now.UnixNano(), by, id)
	if err != nil {
		return false, fmt.Errorf("store: revoke grant: %w", err)
	}
	return n == 1, nil
}

// DeleteGrant removes a grant that must never have existed (its approval
// could not be audited).
func (s *Store) DeleteGrant(ctx context.Context, id string) error {
	if _, err := s.db.exec(ctx, `DELETE FROM grants WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete grant: %w", err)
	}
	return nil
}
