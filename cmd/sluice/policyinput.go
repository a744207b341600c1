package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/catalog"
	"github.com/sluice-gw/sluice/gateway/toolinput"
	"github.com/sluice-gw/sluice/policy"
)

func policyInputCmd(g *globals) *cobra.Command {
	var tool, args, when string
	var example bool
	var caller policy.Caller
	cmd := &cobra.Command{
		Use:   "input --tool T (--example | --args JSON) [--agent A]",
		Short: "Print the input document the gateway builds for a call of a tool",
		Long: `Print the policy input document (rego/README.md) that the gateway builds
for a call of tool T, with the same code POST /v1/tools/T runs: the spec loaded
as serve loads it, the arguments validated and turned into the upstream
request, the caller as given. --example makes the arguments from the tool's
schema (each property's example, default or first enum value, else a value
of its type); --args gives them as the agent would POST them.

--agent defaults to the first agent in the config granted T's connector;
--sandbox, --session and --user complete the caller (defaults sb-example,
s-example, alice); --time fixes input.time. A tool counted under usage: gets
an input.usage with zero counts: the gateway fills in the store's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case tool == "":
				return errors.New("policy input: --tool is required")
			case example == cmd.Flags().Changed("args"):
				return errors.New("policy input: give exactly one of --example and --args")
			}
			lc, err := g.loadConfig()
			if err != nil {
				return fmt.Errorf("policy input: %w", err)
			}
			ctx := cmd.Context()
			raw := []byte(args)
			if example {
				if raw, err = catalog.ToolExample(ctx, lc.Config, tool); err != nil {
					return fmt.Errorf("policy input (%s): %w", lc.Source, err)
				}
			}
			c := toolinput.Call{Tool: tool, Args: raw, Caller: caller}
			if when != "" {
				if c.Time, err = time.Parse(time.RFC3339Nano, when); err != nil {
					return fmt.Errorf("policy input: --time: want RFC 3339 like 2025-03-01T12:00:00Z: %w", err)
				}
			}
			agents := []string{caller.Agent}
			if caller.Agent == "" {
				agents = agents[:0]
				for _, a := range lc.Config.Agents {
					agents = append(agents, a.Name)
				}
			}
			var in *policy.Input
			for _, a := range agents {
				c.Caller.Agent = a
				in, err = catalog.ToolCallInput(ctx, lc.Config, c)
				var re *toolinput.RefusedError
				if err == nil || !errors.As(err, &re) || re.Code != "not_granted" || caller.Agent != "" {
					break
				}
			}
			switch {
			case err != nil && example:
				return fmt.Errorf("policy input (%s): the example arguments %s: %w; give --args", lc.Source, raw, err)
			case err != nil:
				return fmt.Errorf("policy input (%s): %w", lc.Source, err)
			case in == nil:
				return fmt.Errorf("policy input (%s): no agent in the config; give --agent", lc.Source)
			}
			if counted, _ := lc.Config.Usage.Counted(in.Tool); counted {
				in.Usage = &policy.Usage{}
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(in)
		},
	}
	f := cmd.Flags()
	f.StringVar(&tool, "tool", "", "the tool called (name or alias)")
	f.BoolVar(&example, "example", false, "make the arguments from the tool's schema")
	f.StringVar(&args, "args", "{}", `the call's arguments as the agent POSTs them: {"path":{…},"query":{…},"headers":{…},"body":…}`)
	f.StringVar(&caller.Agent, "agent", "", "the calling agent (default: the first granted the tool)")
	f.StringVar(&caller.Sandbox, "sandbox", "sb-example", "the calling sandbox")
	f.StringVar(&caller.Session, "session", "s-example", "the caller's session")
	f.StringVar(&caller.User, "user", "alice", "the user the sandbox runs for")
	f.StringVar(&when, "time", "", "input.time, RFC 3339 (default now)")
	return cmd
}
