// Package store keeps the gateway's state in SQLite (modernc.org/sqlite, WAL):
// usage counters, held calls, "always allow" grants and ended sessions.
//
// The schema evolves through numbered migrations (see migrations), recorded
// in the schema_migrations table; Open applies the missing ones in order,
// each in its own transaction.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// migrations[i] moves the schema from version i to i+1. Append only: never
// edit a migration that has shipped.
var migrations = []string{
	// 1: usage counters per hour.
	`CREATE TABLE usage (
		hour   TEXT    NOT NULL,
		agent  TEXT    NOT NULL,
		tool   TEXT    NOT NULL,
		action TEXT    NOT NULL,
		count  INTEGER NOT NULL,
		PRIMARY KEY (hour, agent, tool, action)
	) WITHOUT ROWID;
	CREATE INDEX usage_hour ON usage (hour DESC);`,
	// 2: held calls (gateway/holds). doc is the immutable part as JSON; the
	// columns are what queries select on and what a decision changes.
	`CREATE TABLE holds (
		id              TEXT    PRIMARY KEY,
		status          TEXT    NOT NULL,
		agent           TEXT    NOT NULL,
		session         TEXT    NOT NULL,
		user            TEXT    NOT NULL,
		tool            TEXT    NOT NULL,
		sha256          TEXT    NOT NULL,
		created         INTEGER NOT NULL,
		expires         INTEGER NOT NULL,
		doc             BLOB    NOT NULL,
		decided_by      TEXT    NOT NULL DEFAULT '',
		decision_reason TEXT    NOT NULL DEFAULT '',
		decided         INTEGER NOT NULL DEFAULT 0,
		result          BLOB
	);
	CREATE INDEX holds_status ON holds (status, expires);
	CREATE INDEX holds_caller ON holds (agent, status);
	CREATE INDEX holds_same ON holds (agent, session, user, tool, sha256, status);
	CREATE INDEX holds_created ON holds (created DESC);`,
	// 3: ended sessions (gateway/sessions.go). holds is the JSON list of
	// the hold ids the end expired.
	`CREATE TABLE ended_sessions (
		session  TEXT    PRIMARY KEY,
		ended    INTEGER NOT NULL,
		ended_by TEXT    NOT NULL,
		holds    TEXT    NOT NULL DEFAULT '[]'
	) WITHOUT ROWID;
	CREATE INDEX holds_session ON holds (session, status);`,
	// 4: "always allow" grants (gateway/holds): an approver's standing
	// approval of one exact request (tool and canonical request hash) for
	// one agent and user, until expires or until revoked. doc is the
	// immutable rest as JSON (the granter's groups, the note).
	`CREATE TABLE grants (
		id         TEXT    PRIMARY KEY,
		agent      TEXT    NOT NULL,
		user       TEXT    NOT NULL,
		tool       TEXT    NOT NULL,
		sha256     TEXT    NOT NULL,
		hold       TEXT    NOT NULL,
		granted_by TEXT    NOT NULL,
		created    INTEGER NOT NULL,
		expires    INTEGER NOT NULL,
		doc        BLOB    NOT NULL,
		revoked    INTEGER NOT NULL DEFAULT 0,
		revoked_by TEXT    NOT NULL DEFAULT ''
	) WITHOUT ROWID;
	CREATE INDEX grants_match ON grants (agent, user, tool, sha256, expires);
	CREATE INDEX grants_created ON grants (created DESC);`,
	// 5: the sandbox a hold was asked from: holds are deduplicated only
	// within one sandbox (never answered with another sandbox's hold), and
	// each sandbox has its own cap on pending holds under its agent's
	// (THREATS B9). Holds stored before have sandbox ''.
	`ALTER TABLE holds ADD COLUMN sandbox TEXT NOT NULL DEFAULT '';
	DROP INDEX holds_same;
	CREATE INDEX holds_same ON holds (agent, sandbox, session, user, tool, sha256, status);
	CREATE INDEX holds_sandbox ON holds (agent, sandbox, status);`,
	// 6: the audit log's head as the gateway last made it durable
	// (THREATS G9): at start a log that does not reach it, or holds
	// another record at its seq, is refused. One row.
	`CREATE TABLE audit_head (
		id      INTEGER PRIMARY KEY CHECK (id = 1),
		seq     INTEGER NOT NULL,
		hash    TEXT    NOT NULL,
		updated INTEGER NOT NULL
	);`,
}

// Store is an open database. Safe for concurrent use.
type Store struct {
	db  *sql.DB
	now func() time.Time
	// ended is SessionEnded's query, prepared once: it runs on every tool
	// call and proxied request, and preparing it each time cost ~11% of the
	// gateway's CPU under proxy load.
	ended *sql.Stmt
	// endedCache holds SessionEnded's answers; the query itself was still
	// ~8% of a proxied request's CPU.
	endedCache endedCache
	// lock is the database file, held with an exclusive flock for as long
	// as the store is open: an SQLite store is one gateway's, which is what
	// lets endedCache trust that every end passes through EndSession.
	lock *os.File
}

// Open opens a DSN of the form "sqlite:/path/to/file.db" (or ":memory:" after
// "sqlite:"), creating and migrating the schema.
//
// A new database file is created with mode 0600 in a directory created 0700;
// SQLite gives its -wal and -shm files the same mode as the database.
func Open(ctx context.Context, dsn string) (*Store, error) {
	path, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	params := "?_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_txlock=immediate"
	memory := path == ":memory:"
	var lock *os.File
	if !memory {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("store: open: %w", err)
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("store: open: %w", err)
		}
		// flock and SQLite's own POSIX record locks do not interact.
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("store: open %s: in use by another gateway process (an sqlite store serves one gateway)", path)
			}
			return nil, fmt.Errorf("store: open %s: lock: %w", path, err)
		}
		lock = f
		params += "&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	}
	db, err := sql.Open("sqlite", path+params)
	if err != nil {
		closeLock(lock)
		return nil, fmt.Errorf("store: open: %w", err)
	}
	if memory {
		// Every connection to ":memory:" is a separate database.
		db.SetMaxOpenConns(1)
	} else {
		// database/sql keeps 2 idle connections by default: under a few
		// concurrent calls the rest were closed and reopened each time.
		db.SetMaxIdleConns(16)
	}
	s := &Store{db: db, now: time.Now, lock: lock}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		closeLock(lock)
		return nil, err
	}
	if s.ended, err = db.PrepareContext(ctx, `SELECT 1 FROM ended_sessions WHERE session = ?`); err != nil {
		db.Close()
		closeLock(lock)
		return nil, fmt.Errorf("store: prepare: %w", err)
	}
	return s, nil
}

func closeLock(f *os.File) {
	if f != nil {
		f.Close() // closing the last descriptor releases the flock
	}
}

func parseDSN(dsn string) (string, error) {
	path, ok := strings.CutPrefix(dsn, "sqlite:")
	if !ok {
		scheme, _, found := strings.Cut(dsn, ":")
		if !found || scheme == "" {
			return "", fmt.Errorf("store: dsn %q: want sqlite:/path/to/file.db", dsn)
		}
		if scheme == "postgres" || scheme == "postgresql" {
			return "", fmt.Errorf("store: dsn: %s:// is not supported yet; use sqlite:/path/to/file.db", scheme)
		}
		return "", fmt.Errorf("store: dsn: scheme %q is not supported; use sqlite:/path/to/file.db", scheme)
	}
	// "sqlite:///abs/path" is accepted as a URL-shaped spelling of "/abs/path".
	if rest, ok := strings.CutPrefix(path, "//"); ok && strings.HasPrefix(rest, "/") {
		path = rest
	}
	switch {
	case path == "":
		return "", errors.New("store: dsn: empty sqlite path")
	case path == ":memory:":
		return path, nil
	case strings.ContainsAny(path, "?#\x00"):
		// The driver splits its options off at '?'.
		return "", fmt.Errorf("store: dsn: sqlite path %q must not contain '?', '#' or NUL", path)
	case strings.HasPrefix(path, "file:"):
		return "", fmt.Errorf("store: dsn: sqlite path %q: give a plain path, not a file: URI", path)
	}
	return path, nil
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY,
		applied TEXT NOT NULL
	)`); err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	for i, stmt := range migrations {
		version := i + 1
		if err := s.applyMigration(ctx, version, stmt); err != nil {
			return fmt.Errorf("store: migrate to version %d: %w", version, err)
		}
	}
	// A database written by a newer sluice must not be used by an older one.
	var max sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&max); err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	if max.Int64 > int64(len(migrations)) {
		return fmt.Errorf("store: migrate: database schema version %d is newer than this binary's %d", max.Int64, len(migrations))
	}
	return nil
}

// applyMigration runs one migration unless already applied. The transaction
// takes the write lock at BEGIN (_txlock=immediate), so two processes opening
// the same file apply each migration once.
func (s *Store) applyMigration(ctx context.Context, version int, stmt string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, stmt); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied) VALUES (?, ?)`,
		version, s.now().UTC().Format(time.RFC3339)); err != nil {
		return err
	}
	return tx.Commit()
}

// SchemaVersion returns the highest applied migration.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("store: schema version: %w", err)
	}
	return int(v.Int64), nil
}

// CountCall adds one to the usage counter of (agent, tool, action) for the current hour.
func (s *Store) CountCall(ctx context.Context, agent, tool, action string) error {
	return s.AddUsage(ctx, []Usage{{Agent: agent, Tool: tool, Action: action, Count: 1}})
}

// AddUsage adds each row's Count to its counter in one transaction, so a
// caller can aggregate in memory and flush now and then. A row's Hour, if
// empty, is the current hour.
func (s *Store) AddUsage(ctx context.Context, rows []Usage) error {
	if len(rows) == 0 {
		return nil
	}
	now := s.now().UTC().Truncate(time.Hour).Format(time.RFC3339)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: add usage: %w", err)
	}
	defer tx.Rollback()
	for _, r := range rows {
		hour := r.Hour
		if hour == "" {
			hour = now
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO usage (hour, agent, tool, action, count) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (hour, agent, tool, action) DO UPDATE SET count = count + excluded.count`,
			hour, r.Agent, r.Tool, r.Action, r.Count); err != nil {
			return fmt.Errorf("store: add usage: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: add usage: %w", err)
	}
	return nil
}

// Usage is one row of counters.
type Usage struct {
	Hour   string // RFC 3339, truncated to the hour
	Agent  string
	Tool   string
	Action string
	Count  int64
}

// DefaultUsageLimit is used when Usage is called with limit <= 0.
const DefaultUsageLimit = 1000

// Usage lists counters, newest first (then by agent, tool and action).
func (s *Store) Usage(ctx context.Context, limit int) ([]Usage, error) {
	if limit <= 0 {
		limit = DefaultUsageLimit
	}
	rows, err := s.db.QueryContext(ctx, `SELECT hour, agent, tool, action, count FROM usage
		ORDER BY hour DESC, agent, tool, action LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	defer rows.Close()
	var out []Usage
	for rows.Next() {
		var u Usage
		if err := rows.Scan(&u.Hour, &u.Agent, &u.Tool, &u.Action, &u.Count); err != nil {
			return nil, fmt.Errorf("store: usage: %w", err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	return out, nil
}

// Close closes the database.
func (s *Store) Close() error {
	_ = s.ended.Close()
	err := s.db.Close()
	closeLock(s.lock) // after the database: no write may follow the unlock
	if err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	return nil
}
