package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// holdsChannel is the PostgreSQL notification channel of hold changes.
// A payload is "<origin> <hold id>": origin is the Store that made the
// change, so a replica does not act on its own changes twice.
const holdsChannel = "sluice_holds"

func newOrigin() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// notifyHold tells every other replica sharing the database that hold
// id changed (PostgreSQL; nothing on SQLite, where no other process
// shares the store). It is a hint, never the state: a lost notification
// only delays a waiter until its re-check (ListenHolds' onReconnect, or
// its own poll), so a failure is not reported.
func (s *Store) notifyHold(ctx context.Context, ids ...string) {
	if s.b.Kind() != Postgres || len(ids) == 0 {
		return
	}
	for _, id := range ids {
		_, _ = s.db.exec(context.WithoutCancel(ctx), `SELECT pg_notify('`+holdsChannel+`', ?)`, s.origin+" "+id)
	}
}

// ListenHolds calls changed with the id of every hold another replica
// changes, until ctx ends. When its connection is lost it reconnects
// (backing off up to 2s) and then calls resync: notifications sent
// meanwhile are lost, so the caller re-checks every hold it waits on.
// On SQLite it returns at once: no other process changes the store.
func (s *Store) ListenHolds(ctx context.Context, changed func(id string), resync func()) {
	pb, ok := s.b.(postgresBackend)
	if !ok {
		return
	}
	cfg := pb.pool.Config().ConnConfig
	cfg.RuntimeParams["application_name"] = "sluice-listen"
	// A listener waits for notifications: no statement timeout applies.
	delete(cfg.RuntimeParams, "statement_timeout")
	backoff := 100 * time.Millisecond
	first := true
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, cfg, changed, func() {
			backoff = 100 * time.Millisecond
			if !first {
				resync()
			}
			first = false
		})
		if ctx.Err() != nil {
			return
		}
		_ = err // the next attempt says more; the waiters are re-checked after it
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (s *Store) listenOnce(ctx context.Context, cfg *pgx.ConnConfig, changed func(string), listening func()) error {
	cctx, cancel := context.WithTimeout(ctx, s.db.timeout)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+holdsChannel); err != nil {
		return err
	}
	listening()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		origin, id, ok := strings.Cut(n.Payload, " ")
		if !ok || origin == s.origin || id == "" {
			continue
		}
		changed(id)
	}
}
