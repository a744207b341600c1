package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// db runs the Store's statements: each one rewritten to the engine's
// placeholders, bounded by the query timeout, and its failure marked
// ErrUnavailable when the backend says the database was not reached.
type db struct {
	sql     *sql.DB
	b       Backend
	dollar  bool // PostgreSQL: $1, $2… instead of ?
	timeout time.Duration
	qs      sync.Map // query text → rewritten text
}

func newDB(s *sql.DB, b Backend, timeout time.Duration) *db {
	return &db{sql: s, b: b, dollar: b.Kind() == Postgres, timeout: timeout}
}

// q rewrites query's ? placeholders for the engine. The Store's queries
// never hold a ? inside a string literal.
func (d *db) q(query string) string {
	if !d.dollar {
		return query
	}
	if v, ok := d.qs.Load(query); ok {
		return v.(string)
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	d.qs.Store(query, b.String())
	return b.String()
}

// classify marks err ErrUnavailable when the query's own deadline (qctx,
// derived from ctx) ran out while the caller's had not, or when the
// backend says so. A caller that gave up (its ctx ended) gets its own
// context error.
func (d *db) classify(ctx, qctx context.Context, err error) error {
	if err == nil || errors.Is(err, sql.ErrNoRows) || errors.Is(err, ErrUnavailable) {
		return err
	}
	if ctx.Err() == nil && qctx.Err() != nil {
		return fmt.Errorf("%w: no answer within %s: %w", ErrUnavailable, d.timeout, err)
	}
	if ctx.Err() != nil {
		return err
	}
	if d.b.unavailable(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

func (d *db) exec(ctx context.Context, query string, args ...any) (int64, error) {
	qctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	res, err := d.sql.ExecContext(qctx, d.q(query), args...)
	if err != nil {
		return 0, d.classify(ctx, qctx, err)
	}
	n, err := res.RowsAffected()
	return n, d.classify(ctx, qctx, err)
}

// row is a *sql.Row whose deadline lasts until Scan.
type row struct {
	r      *sql.Row
	ctx    context.Context
	qctx   context.Context
	cancel context.CancelFunc
	d      *db
}

func (r *row) Scan(dest ...any) error {
	defer r.cancel()
	return r.d.classify(r.ctx, r.qctx, r.r.Scan(dest...))
}

func (d *db) queryRow(ctx context.Context, query string, args ...any) *row {
	qctx, cancel := context.WithTimeout(ctx, d.timeout)
	return &row{r: d.sql.QueryRowContext(qctx, d.q(query), args...), ctx: ctx, qctx: qctx, cancel: cancel, d: d}
}

// stmtRow is queryRow on a prepared statement.
func (d *db) stmtRow(ctx context.Context, st *sql.Stmt, args ...any) *row {
	qctx, cancel := context.WithTimeout(ctx, d.timeout)
	return &row{r: st.QueryRowContext(qctx, args...), ctx: ctx, qctx: qctx, cancel: cancel, d: d}
}

// each runs query and calls fn for every row.
func (d *db) each(ctx context.Context, query string, args []any, fn func(scanner) error) error {
	qctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	rows, err := d.sql.QueryContext(qctx, d.q(query), args...)
	if err != nil {
		return d.classify(ctx, qctx, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return d.classify(ctx, qctx, err)
		}
	}
	return d.classify(ctx, qctx, rows.Err())
}

// txn is a transaction inside inTx.
type txn struct {
	tx   *sql.Tx
	ctx  context.Context // the caller's
	qctx context.Context // bounded by the timeout
	d    *db
}

func (t *txn) exec(query string, args ...any) (int64, error) {
	res, err := t.tx.ExecContext(t.qctx, t.d.q(query), args...)
	if err != nil {
		return 0, t.d.classify(t.ctx, t.qctx, err)
	}
	n, err := res.RowsAffected()
	return n, t.d.classify(t.ctx, t.qctx, err)
}

func (t *txn) queryRow(query string, args ...any) scanner {
	return classifiedRow{t.tx.QueryRowContext(t.qctx, t.d.q(query), args...), t}
}

type classifiedRow struct {
	r *sql.Row
	t *txn
}

func (c classifiedRow) Scan(dest ...any) error {
	return c.t.d.classify(c.t.ctx, c.t.qctx, c.r.Scan(dest...))
}

// errRollback ends inTx without committing and without an error.
var errRollback = errors.New("store: rollback")

// inTx runs fn in one transaction, committed when fn returns nil, rolled
// back otherwise (errRollback: rolled back, inTx returns nil). The whole
// transaction is bounded by the query timeout.
func (d *db) inTx(ctx context.Context, fn func(*txn) error) error {
	qctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	tx, err := d.sql.BeginTx(qctx, nil)
	if err != nil {
		return d.classify(ctx, qctx, err)
	}
	defer tx.Rollback()
	if err := fn(&txn{tx: tx, ctx: ctx, qctx: qctx, d: d}); err != nil {
		if errors.Is(err, errRollback) {
			return nil
		}
		return err
	}
	return d.classify(ctx, qctx, tx.Commit())
}
