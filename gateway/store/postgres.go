package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// postgresBackend is a PostgreSQL database that several gateway replicas
// share, through a pgx pool.
type postgresBackend struct {
	pool *pgxpool.Pool
}

func (postgresBackend) Kind() Kind { return Postgres }

// migrationLockKey is the advisory lock migrations run under (the first
// eight bytes of "sluice.m" read as a big-endian integer): any number of
// replicas starting together, one migrates, the others wait and then find
// nothing left to do.
const migrationLockKey int64 = 0x736c756963652e6d

func (postgresBackend) lockMigrations(ctx context.Context, conn *sql.Conn) (func(), error) {
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, migrationLockKey); err != nil {
		return nil, err
	}
	return func() {
		// A session lock: released here, or when the connection ends.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.ExecContext(uctx, `SELECT pg_advisory_unlock($1)`, migrationLockKey); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // drop the connection: that releases it
		}
	}, nil
}

// unavailable: the server's own refusals of a statement (constraint,
// syntax) are not; connection classes (08), resources (53), operator
// intervention and statement timeouts (57), system errors (58), and any
// failure that never reached the server are.
func (postgresBackend) unavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "53", "57", "58":
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connErr), errors.As(err, &netErr), pgconn.Timeout(err), pgconn.SafeToRetry(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, driver.ErrBadConn):
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "closed pool") || strings.Contains(msg, "conn busy")
}

func (postgresBackend) shared() bool { return true }

func (b postgresBackend) close() error {
	b.pool.Close()
	return nil
}

// openPostgres opens a "postgres://user[:password]@host[:port]/db?…" DSN
// with pgx's pool. Its parameters are libpq's as pgx reads them, among
// them:
//   - sslmode (disable | require | verify-ca | verify-full) and
//     sslrootcert (the CA file): honoured as libpq does. Unless the host is
//     loopback or a Unix socket, sslmode must be given (here or in
//     $PGSSLMODE): the default "prefer" falls back to plaintext and checks
//     no certificate, which is not a choice to make silently.
//   - pool_max_conns: the pool size (default: 4 or the number of CPUs).
//   - statement_timeout: sent to the server (default 5s); the client gives
//     up 1s later (o.QueryTimeout), so a stopped or unreachable server
//     fails a call in bounded time.
//
// The password (in the DSN, $PGPASSWORD or a passfile) never appears in an
// error this returns.
func openPostgres(ctx context.Context, dsn string, o *Options) (*sql.DB, Backend, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("store: dsn %s: %s", Redact(dsn), scrub(dsn, err.Error()))
	}
	if err := needSSLMode(dsn, cfg); err != nil {
		return nil, nil, err
	}
	rp := cfg.ConnConfig.RuntimeParams
	if rp["statement_timeout"] == "" {
		rp["statement_timeout"] = strconv.FormatInt(DefaultQueryTimeout.Milliseconds(), 10)
	}
	st, err := parsePGDuration(rp["statement_timeout"])
	if err != nil {
		return nil, nil, fmt.Errorf("store: dsn %s: statement_timeout: %w", Redact(dsn), err)
	}
	if st > 0 {
		o.QueryTimeout = st + time.Second
	}
	if cfg.ConnConfig.ConnectTimeout <= 0 || cfg.ConnConfig.ConnectTimeout > o.QueryTimeout {
		cfg.ConnConfig.ConnectTimeout = o.QueryTimeout
	}
	if rp["application_name"] == "" {
		rp["application_name"] = "sluice"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("store: open %s: %s", Redact(dsn), scrub(dsn, err.Error()))
	}
	return stdlib.OpenDBFromPool(pool), postgresBackend{pool: pool}, nil
}

// needSSLMode refuses a remote server without an explicit sslmode.
func needSSLMode(dsn string, cfg *pgxpool.Config) error {
	if u, err := url.Parse(dsn); err == nil && u.Query().Get("sslmode") != "" {
		return nil
	}
	if os.Getenv("PGSSLMODE") != "" {
		return nil
	}
	host := cfg.ConnConfig.Host
	if strings.HasPrefix(host, "/") {
		return nil // a Unix socket
	}
	if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" {
		return nil
	}
	return fmt.Errorf("store: dsn %s: set sslmode (verify-full with sslrootcert=/path/to/ca.pem for a server across a network; disable only on a trusted one)", Redact(dsn))
}

// parsePGDuration reads a PostgreSQL duration setting: a bare number is
// milliseconds; otherwise a number with ms, s, min or h.
func parsePGDuration(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Duration(n) * time.Millisecond, nil
	}
	v = strings.Replace(v, "min", "m", 1)
	d, err := time.ParseDuration(strings.ReplaceAll(v, " ", ""))
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q: want milliseconds or a number with ms, s, min or h", v)
	}
	return d, nil
}

// redactPostgres replaces the password in a postgres:// URL (userinfo or
// ?password=) with "xxxxx".
func redactPostgres(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		// Unparsable: keep the scheme only, the rest may hold anything.
		scheme, _, _ := strings.Cut(dsn, ":")
		return scheme + "://[unparsable]"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	// By hand: url.Query drops a pair it cannot unescape, password and all.
	parts := strings.Split(u.RawQuery, "&")
	for i, p := range parts {
		if k, _, _ := strings.Cut(p, "="); strings.EqualFold(k, "password") {
			parts[i] = "password=xxxxx"
		}
	}
	u.RawQuery = strings.Join(parts, "&")
	return u.String()
}

// scrub removes the DSN's password (and its URL-escaped form) from msg:
// a driver's error text is not trusted to have done it.
func scrub(dsn, msg string) string {
	for _, pw := range passwords(dsn) {
		if pw == "" {
			continue
		}
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
		msg = strings.ReplaceAll(msg, url.QueryEscape(pw), "xxxxx")
		msg = strings.ReplaceAll(msg, url.PathEscape(pw), "xxxxx")
	}
	return msg
}

func passwords(dsn string) []string {
	var out []string
	if env := os.Getenv("PGPASSWORD"); env != "" {
		out = append(out, env)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		// Take whatever sits between the first "://user:" and the last '@'.
		if _, rest, ok := strings.Cut(dsn, "://"); ok {
			if at := strings.LastIndex(rest, "@"); at > 0 {
				if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
					out = append(out, pw)
				}
			}
		}
		return out
	}
	if pw, ok := u.User.Password(); ok {
		out = append(out, pw)
	}
	for _, p := range strings.Split(u.RawQuery, "&") {
		if k, v, _ := strings.Cut(p, "="); strings.EqualFold(k, "password") && v != "" {
			out = append(out, v)
			if uv, err := url.QueryUnescape(v); err == nil {
				out = append(out, uv)
			}
		}
	}
	return out
}
