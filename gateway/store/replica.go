package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrReplicaInUse is returned (wrapped) by ClaimReplica when another
// running gateway holds the replica id (THREATS G21).
var ErrReplicaInUse = errors.New("store: replica id in use")

// replicaKey is the advisory lock of replica id: FNV-64a of a prefixed
// id, so it cannot meet the migration lock or the holds' per-agent locks
// (those hash other prefixes with hashtextextended).
func replicaKey(id string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("sluice.replica." + id))
	return int64(h.Sum64())
}

// ClaimReplica takes the store's replica id (Options.Replica) for as long
// as the Store is open, so that two gateways given one id cannot share a
// head row and its leases unwarned (THREATS G21). PostgreSQL: a session
// advisory lock on a connection of its own, outside the pool, which the
// server releases when this process dies (a kill -9 frees the id for a
// restart at once, no expiry to wait for). If another process holds it,
// the error names the id and that process: its host, pid and since when,
// as its lock connection reports them (application_name, backend_start).
//
// When the lock connection is lost (the server restarted) it is taken
// again; if another gateway took the id meanwhile, lost is called with
// the error (and called again until the id is back). SQLite: nothing to
// do, the file's lock already admits one gateway.
func (s *Store) ClaimReplica(ctx context.Context, lost func(error)) error {
	pb, ok := s.b.(postgresBackend)
	if !ok || s.replica == "" {
		return nil
	}
	cfg := pb.pool.Config().ConnConfig.Copy()
	host, _ := os.Hostname()
	cfg.RuntimeParams["application_name"] = truncate("sluice-replica "+host+" pid "+strconv.Itoa(os.Getpid()), 63)
	conn, err := s.lockReplica(ctx, cfg)
	if err != nil {
		return err
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	s.replicaStop = func() {
		cancel()
		<-done
	}
	go func() {
		defer close(done)
		s.keepReplica(kctx, cfg, conn, lost)
	}()
	return nil
}

// lockReplica connects and takes the replica id's lock, or says who has it.
func (s *Store) lockReplica(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, s.db.timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: claim gateway.replica_id %q: %w", s.replica, s.db.classify(ctx, cctx, err))
	}
	key := replicaKey(s.replica)
	var got bool
	if err := conn.QueryRow(cctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("store: claim gateway.replica_id %q: %w", s.replica, s.db.classify(ctx, cctx, err))
	}
	if got {
		return conn, nil
	}
	// The holder as the server sees it: a bigint advisory lock is
	// (classid, objid) = (high, low) 32 bits of the key, objsubid 1.
	who := "a process whose session this role cannot see"
	var (
		app, addr string
		since     time.Time
	)
	err = conn.QueryRow(cctx, `SELECT a.application_name, COALESCE(host(a.client_addr), 'the Unix socket'), a.backend_start
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid::bigint = $1 AND l.objid::bigint = $2
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int64(uint64(key)>>32), int64(uint64(key)&0xffffffff)).Scan(&app, &addr, &since)
	if err == nil && app != "" {
		who = fmt.Sprintf("%q connected from %s since %s", app, addr, since.UTC().Format(time.RFC3339))
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	return nil, fmt.Errorf("%w: gateway.replica_id %q is held by another running gateway (%s): give each replica its own replica_id (two sharing one would write one audit head and one set of hold leases)",
		ErrReplicaInUse, s.replica, who)
}

// keepReplica watches the lock connection and takes the lock again when
// the connection was lost, until ctx ends; then it releases the lock.
func (s *Store) keepReplica(ctx context.Context, cfg *pgx.ConnConfig, conn *pgx.Conn, lost func(error)) {
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background()) // ends the session: releases the lock
		}
	}()
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if conn != nil {
			pctx, cancel := context.WithTimeout(ctx, s.db.timeout)
			err := conn.Ping(pctx)
			cancel()
			if err == nil || ctx.Err() != nil {
				continue
			}
			_ = conn.Close(context.Background())
			conn = nil
		}
		c, err := s.lockReplica(ctx, cfg)
		if err != nil {
			if errors.Is(err, ErrReplicaInUse) {
				s.replicaErr.Store(&err)
				if lost != nil {
					lost(err)
				}
			}
			continue // unreachable: try again at the next tick
		}
		s.replicaErr.Store(nil)
		conn = c
	}
}

// ReplicaErr is the ErrReplicaInUse ClaimReplica's keeper met when it
// took the id again after losing its lock connection (another gateway
// took the id meanwhile), until it holds the id again; nil otherwise.
// The gateway's /readyz reports it, so a load balancer drains one of the
// two.
func (s *Store) ReplicaErr() error {
	if p := s.replicaErr.Load(); p != nil {
		return *p
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
