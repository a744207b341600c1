package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/store"
)

// storeCmd is `sluice store migrate|status`: for operators who migrate a
// shared (PostgreSQL) database ahead of rolling out a new gateway version.
// `serve` migrates at start too, under the same advisory lock.
func storeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Migrate or inspect the state store (the config's store:)",
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
