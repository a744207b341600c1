package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/audit"
)

func auditSessionCmd(g *globals) *cobra.Command {
	var (
		files  []string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "session SESSION",
		Short: "Print one session's timeline from the audit log",
		Long: `Print every record the gateway wrote for one session, in the order written: tool
calls, proxied requests, tunnels, the DNS questions it recorded, decisions, holds
and results. It is the review UI's session page as text: what a reviewer reads to
replay what an agent did.

It reads audit.path from the config, or the files given with --file (oldest
first, for a log that was rotated), and verifies each file's chain as
"audit verify" does. The last lines say, per file, up to where the chain
verifies. A record past a break is printed marked "!" and the command exits
non-zero: it is not proven to be what the gateway wrote. A line that is not a
record is reported with its line number, never skipped silently.

--json prints the session's records as they are in the log, one a line.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sess := args[0]
			paths := files
			if len(paths) == 0 {
				lc, err := g.loadConfig()
				if err != nil {
					return fmt.Errorf("audit session: %w", err)
				}
				paths = []string{lc.Audit.Path}
			}
			out := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			if !asJSON {
				fmt.Fprintln(tw, "SEQ\tTIME\tWHAT\tTO WHAT\tDECISION\tRESULT\tHOLD\tREQUEST")
			}
			n, unproven := 0, 0
			var notes []string
			for _, path := range paths {
				var skipped []string
				ch, err := audit.Scan(path, func(e audit.Entry) {
					if e.Err != "" {
						skipped = append(skipped, fmt.Sprintf("line %d: %s", e.Line, e.Err))
						return
					}
					if e.Record.Field("session") != sess {
						return
					}
					n++
					if !e.Verified {
						unproven++
					}
					if asJSON {
						fmt.Fprintf(out, "%s\n", e.Raw)
						return
					}
					b := audit.Briefly(e.Record)
					mark := ""
					if !e.Verified {
						mark = "!"
					}
					fmt.Fprintf(tw, "%s%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", mark, e.Record.Seq,
						e.Record.Time.UTC().Format(time.RFC3339Nano), termSafe(b.Kind+" ("+e.Record.Event+")"), termSafe(b.What),
						termSafe(b.Decision), termSafe(b.Result), termSafe(b.Hold), termSafe(e.Record.RequestID))
				})
				if err != nil {
					return fmt.Errorf("audit session: %w", err)
				}
				notes = append(notes, "chain: "+path+": "+ch.String())
				for _, s := range skipped {
					notes = append(notes, "not a record: "+path+" "+termSafe(s))
				}
			}
			if !asJSON {
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			w := out
			if asJSON {
				w = cmd.ErrOrStderr() // stdout stays JSON lines
			}
			fmt.Fprintf(w, "%d records of session %s\n", n, termSafe(sess))
			for _, s := range notes {
				fmt.Fprintln(w, s)
			}
			if n == 0 {
				return silentError{"audit session: no records of session " + strconv.Quote(sess) + " in " + strings.Join(paths, ", ")}
			}
			if unproven > 0 {
				fmt.Fprintf(w, "FAIL: %d of these records are past a break in the chain (marked !): they are not proven to be what the gateway wrote\n", unproven)
				return silentError{fmt.Sprintf("audit session: %d records past a break in the chain", unproven)}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&files, "file", nil, "an audit log to read (default: audit.path from the config); repeat, oldest first")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the session's records as JSON lines, as they are in the log")
	return cmd
}

// termSafe makes s safe to print on a terminal: control, bidi and other
// invisible characters (an agent chose some of these values) and bytes
// that are not UTF-8 are written as escapes, and an empty value as "-".
func termSafe(s string) string {
	if s == "" {
		return "-"
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\t' || r == '\n' || !unicode.IsPrint(r) || unicode.Is(unicode.Bidi_Control, r):
			fmt.Fprintf(&b, `\u{%04x}`, r)
		default:
			b.WriteRune(r)
		}
		i += n
	}
	return b.String()
}
