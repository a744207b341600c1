package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/store"
)

// headsReport is `audit verify --heads --json`.
type headsReport struct {
	OK       bool          `json:"ok"`
	Replicas []replicaLogs `json:"replicas"`
	Problems []string      `json:"problems"`
}

// replicaLogs is one replica's files (in the order given: oldest first)
// and what verifying them against its recorded head found.
type replicaLogs struct {
	Replica      string   `json:"replica"`
	Files        []string `json:"files,omitempty"`
	Records      int      `json:"records"`
	Head         string   `json:"head,omitempty"`          // the files' last record
	RecordedHead string   `json:"recorded_head,omitempty"` // in the store
	Recorded     string   `json:"recorded_at,omitempty"`
	OK           bool     `json:"ok"`
}

// openHeadsStore opens --heads: a postgres:// URL, sqlite:PATH or a bare
// path to a SQLite file. It reads only: nothing is migrated or locked, so
// it runs next to a running gateway.
func openHeadsStore(ctx context.Context, heads string) (*store.Store, error) {
	dsn := heads
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") && !strings.HasPrefix(dsn, "sqlite:") {
		dsn = "sqlite:" + dsn
	}
	st, err := store.OpenWith(ctx, dsn, store.Options{NoMigrate: true})
	if err != nil {
		return nil, fmt.Errorf("--heads %s: %s", store.Redact(dsn), redactIn(err.Error(), heads, dsn))
	}
	return st, nil
}

// redactIn replaces any DSN it was given in msg with its redacted form:
// a driver error that quotes its input never shows the password.
func redactIn(msg string, dsns ...string) string {
	for _, d := range dsns {
		if r := store.Redact(d); r != d {
			msg = strings.ReplaceAll(msg, d, r)
		}
	}
	return msg
}

// fileReplica is the replica id of the log at path: that of its last
// record that carries one ("" when none does: a log written before
// replica ids, or by a gateway on SQLite's single head).
func fileReplica(path string) (string, error) {
	var id string
	_, err := audit.Scan(path, func(e audit.Entry) {
		if e.Record.Replica != "" {
			id = e.Record.Replica
		}
	})
	return id, err
}

// verifyHeads is `audit verify --file A --file B … --heads DSN`: it groups
// the files by the replica that wrote them, verifies each replica's chain,
// and checks that it holds the head that replica last recorded in the
// store (a file cut or replaced behind it fails, naming the file, the
// recorded seq and the last seq found). A recorded head none of the files
// belong to, and a replica with no recorded head, are failures too: every
// problem is one FAIL line, and any fails the run.
func verifyHeads(ctx context.Context, out io.Writer, paths []string, heads string, asJSON bool) error {
	st, err := openHeadsStore(ctx, heads)
	if err != nil {
		return fmt.Errorf("audit verify: %w", err)
	}
	defer st.Close()
	rows, err := st.AuditHeads(ctx)
	if err != nil {
		return fmt.Errorf("audit verify: --heads %s: %s", store.Redact(heads), redactIn(err.Error(), heads))
	}
	rep := headsReport{OK: true, Replicas: []replicaLogs{}, Problems: []string{}}
	fail := func(format string, args ...any) {
		rep.OK = false
		rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...))
	}
	var order []string
	byReplica := map[string][]string{}
	for _, p := range paths {
		// A SQLite store is one gateway's: its single head (the empty
		// key) is that of every file given.
		id, err := "", error(nil)
		if st.Kind() != store.SQLite {
			id, err = fileReplica(p)
		}
		if err != nil {
			fail("%s: %v", p, err)
			continue
		}
		if _, ok := byReplica[id]; !ok {
			order = append(order, id)
		}
		byReplica[id] = append(byReplica[id], p)
	}
	recorded := map[string]store.AuditHeadRow{}
	for _, r := range rows {
		recorded[r.Log] = r
	}
	for _, id := range order {
		files := byReplica[id]
		rl := replicaLogs{Replica: id, Files: files}
		head, n, problem := verifyChain(files)
		rl.Records, rl.Head = n, head.String()
		name := replicaName(id)
		if problem != "" {
			fail("%s", problem)
			rep.Replicas = append(rep.Replicas, rl)
			continue
		}
		r, ok := recorded[id]
		if !ok {
			fail("%s (%s): no head recorded in the store for it: the chain verifies but nothing shows it was not cut or replaced", strings.Join(files, ", "), name)
			rep.Replicas = append(rep.Replicas, rl)
			continue
		}
		want := audit.Head{Seq: r.Seq, Hash: r.Hash}
		rl.RecordedHead, rl.Recorded = want.String(), r.Updated.Format(time.RFC3339)
		if problem := headHeld(files, want, name); problem != "" {
			fail("%s", problem)
		} else {
			rl.OK = true
		}
		rep.Replicas = append(rep.Replicas, rl)
	}
	for _, r := range rows {
		if _, ok := byReplica[r.Log]; ok {
			continue
		}
		if host, path, legacy := strings.Cut(r.Log, ":"); legacy {
			// Replica ids hold no ':' (config.ReplicaRE): a head from before them.
			fail("%s: a head recorded before replica ids, by the gateway on host %s with audit.path %s (%s, recorded %s): that gateway's next start re-keys it to its replica_id; if that gateway is gone for good, check its file with `sluice audit verify --file F --expect-head %s`",
				r.Log, host, path, audit.Head{Seq: r.Seq, Hash: r.Hash}, r.Updated.Format(time.RFC3339), audit.Head{Seq: r.Seq, Hash: r.Hash})
			continue
		}
		fail("%s: its recorded head %s (recorded %s) is in none of the files given: give its file (--file)", replicaName(r.Log),
			audit.Head{Seq: r.Seq, Hash: r.Hash}, r.Updated.Format(time.RFC3339))
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		for _, rl := range rep.Replicas {
			if rl.OK {
				fmt.Fprintf(out, "ok: %s: %d records, chain intact (%s), head %s holds the recorded head %s (recorded %s)\n",
					replicaName(rl.Replica), rl.Records, strings.Join(rl.Files, ", "), rl.Head, rl.RecordedHead, rl.Recorded)
			}
		}
		for _, p := range rep.Problems {
			fmt.Fprintf(out, "FAIL: %s\n", p)
		}
	}
	if !rep.OK {
		return silentError{fmt.Sprintf("audit verify: %d problem(s) against the heads recorded in %s", len(rep.Problems), store.Redact(heads))}
	}
	return nil
}

func replicaName(id string) string {
	if id == "" {
		return "the log without a replica id (a SQLite store's single gateway)"
	}
	return "replica " + id
}

// verifyChain verifies files (one replica's, oldest first) as one chain,
// as `audit verify` does (verifyFiles), and returns its head and record
// count, or the problem found.
func verifyChain(files []string) (audit.Head, int, string) {
	head, total, err := verifyFiles(files, nil)
	var ve *audit.VerifyError
	var fe *fileError
	errors.As(err, &fe)
	switch {
	case err == nil:
		return head, total, ""
	case errors.As(err, &ve) && ve.Unfinished:
		return audit.Head{}, total, fmt.Sprintf("%s line %d: an unfinished write (not tampering; the gateway's next start removes it): %s", fe.path, ve.Line, ve.Reason)
	case errors.As(err, &ve):
		return audit.Head{}, total, fmt.Sprintf("%s line %d: chain broken: %s", fe.path, ve.Line, ve.Reason)
	}
	return audit.Head{}, total, err.Error()
}

// headHeld checks that files (one replica's, oldest first) hold want
// (findHead), and returns the problem if not.
func headHeld(files []string, want audit.Head, name string) string {
	f := findHead(files, want)
	switch {
	case f.held:
		return ""
	case f.err != nil:
		return fmt.Sprintf("%s (%s): %v", f.path, name, f.err)
	case f.rewritten != nil:
		return fmt.Sprintf("%s (%s): the record at seq %d has hash %s, the recorded head says %s: the file was replaced or rewritten", f.path, name, want.Seq, f.rewritten.At, want.Hash)
	case f.startsAfter:
		return fmt.Sprintf("%s (%s): starts after the recorded seq %d: give the file that holds it first", f.path, name, want.Seq)
	}
	return fmt.Sprintf("%s (%s): ends at seq %d, before the recorded head's seq %d (%s): truncated or replaced", strings.Join(files, ", "), name, f.got.Seq, want.Seq, want)
}

// holdRecords prints every record of the files whose fields name hold id
// (the hold it made, decided, granted or executed), in time order, with
// the file and replica of each: a hold made on one replica and executed
// on another reads as one story.
func holdRecords(out io.Writer, paths []string, id string) error {
	type found struct {
		path string
		rec  audit.Record
	}
	var recs []found
	for _, p := range paths {
		ch, err := audit.Scan(p, func(e audit.Entry) {
			if e.Err != "" {
				return
			}
			for _, k := range []string{"hold", "hold_id"} {
				if v, ok := e.Record.Fields[k].(string); ok && v == id {
					recs = append(recs, found{p, e.Record})
					return
				}
			}
		})
		if err != nil {
			return fmt.Errorf("audit hold: %w", err)
		}
		if ch.Break != nil {
			fmt.Fprintf(out, "warning: %s line %d does not verify (%s): records from there on are shown unverified\n", p, ch.Break.Line, ch.Break.Reason)
		}
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].rec.Time.Before(recs[j].rec.Time) })
	if len(recs) == 0 {
		return silentError{fmt.Sprintf("audit hold: no record names hold %s in %s", id, strings.Join(paths, ", "))}
	}
	for _, f := range recs {
		keys := make([]string, 0, len(f.rec.Fields))
		for k := range f.rec.Fields {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%v", k, f.rec.Fields[k])
		}
		replica := f.rec.Replica
		if replica == "" {
			replica = "-"
		}
		fmt.Fprintf(out, "%s %s %s seq %d %s%s\n", f.rec.Time.Format(time.RFC3339Nano), replica, f.path, f.rec.Seq, f.rec.Event, b.String())
	}
	return nil
}
