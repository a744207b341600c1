package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrNotFound is returned for a hold id that does not exist.
var ErrNotFound = errors.New("store: not found")

// HoldRow is one held call as stored. Doc is the caller's immutable part
// (JSON, opaque to the store); the other fields are what queries select on
// and what a decision changes.
type HoldRow struct {
	ID      string
	Status  string
	Agent   string
	Sandbox string // '' for holds stored before it was kept
	Session string
	User    string
	Tool    string
	SHA256  string
	Created time.Time
	Expires time.Time
	Doc     []byte

	DecidedBy      string
	DecisionReason string
	Decided        time.Time // zero until decided
	Result         []byte    // nil until finished
}

const holdCols = `id, status, agent, session, user, tool, sha256, created, expires, doc, decided_by, decision_reason, decided, result, sandbox`

type scanner interface{ Scan(dest ...any) error }

func scanHold(sc scanner) (HoldRow, error) {
	var h HoldRow
	var created, expires, decided int64
	if err := sc.Scan(&h.ID, &h.Status, &h.Agent, &h.Session, &h.User, &h.Tool, &h.SHA256, &created, &expires, &h.Doc,
		&h.DecidedBy, &h.DecisionReason, &decided, &h.Result, &h.Sandbox); err != nil {
		return HoldRow{}, err
	}
	h.Created, h.Expires = time.Unix(0, created).UTC(), time.Unix(0, expires).UTC()
	if decided != 0 {
		h.Decided = time.Unix(0, decided).UTC()
	}
	return h, nil
}

// InsertHold stores a new hold.
func (s *Store) InsertHold(ctx context.Context, h HoldRow) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO holds (id, status, agent, sandbox, session, user, tool, sha256, created, expires, doc)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		h.ID, h.Status, h.Agent, h.Sandbox, h.Session, h.User, h.Tool, h.SHA256, h.Created.UnixNano(), h.Expires.UnixNano(), h.Doc); err != nil {
		return fmt.Errorf("store: insert hold: %w", err)
	}
	return nil
}

// GetHold returns one hold, or ErrNotFound.
func (s *Store) GetHold(ctx context.Context, id string) (HoldRow, error) {
	h, err := scanHold(s.db.QueryRowContext(ctx, `SELECT `+holdCols+` FROM holds WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return HoldRow{}, ErrNotFound
	}
	if err != nil {
		return HoldRow{}, fmt.Errorf("store: get hold: %w", err)
	}
	return h, nil
}

// FindHold returns the newest hold of this caller (agent, sandbox, session
// and user: all four) for the same tool and canonical request hash whose
// status is one of statuses.
func (s *Store) FindHold(ctx context.Context, agent, sandbox, session, user, tool, sha string, statuses []string) (HoldRow, bool, error) {
	q := `SELECT ` + holdCols + ` FROM holds WHERE agent = ? AND sandbox = ? AND session = ? AND user = ? AND tool = ? AND sha256 = ?` +
		statusIn(statuses) + ` ORDER BY created DESC LIMIT 1`
	args := append([]any{agent, sandbox, session, user, tool, sha}, anys(statuses)...)
	h, err := scanHold(s.db.QueryRowContext(ctx, q, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return HoldRow{}, false, nil
	}
	if err != nil {
		return HoldRow{}, false, fmt.Errorf("store: find hold: %w", err)
	}
	return h, true, nil
}

// CountHolds counts an agent's holds whose status is one of statuses.
func (s *Store) CountHolds(ctx context.Context, agent string, statuses []string) (int, error) {
	var n int
	args := append([]any{agent}, anys(statuses)...)
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM holds WHERE agent = ?`+statusIn(statuses), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count holds: %w", err)
	}
	return n, nil
}

// CountAllHolds counts every agent's holds whose status is one of statuses.
func (s *Store) CountAllHolds(ctx context.Context, statuses []string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM holds WHERE 1 = 1`+statusIn(statuses), anys(statuses)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count holds: %w", err)
	}
	return n, nil
}

// CountSandboxHolds counts one sandbox's holds under agent whose status
// is one of statuses.
func (s *Store) CountSandboxHolds(ctx context.Context, agent, sandbox string, statuses []string) (int, error) {
	var n int
	args := append([]any{agent, sandbox}, anys(statuses)...)
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM holds WHERE agent = ? AND sandbox = ?`+statusIn(statuses), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count holds: %w", err)
	}
	return n, nil
}

// HoldQuery selects holds for ListHolds.
type HoldQuery struct {
	Statuses []string // empty: all
	User     string   // non-empty: only this caller.user's
	Limit    int      // <= 0: 100
}

// ListHolds lists holds, newest first.
func (s *Store) ListHolds(ctx context.Context, q HoldQuery) ([]HoldRow, error) {
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	where, args := ` WHERE 1 = 1`, []any{}
	if q.User != "" {
		where += ` AND user = ?`
		args = append(args, q.User)
	}
	where += statusIn(q.Statuses)
	args = append(append(args, anys(q.Statuses)...), limit)
	rows, err := s.db.QueryContext(ctx, `SELECT `+holdCols+` FROM holds`+where+` ORDER BY created DESC LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list holds: %w", err)
	}
	defer rows.Close()
	out := []HoldRow{}
	for rows.Next() {
		h, err := scanHold(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list holds: %w", err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list holds: %w", err)
	}
	return out, nil
}

// DecideHold moves a pending, unexpired hold (expires after now) to status
// `to`, recording who decided and why. It reports whether this call made the
// change: the UPDATE is conditional on status = 'pending', so of any number
// of concurrent deciders exactly one wins.
func (s *Store) DecideHold(ctx context.Context, id, to, by, reason string, now time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE holds SET status = ?, decided_by = ?, decision_reason = ?, decided = ?
		WHERE id = ? AND status = 'pending' AND expires > ?`, to, by, reason, now.UnixNano(), id, now.UnixNano())
	if err != nil {
		return false, fmt.Errorf("store: decide hold: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: decide hold: %w", err)
	}
	return n == 1, nil
}

// FinishHold moves a hold from status `from` to `to` and stores its result.
// It reports whether the hold was in `from`.
func (s *Store) FinishHold(ctx context.Context, id, from, to string, result []byte) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE holds SET status = ?, result = ? WHERE id = ? AND status = ?`, to, result, id, from)
	if err != nil {
		return false, fmt.Errorf("store: finish hold: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: finish hold: %w", err)
	}
	return n == 1, nil
}

// ExpireHolds moves every pending hold whose expiry is at or before now to
// "expired" and returns their ids.
func (s *Store) ExpireHolds(ctx context.Context, now time.Time) ([]string, error) {
	return s.moveAll(ctx, `UPDATE holds SET status = 'expired' WHERE status = 'pending' AND expires <= ? RETURNING id`, now.UnixNano())
}

// MarkHolds moves every hold in status `from` to `to` (startup recovery:
// executing → outcome_unknown) and returns their ids.
func (s *Store) MarkHolds(ctx context.Context, from, to string) ([]string, error) {
	return s.moveAll(ctx, `UPDATE holds SET status = ? WHERE status = ? RETURNING id`, to, from)
}

func (s *Store) moveAll(ctx context.Context, q string, args ...any) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: update holds: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("store: update holds: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: update holds: %w", err)
	}
	return ids, nil
}

// statusIn is " AND status IN (?, …)" for len(st) placeholders, or "".
func statusIn(st []string) string {
	if len(st) == 0 {
		return ""
	}
	return ` AND status IN (` + strings.TrimSuffix(strings.Repeat("?, ", len(st)), ", ") + `)`
}

func anys(st []string) []any {
	out := make([]any, len(st))
	for i, v := range st {
		out[i] = v
	}
	return out
}
