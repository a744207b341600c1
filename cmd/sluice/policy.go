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

	"github.com/sluice-gw/sluice/gateway"
	"github.com/sluice-gw/sluice/gateway/catalog"
	"github.com/sluice-gw/sluice/gateway/toolinput"
	"github.com/sluice-gw/sluice/policy"
)

func policyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Test and evaluate the policy (shipped Rego library, simple rules, your rego: modules)",
	}
	cmd.AddCommand(policyTestCmd(g), policyEvalCmd(g), policyReplayCmd(g), policyInputCmd(g))
	return cmd
}

func policyEvalCmd(g *globals) *cobra.Command {
	var inputFile, tool, args, when string
	var caller policy.Caller
	cmd := &cobra.Command{
		Use:   "eval (--input FILE | --tool T --agent A [--args JSON])",
		Short: "Decide one call with the configured policy and print the decision",
		Long: `Build the policy engine exactly as serve does (shipped library, the simple rules
under policies:, the modules under rego:) and decide one call.

With --tool T --agent A [--args '{"path":{…},"query":{…},"headers":{…},"body":…}']
the input document is built by the gateway's own code for POST /v1/tools/T:
the connector's spec loaded as serve loads it, T found by name or alias, the
agent's grant checked, the arguments validated against the tool's schema and
turned into the upstream request. A call the gateway refuses before policy
(unknown_tool, not_granted, schema_violation) is an error saying so. --sandbox,
--session and --user complete the caller; --time (RFC 3339) fixes input.time.

With --input FILE (- for stdin) the document is taken as written
(rego/README.md); unknown keys are an error and "version" defaults to the
current input version.

Prints the decision as JSON: action, reason, rule, approvers, obligations.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case inputFile != "" && tool != "":
				return errors.New("policy eval: --input and --tool are exclusive")
			case inputFile == "" && tool == "":
				return errors.New("policy eval: --input FILE or --tool T --agent A is required")
			case tool != "" && caller.Agent == "":
				return errors.New("policy eval: --tool needs --agent (the grant and the input's caller.agent)")
			}
			lc, err := g.loadConfig()
			if err != nil {
				return fmt.Errorf("policy eval: %w", err)
			}
			ctx := cmd.Context()
			var in *policy.Input
			if tool != "" {
				call := toolinput.Call{Tool: tool, Args: []byte(args), Caller: caller}
				if when != "" {
					if call.Time, err = time.Parse(time.RFC3339Nano, when); err != nil {
						return fmt.Errorf("policy eval: --time: want RFC 3339 like 2025-03-01T12:00:00Z: %w", err)
					}
				}
				if in, err = catalog.ToolCallInput(ctx, lc.Config, call); err != nil {
					return fmt.Errorf("policy eval (%s): %w", lc.Source, err)
				}
			} else {
				raw, err := readInput(cmd.InOrStdin(), inputFile)
				if err != nil {
					return fmt.Errorf("policy eval: %w", err)
				}
				if in, err = policy.DecodeInput(raw); err != nil {
					return fmt.Errorf("policy eval: input %s: %w", inputFile, err)
				}
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			eng, err := policy.New(ctx, gateway.PolicyConfig(lc.Config, log))
			if err != nil {
				return fmt.Errorf("policy eval (%s): %w", lc.Source, err)
			}
			return printDecision(cmd.OutOrStdout(), eng.Decide(ctx, in))
		},
	}
	f := cmd.Flags()
	f.StringVar(&inputFile, "input", "", "the input document (JSON), - for stdin")
	f.StringVar(&tool, "tool", "", "the tool called (name or alias): build the input as the gateway does")
	f.StringVar(&args, "args", "{}", `the call's arguments as the agent POSTs them: {"path":{…},"query":{…},"headers":{…},"body":…}`)
	f.StringVar(&caller.Agent, "agent", "", "the calling agent (with --tool)")
	f.StringVar(&caller.Sandbox, "sandbox", "", "the calling sandbox (with --tool)")
	f.StringVar(&caller.Session, "session", "", "the caller's session (with --tool)")
	f.StringVar(&caller.User, "user", "", "the user the sandbox runs for (with --tool)")
	f.StringVar(&when, "time", "", "input.time, RFC 3339 (with --tool; default now)")
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
	var verbose, withConfig bool
	cmd := &cobra.Command{
		Use:   "test [PATH...]",
		Short: "Run the Rego tests: the shipped library's and your modules' *_test.rego",
		Long: `Run every test rule (test_*) of the shipped library and of the given files or
directories (default: the config's rego: paths), with the same restricted
capabilities the gateway uses. Prints PASS or FAIL per test and a summary;
exits non-zero if any test fails or errors.

By default the config's simple rules (policies:) are not loaded: a test
supplies the rules it needs with "with data.sluice.config.rules as ...", as the
shipped library's tests do, so it passes or fails whatever the config holds.
--with-config compiles the config's simple rules and agents' egress allowlists
into data.sluice.config exactly as serve does, so that a test can check what
the config decides: data.sluice.main.decision with input as {...} is then the
gateway's decision (rule "policies[N]" names the config's rule N).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			lc, err := g.loadConfig()
			if err != nil {
				return fmt.Errorf("policy test: %w", err)
			}
			paths := args
			if len(paths) == 0 {
				paths = lc.Rego
			}
			var pc policy.Config
			if withConfig {
				pc = gateway.PolicyConfig(lc.Config, nil)
			}
			return runPolicyTests(cmd.Context(), cmd.OutOrStdout(), paths, pc, verbose)
		},
	}
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "also print each test's duration")
	cmd.Flags().BoolVar(&withConfig, "with-config", false, "compile the config's simple rules and egress allowlists into data, as serve does")
	return cmd
}

// runPolicyTests runs policy.TestWith with the shipped library, paths and
// the data of pc, and prints one line per test and a summary.
func runPolicyTests(ctx context.Context, w io.Writer, paths []string, pc policy.Config, verbose bool) error {
	rep, err := policy.TestWith(ctx, paths, pc)
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
