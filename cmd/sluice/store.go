package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/store"
)

// storeCmd is `sluice store migrate|status|export|import`: for operators
// who migrate a shared (PostgreSQL) database ahead of rolling out a new
// gateway version (`serve` migrates at start too, under the same advisory
// lock), and who move a gateway's state from SQLite to PostgreSQL.
func storeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Migrate, inspect, export or import the state store (the config's store:)",
	}
	var dsn string
	cmd.PersistentFlags().StringVar(&dsn, "store", "", "the store to use instead of the config's store: (sqlite:/path or postgres://…)")
	target := func() (string, error) {
		if dsn != "" {
			return dsn, nil
		}
		lc, err := g.loadConfig()
		if err != nil {
			return "", err
		}
		return lc.Store, nil
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "migrate",
		Short: "Apply the missing schema migrations (under the migration lock) and print the status",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			d, err := target()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context(), 2*time.Minute)
			defer cancel()
			st, err := store.Open(ctx, d)
			if err != nil {
				return err
			}
			defer st.Close()
			return printStatus(ctx, c, st, d)
		},
	})
	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the applied and pending schema migrations (changes nothing)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			d, err := target()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context(), time.Minute)
			defer cancel()
			st, err := store.OpenWith(ctx, d, store.Options{NoMigrate: true})
			if err != nil {
				return err
			}
			defer st.Close()
			if asJSON {
				s, err := st.Status(ctx)
				if err != nil {
					return err
				}
				return json.NewEncoder(c.OutOrStdout()).Encode(map[string]any{"store": store.Redact(d), "kind": s.Kind.String(),
					"current": s.Current(), "latest": s.Latest, "applied": s.Applied})
			}
			return printStatus(ctx, c, st, d)
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(status)
	cmd.AddCommand(&cobra.Command{
		Use:   "export",
		Short: "Write the store's holds, grants, ended sessions and usage counters to stdout as JSON lines (stop the gateway first)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			d, err := target()
			if err != nil {
				return err
			}
			st, err := store.Open(c.Context(), d)
			if err != nil {
				return err
			}
			defer st.Close()
			n, err := st.Export(c.Context(), c.OutOrStdout())
			if err != nil {
				return err
			}
			fmt.Fprintf(c.ErrOrStderr(), "exported from %s: %s\n", store.Redact(d), n)
			return nil
		},
	})
	var merge bool
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Read a `store export` (FILE, or - for stdin) into the store in one transaction; the store must be empty unless --merge",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			d, err := target()
			if err != nil {
				return err
			}
			in := c.InOrStdin()
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			st, err := store.Open(c.Context(), d)
			if err != nil {
				return err
			}
			defer st.Close()
			n, err := st.Import(c.Context(), in, merge)
			if err != nil {
				return fmt.Errorf("%s: %w (nothing was imported)", args[0], err)
			}
			fmt.Fprintf(c.OutOrStdout(), "imported into %s: %s\n", store.Redact(d), n)
			return nil
		},
	}
	imp.Flags().BoolVar(&merge, "merge", false, "add to a store that already holds state (a hold, grant or ended session already there is refused; usage counts add up)")
	cmd.AddCommand(imp)
	return cmd
}

func printStatus(ctx context.Context, c *cobra.Command, st *store.Store, dsn string) error {
	s, err := st.Status(ctx)
	if err != nil {
		return err
	}
	w := c.OutOrStdout()
	fmt.Fprintf(w, "store %s (%s): schema version %d of %d\n", store.Redact(dsn), s.Kind, s.Current(), s.Latest)
	for _, m := range s.Applied {
		fmt.Fprintf(w, "  applied  %04d  %s\n", m.Version, m.Applied)
	}
	migs := store.Migrations(s.Kind)
	for _, m := range migs[min(s.Current(), len(migs)):] {
		fmt.Fprintf(w, "  pending  %04d  %s\n", m.Version, m.Name)
	}
	return nil
}
