package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/store"
)

func auditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Work with the hash-chained audit log",
	}
	var (
		files       []string
		expect      string
		checkpoints string
		pubkey      string
		heads       string
		asJSON      bool
	)
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Check every hash, link and sequence number of the audit log",
		Long: `Read the whole audit log (audit.path from the config, or --file) and check that
every record's hash is right, that each links to the one before and that the
sequence numbers have no gap. Exits non-zero at the first break, naming its line.
Prints the head it verified to (SEQ:HASH of the last record).

The chain alone cannot show that the last records were deleted, or that the
whole file was rewritten with a recomputed chain. --expect-head SEQ:HASH (a head
printed earlier, or kept elsewhere) fails when the log ends before SEQ or holds
another record there. --checkpoints FILE does the same against the newest of the
gateway's signed checkpoints (audit.checkpoint), after checking every
checkpoint's Ed25519 signature against --public-key (hex), or the public half of
audit.checkpoint.key_file from the config.

A last line without its newline that is the start of the record due next is a
write cut short (a full disk, a crash): it was never acknowledged, and the
gateway's next start removes it. verify prints it as UNFINISHED, not FAIL, says
so, and still exits non-zero until it is gone.

A log the gateway re-created after its file was deleted or rotated starts with an
audit_log_recreated record that continues the old chain. Give the files in order
(--file old --file new) to check that each continues the one before; a single
re-created file is checked from its marker, and the output says that the records
before it are not in that file.

Several replicas (gateway.replica_id) each write their own file and record
its head in the shared store. --heads postgres://…, sqlite:PATH or a SQLite
file path, with every replica's files (--file, a replica's oldest first),
groups the files by the replica id their records carry, verifies each
replica's chain and checks that it holds the head that replica last recorded:
a file cut or replaced behind it fails, naming the file, the recorded seq and
the last seq found. A recorded head whose file is not given, and a file whose
replica recorded none, fail too. One line per problem; --json prints the
report as JSON. The store is only read (nothing migrated or locked).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if heads != "" {
				if len(files) == 0 || expect != "" || checkpoints != "" {
					return errors.New("audit verify: --heads: give every replica's log with --file (and no --expect-head or --checkpoints)")
				}
				return verifyHeads(cmd.Context(), cmd.OutOrStdout(), files, heads, asJSON)
			}
			if asJSON {
				return errors.New("audit verify: --json: only with --heads")
			}
			var want audit.Head
			if expect != "" {
				var err error
				if want, err = audit.ParseHead(expect); err != nil {
					return fmt.Errorf("audit verify: --expect-head: %w", err)
				}
			}
			paths := files
			var lc *loadedConfig
			if len(paths) == 0 || (checkpoints != "" && pubkey == "") {
				var err error
				if lc, err = g.loadConfig(); err != nil {
					return fmt.Errorf("audit verify: %w", err)
				}
			}
			if len(paths) == 0 {
				paths = []string{lc.Audit.Path}
			}
			out := cmd.OutOrStdout()
			head, total, err := verifyFiles(paths, func(path string, res verified) {
				fmt.Fprintf(out, "note: %s starts with an %s record at seq %d: it continues a chain whose records 1..%d are not in this file (give the earlier file first to check the link)\n",
					path, audit.EventRecreated, res.first, res.first-1)
			})
			if err != nil {
				var ve *audit.VerifyError
				var fe *fileError
				errors.As(err, &fe)
				if errors.As(err, &ve) && ve.Unfinished {
					fmt.Fprintf(out, "UNFINISHED: %s line %d: %s\n", fe.path, ve.Line, ve.Reason)
					fmt.Fprintf(out, "note: an unfinished write, not tampering: the next start of the gateway on this log removes these %d bytes before it writes again (it logs \"audit: removed an unfinished last line\"); the %d records before them verify\n",
						ve.Bytes, total+ve.Line-1)
					return silentError{fmt.Sprintf("audit verify: unfinished write at line %d of %s (not tampering): the next start removes it", ve.Line, fe.path)}
				}
				if errors.As(err, &ve) {
					fmt.Fprintf(out, "FAIL: %s line %d: %s\n", fe.path, ve.Line, ve.Reason)
					return silentError{fmt.Sprintf("audit verify: chain broken at line %d of %s", ve.Line, fe.path)}
				}
				return fmt.Errorf("audit verify: %w", fe.err)
			}
			fmt.Fprintf(out, "ok: %d records, chain intact (%s)\nhead: %s\n", total, strings.Join(paths, ", "), head)
			if expect != "" {
				if err := holdsHead(out, paths, want, "--expect-head"); err != nil {
					return err
				}
			}
			if checkpoints != "" {
				pub, err := checkpointPublicKey(lc, pubkey)
				if err != nil {
					return fmt.Errorf("audit verify: %w", err)
				}
				newest, n, err := audit.ReadCheckpoints(checkpoints, pub)
				if err != nil {
					fmt.Fprintf(out, "FAIL: %v\n", err)
					return silentError{"audit verify: checkpoints do not verify"}
				}
				fmt.Fprintf(out, "checkpoints: %d signed by %x, newest %s at %s\n", n, []byte(pub), newest.Head(), newest.Time.Format(time.RFC3339))
				if err := holdsHead(out, paths, newest.Head(), "the newest checkpoint"); err != nil {
					return err
				}
			}
			return nil
		},
	}
	verify.Flags().StringArrayVar(&files, "file", nil, "a log to verify (default: audit.path from the config); repeat, oldest first, to check that each file continues the one before")
	verify.Flags().StringVar(&expect, "expect-head", "", "SEQ:HASH the log must hold (a head printed or recorded earlier): fails when the log ends before SEQ or its record SEQ has another hash")
	verify.Flags().StringVar(&checkpoints, "checkpoints", "", "a checkpoint file (audit.checkpoint.path): every signature must verify and the log must hold the newest checkpoint's head")
	verify.Flags().StringVar(&pubkey, "public-key", "", "hex Ed25519 public key the checkpoints must be signed with (default: from audit.checkpoint.key_file)")
	verify.Flags().StringVar(&heads, "heads", "", "the store the replicas record their audit heads in (postgres://…, sqlite:PATH or a path): every file must hold its replica's recorded head")
	verify.Flags().BoolVar(&asJSON, "json", false, "with --heads: print the report as JSON")
	var holdFiles []string
	hold := &cobra.Command{
		Use:   "hold ID",
		Short: "Print every record naming a hold, from every replica's file, in time order",
		Long: `A hold made on one replica may be decided and executed on another: each writes
its own audit file. This prints the records of the files given (--file, one
or more; default audit.path from the config) that name the hold, in time
order, each with its replica id, file and seq. It exits non-zero when no
record names it. It does not verify the chains (audit verify does).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			paths := holdFiles
			if len(paths) == 0 {
				lc, err := g.loadConfig()
				if err != nil {
					return fmt.Errorf("audit hold: %w", err)
				}
				paths = []string{lc.Audit.Path}
			}
			return holdRecords(cmd.OutOrStdout(), paths, args[0])
		},
	}
	hold.Flags().StringArrayVar(&holdFiles, "file", nil, "an audit file to read (repeat for every replica's)")
	cmd.AddCommand(verify, hold, acceptHeadCmd(g), auditSessionCmd(g))
	return cmd
}

// holdsHead checks that the verified files (oldest first) hold want,
// printing the outcome.
func holdsHead(out io.Writer, paths []string, want audit.Head, what string) error {
	f := findHead(paths, want)
	switch {
	case f.err != nil:
		return fmt.Errorf("audit verify: %w", f.err)
	case f.rewritten != nil:
		fmt.Fprintf(out, "FAIL: %s: the record at seq %d has hash %s, %s says %s: the log was rewritten\n", f.path, want.Seq, f.rewritten.At, what, want.Hash)
		return silentError{fmt.Sprintf("audit verify: the log does not hold %s %s", what, want)}
	case f.startsAfter:
		fmt.Fprintf(out, "FAIL: %s starts after seq %d: give the file that holds it (%s %s)\n", f.path, want.Seq, what, want)
		return silentError{fmt.Sprintf("audit verify: %s %s is not in the files given", what, want)}
	case f.held:
		fmt.Fprintf(out, "ok: the log holds %s %s\n", what, want)
		return nil
	}
	if f.truncated {
		fmt.Fprintf(out, "FAIL: the log ends at seq %d, before seq %d of %s %s: records were deleted from its end\n", f.got.Seq, want.Seq, what, want)
	}
	return silentError{fmt.Sprintf("audit verify: the log does not hold %s %s", what, want)}
}

// headFound is where findHead found a head in a replica's files.
type headFound struct {
	held        bool
	path        string           // the file that decided it
	rewritten   *audit.HeadError // the record at the head's seq has another hash
	startsAfter bool             // path starts after the head's seq
	truncated   bool             // every file ends before it; got is the last head seen
	got         audit.Head
	err         error
}

// findHead looks for want in the verified files (oldest first), with
// audit.CheckHead: for `audit verify --expect-head/--checkpoints` and for
// every replica's recorded head (--heads).
func findHead(paths []string, want audit.Head) headFound {
	var f headFound
	for _, path := range paths {
		f.path = path
		_, ok, err := audit.CheckHead(path, want)
		var he *audit.HeadError
		switch {
		case errors.As(err, &he) && he.Truncated:
			f.truncated, f.got = true, he.Got
			continue // in a later file, or nowhere
		case errors.As(err, &he):
			f.rewritten = he
		case err != nil:
			f.err = err
		case !ok:
			f.startsAfter = true
		default:
			f.held = true
		}
		return f
	}
	return f
}

// fileError is an error of verifyFiles with the file it concerns.
type fileError struct {
	path string
	err  error
}

func (e *fileError) Error() string { return e.path + ": " + e.err.Error() }
func (e *fileError) Unwrap() error { return e.err }

// verifyFiles verifies paths (one log's files, oldest first) as one
// chain, each with verifyAudit (audit.VerifyFrom), and returns its head
// and record count; marker is told of a first file that starts at a
// re-creation marker. An error is a *fileError naming the file.
func verifyFiles(paths []string, marker func(path string, res verified)) (audit.Head, int, error) {
	var (
		seq   uint64
		prev  string
		total int
	)
	for i, path := range paths {
		res, err := verifyAudit(path, i == 0, seq, prev)
		if err != nil {
			return audit.Head{}, total, &fileError{path, err}
		}
		if res.fromMarker && marker != nil {
			marker(path, res)
		}
		if res.n > 0 {
			seq, prev = res.last+1, res.lastHash
		}
		total += res.n
	}
	if seq == 0 {
		return audit.Head{Hash: audit.ZeroHash}, total, nil
	}
	return audit.Head{Seq: seq - 1, Hash: prev}, total, nil
}

// appendAccepted appends the audit_head_accepted record to the log at path
// and returns the head it makes.
func appendAccepted(ctx context.Context, path, replica string, found audit.Head, was string) (audit.Head, error) {
	l, err := audit.OpenWith(path, audit.Options{Replica: replica})
	if err != nil {
		return audit.Head{}, err
	}
	by := strconv.Itoa(os.Getuid())
	if u, err := user.Current(); err == nil {
		by = u.Username
	}
	rec, err := l.Append(ctx, audit.Record{Event: audit.EventHeadAccepted, Fields: map[string]any{
		"accepted_head": found.String(), "previous_head": was, "by": by,
	}})
	if cerr := l.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return audit.Head{}, err
	}
	return audit.Head{Seq: rec.Seq, Hash: rec.Hash}, nil
}

// checkpointPublicKey is --public-key, or the public half of the config's
// checkpoint key.
func checkpointPublicKey(lc *loadedConfig, hexKey string) (ed25519.PublicKey, error) {
	if hexKey != "" {
		pub, err := audit.ParsePublicKey(hexKey)
		if err != nil {
			return nil, fmt.Errorf("--public-key: %w", err)
		}
		return pub, nil
	}
	cp := lc.Audit.Checkpoint
	if cp == nil {
		return nil, errors.New("--checkpoints: give --public-key, or set audit.checkpoint in the config")
	}
	key, err := audit.LoadCheckpointKey(cp.KeyFile, false)
	if err != nil {
		return nil, err
	}
	return key.Public().(ed25519.PublicKey), nil
}

func acceptHeadCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "accept-head",
		Short: "Accept the audit log's current head after the log was replaced on purpose",
		Long: `The gateway records the audit log's head in its store (and in signed checkpoints
when audit.checkpoint is set) and refuses to start on a log that ends before
that head or holds another record at its seq: the log was truncated or rewritten.
When that was done on purpose (a restored backup, a log deliberately cut), run
this with the gateway stopped: it verifies the log's chain, appends an
audit_head_accepted record naming the file's head, the head it replaces and who
ran it, and records the head after it as the one to continue (in the store, and
as a new checkpoint). It prints the heads. Never run it to make a refusal go away without knowing why
the log changed: that is the refusal's whole point.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lc, err := g.loadConfig()
			if err != nil {
				return fmt.Errorf("audit accept-head: %w", err)
			}
			path := lc.Audit.Path
			res, err := verifyAudit(path, true, 0, "")
			if err != nil {
				return fmt.Errorf("audit accept-head: %s does not verify, nothing accepted: %w", path, err)
			}
			found := audit.Head{Hash: audit.ZeroHash}
			if res.n > 0 {
				found = audit.Head{Seq: res.last, Hash: res.lastHash}
			}
			ctx := cmd.Context()
			// The store is one gateway's (flock): a running gateway makes
			// this fail here, before anything is written.
			st, err := store.OpenWith(ctx, lc.Store, store.Options{AuditLog: path, Replica: lc.Gateway.ReplicaID})
			if err != nil {
				return fmt.Errorf("audit accept-head: %w", err)
			}
			defer st.Close()
			seq, hash, _, had, err := st.AuditHead(ctx)
			if err != nil {
				return fmt.Errorf("audit accept-head: %w", err)
			}
			was := "none"
			if had {
				was = audit.Head{Seq: seq, Hash: hash}.String()
			}
			// The acceptance is itself a record of the chain, so a reader of
			// the log sees where a head was accepted and what was replaced.
			head, err := appendAccepted(ctx, path, lc.Gateway.ReplicaID, found, was)
			if err != nil {
				return fmt.Errorf("audit accept-head: %w", err)
			}
			if err := st.SetAuditHead(ctx, head.Seq, head.Hash); err != nil {
				return fmt.Errorf("audit accept-head: %w", err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "accepted head %s of %s (the store had %s); recorded as %s, the new head %s\n", found, path, was, audit.EventHeadAccepted, head)
			if cp := lc.Audit.Checkpoint; cp != nil {
				key, err := audit.LoadCheckpointKey(cp.KeyFile, true)
				if err != nil {
					return fmt.Errorf("audit accept-head: %w", err)
				}
				if err := audit.AppendCheckpoint(cp.Path, audit.NewCheckpoint(key, head, time.Now())); err != nil {
					return fmt.Errorf("audit accept-head: %w", err)
				}
				fmt.Fprintf(out, "checkpoint of %s appended to %s\n", head, cp.Path)
			}
			return nil
		},
	}
}

// verified is what one file's verification found.
type verified struct {
	n           int
	first, last uint64
	lastHash    string
	fromMarker  bool // a first file that starts at a re-creation marker
}

// verifyAudit verifies the file at path. The first file of a run starts
// at seq 1 unless its first record is a re-creation marker; a later file
// must continue at seq with prev.
func verifyAudit(path string, first bool, seq uint64, prev string) (verified, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return verified{}, err
	}
	var head audit.Record
	if nl := bytes.IndexByte(data, '\n'); nl > 0 {
		_ = json.Unmarshal(data[:nl], &head)
	}
	v := verified{}
	if first {
		seq, prev = 1, audit.ZeroHash
		if head.Event == audit.EventRecreated && head.Seq > 1 {
			seq, prev, v.fromMarker = head.Seq, head.Prev, true
		}
	}
	v.first = seq
	n, err := audit.VerifyFrom(bytes.NewReader(data), seq, prev)
	if err != nil {
		return verified{}, err
	}
	v.n = n
	if n > 0 {
		v.last = seq + uint64(n) - 1
		lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
		var tail audit.Record
		if err := json.Unmarshal(lines[len(lines)-1], &tail); err != nil {
			return verified{}, fmt.Errorf("%s: last record: %w", path, err)
		}
		v.lastHash = tail.Hash
	}
	return v, nil
}
