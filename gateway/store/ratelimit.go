package store

import (
	"context"
	"errors"
	"fmt"
)

// ErrNotShared is returned by TakeTokens on a store no other gateway
// shares (SQLite): its gateway keeps its buckets in memory.
var ErrNotShared = errors.New("store: not a shared store")

// TakeTokens takes up to want tokens from the shared token bucket key,
// which refills at perSecond up to burst (a new bucket starts full), and
// returns how many it took (0 when empty). The refill uses the database
// server's clock, so replicas with skewed clocks share one bucket
// correctly; the row lock orders concurrent takers on every replica.
func (s *Store) TakeTokens(ctx context.Context, key string, want int, perSecond float64, burst int) (int, error) {
	if s.b.Kind() != Postgres {
		return 0, ErrNotShared
	}
	var n int
	err := s.db.inTx(ctx, func(tx *txn) error {
		if _, err := tx.exec(`INSERT INTO rate_buckets (key, tokens, updated)
			VALUES ($1, $2, (extract(epoch from clock_timestamp()) * 1e9)::bigint) ON CONFLICT (key) DO NOTHING`, key, float64(burst)); err != nil {
			return err
		}
		return tx.queryRow(`WITH cur AS (
				SELECT LEAST($2::float8, tokens + GREATEST(0, now_ns - updated) / 1e9 * $3::float8) AS t, now_ns
				FROM rate_buckets, (SELECT (extract(epoch from clock_timestamp()) * 1e9)::bigint AS now_ns) AS c
				WHERE key = $1 FOR UPDATE OF rate_buckets
			), g AS (SELECT t, now_ns, LEAST($4::int, floor(t))::int AS n FROM cur)
			UPDATE rate_buckets SET tokens = g.t - g.n, updated = GREATEST(updated, g.now_ns) FROM g
			WHERE key = $1 RETURNING g.n`, key, float64(burst), perSecond, want).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("store: take tokens: %w", err)
	}
	return n, nil
}
