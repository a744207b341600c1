package main

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway"
	"github.com/sluice-gw/sluice/gateway/config"
)

// connectorsCmd lists the configured connectors and what validate found
// about each: a remote MCP server that cannot be listed, or whose MCP
// authorization cannot be discovered, shows the step and the reason.
func connectorsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "connectors",
		Short: "List the connectors, their credential and tools, and each one's problems",
		Long: `Load the config as validate does (every spec fetched, every remote MCP server
listed or its MCP authorization discovered; nothing registered, no listener) and
print one row per connector: slug, provider, how it authenticates, how many tools
it offers, and "ok" or its first problem; every problem follows, by connector.
Exit non-zero only when the config has errors.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			lc, err := g.loadConfig()
			if err != nil {
				return printProblems(out, err)
			}
			f := gateway.Check(cmd.Context(), lc.Config, gateway.CheckOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			tools := map[string]int{}
			for _, c := range f.Connectors {
				tools[c.Slug] = len(c.Tools)
			}
			said := map[int][]string{}
			for _, e := range append(append([]error(nil), f.Errors...), f.Warnings...) {
				for _, p := range problems(e) {
					for i := range lc.Config.Connectors {
						if k := fmt.Sprintf("connectors[%d]", i); strings.HasPrefix(p, k+".") || strings.HasPrefix(p, k+":") {
							said[i] = append(said[i], p)
						}
					}
				}
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SLUG\tPROVIDER\tCREDENTIAL\tTOOLS\tSTATUS")
			for i, cc := range lc.Config.Connectors {
				status := "ok"
				if len(said[i]) > 0 {
					status = clipLine(said[i][0], 120)
				}
				n := fmt.Sprint(tools[cc.Slug])
				if _, ok := tools[cc.Slug]; !ok || (cc.Provider == "mcp" && cc.Credential != nil && cc.Credential.OAuth2 != nil) {
					// Not loaded, or listed only with a connected person's token (by serve).
					n = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cc.Slug, provider(cc), credentialKind(cc), n, status)
			}
			tw.Flush()
			for i, cc := range lc.Config.Connectors {
				for _, p := range said[i] {
					fmt.Fprintf(out, "%s: %s\n", cc.Slug, p)
				}
			}
			if len(f.Errors) > 0 {
				return silentError{fmt.Sprintf("connectors: %d error(s)", len(f.Errors))}
			}
			return nil
		},
	}
}

func provider(cc config.Connector) string {
	if cc.Provider == "" {
		return "openapi"
	}
	return cc.Provider
}

// credentialKind names how a connector authenticates, never a value.
func credentialKind(cc config.Connector) string {
	cr := cc.Credential
	switch {
	case cr == nil:
		return "none"
	case cr.OAuth2 != nil && cc.Provider == "mcp":
		return "oauth2 (MCP authorization, per person)"
	case cr.OAuth2 != nil:
		return "oauth2 " + cr.OAuth2.Flow
	case cr.Vault != nil:
		return "vault"
	default:
		return "secret " + cr.Secret
	}
}

func clipLine(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
