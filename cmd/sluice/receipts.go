package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/receipts"
)

// receiptsCmd is `sluice receipts`: the verification key of the signed
// receipts of executed holds, and offline verification of a receipt.
func receiptsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "receipts",
		Short: "Signed receipts of approved calls: print the key, verify a receipt offline",
	}
	key := &cobra.Command{
		Use:   "key",
		Short: "Print the receipts' public key (PEM) from receipts.key_file",
		Long: `Print the Ed25519 public key that receipts are signed with, as PEM, read from
the configuration's receipts.key_file (made by ` + "`sluice serve`" + ` at its first start).
A running gateway serves the same key at GET /api/v1/receipts/key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lc, err := g.loadConfig()
			if err != nil {
				return err
			}
			if lc.Receipts.Disabled {
				return errors.New("receipts: disabled in " + lc.Source)
			}
			priv, err := receipts.LoadKey(lc.ReceiptsKeyFile(), false)
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("receipts: no key at %s yet: sluice serve makes it at its first start", lc.ReceiptsKeyFile())
			}
			if err != nil {
				return err
			}
			s := receipts.NewSigner(priv)
			fmt.Fprintf(cmd.OutOrStdout(), "# key_id %s\n%s", s.KeyID(), receipts.PublicPEM(s.Public()))
			return nil
		},
	}
	var pubArg string
	var asJSON bool
	verify := &cobra.Command{
		Use:   "verify FILE --key PUB",
		Short: "Verify a receipt offline against a public key",
		Long: `Verify a receipt file (GET /api/v1/holds/{id}/receipt) against the receipts'
public key: PUB is a file holding it (PEM, as ` + "`sluice receipts key`" + ` prints it, or 64 hex
digits), or the hex digits themselves. It exits non-zero unless the receipt is
exactly as signed: any byte changed fails.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if pubArg == "" {
				return errors.New("--key: required")
			}
			raw, err := os.ReadFile(pubArg)
			if err != nil {
				raw = []byte(pubArg) // the key itself, not a file
			}
			pub, err := receipts.ParsePublicKey(raw)
			if err != nil {
				return fmt.Errorf("--key: %w", err)
			}
			file, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			r, err := receipts.Verify(file, pub)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"ok": true, "receipt": r})
			}
			fmt.Fprintf(out, "receipt OK (key %s)\n  hold      %s (%s)\n  caller    agent %s, user %s, session %s, sandbox %s\n  approved  by %s at %s\n  executed  %s: upstream status %d\n  request   sha256 %s\n  policy    %s (decided %s)\n",
				r.KeyID, r.HoldID, r.Tool, r.Caller.Agent, r.Caller.User, r.Caller.Session, r.Caller.Sandbox,
				r.Approver, r.ApprovedAt.Format("2006-01-02T15:04:05Z07:00"), r.ExecutedAt.Format("2006-01-02T15:04:05Z07:00"), r.UpstreamStatus,
				r.RequestSHA256, r.PolicyRevision, r.Decision)
			if r.Credential != "" || r.LeaseID != "" {
				fmt.Fprintf(out, "  credential %s %s\n", r.Credential, r.LeaseID)
			}
			return nil
		},
	}
	verify.Flags().StringVar(&pubArg, "key", "", "the public key: a file (PEM or hex) or 64 hex digits")
	verify.Flags().BoolVar(&asJSON, "json", false, "print the verified receipt as JSON")
	cmd.AddCommand(key, verify)
	return cmd
}
