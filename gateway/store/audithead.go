package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// AuditHead returns the audit log head recorded by SetAuditHead; ok is
// false when none was recorded yet.
func (s *Store) AuditHead(ctx context.Context) (seq uint64, hash string, updated time.Time, ok bool, err error) {
	var (
		n    int64
		unix int64
	)
	err = s.db.queryRow(ctx, `SELECT seq, hash, updated FROM audit_head WHERE id = 1`).Scan(&n, &hash, &unix)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", time.Time{}, false, nil
	}
	if err != nil {
		return 0, "", time.Time{}, false, fmt.Errorf("store: audit head: %w", err)
	}
	return uint64(n), hash, time.Unix(0, unix).UTC(), true, nil
}

// SetAuditHead records the audit log's head.
func (s *Store) SetAuditHead(ctx context.Context, seq uint64, hash string) error {
	_, err := s.db.exec(ctx, `INSERT INTO audit_head (id, seq, hash, updated) VALUES (1, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, updated = excluded.updated`,
		int64(seq), hash, s.now().UnixNano())
	if err != nil {
		return fmt.Errorf("store: set audit head: %w", err)
	}
	return nil
}
