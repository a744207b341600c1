package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// UIOIDCPending is a review UI sign-in through OIDC that was started and
// not yet finished (table ui_oidc_pending), kept here so that the
// provider's redirect may reach any replica. IDHash is the SHA-256 of the
// id in the browser's cookie; Sealed is what the review UI sealed under a
// key only that id gives.
type UIOIDCPending struct {
	IDHash  string
	Sealed  string
	Created time.Time
	Expires time.Time
}

// PutUIOIDCPending stores p in one transaction that also drops every
// pending sign-in expired at p.Created, and the oldest beyond max-1 (max
// <= 0: no bound), so that starting sign-ins without finishing them
// cannot grow the table without end.
func (s *Store) PutUIOIDCPending(ctx context.Context, p UIOIDCPending, max int) error {
	if len(p.IDHash) != 64 || p.Sealed == "" || !p.Expires.After(p.Created) {
		return errors.New("bug(): store: oidc pending: a field is empty or out of range")
	}
	err := s.db.inTx(ctx, func(tx *txn) error {
		if _, err := tx.exec(`DELETE FROM ui_oidc_pending WHERE expires <= ?`, p.Created.UnixNano()); err != nil {
			return err
		}
		if max > 0 {
			if _, err := tx.exec(`DELETE FROM ui_oidc_pending WHERE id_hash NOT IN
				(SELECT id_hash FROM ui_oidc_pending ORDER BY created DESC, id_hash LIMIT ?)`, max-1); err != nil {
				return err
			}
		}
		_, err := tx.exec(`INSERT INTO ui_oidc_pending (id_hash, sealed, created, expires) VALUES (?, ?, ?, ?)`,
			p.IDHash, p.Sealed, p.Created.UnixNano(), p.Expires.UnixNano())
		return err
	})
	if err != nil {
		return fmt.Errorf("store: put oidc pending: %w", err)
	}
	return nil
}

// TakeUIOIDCPending deletes the pending sign-in idHash and returns it, or
// ErrNotFound: one DELETE … RETURNING, so of two callbacks with one
// cookie (on any replicas) exactly one gets it. Expiry is the caller's to
// check.
func (s *Store) TakeUIOIDCPending(ctx context.Context, idHash string) (UIOIDCPending, error) {
	p := UIOIDCPending{}
	var created, expires int64
	err := s.db.queryRow(ctx, `DELETE FROM ui_oidc_pending WHERE id_hash = ? RETURNING id_hash, sealed, created, expires`, idHash).
		Scan(&p.IDHash, &p.Sealed, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return UIOIDCPending{}, ErrNotFound
	}
	if err != nil {
		return UIOIDCPending{}, fmt.Errorf("store: take oidc pending: %w", err)
	}
	p.Created, p.Expires = time.Unix(0, created).UTC(), time.Unix(0, expires).UTC()
	return p, nil
}
