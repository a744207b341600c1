// Package store keeps the gateway's state: usage counters, held calls,
// "always allow" grants, ended sessions, review UI sign-ins and the audit
// log's head.
//
// One Store type serves two engines (see Backend): SQLite
// (modernc.org/sqlite, WAL), the embedded default that one gateway process
// owns, and PostgreSQL (jackc/pgx/v5, pgxpool), which several gateway
// replicas share. Every query is written once, in the SQL both speak; the
// engines differ in their schema text, how migrations are serialised, what
// counts as "the database is unreachable" and whether another process may
// change the state behind this one's back.
//
// The schema evolves through numbered migrations embedded from
// migrations/<engine>/NNNN_name.sql, recorded in the schema_migrations
// table; Open applies the missing ones in order, each in its own
// transaction (PostgreSQL: all under one advisory lock, so replicas
// starting together migrate once).
package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

//go:embed migrations
var migrationFS embed.FS

// Migration is one numbered schema step.
type Migration struct {
	Version int
	Name    string // file name without the number and .sql
	SQL     string
}

// Migrations returns kind's migrations in order; Version i+1 is at index i.
func Migrations(kind Kind) []Migration {
	dir := path.Join("migrations", kind.String())
	ents, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		panic("bug(): store: embedded migrations: " + err.Error())
	}
	var out []Migration
	for i, e := range ents {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v != i+1 {
			panic(fmt.Sprintf("bug(): store: migration %s/%s is not number %d", dir, e.Name(), i+1))
		}
		b, err := migrationFS.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			panic("bug(): store: embedded migrations: " + err.Error())
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(b)})
	}
	return out
}

// Kind is a store's engine.
type Kind int

const (
	SQLite Kind = iota + 1
	Postgres
)

func (k Kind) String() string {
	switch k {
	case SQLite:
		return "sqlite"
	case Postgres:
		return "postgres"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// ErrUnavailable marks an error that means the database could not be
// reached or did not answer in time (not that it refused a statement).
// The gateway answers such calls 503 store_unavailable and sends nothing.
var ErrUnavailable = errors.New("store: unavailable")

// Backend is what differs between the engines. The SQL of every query is
// the same (the Store's); a Backend opens the database, serialises
// migrations, and says which errors mean "unreachable".
type Backend interface {
	Kind() Kind
	// lockMigrations serialises migrations across every process using the
	// database for as long as conn is held; unlock releases it.
	lockMigrations(ctx context.Context, conn *sql.Conn) (unlock func(), err error)
	// unavailable says whether err (from a statement) means the database
	// could not be reached or did not answer, rather than refused it.
	unavailable(err error) bool
	// shared says whether other processes may change the state too (so
	// answers this process caches must expire).
	shared() bool
	// close releases what the backend holds beyond the *sql.DB (the
	// SQLite file lock, the pgx pool), after the DB is closed.
	close() error
}

// Options tune a Store; the zero value is the defaults.
type Options struct {
	// QueryTimeout bounds every statement and transaction from the
	// client side (a hung network, a stopped server). Default 5s; a
	// PostgreSQL DSN's statement_timeout, if set, is used (plus 1s, so
	// the server's own timeout fires first).
	QueryTimeout time.Duration
	// AuditLog is the gateway's audit log path: on a shared store each
	// replica's head is kept apart (host name and this path) when Replica
	// is not set.
	AuditLog string
	// Replica is the gateway's gateway.replica_id: on a shared store its
	// audit head is the row of that name, the name every record of its
	// audit file carries (so `sluice audit verify --heads` finds the file
	// of each head).
	Replica string
	// NoMigrate opens the database without creating or migrating the
	// schema (sluice store status); the SQLite file is not locked.
	NoMigrate bool
}

// testMaxVersion, when set by a test, stops migrations at that version
// (to write a database as an older binary did).
var testMaxVersion int

// DefaultQueryTimeout is Options.QueryTimeout's default.
const DefaultQueryTimeout = 5 * time.Second

// Store is an open database. Safe for concurrent use.
type Store struct {
	b   Backend
	db  *db
	now func() time.Time
	// ended is SessionEnded's query, prepared once: it runs on every tool
	// call and proxied request, and preparing it each time cost ~11% of the
	// gateway's CPU under proxy load.
	ended *sql.Stmt
	// endedCache holds SessionEnded's answers; the query itself was still
	// ~8% of a proxied request's CPU.
	endedCache endedCache
	auditLog   string // Options.AuditLog
	replica    string // Options.Replica
	origin     string // this Store in hold notifications (notify.go)
	leaseOwner string // this Store in holds' leases (lease.go)
	// replicaStop releases the replica id ClaimReplica took (nil: none);
	// replicaErr is what ReplicaErr returns.
	replicaStop func()
	replicaErr  atomic.Pointer[error]
}

// Open opens a DSN: "sqlite:/path/to/file.db" (or ":memory:" after
// "sqlite:"), or "postgres://…" / "postgresql://…" (see openPostgres),
// creating and migrating the schema.
func Open(ctx context.Context, dsn string) (*Store, error) {
	return OpenWith(ctx, dsn, Options{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, dsn string, o Options) (*Store, error) {
	if o.QueryTimeout <= 0 {
		o.QueryTimeout = DefaultQueryTimeout
	}
	var (
		sdb *sql.DB
		b   Backend
		err error
	)
	switch scheme, _, _ := strings.Cut(dsn, ":"); scheme {
	case "postgres", "postgresql":
		sdb, b, err = openPostgres(ctx, dsn, &o)
	default:
		sdb, b, err = openSQLite(dsn, o)
	}
	if err != nil {
		return nil, err
	}
	s := &Store{b: b, db: newDB(sdb, b, o.QueryTimeout), now: time.Now, auditLog: o.AuditLog, replica: o.Replica, origin: newOrigin(),
		leaseOwner: newLeaseOwner(o.Replica)}
	s.endedCache.shared = b.shared()
	fail := func(err error) (*Store, error) {
		sdb.Close()
		_ = b.close()
		return nil, err
	}
	if !o.NoMigrate {
		if err := s.migrate(ctx); err != nil {
			return fail(err)
		}
		if s.ended, err = sdb.PrepareContext(ctx, s.db.q(`SELECT 1 FROM ended_sessions WHERE session = ?`)); err != nil {
			return fail(fmt.Errorf("store: prepare: %w", s.db.classify(ctx, ctx, err)))
		}
	}
	return s, nil
}

// Kind is the store's engine.
func (s *Store) Kind() Kind { return s.b.Kind() }

// Ping checks that the database answers (within the query timeout).
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.db.queryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	return nil
}

// Redact returns dsn with any password replaced, for logs and messages.
func Redact(dsn string) string {
	if scheme, _, _ := strings.Cut(dsn, ":"); scheme != "postgres" && scheme != "postgresql" {
		return dsn
	}
	return redactPostgres(dsn)
}

func (s *Store) migrate(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, s.db.timeout*4)
	defer cancel()
	conn, err := s.db.sql.Conn(qctx)
	if err != nil {
		return fmt.Errorf("store: migrate: %w", s.db.classify(ctx, qctx, err))
	}
	defer conn.Close()
	unlock, err := s.b.lockMigrations(qctx, conn)
	if err != nil {
		return fmt.Errorf("store: migrate: lock: %w", s.db.classify(ctx, qctx, err))
	}
	defer unlock()
	if _, err := conn.ExecContext(qctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY,
		applied TEXT NOT NULL
	)`); err != nil {
		return fmt.Errorf("store: migrate: %w", s.db.classify(ctx, qctx, err))
	}
	migs := Migrations(s.b.Kind())
	if testMaxVersion > 0 {
		migs = migs[:testMaxVersion]
	}
	for _, m := range migs {
		if err := s.applyMigration(qctx, conn, m); err != nil {
			return fmt.Errorf("store: migrate to version %d (%s): %w", m.Version, m.Name, s.db.classify(ctx, qctx, err))
		}
	}
	// A database written by a newer sluice must not be used by an older one.
	var max sql.NullInt64
	if err := conn.QueryRowContext(qctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&max); err != nil {
		return fmt.Errorf("store: migrate: %w", s.db.classify(ctx, qctx, err))
	}
	if max.Int64 > int64(len(migs)) {
		return fmt.Errorf("store: migrate: database schema version %d is newer than this binary's %d", max.Int64, len(migs))
	}
	return nil
}

// applyMigration runs one migration unless already applied. SQLite: the
// transaction takes the write lock at BEGIN (_txlock=immediate), so two
// processes opening the same file apply each migration once; PostgreSQL:
// the advisory lock migrate holds does the same.
func (s *Store) applyMigration(ctx context.Context, conn *sql.Conn, m Migration) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, s.db.q(`SELECT COUNT(*) FROM schema_migrations WHERE version = ?`), m.Version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.db.q(`INSERT INTO schema_migrations (version, applied) VALUES (?, ?)`),
		m.Version, s.now().UTC().Format(time.RFC3339)); err != nil {
		return err
	}
	return tx.Commit()
}

// Status is what `sluice store status` shows.
type Status struct {
	Kind    Kind
	Applied []AppliedMigration
	Latest  int // the newest migration this binary has
}

// AppliedMigration is one row of schema_migrations.
type AppliedMigration struct {
	Version int
	Applied string // RFC 3339
}

// Current is the highest applied version (0: none).
func (st Status) Current() int {
	if len(st.Applied) == 0 {
		return 0
	}
	return st.Applied[len(st.Applied)-1].Version
}

// Status reads the applied migrations. It works on a store opened with
// NoMigrate too (a database never migrated has none).
func (s *Store) Status(ctx context.Context) (Status, error) {
	st := Status{Kind: s.b.Kind(), Latest: len(Migrations(s.b.Kind())), Applied: []AppliedMigration{}}
	var exists int
	if s.b.Kind() == Postgres {
		err := s.db.queryRow(ctx, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'schema_migrations'`).Scan(&exists)
		if err != nil {
			return Status{}, fmt.Errorf("store: status: %w", err)
		}
	} else if err := s.db.queryRow(ctx, `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`).Scan(&exists); err != nil {
		return Status{}, fmt.Errorf("store: status: %w", err)
	}
	if exists == 0 {
		return st, nil
	}
	err := s.db.each(ctx, `SELECT version, applied FROM schema_migrations ORDER BY version`, nil, func(sc scanner) error {
		var m AppliedMigration
		if err := sc.Scan(&m.Version, &m.Applied); err != nil {
			return err
		}
		st.Applied = append(st.Applied, m)
		return nil
	})
	if err != nil {
		return Status{}, fmt.Errorf("store: status: %w", err)
	}
	return st, nil
}

// SchemaVersion returns the highest applied migration.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v sql.NullInt64
	if err := s.db.queryRow(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
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
	err := s.db.inTx(ctx, func(tx *txn) error {
		for _, r := range rows {
			hour := r.Hour
			if hour == "" {
				hour = now
			}
			if _, err := tx.exec(`INSERT INTO usage (hour, agent, tool, action, count) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (hour, agent, tool, action) DO UPDATE SET count = usage.count + excluded.count`,
				hour, r.Agent, r.Tool, r.Action, r.Count); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
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
	var out []Usage
	err := s.db.each(ctx, `SELECT hour, agent, tool, action, count FROM usage
		ORDER BY hour DESC, agent, tool, action LIMIT ?`, []any{limit}, func(sc scanner) error {
		var u Usage
		if err := sc.Scan(&u.Hour, &u.Agent, &u.Tool, &u.Action, &u.Count); err != nil {
			return err
		}
		out = append(out, u)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	return out, nil
}

// Close closes the database.
func (s *Store) Close() error {
	if s.replicaStop != nil {
		s.replicaStop()
	}
	if s.ended != nil {
		_ = s.ended.Close()
	}
	err := s.db.sql.Close()
	// After the database: no write may follow the release of the SQLite
	// file lock.
	if cerr := s.b.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	return nil
}
