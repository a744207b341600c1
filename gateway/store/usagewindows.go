package store

import (
	"context"
	"fmt"
	"time"
)

// UsageScope is one of the callers a tool's usage is counted for: Scope
// "agent", "user" or "session" and its name.
type UsageScope struct {
	Scope, Who string
}

// UsageWindow is a count of calls and the sum of their counted argument.
type UsageWindow struct {
	Count int64
	Sum   float64
}

// UsageWindows are one scope's windows: the last 1, 60 and 1440 minutes
// (one-minute buckets, the current one included).
type UsageWindows struct {
	Minute, Hour, Day UsageWindow
}

// CountUsage counts one call of tool, adding amount to its sum, for each
// scope (in order), and returns each scope's windows with this call in
// them; with add false it counts nothing and only reads. The upsert and the read are one transaction and the upsert takes
// the bucket's row first, so concurrent calls of the same tool by the same
// caller are ordered: the n-th sees n, on SQLite and on PostgreSQL, on one
// gateway or several. Buckets older than a day are removed on the way.
func (s *Store) CountUsage(ctx context.Context, tool string, scopes []UsageScope, amount float64, add bool, now time.Time) ([]UsageWindows, error) {
	out := make([]UsageWindows, len(scopes))
	minute := now.Unix() / 60
	err := s.db.inTx(ctx, func(tx *txn) error {
		for i, sc := range scopes {
			if add {
				if err := bumpUsage(tx, tool, sc, minute, amount); err != nil {
					return err
				}
			}
			w := &out[i]
			if err := tx.queryRow(`SELECT
					CAST(COALESCE(SUM(CASE WHEN minute > ? THEN count END), 0) AS BIGINT),
					CAST(COALESCE(SUM(CASE WHEN minute > ? THEN total END), 0) AS DOUBLE PRECISION),
					CAST(COALESCE(SUM(CASE WHEN minute > ? THEN count END), 0) AS BIGINT),
					CAST(COALESCE(SUM(CASE WHEN minute > ? THEN total END), 0) AS DOUBLE PRECISION),
					CAST(COALESCE(SUM(count), 0) AS BIGINT), CAST(COALESCE(SUM(total), 0) AS DOUBLE PRECISION)
				FROM usage_windows WHERE scope = ? AND who = ? AND tool = ? AND minute > ?`,
				minute-1, minute-1, minute-60, minute-60, sc.Scope, sc.Who, tool, minute-1440).Scan(
				&w.Minute.Count, &w.Minute.Sum, &w.Hour.Count, &w.Hour.Sum, &w.Day.Count, &w.Day.Sum); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: count usage: %w", err)
	}
	return out, nil
}

// ApprovedBefore reports whether a call of tool with request hash sha was
// approved (and not denied) earlier in session: a hold of it that a
// person approved, whether or not it has run yet.
func (s *Store) ApprovedBefore(ctx context.Context, session, tool, sha string) (bool, error) {
	if session == "" {
		return false, nil
	}
	var n int64
	if err := s.db.queryRow(ctx, `SELECT COUNT(*) FROM holds WHERE session = ? AND tool = ? AND sha256 = ?
		AND status IN ('approved', 'executing', 'executed')`, session, tool, sha).Scan(&n); err != nil {
		return false, fmt.Errorf("store: approved before: %w", err)
	}
	return n > 0, nil
}

// bumpUsage counts one call in sc's current bucket and drops its buckets
// older than a day. It first takes the key's anchor row (minute 0, never
// in a window): every counter of the key passes that one row lock, so two
// calls on either side of a minute's turn are ordered too.
func bumpUsage(tx *txn, tool string, sc UsageScope, minute int64, amount float64) error {
	if _, err := tx.exec(`INSERT INTO usage_windows (scope, who, tool, minute, count, total) VALUES (?, ?, ?, 0, 0, 0)
		ON CONFLICT (scope, who, tool, minute) DO UPDATE SET count = usage_windows.count`, sc.Scope, sc.Who, tool); err != nil {
		return err
	}
	if _, err := tx.exec(`INSERT INTO usage_windows (scope, who, tool, minute, count, total) VALUES (?, ?, ?, ?, 1, ?)
		ON CONFLICT (scope, who, tool, minute) DO UPDATE SET count = usage_windows.count + 1, total = usage_windows.total + excluded.total`,
		sc.Scope, sc.Who, tool, minute, amount); err != nil {
		return err
	}
	_, err := tx.exec(`DELETE FROM usage_windows WHERE scope = ? AND who = ? AND tool = ? AND minute > 0 AND minute <= ?`,
		sc.Scope, sc.Who, tool, minute-1440)
	return err
}
