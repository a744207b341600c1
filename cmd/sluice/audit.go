package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/audit"
)

func auditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Work with the hash-chained audit log",
	}
	var files []string
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Check every hash, link and sequence number of the audit log",
		Long: `Read the whole audit log (audit.path from the config, or --file) and check that
every record's hash is right, that each links to the one before and that the
sequence numbers have no gap. Exits non-zero at the first break, naming its line.

A last line without its newline that is the start of the record due next is a
write cut short (a full disk, a crash): it was never acknowledged, and the
gateway's next start removes it. verify prints it as UNFINISHED, not FAIL, says
so, and still exits non-zero until it is gone.

A log the gateway re-created after its file was deleted or rotated starts with an
audit_log_recreated record that continues the old chain. Give the files in order
(--file old --file new) to check that each continues the one before; a single
re-created file is checked from its marker, and the output says that the records
before it are not in that file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			paths := files
			if len(paths) == 0 {
				lc, err := g.loadConfig()
				if err != nil {
					return fmt.Errorf("audit verify: %w", err)
				}
				paths = []string{lc.Audit.Path}
			}
			out := cmd.OutOrStdout()
			var seq uint64
			var prev string
			total := 0
			for i, path := range paths {
				res, err := verifyAudit(path, i == 0, seq, prev)
				if err != nil {
					var ve *audit.VerifyError
					if errors.As(err, &ve) && ve.Unfinished {
						fmt.Fprintf(out, "UNFINISHED: %s line %d: %s\n", path, ve.Line, ve.Reason)
						fmt.Fprintf(out, "note: an unfinished write, not tampering: the next start of the gateway on this log removes these %d bytes before it writes again (it logs \"audit: removed an unfinished last line\"); the %d records before them verify\n",
							ve.Bytes, total+ve.Line-1)
						return silentError{fmt.Sprintf("audit verify: unfinished write at line %d of %s (not tampering): the next start removes it", ve.Line, path)}
					}
					if errors.As(err, &ve) {
						fmt.Fprintf(out, "FAIL: %s line %d: %s\n", path, ve.Line, ve.Reason)
						return silentError{fmt.Sprintf("audit verify: chain broken at line %d of %s", ve.Line, path)}
					}
					return fmt.Errorf("audit verify: %w", err)
				}
				if res.fromMarker {
					fmt.Fprintf(out, "note: %s starts with an %s record at seq %d: it continues a chain whose records 1..%d are not in this file (give the earlier file first to check the link)\n",
						path, audit.EventRecreated, res.first, res.first-1)
				}
				if res.n > 0 {
					seq, prev = res.last+1, res.lastHash
				}
				total += res.n
			}
			fmt.Fprintf(out, "ok: %d records, chain intact (%s)\n", total, strings.Join(paths, ", "))
			return nil
		},
	}
	verify.Flags().StringArrayVar(&files, "file", nil, "a log to verify (default: audit.path from the config); repeat, oldest first, to check that each file continues the one before")
	cmd.AddCommand(verify)
	return cmd
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
