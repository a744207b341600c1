package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/audit"
)

func auditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Work with the hash-chained audit log",
	}
	var file string
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Check every hash, link and sequence number of the audit log",
		Long: `Read the whole audit log (audit.path from the config, or --file) and check that
every record's hash is right, that each links to the one before and that the
sequence numbers have no gap. Exits non-zero at the first break, naming its line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := file
			if path == "" {
				lc, err := g.loadConfig()
				if err != nil {
					return fmt.Errorf("audit verify: %w", err)
				}
				path = lc.Audit.Path
			}
			n, err := verifyAudit(path)
			if err != nil {
				var ve *audit.VerifyError
				if errors.As(err, &ve) {
					fmt.Fprintf(cmd.OutOrStdout(), "FAIL: %s line %d: %s\n", path, ve.Line, ve.Reason)
					return silentError{fmt.Sprintf("audit verify: chain broken at line %d", ve.Line)}
				}
				return fmt.Errorf("audit verify: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ok: %d records, chain intact (%s)\n", n, path)
			return nil
		},
	}
	verify.Flags().StringVar(&file, "file", "", "the log to verify (default: audit.path from the config)")
	cmd.AddCommand(verify)
	return cmd
}

// verifyAudit runs audit.Verify on the file at path.
func verifyAudit(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return audit.Verify(f)
}
