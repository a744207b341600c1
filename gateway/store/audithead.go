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
// the empty key (one gateway per store, as before the table was keyed).
// PostgreSQL: Options.Replica, the replica id its records carry, or
// without one the host name and Options.AuditLog; so each replica checks
// its own file against its own head, never against another replica's.
func (s *Store) auditLogKey() string {
	if s.b.Kind() == SQLite {
		return ""
	}
	if s.replica != "" {
		return s.replica
	}
	host, _ := os.Hostname()
	return LegacyAuditLogKey(host, s.auditLog)
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

// AuditHeadRow is one recorded audit log head: Log is the replica id
// (the empty key for a SQLite store's single gateway, host:path for a replica
// that had none).
type AuditHeadRow struct {
	Log     string
	Seq     uint64
	Hash    string
	Updated time.Time
}

// AuditHeads returns every recorded audit log head, by Log.
func (s *Store) AuditHeads(ctx context.Context) ([]AuditHeadRow, error) {
	var out []AuditHeadRow
	err := s.db.each(ctx, `SELECT log, seq, hash, updated FROM audit_heads ORDER BY log`, nil, func(sc scanner) error {
		var (
			r       AuditHeadRow
			n, unix int64
		)
		if err := sc.Scan(&r.Log, &n, &r.Hash, &unix); err != nil {
			return err
		}
		r.Seq, r.Updated = uint64(n), time.Unix(0, unix).UTC()
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: audit heads: %w", err)
	}
	return out, nil
}

// LegacyAuditLogKey is the audit_heads key a gateway on a shared store
// used before replica ids (migration 8 to the replica_id default): its
// host name and audit log path. Replica ids never hold ':'.
func LegacyAuditLogKey(host, auditLog string) string { return host + ":" + auditLog }

// RekeyLegacyAuditHead moves this gateway's head recorded under the
// legacy key (this host's name and Options.AuditLog) to its replica id,
// when no head is recorded under the id yet: so the first start after an
// upgrade checks its file against the head its previous version recorded
// (THREATS G9), and `sluice audit verify --heads` finds the file of every
// head. It returns the key it moved from ("" when nothing moved). SQLite,
// or no replica id: nothing to do.
func (s *Store) RekeyLegacyAuditHead(ctx context.Context) (string, error) {
	if s.b.Kind() == SQLite || s.replica == "" || s.auditLog == "" {
		return "", nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("store: re-key audit head: %w", err)
	}
	from := LegacyAuditLogKey(host, s.auditLog)
	n, err := s.db.exec(ctx, `UPDATE audit_heads SET log = ? WHERE log = ? AND NOT EXISTS (SELECT 1 FROM audit_heads WHERE log = ?)`,
		s.replica, from, s.replica)
	if err != nil {
		return "", fmt.Errorf("store: re-key audit head %s: %w", from, err)
	}
	if n == 0 {
		return "", nil
	}
	return from, nil
}
