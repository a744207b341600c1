package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
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
	n, err := s.db.exec(ctx, `INSERT INTO ended_sessions (session, ended, ended_by) VALUES (?, ?, ?)
		ON CONFLICT (session) DO NOTHING`, session, now.UnixNano(), by)
	// Whether or not the insert reports success, the cached answer for
	// session can no longer be trusted: on success it is now "ended", on
	// failure the commit's outcome is unknown and the next lookup asks the
	// database.
	s.endedCache.ended(session, err == nil)
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
	if err := s.db.queryRow(ctx, `SELECT session, ended, ended_by, holds FROM ended_sessions WHERE session = ?`, session).
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

// SessionEnded says whether session has been ended. Answers are cached.
// SQLite: sessions end only through EndSession on this store (Open holds
// the database file exclusively), which updates the cache after its
// commit. PostgreSQL: another replica may end a session, so an answer
// "not ended" is trusted for endedSharedTTL only ("ended" is final).
func (s *Store) SessionEnded(ctx context.Context, session string) (bool, error) {
	ended, ok, gen := s.endedCache.get(session)
	if ok {
		return ended, nil
	}
	var one int
	err := s.db.stmtRow(ctx, s.ended, session).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		ended = false
	case err != nil:
		return false, fmt.Errorf("store: session ended: %w", err) // errors are never cached
	default:
		ended = true
	}
	s.endedCache.put(session, ended, gen)
	return ended, nil
}

// endedCacheMax bounds endedCache; when full it starts over empty.
const endedCacheMax = 1 << 16

// endedSharedTTL is how long a shared store trusts a cached "not ended":
// a session ended on another replica is refused here within this time.
const endedSharedTTL = 500 * time.Millisecond

// endedCache maps session → ended. gen counts EndSession calls: a lookup
// keeps its database answer only if no end happened while it asked, so an
// answer read just before an end's commit can never overwrite it.
type endedCache struct {
	mu     sync.RWMutex // every tool call reads; only puts and ends write
	gen    uint64
	m      map[string]endedEntry
	shared bool // set at Open: "not ended" answers expire after endedSharedTTL
}

type endedEntry struct {
	ended bool
	at    time.Time // when a "not ended" answer was read (shared stores)
}

func (c *endedCache) get(session string) (ended, ok bool, gen uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.m[session]
	if ok && !e.ended && c.shared && time.Since(e.at) >= endedSharedTTL {
		ok = false
	}
	return e.ended, ok, c.gen
}

func (c *endedCache) put(session string, ended bool, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if c.m == nil || len(c.m) >= endedCacheMax {
		c.m = make(map[string]endedEntry)
	}
	e := endedEntry{ended: ended}
	if c.shared && !ended {
		e.at = time.Now()
	}
	c.m[session] = e
}

// ended records an EndSession: known says the session is now ended in
// the database; otherwise the entry is dropped so the next lookup asks.
func (c *endedCache) ended(session string, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if !known {
		delete(c.m, session)
		return
	}
	if c.m == nil || len(c.m) >= endedCacheMax {
		c.m = make(map[string]endedEntry)
	}
	c.m[session] = endedEntry{ended: true}
}

// CutSessionHolds makes every pending, unexpired hold of session due now
// (its expiry becomes now) and returns their ids; the holds manager's
// expiry then moves them to "expired". The UPDATE is conditional on status
// = 'pending' and expires > now, the same condition DecideHold needs, so a
// hold is either cut here or decided, never both.
func (s *Store) CutSessionHolds(ctx context.Context, session string, now time.Time) ([]string, error) {
	return s.moveAll(ctx, `UPDATE holds SET expires = ?, version = version + 1 WHERE session = ? AND status = 'pending' AND expires > ? RETURNING id`,
		now.UnixNano(), session, now.UnixNano())
}

// AddSessionHolds adds ids to an ended session's list of expired holds
// and returns the stored record.
func (s *Store) AddSessionHolds(ctx context.Context, session string, ids []string) (SessionEnd, error) {
	err := s.db.inTx(ctx, func(tx *txn) error {
		// FOR UPDATE on PostgreSQL: two replicas adding at once must not
		// each write back the list without the other's ids. (SQLite's
		// immediate transactions are serialised already.)
		q := `SELECT holds FROM ended_sessions WHERE session = ?`
		if s.b.Kind() == Postgres {
			q += ` FOR UPDATE`
		}
		var hs string
		if err := tx.queryRow(q, session).Scan(&hs); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		var cur []string
		if err := json.Unmarshal([]byte(hs), &cur); err != nil {
			return fmt.Errorf("stored holds: %w", err)
		}
		for _, id := range ids {
			if !slices.Contains(cur, id) {
				cur = append(cur, id)
			}
		}
		data, err := json.Marshal(cur)
		if err != nil {
			return err
		}
		_, err = tx.exec(`UPDATE ended_sessions SET holds = ? WHERE session = ?`, string(data), session)
		return err
	})
	if errors.Is(err, ErrNotFound) {
		return SessionEnd{}, ErrNotFound
	}
	if err != nil {
		return SessionEnd{}, fmt.Errorf("store: add session holds: %w", err)
	}
	e, err := s.getSessionEnd(ctx, session)
	if err != nil {
		return SessionEnd{}, fmt.Errorf("store: add session holds: %w", err)
	}
	return e, nil
}
