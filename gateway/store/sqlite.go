package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// sqliteBackend is one gateway's own database file. lock is the file,
// held with an exclusive flock for as long as the store is open: an SQLite
// store is one gateway's, which is what lets endedCache trust that every
// end passes through EndSession.
type sqliteBackend struct {
	lock *os.File
}

func (sqliteBackend) Kind() Kind { return SQLite }

// lockMigrations: the migration transactions take the write lock at
// BEGIN (_txlock=immediate), which already serialises them.
func (sqliteBackend) lockMigrations(context.Context, *sql.Conn) (func(), error) {
	return func() {}, nil
}

// unavailable: a local file has no network; only the query timeout (in
// db.classify) means "no answer".
func (sqliteBackend) unavailable(error) bool { return false }

func (sqliteBackend) shared() bool { return false }

func (b sqliteBackend) close() error {
	if b.lock != nil {
		return b.lock.Close() // closing the last descriptor releases the flock
	}
	return nil
}

// openSQLite opens "sqlite:/path/to/file.db" (or "sqlite::memory:").
//
// A new database file is created with mode 0600 in a directory created 0700;
// SQLite gives its -wal and -shm files the same mode as the database.
func openSQLite(dsn string, o Options) (*sql.DB, Backend, error) {
	path, err := parseDSN(dsn)
	if err != nil {
		return nil, nil, err
	}
	params := "?_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_txlock=immediate"
	memory := path == ":memory:"
	var b sqliteBackend
	if !memory && !o.NoMigrate {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, nil, fmt.Errorf("store: open: %w", err)
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("store: open: %w", err)
		}
		// flock and SQLite's own POSIX record locks do not interact.
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, nil, fmt.Errorf("store: open %s: in use by another gateway process (an sqlite store serves one gateway)", path)
			}
			return nil, nil, fmt.Errorf("store: open %s: lock: %w", path, err)
		}
		b.lock = f
		params += "&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	} else if !memory {
		// Read only, without the gateway's lock: `sluice store status`
		// beside a running gateway. A missing file is not created.
		if _, err := os.Stat(path); err != nil {
			return nil, nil, fmt.Errorf("store: open: %w", err)
		}
		params += "&_pragma=query_only(1)"
	}
	sdb, err := sql.Open("sqlite", path+params)
	if err != nil {
		_ = b.close()
		return nil, nil, fmt.Errorf("store: open: %w", err)
	}
	if memory {
		// Every connection to ":memory:" is a separate database.
		sdb.SetMaxOpenConns(1)
	} else {
		// database/sql keeps 2 idle connections by default: under a few
		// concurrent calls the rest were closed and reopened each time.
		sdb.SetMaxIdleConns(16)
	}
	return sdb, b, nil
}

func parseDSN(dsn string) (string, error) {
	path, ok := strings.CutPrefix(dsn, "sqlite:")
	if !ok {
		scheme, _, found := strings.Cut(dsn, ":")
		if !found || scheme == "" {
			return "", fmt.Errorf("store: dsn %q: want sqlite:/path/to/file.db or postgres://…", dsn)
		}
		return "", fmt.Errorf("store: dsn: scheme %q is not supported; use sqlite:/path/to/file.db or postgres://…", scheme)
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
