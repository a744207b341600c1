package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"time"
)

// auditLogKey is the audit_heads row this store's gateway uses. SQLite:
// ” (one gateway per store, as before the table was keyed). PostgreSQL:
// the host name and Options.AuditLog, so each replica checks its own
// file against its own head, never against another replica's.
func (s *Store) auditLogKey() string {
	if s.b.Kind() == SQLite {
		return ""
	}
	host, _ := os.Hostname()
	return host + ":" + s.auditLog
}

// AuditHead returns the audit log head recorded by SetAuditHead; ok is
// false when none was recorded yet.
func (s *Store) AuditHead(ctx context.Context) (seq uint64, hash string, updated time.Time, ok bool, err error) {
	var (
		n    int64
		unix int64
	)
	err = s.db.queryRow(ctx, `SELECT seq, hash, updated FROM audit_heads WHERE log = ?`, s.auditLogKey()).Scan(&n, &hash, &unix)
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
	_, err := s.db.exec(ctx, `INSERT INTO audit_heads (log, seq, hash, updated) VALUES (?, ?, ?, ?)
		ON CONFLICT (log) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, updated = excluded.updated`,
		s.auditLogKey(), int64(seq), hash, s.now().UnixNano())
	if err != nil {
		return fmt.Errorf("store: set audit head: %w", err)
	}
	return nil
}
