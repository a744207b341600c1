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
	// Version counts the changes made to the hold since it was stored:
	// every change is conditional on the status (and, for a decision, on
	// the version its decider read) and increments it.
	Version int64
}

const holdCols = `id, status, agent, session, "user", tool, sha256, created, expires, doc, decided_by, decision_reason, decided, result, sandbox, version`

type scanner interface{ Scan(dest ...any) error }

func scanHold(sc scanner) (HoldRow, error) {
	var h HoldRow
	var created, expires, decided int64
	if err := sc.Scan(&h.ID, &h.Status, &h.Agent, &h.Session, &h.User, &h.Tool, &h.SHA256, &created, &expires, &h.Doc,
		&h.DecidedBy, &h.DecisionReason, &decided, &h.Result, &h.Sandbox, &h.Version); err != nil {
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
	if _, err := s.db.exec(ctx, `INSERT INTO holds (id, status, agent, sandbox, session, "user", tool, sha256, created, expires, doc)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		h.ID, h.Status, h.Agent, h.Sandbox, h.Session, h.User, h.Tool, h.SHA256, h.Created.UnixNano(), h.Expires.UnixNano(), h.Doc); err != nil {
		return fmt.Errorf("store: insert hold: %w", err)
	}
	return nil
}

// GetHold returns one hold, or ErrNotFound.
func (s *Store) GetHold(ctx context.Context, id string) (HoldRow, error) {
	h, err := scanHold(s.db.queryRow(ctx, `SELECT `+holdCols+` FROM holds WHERE id = ?`, id))
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
	q := `SELECT ` + holdCols + ` FROM holds WHERE agent = ? AND sandbox = ? AND session = ? AND "user" = ? AND tool = ? AND sha256 = ?` +
		statusIn(statuses) + ` ORDER BY created DESC LIMIT 1`
	args := append([]any{agent, sandbox, session, user, tool, sha}, anys(statuses)...)
	h, err := scanHold(s.db.queryRow(ctx, q, args...))
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
	if err := s.db.queryRow(ctx, `SELECT COUNT(*) FROM holds WHERE agent = ?`+statusIn(statuses), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count holds: %w", err)
	}
	return n, nil
}

// CountAllHolds counts every agent's holds whose status is one of statuses.
func (s *Store) CountAllHolds(ctx context.Context, statuses []string) (int, error) {
	var n int
	if err := s.db.queryRow(ctx, `SELECT COUNT(*) FROM holds WHERE 1 = 1`+statusIn(statuses), anys(statuses)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count holds: %w", err)
	}
	return n, nil
}

// CountSandboxHolds counts one sandbox's holds under agent whose status
// is one of statuses.
func (s *Store) CountSandboxHolds(ctx context.Context, agent, sandbox string, statuses []string) (int, error) {
	var n int
	args := append([]any{agent, sandbox}, anys(statuses)...)
	if err := s.db.queryRow(ctx, `SELECT COUNT(*) FROM holds WHERE agent = ? AND sandbox = ?`+statusIn(statuses), args...).Scan(&n); err != nil {
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
		where += ` AND "user" = ?`
		args = append(args, q.User)
	}
	where += statusIn(q.Statuses)
	args = append(append(args, anys(q.Statuses)...), limit)
	out := []HoldRow{}
	err := s.db.each(ctx, `SELECT `+holdCols+` FROM holds`+where+` ORDER BY created DESC LIMIT ?`, args, func(sc scanner) error {
		h, err := scanHold(sc)
		if err != nil {
			return err
		}
		out = append(out, h)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: list holds: %w", err)
	}
	return out, nil
}

// AnyVersion in Decision.Version decides whatever the hold's version.
const AnyVersion int64 = -1

// Decision is one decision on a pending hold.
type Decision struct {
	ID string
	// Version is the version the decider read (AnyVersion: any): a hold
	// changed since (its expiry cut, another decision) is not decided.
	Version    int64
	To         string // the new status
	By, Reason string
	Now        time.Time
	// Grant, if set, is stored in the same transaction: it exists if and
	// only if this decision won.
	Grant *GrantRow
	// Lease, when To is "executing", leases the hold to this Store for
	// that long (lease.go): the winner sends it and renews the lease.
	Lease time.Duration
}

// Decide moves a pending, unexpired hold (expires after d.Now) to d.To,
// recording who decided and why. It reports whether this call made the
// change: the UPDATE is conditional on status = 'pending' (and the
// version), so of any number of concurrent deciders, on any number of
// gateways sharing the database, exactly one wins.
func (s *Store) Decide(ctx context.Context, d Decision) (bool, error) {
	won := false
	err := s.db.inTx(ctx, func(tx *txn) error {
		owner := ""
		if d.Lease > 0 {
			owner = s.leaseOwner
		}
		n, err := tx.exec(`UPDATE holds SET status = ?, decided_by = ?, decision_reason = ?, decided = ?, version = version + 1,
		lease_owner = ?, lease_expires = `+s.clock()+` + ?
		WHERE id = ? AND status = 'pending' AND expires > ? AND (? < 0 OR version = ?)`,
			d.To, d.By, d.Reason, d.Now.UnixNano(), owner, d.Lease.Nanoseconds(), d.ID, d.Now.UnixNano(), d.Version, d.Version)
		if err != nil {
			return err
		}
		if n != 1 {
			return errRollback
		}
		if g := d.Grant; g != nil {
			if _, err := tx.exec(`INSERT INTO grants (id, agent, "user", tool, sha256, hold, granted_by, created, expires, doc, max_uses)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, g.ID, g.Agent, g.User, g.Tool, g.SHA256, g.Hold, g.GrantedBy,
				g.Created.UnixNano(), g.Expires.UnixNano(), g.Doc, g.MaxUses); err != nil {
				return fmt.Errorf("insert grant: %w", err)
			}
		}
		won = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("store: decide hold: %w", err)
	}
	if won {
		s.notifyHold(ctx, d.ID)
	}
	return won, nil
}

// DecideHold is Decide at any version, without a grant.
func (s *Store) DecideHold(ctx context.Context, id, to, by, reason string, now time.Time) (bool, error) {
	return s.Decide(ctx, Decision{ID: id, Version: AnyVersion, To: to, By: by, Reason: reason, Now: now})
}

// FinishHold moves a hold from status `from` to `to` and stores its result.
// It reports whether the hold was in `from`.
func (s *Store) FinishHold(ctx context.Context, id, from, to string, result []byte) (bool, error) {
	n, err := s.db.exec(ctx, `UPDATE holds SET status = ?, result = ?, version = version + 1 WHERE id = ? AND status = ?`, to, result, id, from)
	if err != nil {
		return false, fmt.Errorf("store: finish hold: %w", err)
	}
	if n == 1 {
		s.notifyHold(ctx, id)
	}
	return n == 1, nil
}

// ExpireHolds moves every pending hold whose expiry is at or before now to
// "expired" and returns their ids.
func (s *Store) ExpireHolds(ctx context.Context, now time.Time) ([]string, error) {
	return s.moveAll(ctx, `UPDATE holds SET status = 'expired', version = version + 1 WHERE status = 'pending' AND expires <= ? RETURNING id`, now.UnixNano())
}

// MarkHolds moves every hold in status `from` to `to` (startup recovery:
// executing → outcome_unknown) and returns their ids.
func (s *Store) MarkHolds(ctx context.Context, from, to string) ([]string, error) {
	return s.moveAll(ctx, `UPDATE holds SET status = ?, version = version + 1 WHERE status = ? RETURNING id`, to, from)
}

func (s *Store) moveAll(ctx context.Context, q string, args ...any) ([]string, error) {
	var ids []string
	err := s.db.each(ctx, q, args, func(sc scanner) error {
		var id string
		if err := sc.Scan(&id); err != nil {
			return err
		}
		ids = append(ids, id)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: update holds: %w", err)
	}
	s.notifyHold(ctx, ids...)
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

// HoldCaps bounds CreateHold: the pending holds of one agent, and of one
// sandbox under it.
type HoldCaps struct {
	Statuses   []string // what counts as the same request still open (deduplication)
	Pending    string   // the status the caps count
	PerAgent   int
	PerSandbox int
}

var (
	// ErrAgentCap: the agent has HoldCaps.PerAgent pending holds.
	ErrAgentCap = errors.New("store: the agent's pending holds are at their cap")
	// ErrSandboxCap: the sandbox has HoldCaps.PerSandbox pending holds.
	ErrSandboxCap = errors.New("store: the sandbox's pending holds are at its cap")
)

// CreateHold stores h unless the same caller already has a hold of the
// same tool and request hash in one of c.Statuses (that one is returned,
// created false) or a cap is reached (ErrAgentCap, ErrSandboxCap). The
// look-up, the counts and the insert are one step on every gateway
// sharing the database: SQLite's write transaction starts at BEGIN;
// PostgreSQL takes a transaction-scoped advisory lock on the agent, so
// concurrent asks on different replicas can neither pass a cap together
// nor make two holds of one request.
func (s *Store) CreateHold(ctx context.Context, h HoldRow, c HoldCaps) (HoldRow, bool, error) {
	var (
		existing HoldRow
		created  bool
	)
	err := s.db.inTx(ctx, func(tx *txn) error {
		if s.b.Kind() == Postgres {
			if _, err := tx.exec(`SELECT pg_advisory_xact_lock(hashtextextended('sluice.holds.' || ?, 0))`, h.Agent); err != nil {
				return err
			}
		}
		q := `SELECT ` + holdCols + ` FROM holds WHERE agent = ? AND sandbox = ? AND session = ? AND "user" = ? AND tool = ? AND sha256 = ?` +
			statusIn(c.Statuses) + ` ORDER BY created DESC LIMIT 1`
		old, err := scanHold(tx.queryRow(q, append([]any{h.Agent, h.Sandbox, h.Session, h.User, h.Tool, h.SHA256}, anys(c.Statuses)...)...))
		switch {
		case err == nil:
			existing = old
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		var n int
		if err := tx.queryRow(`SELECT COUNT(*) FROM holds WHERE agent = ? AND status = ?`, h.Agent, c.Pending).Scan(&n); err != nil {
			return err
		}
		if n >= c.PerAgent {
			return ErrAgentCap
		}
		if err := tx.queryRow(`SELECT COUNT(*) FROM holds WHERE agent = ? AND sandbox = ? AND status = ?`, h.Agent, h.Sandbox, c.Pending).Scan(&n); err != nil {
			return err
		}
		if n >= c.PerSandbox {
			return ErrSandboxCap
		}
		if _, err := tx.exec(`INSERT INTO holds (id, status, agent, sandbox, session, "user", tool, sha256, created, expires, doc)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			h.ID, h.Status, h.Agent, h.Sandbox, h.Session, h.User, h.Tool, h.SHA256, h.Created.UnixNano(), h.Expires.UnixNano(), h.Doc); err != nil {
			return err
		}
		created = true
		return nil
	})
	switch {
	case errors.Is(err, ErrAgentCap), errors.Is(err, ErrSandboxCap):
		return HoldRow{}, false, err
	case err != nil:
		return HoldRow{}, false, fmt.Errorf("store: create hold: %w", err)
	case created:
		s.notifyHold(ctx, h.ID)
		return h, true, nil
	}
	return existing, false, nil
}
