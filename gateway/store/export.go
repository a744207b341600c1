package store

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// Export and Import move a store's lasting state between databases (the
// path users take: one gateway on SQLite → several on PostgreSQL) as JSON
// lines. The first line is a header,
//
//	{"sluice_store_export":1,"kind":"sqlite","schema":9}
//
// and every other line one row: {"table":"holds","row":{"id":…,…}}, with
// times as Unix nanoseconds and BLOB columns as base64. The tables are
// holds, grants, ended_sessions, usage and oauth_connections (without
// refresh leases; the tokens stay in the secret store); rate-limit
// buckets, audit heads, started OAuth connects, review UI sessions and
// started OIDC sign-ins belong to one database's gateways and are not
// moved (people sign in again).

// ExportVersion is the format version Export writes and Import reads.
const ExportVersion = 1

type colKind int

const (
	colText colKind = iota
	colInt
	colBlob
	colNullBlob // NULL or BLOB
)

type exportCol struct {
	name string // as in SQL (quoted if needed)
	key  string // in the JSON row
	kind colKind
}

type exportTable struct {
	name string
	cols []exportCol
	key  []string // the primary key's JSON keys
	// sum: on --merge a row whose key exists adds its count (usage)
	// instead of being refused.
	sum bool
	// check validates a decoded row beyond types.
	check func(row map[string]any) error
}

func c(name string, k colKind) exportCol {
	return exportCol{name: name, key: strings.Trim(name, `"`), kind: k}
}

var holdStatuses = []string{"pending", "approved", "executing", "executed", "denied", "expired", "outcome_unknown", "failed"}

func nonEmpty(keys ...string) func(map[string]any) error {
	return func(r map[string]any) error {
		for _, k := range keys {
			if r[k] == "" {
				return fmt.Errorf("row.%s: empty", k)
			}
		}
		return nil
	}
}

var exportTables = []exportTable{
	{name: "holds", key: []string{"id"}, cols: []exportCol{
		c("id", colText), c("status", colText), c("agent", colText), c("sandbox", colText), c("session", colText),
		c(`"user"`, colText), c("tool", colText), c("sha256", colText), c("created", colInt), c("expires", colInt),
		c("doc", colBlob), c("decided_by", colText), c("decision_reason", colText), c("decided", colInt),
		c("result", colNullBlob), c("version", colInt)},
		check: func(r map[string]any) error {
			if err := nonEmpty("id", "agent", "tool")(r); err != nil {
				return err
			}
			if !slices.Contains(holdStatuses, r["status"].(string)) {
				return fmt.Errorf("row.status: %q is not one of %s", r["status"], strings.Join(holdStatuses, ", "))
			}
			if !json.Valid(r["doc"].([]byte)) {
				return errors.New("row.doc: not JSON")
			}
			return nil
		}},
	{name: "grants", key: []string{"id"}, cols: []exportCol{
		c("id", colText), c("agent", colText), c(`"user"`, colText), c("tool", colText), c("sha256", colText),
		c("hold", colText), c("granted_by", colText), c("created", colInt), c("expires", colInt), c("doc", colBlob),
		c("revoked", colInt), c("revoked_by", colText)},
		check: func(r map[string]any) error {
			if err := nonEmpty("id", "agent", "tool", "sha256")(r); err != nil {
				return err
			}
			if !json.Valid(r["doc"].([]byte)) {
				return errors.New("row.doc: not JSON")
			}
			return nil
		}},
	{name: "ended_sessions", key: []string{"session"}, cols: []exportCol{
		c("session", colText), c("ended", colInt), c("ended_by", colText), c("holds", colText)},
		check: func(r map[string]any) error {
			if err := nonEmpty("session")(r); err != nil {
				return err
			}
			var ids []string
			if err := json.Unmarshal([]byte(r["holds"].(string)), &ids); err != nil {
				return errors.New("row.holds: not a JSON list of hold ids")
			}
			return nil
		}},
	{name: "usage", key: []string{"hour", "agent", "tool", "action"}, sum: true, cols: []exportCol{
		c("hour", colText), c("agent", colText), c("tool", colText), c("action", colText), c("count", colInt)},
		check: func(r map[string]any) error {
			if r["count"].(int64) < 0 {
				return errors.New("row.count: negative")
			}
			return nonEmpty("hour")(r)
		}},
	{name: "oauth_connections", key: []string{"connector", "user"}, cols: []exportCol{
		c("connector", colText), c(`"user"`, colText), c("status", colText), c("scopes", colText),
		c("connected_at", colInt), c("updated", colInt)},
		check: func(r map[string]any) error {
			if err := nonEmpty("connector", "user")(r); err != nil {
				return err
			}
			return checkOAuthConnection(OAuthConnection{Connector: r["connector"].(string), User: r["user"].(string),
				Status: r["status"].(string), Scopes: strings.Fields(r["scopes"].(string))})
		}},
}

type exportHeader struct {
	Version int    `json:"sluice_store_export"`
	Kind    string `json:"kind"`
	Schema  int    `json:"schema"`
}

type exportLine struct {
	Table string                     `json:"table"`
	Row   map[string]json.RawMessage `json:"row"`
}

// ExportCounts says how many rows of each table were written or read.
type ExportCounts map[string]int

func (c ExportCounts) String() string {
	var parts []string
	for _, t := range exportTables {
		parts = append(parts, fmt.Sprintf("%s %d", t.name, c[t.name]))
	}
	return strings.Join(parts, ", ")
}

// Export writes the store's holds, grants, ended sessions and usage
// counters to w as JSON lines, read in one transaction (a consistent
// snapshot on either engine). It is bounded by ctx only, not the query
// timeout: a large store takes a while.
func (s *Store) Export(ctx context.Context, w io.Writer) (ExportCounts, error) {
	ver, err := s.SchemaVersion(ctx)
	if err != nil {
		return nil, err
	}
	// One snapshot: PostgreSQL's repeatable read; on SQLite a deferred
	// transaction on one connection (BeginTx would take the write lock,
	// which a read-only open cannot).
	var tx interface {
		QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	}
	if s.Kind() == Postgres {
		t, err := s.db.sql.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("store: export: %w", s.db.classify(ctx, ctx, err))
		}
		defer t.Rollback()
		tx = t
	} else {
		conn, err := s.db.sql.Conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("store: export: %w", err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `BEGIN DEFERRED`); err != nil {
			return nil, fmt.Errorf("store: export: %w", err)
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		tx = conn
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(exportHeader{Version: ExportVersion, Kind: s.Kind().String(), Schema: ver}); err != nil {
		return nil, err
	}
	counts := ExportCounts{}
	for _, t := range exportTables {
		names := make([]string, len(t.cols))
		for i, col := range t.cols {
			names[i] = col.name
		}
		order := make([]string, len(t.key))
		for i, k := range t.key {
			order[i] = t.cols[slices.IndexFunc(t.cols, func(c exportCol) bool { return c.key == k })].name
		}
		rows, err := tx.QueryContext(ctx, `SELECT `+strings.Join(names, ", ")+` FROM `+t.name+` ORDER BY `+strings.Join(order, ", "))
		if err != nil {
			return nil, fmt.Errorf("store: export %s: %w", t.name, s.db.classify(ctx, ctx, err))
		}
		for rows.Next() {
			dest := make([]any, len(t.cols))
			for i, col := range t.cols {
				switch col.kind {
				case colText:
					dest[i] = new(string)
				case colInt:
					dest[i] = new(int64)
				case colBlob, colNullBlob:
					dest[i] = new([]byte)
				}
			}
			if err := rows.Scan(dest...); err != nil {
				rows.Close()
				return nil, fmt.Errorf("store: export %s: %w", t.name, err)
			}
			row := map[string]any{}
			for i, col := range t.cols {
				switch v := dest[i].(type) {
				case *string:
					row[col.key] = *v
				case *int64:
					row[col.key] = *v
				case *[]byte:
					if *v == nil && col.kind == colNullBlob {
						row[col.key] = nil
					} else if *v == nil {
						row[col.key] = []byte{}
					} else {
						row[col.key] = *v
					}
				}
			}
			if err := enc.Encode(map[string]any{"table": t.name, "row": row}); err != nil {
				rows.Close()
				return nil, err
			}
			counts[t.name]++
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("store: export %s: %w", t.name, s.db.classify(ctx, ctx, err))
		}
	}
	return counts, bw.Flush()
}

// ImportError is a bad line of an import: nothing was written.
type ImportError struct {
	Line int
	Err  error
}

func (e *ImportError) Error() string { return fmt.Sprintf("store: import: line %d: %v", e.Line, e.Err) }
func (e *ImportError) Unwrap() error { return e.Err }

// ErrNotEmpty is Import's refusal of a target that already holds state
// (without merge).
var ErrNotEmpty = errors.New("store: import: the target store is not empty (use merge to add to it)")

type importRow struct {
	line  int
	table *exportTable
	vals  map[string]any
}

// Import reads an Export from r and writes it into the store in one
// transaction: every line is checked first, and a bad one (naming its
// line and key) writes nothing. The target must be empty unless merge;
// with merge a hold, grant or ended session already present is refused
// (its line named) and usage counts add up.
func (s *Store) Import(ctx context.Context, r io.Reader, merge bool) (ExportCounts, error) {
	rows, err := parseImport(r)
	if err != nil {
		return nil, err
	}
	counts := ExportCounts{}
	tx, err := s.db.sql.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store: import: %w", s.db.classify(ctx, ctx, err))
	}
	defer tx.Rollback()
	if !merge {
		for _, t := range exportTables {
			var one int
			err := tx.QueryRowContext(ctx, `SELECT 1 FROM `+t.name+` LIMIT 1`).Scan(&one)
			if err == nil {
				return nil, fmt.Errorf("%w: it has %s", ErrNotEmpty, t.name)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return nil, fmt.Errorf("store: import: %w", s.db.classify(ctx, ctx, err))
			}
		}
	}
	for _, ir := range rows {
		t := ir.table
		names := make([]string, len(t.cols))
		args := make([]any, len(t.cols))
		marks := make([]string, len(t.cols))
		for i, col := range t.cols {
			names[i], args[i], marks[i] = col.name, ir.vals[col.key], "?"
		}
		var keys []string
		for _, k := range t.key {
			keys = append(keys, t.cols[slices.IndexFunc(t.cols, func(c exportCol) bool { return c.key == k })].name)
		}
		q := `INSERT INTO ` + t.name + ` (` + strings.Join(names, ", ") + `) VALUES (` + strings.Join(marks, ", ") + `) ON CONFLICT (` + strings.Join(keys, ", ") + `) DO `
		if t.sum {
			q += `UPDATE SET count = ` + t.name + `.count + excluded.count`
		} else {
			q += `NOTHING`
		}
		res, err := tx.ExecContext(ctx, s.db.q(q), args...)
		if err != nil {
			return nil, &ImportError{Line: ir.line, Err: fmt.Errorf("%s: %w", t.name, s.db.classify(ctx, ctx, err))}
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return nil, &ImportError{Line: ir.line, Err: fmt.Errorf("%s %s %v is already in the target store", t.name, t.key[0], ir.vals[t.key[0]])}
		}
		counts[t.name]++
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("store: import: commit: %w", s.db.classify(ctx, ctx, err))
	}
	// imported ended sessions must not be answered "not ended" from cache
	s.endedCache.mu.Lock()
	s.endedCache.gen++
	s.endedCache.m = nil
	s.endedCache.mu.Unlock()
	return counts, nil
}

// parseImport reads and checks every line; rows come back in file order.
func parseImport(r io.Reader) ([]importRow, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 64<<20)
	var out []importRow
	line := 0
	seen := map[string]int{} // table + key → line
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if line == 1 {
			var h exportHeader
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&h); err != nil || h.Version == 0 {
				return nil, &ImportError{Line: 1, Err: errors.New("not a sluice store export (no sluice_store_export header)")}
			}
			if h.Version != ExportVersion {
				return nil, &ImportError{Line: 1, Err: fmt.Errorf("sluice_store_export: version %d, this sluice reads %d", h.Version, ExportVersion)}
			}
			continue
		}
		if len(b) == 0 {
			continue
		}
		ir, err := parseRow(b)
		if err != nil {
			return nil, &ImportError{Line: line, Err: err}
		}
		ir.line = line
		var kb strings.Builder
		kb.WriteString(ir.table.name)
		for _, k := range ir.table.key {
			fmt.Fprintf(&kb, "\x00%v", ir.vals[k])
		}
		if prev, dup := seen[kb.String()]; dup {
			return nil, &ImportError{Line: line, Err: fmt.Errorf("%s %s %v repeats line %d", ir.table.name, ir.table.key[0], ir.vals[ir.table.key[0]], prev)}
		}
		seen[kb.String()] = line
		out = append(out, ir)
	}
	if err := sc.Err(); err != nil {
		return nil, &ImportError{Line: line + 1, Err: err}
	}
	if line == 0 {
		return nil, &ImportError{Line: 1, Err: errors.New("empty input (no sluice_store_export header)")}
	}
	return out, nil
}

func parseRow(b []byte) (importRow, error) {
	var l exportLine
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return importRow{}, fmt.Errorf("not a JSON row: %v", err)
	}
	ti := slices.IndexFunc(exportTables, func(t exportTable) bool { return t.name == l.Table })
	if ti < 0 {
		names := make([]string, len(exportTables))
		for i, t := range exportTables {
			names[i] = t.name
		}
		return importRow{}, fmt.Errorf("table: %q is not one of %s", l.Table, strings.Join(names, ", "))
	}
	t := &exportTables[ti]
	vals := map[string]any{}
	var unknown []string
	for k := range l.Row {
		if !slices.ContainsFunc(t.cols, func(c exportCol) bool { return c.key == k }) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return importRow{}, fmt.Errorf("row.%s: not a column of %s", unknown[0], t.name)
	}
	for _, col := range t.cols {
		raw, ok := l.Row[col.key]
		if !ok {
			return importRow{}, fmt.Errorf("row.%s: missing", col.key)
		}
		var err error
		switch col.kind {
		case colText:
			var v string
			err = json.Unmarshal(raw, &v)
			vals[col.key] = v
		case colInt:
			var v int64
			err = json.Unmarshal(raw, &v)
			vals[col.key] = v
		case colBlob, colNullBlob:
			var v []byte
			if string(raw) == "null" {
				if col.kind == colBlob {
					err = errors.New("null")
				}
				vals[col.key] = nil
				break
			}
			err = json.Unmarshal(raw, &v)
			if v == nil {
				v = []byte{}
			}
			vals[col.key] = v
		}
		if err != nil || string(raw) == "null" && col.kind != colNullBlob {
			want := map[colKind]string{colText: "a string", colInt: "an integer", colBlob: "base64", colNullBlob: "base64 or null"}[col.kind]
			return importRow{}, fmt.Errorf("row.%s: not %s", col.key, want)
		}
	}
	if t.check != nil {
		if err := t.check(vals); err != nil {
			return importRow{}, err
		}
	}
	return importRow{table: t, vals: vals}, nil
}
