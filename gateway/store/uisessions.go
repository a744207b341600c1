package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Review UI sessions (gateway/review) live here so that every replica
// sharing the database sees the same ones: a person signed in through one
// replica is signed in on all, and a sign-out or an expiry deletes the
// row for all. The row is keyed by the SHA-256 of the session id, never
// the id, which only the person's cookie carries. Liveness is decided
// from the row on every read: now < expires (the absolute lifetime) and
// now < last_seen + idle (the idle timeout). Times are the gateway's
// clock, passed in; replicas' clocks differ by far less than the idle
// timeout.

// UISession is one signed-in person's session, without its id.
type UISession struct {
	IDHash   string // SHA-256 of the session id, hex
	Person   string
	Groups   []string
	Method   string // "password" or "oidc"
	Created  time.Time
	LastSeen time.Time
	Expires  time.Time     // the absolute end
	Idle     time.Duration // the session ends this long after its last use
}

// Live says whether u is live at now by its own row's terms.
func (u UISession) Live(now time.Time) bool {
	return now.Before(u.Expires) && now.Before(u.LastSeen.Add(u.Idle))
}

// PutUISession stores a new session, and deletes every session no longer
// live at u.Created (expired or idle), so the table stays small.
func (s *Store) PutUISession(ctx context.Context, u UISession) error {
	if len(u.IDHash) != 64 || u.Person == "" || u.Method == "" || u.Idle <= 0 || !u.Expires.After(u.Created) {
		return errors.New("bug(): store: ui session: a field is empty or out of range")
	}
	groups, err := json.Marshal(u.Groups)
	if err != nil {
		return fmt.Errorf("bug(): store: ui session groups: %w", err)
	}
	now := u.Created.UnixNano()
	err = s.db.inTx(ctx, func(tx *txn) error {
		if _, err := tx.exec(`DELETE FROM ui_sessions WHERE expires <= ? OR last_seen + idle <= ?`, now, now); err != nil {
			return err
		}
		_, err := tx.exec(`INSERT INTO ui_sessions (id_hash, person, member_of, method, created, last_seen, expires, idle)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, u.IDHash, u.Person, string(groups), u.Method, now, now, u.Expires.UnixNano(), u.Idle.Nanoseconds())
		return err
	})
	if err != nil {
		return fmt.Errorf("store: put ui session: %w", err)
	}
	return nil
}

// TouchUISession returns the live session idHash and records its use at
// now, or ErrNotFound when there is none or it is no longer live (then
// its row is deleted: expired on one replica is expired on all). One
// conditional UPDATE: a session signed out on another replica a moment
// ago is not found.
func (s *Store) TouchUISession(ctx context.Context, idHash string, now time.Time) (UISession, error) {
	n := now.UnixNano()
	u, err := scanUISession(s.db.queryRow(ctx, `UPDATE ui_sessions SET last_seen = CASE WHEN last_seen < ? THEN ? ELSE last_seen END
		WHERE id_hash = ? AND expires > ? AND last_seen + idle > ?
		RETURNING id_hash, person, member_of, method, created, last_seen, expires, idle`, n, n, idHash, n, n))
	if errors.Is(err, sql.ErrNoRows) {
		if _, err := s.db.exec(ctx, `DELETE FROM ui_sessions WHERE id_hash = ? AND (expires <= ? OR last_seen + idle <= ?)`, idHash, n, n); err != nil {
			return UISession{}, fmt.Errorf("store: delete ended ui session: %w", err)
		}
		return UISession{}, ErrNotFound
	}
	if err != nil {
		return UISession{}, fmt.Errorf("store: touch ui session: %w", err)
	}
	return u, nil
}

// UISessionAlive says whether the session idHash is live at now, without
// counting as a use (the review UI's event stream asks this).
func (s *Store) UISessionAlive(ctx context.Context, idHash string, now time.Time) (bool, error) {
	u, err := scanUISession(s.db.queryRow(ctx, `SELECT id_hash, person, member_of, method, created, last_seen, expires, idle
		FROM ui_sessions WHERE id_hash = ?`, idHash))
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: read ui session: %w", err)
	}
	return u.Live(now), nil
}

// DeleteUISession ends the session idHash on every replica (sign-out, a
// new sign-in in the same browser). Deleting one that is gone is no error.
func (s *Store) DeleteUISession(ctx context.Context, idHash string) error {
	if _, err := s.db.exec(ctx, `DELETE FROM ui_sessions WHERE id_hash = ?`, idHash); err != nil {
		return fmt.Errorf("store: delete ui session: %w", err)
	}
	return nil
}

func scanUISession(sc scanner) (UISession, error) {
	var (
		u                              UISession
		groups                         string
		created, seen, expires, idleNS int64
	)
	if err := sc.Scan(&u.IDHash, &u.Person, &groups, &u.Method, &created, &seen, &expires, &idleNS); err != nil {
		return UISession{}, err
	}
	if err := json.Unmarshal([]byte(groups), &u.Groups); err != nil {
		return UISession{}, fmt.Errorf("ui session %.8s…: member_of: %w", u.IDHash, err)
	}
	u.Created, u.LastSeen, u.Expires = time.Unix(0, created).UTC(), time.Unix(0, seen).UTC(), time.Unix(0, expires).UTC()
	u.Idle = time.Duration(idleNS)
	return u, nil
}
