package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// SessionEnd is an ended session as stored.
type SessionEnd struct {
	Session string
	Ended   time.Time
	EndedBy string
	Holds   []string // the pending holds the end expired
}

// EndSession records session as ended by `by` at now, unless it already
// is; either way it returns the stored record, and created says whether
// this call made it (the first end wins: a repeat keeps its time and name).
func (s *Store) EndSession(ctx context.Context, session, by string, now time.Time) (SessionEnd, bool, error) {
	res, err := s.db.ExecContext(ctx, `INSERT INTO ended_sessions (session, ended, ended_by) VALUES (?, ?, ?)
		ON CONFLICT (session) DO NOTHING`, session, now.UnixNano(), by)
	if err != nil {
		return SessionEnd{}, false, fmt.Errorf("store: end session: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return SessionEnd{}, false, fmt.Errorf("store: end session: %w", err)
	}
	e, err := s.getSessionEnd(ctx, session)
	if err != nil {
		return SessionEnd{}, false, fmt.Errorf("store: end session: %w", err)
	}
	return e, n == 1, nil
}

func (s *Store) getSessionEnd(ctx context.Context, session string) (SessionEnd, error) {
	var e SessionEnd
	var ended int64
	var hs string
	if err := s.db.QueryRowContext(ctx, `SELECT session, ended, ended_by, holds FROM ended_sessions WHERE session = ?`, session).
		Scan(&e.Session, &ended, &e.EndedBy, &hs); err != nil {
		return SessionEnd{}, err
	}
	e.Ended = time.Unix(0, ended).UTC()
	if err := json.Unmarshal([]byte(hs), &e.Holds); err != nil {
		return SessionEnd{}, fmt.Errorf("stored holds: %w", err)
	}
	if e.Holds == nil {
		e.Holds = []string{}
	}
	return e, nil
}

// SessionEnded says whether session has been ended.
func (s *Store) SessionEnded(ctx context.Context, session string) (bool, error) {
	var one int
	err := s.ended.QueryRowContext(ctx, session).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("store: session ended: %w", err)
	}
	return true, nil
}

// CutSessionHolds makes every pending, unexpired hold of session due now
// (its expiry becomes now) and returns their ids; the holds manager's
// expiry then moves them to "expired". The UPDATE is conditional on status
// = 'pending' and expires > now, the same condition DecideHold needs, so a
// hold is either cut here or decided, never both.
func (s *Store) CutSessionHolds(ctx context.Context, session string, now time.Time) ([]string, error) {
	return s.moveAll(ctx, `UPDATE holds SET expires = ? WHERE session = ? AND status = 'pending' AND expires > ? RETURNING id`,
		now.UnixNano(), session, now.UnixNano())
}

// AddSessionHolds adds ids to an ended session's list of expired holds
// and returns the stored record.
func (s *Store) AddSessionHolds(ctx context.Context, session string, ids []string) (SessionEnd, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return SessionEnd{}, fmt.Errorf("store: add session holds: %w", err)
	}
	defer tx.Rollback()
	var hs string
	if err := tx.QueryRowContext(ctx, `SELECT holds FROM ended_sessions WHERE session = ?`, session).Scan(&hs); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return SessionEnd{}, ErrNotFound
		}
		return SessionEnd{}, fmt.Errorf("store: add session holds: %w", err)
	}
	var cur []string
	if err := json.Unmarshal([]byte(hs), &cur); err != nil {
		return SessionEnd{}, fmt.Errorf("store: add session holds: stored holds: %w", err)
	}
	for _, id := range ids {
		if !slices.Contains(cur, id) {
			cur = append(cur, id)
		}
	}
	data, err := json.Marshal(cur)
	if err != nil {
		return SessionEnd{}, fmt.Errorf("store: add session holds: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE ended_sessions SET holds = ? WHERE session = ?`, string(data), session); err != nil {
		return SessionEnd{}, fmt.Errorf("store: add session holds: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return SessionEnd{}, fmt.Errorf("store: add session holds: %w", err)
	}
	e, err := s.getSessionEnd(ctx, session)
	if err != nil {
		return SessionEnd{}, fmt.Errorf("store: add session holds: %w", err)
	}
	return e, nil
}
