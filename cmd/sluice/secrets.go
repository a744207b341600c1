package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sluice-gw/sluice/vault"
)

func secretsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secrets",
		Short: "Manage the embedded local secret store (values are never printed)",
		Long: `Manage the embedded local secret store (secrets.backend: local): AES-256-GCM
sealed values in secrets.local.path, the key in secrets.local.key_file.

A value is read from stdin, never from an argument (arguments end up in shell
history and in /proc/PID/cmdline): printf '%s' "$TOKEN" | sluice secrets set NAME
One trailing newline is removed. Values are never printed, by any verb.`,
	}
	var scope string
	set := &cobra.Command{
		Use:   "set NAME",
		Short: "Store the value read from stdin under NAME",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, err := openLocal(g)
			if err != nil {
				return fmt.Errorf("secrets set: %w", err)
			}
			in := cmd.InOrStdin()
			if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				fmt.Fprintf(cmd.ErrOrStderr(), "value for %s (input hidden, end with Enter): ", args[0])
				v, err := term.ReadPassword(int(f.Fd()))
				fmt.Fprintln(cmd.ErrOrStderr())
				if err != nil {
					return fmt.Errorf("secrets set: read value: %w", err)
				}
				in = bytes.NewReader(v)
			}
			// Read one byte past the limit so an oversized value is refused
			// rather than silently cut.
			v, err := io.ReadAll(io.LimitReader(in, vault.MaxValue+2))
			if err != nil {
				return fmt.Errorf("secrets set: read value from stdin: %w", err)
			}
			v = trimOneNewline(v)
			if len(v) == 0 {
				return fmt.Errorf("secrets set: empty value on stdin; pipe the value in, e.g. printf '%%s' \"$TOKEN\" | sluice secrets set %s", args[0])
			}
			if err := local.Set(cmd.Context(), args[0], vault.Scope(scope), vault.NewSecret(v)); err != nil {
				clear(v)
				return fmt.Errorf("secrets set: %w", err)
			}
			clear(v)
			fmt.Fprintf(cmd.OutOrStdout(), "stored %s (scope %s)\n", args[0], scope)
			return nil
		},
	}
	set.Flags().StringVar(&scope, "scope", string(vault.ScopeProject), "project, user:NAME or connector:SLUG")

	list := &cobra.Command{
		Use:   "list",
		Short: "List secret names, scopes and update times (never values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A read-only verb: it opens the store only if it exists and
			// creates nothing (no key, store, lock or directory).
			lc, err := localConfig(g)
			if err != nil {
				return fmt.Errorf("secrets list: %w", err)
			}
			var es []vault.Entry
			if _, err := os.Stat(lc.Secrets.Local.Path); errors.Is(err, fs.ErrNotExist) {
				fmt.Fprintf(cmd.ErrOrStderr(), "no local store at %s yet: nothing stored\n", lc.Secrets.Local.Path)
			} else {
				local, err := vault.OpenLocalExisting(lc.Secrets.Local.Path, lc.Secrets.Local.KeyFile)
				if err != nil {
					return fmt.Errorf("secrets list: %s: %w", lc.Source, err)
				}
				if es, err = local.List(cmd.Context()); err != nil {
					return fmt.Errorf("secrets list: %w", err)
				}
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSCOPE\tUPDATED")
			for _, e := range es {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Name, e.Scope, e.Updated)
			}
			return tw.Flush()
		},
	}

	var rmScope string
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a secret",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, err := openLocal(g)
			if err != nil {
				return fmt.Errorf("secrets rm: %w", err)
			}
			if err := local.Delete(cmd.Context(), args[0], vault.Scope(rmScope)); err != nil {
				return fmt.Errorf("secrets rm: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s (scope %s)\n", args[0], rmScope)
			return nil
		},
	}
	rm.Flags().StringVar(&rmScope, "scope", string(vault.ScopeProject), "project, user:NAME or connector:SLUG")

	cmd.AddCommand(set, list, rm)
	return cmd
}

// openLocal opens the configured local store; the Vault backend is managed
// with Vault's own tools.
func openLocal(g *globals) (*vault.Local, error) {
	lc, err := localConfig(g)
	if err != nil {
		return nil, err
	}
	l, err := vault.OpenLocal(lc.Secrets.Local.Path, lc.Secrets.Local.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", lc.Source, err)
	}
	return l, nil
}

// localConfig loads the configuration of a verb that manages the local
// store, refusing any other backend.
func localConfig(g *globals) (*loadedConfig, error) {
	lc, err := g.loadConfig()
	if err != nil {
		return nil, err
	}
	if lc.Secrets.Backend != "local" {
		return nil, fmt.Errorf("%s: secrets.backend is %q: this verb manages only the local store; manage Vault secrets with Vault's own tools", lc.Source, lc.Secrets.Backend)
	}
	return lc, nil
}

// trimOneNewline removes exactly one trailing "\n" (or "\r\n"), as `echo`
// and here-strings add one; any other CR or LF stays and is refused by the
// store.
func trimOneNewline(v []byte) []byte {
	if n := len(v); n > 0 && v[n-1] == '\n' {
		v = v[:n-1]
		if n := len(v); n > 0 && v[n-1] == '\r' {
			v = v[:n-1]
		}
	}
	return v
}
