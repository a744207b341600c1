package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/policy"
)

func policyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Test and evaluate the policy (shipped Rego library, simple rules, your rego: modules)",
	}
	cmd.AddCommand(policyTestCmd(g), policyEvalCmd(g))
	return cmd
}

// engineConfig is the policy configuration the gateway builds from cfg.
func engineConfig(cfg *config.Config, log *slog.Logger) policy.Config {
	rules := make([]policy.Rule, 0, len(cfg.Policies))
	for _, p := range cfg.Policies {
		rules = append(rules, policy.Rule{Match: p.Match, Action: p.Action, Approvers: p.Approvers, Reason: p.Reason})
	}
	return policy.Config{Rules: rules, Paths: cfg.Rego, Logger: log}
}

func policyEvalCmd(g *globals) *cobra.Command {
	var inputFile string
	cmd := &cobra.Command{
		Use:   "eval --input FILE",
		Short: "Decide one input document with the configured policy and print the decision",
		Long: `Build the policy engine exactly as serve does (shipped library, the simple rules
under policies:, the modules under rego:) and decide the input document in FILE
(- for stdin). The document is the one the gateway builds for every call
(rego/README.md); unknown keys are an error. "version" defaults to the current
input version. Prints the decision as JSON: action, reason, rule, approvers,
obligations.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if inputFile == "" {
				return errors.New("policy eval: --input FILE is required")
			}
			lc, err := g.loadConfig()
			if err != nil {
				return fmt.Errorf("policy eval: %w", err)
			}
			in, err := readInput(cmd.InOrStdin(), inputFile)
			if err != nil {
				return fmt.Errorf("policy eval: %w", err)
			}
			ctx := cmd.Context()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			eng, err := policy.New(ctx, engineConfig(lc.Config, log))
			if err != nil {
				return fmt.Errorf("policy eval (%s): %w", lc.Source, err)
			}
			d, err := eng.Eval(ctx, in)
			if err != nil {
				return fmt.Errorf("policy eval: input %s: %w", inputFile, err)
			}
			return printDecision(cmd.OutOrStdout(), d)
		},
	}
	cmd.Flags().StringVar(&inputFile, "input", "", "the input document (JSON), - for stdin")
	return cmd
}

// readInput reads the input document from a file or, for "-", stdin.
// Decoding is policy.DecodeInput's: strict, so a misspelt field cannot
// silently change the decision.
func readInput(stdin io.Reader, name string) ([]byte, error) {
	var data []byte
	var err error
	if name == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, 8<<20))
	} else {
		data, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, fmt.Errorf("read input: %w", err)
	}
	return data, nil
}

// decisionJSON is a policy.Decision with its action spelt out.
type decisionJSON struct {
	Action      string         `json:"action"`
	Reason      string         `json:"reason"`
	Rule        string         `json:"rule"`
	Approvers   []string       `json:"approvers"`
	Obligations map[string]any `json:"obligations"`
}

func printDecision(w io.Writer, d policy.Decision) error {
	out := decisionJSON{Action: d.Action.String(), Reason: d.Reason, Rule: d.Rule, Approvers: d.Approvers, Obligations: d.Obligations}
	if out.Approvers == nil {
		out.Approvers = []string{}
	}
	if out.Obligations == nil {
		out.Obligations = map[string]any{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func policyTestCmd(g *globals) *cobra.Command {
	var verbose bool
	cmd := &cobra.Command{
		Use:   "test [PATH...]",
		Short: "Run the Rego tests: the shipped library's and your modules' *_test.rego",
		Long: `Run every test rule (test_*) of the shipped library and of the given files or
directories (default: the config's rego: paths), with the same restricted
capabilities the gateway uses. The config's simple rules (policies:) are not
loaded: a test supplies the rules it needs with
"with data.sluice.config.rules as ...", as the shipped library's tests do. Prints PASS or FAIL per test and a summary;
exits non-zero if any test fails or errors.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, err := g.loadConfig()
			if err != nil {
				return fmt.Errorf("policy test: %w", err)
			}
			paths := args
			if len(paths) == 0 {
				paths = lc.Rego
			}
			// The tests run without the config's simple rules: the shipped
			// library's tests bring their own data (with data.sluice.config.rules
			// as ...), and a test that depends on whatever policies: a config
			// happens to hold would pass or fail with the config.
			return runPolicyTests(cmd.Context(), cmd.OutOrStdout(), paths, nil, verbose)
		},
	}
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "also print each test's duration")
	return cmd
}

// runPolicyTests runs policy.Test with the shipped library and paths, and
// prints one line per test and a summary.
func runPolicyTests(ctx context.Context, w io.Writer, paths []string, rules []policy.Rule, verbose bool) error {
	rep, err := policy.Test(ctx, paths, rules)
	if err != nil {
		return fmt.Errorf("policy test: %w", err)
	}
	for _, r := range rep.Results {
		where := r.File
		if r.Row > 0 {
			where = fmt.Sprintf("%s:%d", r.File, r.Row)
		}
		name := strings.TrimPrefix(r.Package, "data.") + "." + r.Name
		switch r.Outcome {
		case "pass":
			if verbose {
				fmt.Fprintf(w, "PASS  %s (%s)\n", name, r.Duration.Round(time.Microsecond))
			} else {
				fmt.Fprintf(w, "PASS  %s\n", name)
			}
		case "skip":
			fmt.Fprintf(w, "SKIP  %s  %s\n", name, where)
		case "error":
			fmt.Fprintf(w, "ERROR %s  %s: %s\n", name, where, r.Error)
		default:
			fmt.Fprintf(w, "FAIL  %s  %s\n", name, where)
		}
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d errors, %d skipped\n", rep.Passed, rep.Failed, rep.Errored, rep.Skipped)
	if !rep.OK() {
		if rep.Passed+rep.Failed+rep.Errored == 0 {
			return silentError{"policy test: no tests found"}
		}
		return silentError{fmt.Sprintf("policy test: %d failed, %d errors", rep.Failed, rep.Errored)}
	}
	return nil
}
