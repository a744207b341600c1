package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway"
	"github.com/sluice-gw/sluice/gateway/replay"
	"github.com/sluice-gw/sluice/policy"
)

func policyReplayCmd(g *globals) *cobra.Command {
	var files, paths []string
	var since, bundle, failOn string
	var asJSON, noMemo bool
	var workers int
	cmd := &cobra.Command{
		Use:   "replay --audit FILE… [--since T] [--policy DIR…] [--bundle F] [--json] [--fail-on loosened|changed]",
		Short: "Decide recorded calls again with a candidate policy and show what it would change",
		Long: `Read hash-chained audit logs, verifying each file's chain as it is read (a
broken chain is an error naming the file and line, and no report), take
every decision record that carries its input (audit.record_inputs), decide it
again with the candidate policy and print what changed: a table by tool and
rule (allow → ask, ask → block, …) with counts and the first records of each
(file:line, seq, time).

The candidate policy is built as serve builds it from the config (--config:
the simple rules under policies:, the agents' egress allowlists), with the
Rego modules of --policy (files or directories, repeatable) in place of the
config's rego: paths when given, and the OPA bundle of --bundle (a .tar.gz:
its modules and data, under its roots) in place of the config's
policy.bundle; a signed bundle is checked with policy.bundle.verification
when the config has one, and a bundle that does not load or verify is an
error, nothing replayed.

Records that cannot be replayed are counted as skipped with the reason: no
input recorded (older records, or audit.record_inputs: false), an input cut
to audit.record_input_max, an unreadable record, an evaluation that ran out
of time twice (the second time with ten times the budget).

Records whose input agrees on every field the policy reads are evaluated
once (exactly: a policy that reads input whole, replaces it with 'with', or
calls time.now_ns, rand.intn and the like is evaluated on every record, and
the report says why); --no-memo evaluates every record.

--json prints the report for CI. --fail-on loosened exits 1 when any call
would now be let through further than it was (block → ask, block → allow,
ask → allow); --fail-on changed when any call's action would change.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return errors.New("policy replay: --audit FILE is required (repeat it, oldest file first)")
			}
			switch failOn {
			case "", "loosened", "changed":
			default:
				return fmt.Errorf("policy replay: --fail-on: want loosened or changed, got %q", failOn)
			}
			var o replay.Options
			o.Workers = workers
			o.NoMemo = noMemo
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return fmt.Errorf("policy replay: --since: %w", err)
				}
				o.Since = t
			}
			lc, err := g.loadConfig()
			if err != nil {
				return fmt.Errorf("policy replay: %w", err)
			}
			ctx := cmd.Context()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			pc := gateway.PolicyConfig(lc.Config, log)
			if len(paths) > 0 {
				pc.Paths = paths
			}
			if bundle != "" {
				pc.Bundle = replayBundle(pc.Bundle, bundle)
			}
			eng, err := policy.New(ctx, pc)
			if err != nil {
				return fmt.Errorf("policy replay (%s): %w", lc.Source, err)
			}
			if os.Getenv("GOGC") == "" { // the operator's setting wins
				defer debug.SetGCPercent(debug.SetGCPercent(replay.GCPercent))
			}
			rep, err := replay.Run(ctx, eng, files, o)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printReplay(cmd.OutOrStdout(), rep)
			}
			msg := ""
			switch {
			case failOn == "loosened" && rep.Loosened > 0:
				msg = fmt.Sprintf("policy replay: %d recorded calls would now be let through further (--fail-on loosened)", rep.Loosened)
			case failOn == "changed" && rep.Changed > 0:
				msg = fmt.Sprintf("policy replay: %d recorded calls would now be decided differently (--fail-on changed)", rep.Changed)
			default:
				return nil
			}
			fmt.Fprintln(cmd.ErrOrStderr(), msg) // stdout stays the report (--json)
			return silentError{msg}
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&files, "audit", nil, "an audit log to replay (repeatable; oldest first)")
	f.StringVar(&since, "since", "", "replay only records from this time on: RFC 3339, or a duration before now (168h)")
	f.StringArrayVar(&paths, "policy", nil, "the candidate's Rego modules, a file or directory (repeatable); default the config's rego:")
	f.StringVar(&bundle, "bundle", "", "an OPA bundle (.tar.gz) as the candidate, in place of the config's policy.bundle (its verification key applies)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.StringVar(&failOn, "fail-on", "", "exit 1 when any call is: loosened (let through further) or changed (another action)")
	f.IntVar(&workers, "workers", 0, "deciding goroutines (default: one per CPU)")
	f.BoolVar(&noMemo, "no-memo", false, "evaluate every record, also those whose input agrees with an earlier one on every field the policy reads")
	return cmd
}

// replayBundle is the candidate bundle: the file in place of the
// config's policy.bundle file or URL, checked against the config's
// verification key when it has one (a candidate is held to what the
// gateway would require of it).
func replayBundle(cfg *policy.BundleConfig, file string) *policy.BundleConfig {
	b := &policy.BundleConfig{File: file}
	if cfg != nil {
		b.Verification = cfg.Verification
	}
	return b
}

// parseSince takes an RFC 3339 time or a duration before now.
func parseSince(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("want RFC 3339 (2026-03-01T00:00:00Z) or a positive duration (168h), got %q", v)
	}
	return now.Add(-d), nil
}

// printReplay prints the report for people.
func printReplay(w io.Writer, r *replay.Report) {
	verified := 0
	for _, f := range r.Files {
		verified += f.Verified
	}
	fmt.Fprintf(w, "%d files, %d records verified; %d decisions, %d replayed in %.2fs: %d unchanged, %d changed (%d loosened), %d by another rule\n",
		len(r.Files), verified, r.Decisions, r.Replayed, r.Seconds, r.Unchanged, r.Changed, r.Loosened, r.RuleOnly)
	fmt.Fprintf(w, "%d policy evaluations (memo %s)", r.Evaluated, r.Memo)
	if r.Retried > 0 {
		fmt.Fprintf(w, "; %d records timed out once and were evaluated again", r.Retried)
	}
	fmt.Fprintln(w)
	if len(r.Changes) > 0 {
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "\nTOOL\tDECISION\tRULE\tCALLS\tEXAMPLES")
		for _, c := range r.Changes {
			mark := ""
			if c.Loosened {
				mark = "  LOOSENED"
			}
			ex := make([]string, 0, len(c.Examples))
			for _, e := range c.Examples {
				ex = append(ex, fmt.Sprintf("%s:%d seq %d %s", e.File, e.Line, e.Seq, e.Time.UTC().Format(time.RFC3339)))
			}
			fmt.Fprintf(tw, "%s\t%s → %s%s\t%s → %s\t%d\t%s\n", c.Tool, c.From, c.To, mark, c.FromRule, c.ToRule, c.Count, strings.Join(ex, "; "))
		}
		tw.Flush()
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintln(w, "\nskipped:")
		reasons := make([]string, 0, len(r.Skipped))
		for k := range r.Skipped {
			reasons = append(reasons, k)
		}
		sort.Strings(reasons)
		for _, k := range reasons {
			fmt.Fprintf(w, "  %d  %s\n", r.Skipped[k], k)
		}
	}
}
