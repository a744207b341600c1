package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway"
	"github.com/sluice-gw/sluice/gateway/catalog"
	"github.com/sluice-gw/sluice/gateway/config"
)

func validateCmd(g *globals) *cobra.Command {
	var strict bool
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check the config, its specs, its Rego and its secret references without listening",
		Long: `Load everything serve would load — the config (strictly: a misspelt key is an
error naming its path), every connector's OpenAPI spec, the Rego, every secret
reference — and report every problem found: errors (non-zero exit) and
warnings (printed; exit 0). Besides what serve refuses, it flags what would
fail at every call: a private or loopback base_url that no allow_private
covers, an ask rule nobody can approve, operations the credential cannot be
attached to; and an allow_private wider than the base URL needs. Opens no
listener, writes nothing.

A vendor's spec is loaded leniently: an operation that cannot be understood is
skipped, and a defect that touches no operation drops nothing. Every skipped
operation and every defect is printed (with its JSON pointer into the spec) as
a warning; --strict (or strict: true on a connector) makes each an error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			lc, err := g.loadConfig()
			if err != nil {
				return printProblems(out, err)
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			// One load of every spec: Check returns what it loaded.
			f := gateway.Check(cmd.Context(), lc.Config, gateway.CheckOptions{Logger: log, Strict: strict, Defects: true})
			for _, w := range f.Warnings {
				for _, p := range problems(w) {
					fmt.Fprintln(out, "warning:", p)
				}
			}
			if len(f.Errors) > 0 {
				return printProblems(out, fmt.Errorf("%s: %w", lc.Source, errors.Join(f.Errors...)))
			}
			n := printSkipped(out, f.Connectors)
			tools := 0
			for _, c := range f.Connectors {
				tools += len(c.Tools)
			}
			fmt.Fprintf(out, "ok: %d connectors, %d tools, %d rules, %d modules, %d warnings (%s)\n", len(f.Connectors), tools, len(lc.Policies), f.Modules, n+len(f.Warnings), lc.Source)
			return nil
		},
	}
	cmd.Flags().BoolVar(&strict, "strict", false, "fail on any skipped operation or spec defect (all-or-nothing loading)")
	return cmd
}

// printSkipped prints, per connector, every operation its spec yielded no
// tool for and every defect found, and returns how many lines it printed.
func printSkipped(w io.Writer, conns []*connectors.Connector) int {
	n := 0
	for _, c := range conns {
		for _, p := range c.Skipped {
			fmt.Fprintf(w, "warning: %s: skipped %s\n", c.Slug, p)
			n++
		}
		for _, p := range c.Defects {
			fmt.Fprintf(w, "warning: %s: defect %s\n", c.Slug, p)
			n++
		}
	}
	return n
}

// printProblems lists every problem in err, one a line, and returns the
// silent error that makes the exit status non-zero.
func printProblems(w io.Writer, err error) error {
	ps := problems(err)
	for _, p := range ps {
		fmt.Fprintln(w, "error:", p)
	}
	return silentError{fmt.Sprintf("validate: %d problem(s)", len(ps))}
}

// loadConnectors loads the spec of every configured connector, or only of
// those whose slug is in only when only is non-nil, and reports every
// connector that fails, not the first. It makes no upstream call; a spec
// given as an https URL is fetched through the egress guard with the
// connector's allow_private, as the gateway fetches it. strict applies to
// every connector.
func loadConnectors(ctx context.Context, cfg *config.Config, only []string, strict bool) ([]*connectors.Connector, error) {
	var out []*connectors.Connector
	var errs []error
	for i, cc := range cfg.Connectors {
		if only != nil && !slices.Contains(only, cc.Slug) {
			continue
		}
		c, err := connectors.Load(ctx, connectors.Options{Slug: cc.Slug, Spec: cc.Spec, BaseURL: cc.BaseURL, Client: catalog.SpecClient(cc), Strict: strict || cc.Strict, Defects: true})
		if err != nil {
			errs = append(errs, fmt.Errorf("connectors[%d].spec: %w", i, err))
			continue
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

func toolsCmd(g *globals) *cobra.Command {
	var agent string
	var asJSON, strict bool
	cmd := &cobra.Command{
		Use:   "tools",
		Short: "List the tools the configured connectors provide",
		Long: `Load every connector's spec and list its tools: name, risk, method and path.
--agent limits the list to the connectors that agent is granted; --json prints
each tool with its argument schema. Policy is not applied: a tool listed here
may still be blocked for a caller (see sluice policy eval).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lc, err := g.loadConfig()
			if err != nil {
				return fmt.Errorf("tools: %w", err)
			}
			var only []string
			if agent != "" {
				a := lc.Agent(agent)
				if a == nil {
					return fmt.Errorf("tools: %s has no agent %q", lc.Source, agent)
				}
				only = append([]string{}, a.Connectors...)
			}
			conns, err := loadConnectors(cmd.Context(), lc.Config, only, strict)
			if err != nil {
				return fmt.Errorf("tools (%s): %w", lc.Source, err)
			}
			printSkipped(cmd.ErrOrStderr(), conns) // stdout stays the list (or the JSON)
			return printTools(cmd.OutOrStdout(), conns, asJSON)
		},
	}
	cmd.Flags().StringVar(&agent, "agent", "", "list only the tools of the connectors granted to this agent")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON with each tool's argument schema")
	cmd.Flags().BoolVar(&strict, "strict", false, "fail on any skipped operation or spec defect (all-or-nothing loading)")
	return cmd
}

// toolJSON is one tool in `sluice tools --json`.
type toolJSON struct {
	Name        string          `json:"name"`
	Alias       string          `json:"alias"`
	Connector   string          `json:"connector"`
	Risk        string          `json:"risk"`
	Method      string          `json:"method"`
	Path        string          `json:"path"`
	Summary     string          `json:"summary,omitempty"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema"`
}

func printTools(w io.Writer, conns []*connectors.Connector, asJSON bool) error {
	if asJSON {
		out := []toolJSON{}
		for _, c := range conns {
			for _, t := range c.Tools {
				out = append(out, toolJSON{
					Name: t.Name, Alias: t.Alias, Connector: t.Connector, Risk: t.Risk.String(),
					Method: t.Method, Path: t.PathTemplate, Summary: t.Summary,
					Description: t.Description, Schema: t.Schema,
				})
			}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tALIAS\tRISK\tMETHOD\tPATH")
	for _, c := range conns {
		for _, t := range c.Tools {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, t.Alias, t.Risk, t.Method, t.PathTemplate)
		}
	}
	return tw.Flush()
}
