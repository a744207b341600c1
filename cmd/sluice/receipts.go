package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/receipts"
	"github.com/sluice-gw/sluice/vault"
)

// receiptsCmd is `sluice receipts`: the verification key of the signed
// receipts of executed holds, and offline verification of a receipt.
func receiptsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "receipts",
		Short: "Signed receipts of approved calls: print the key, verify a receipt offline",
	}
	var all bool
	key := &cobra.Command{
		Use:   "key",
		Short: "Print the receipts' public key (PEM): from receipts.key_file, or Vault transit",
		Long: `Print the Ed25519 public key that receipts are signed with, as PEM: read from
the configuration's receipts.key_file (made by ` + "`sluice serve`" + ` at its first start), or,
with receipts.signer vault-transit, the latest version's from Vault
(transit/keys/NAME, logging in as secrets.vault says). --all prints every
version Vault holds, newest first (each PEM after a "# key_id" line), for
receipts signed before a rotation. A running gateway serves the same keys at
GET /api/v1/receipts/key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lc, err := g.loadConfig()
			if err != nil {
				return err
			}
			if lc.Receipts.Disabled {
				return errors.New("receipts: disabled in " + lc.Source)
			}
			keys, err := receiptKeys(cmd.Context(), g, lc.Config, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if !all {
				keys = keys[:1]
			}
			for _, k := range keys {
				name := ""
				if k.Name != "" {
					name = " (" + k.Name + ")"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "# key_id %s%s\n%s", k.KeyID, name, receipts.PublicPEM(k.Key))
			}
			return nil
		},
	}
	key.Flags().BoolVar(&all, "all", false, "with a Vault transit key: every version, newest first")
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
			if r.Key != "" {
				fmt.Fprintf(out, "  key       %s\n", r.Key)
			}
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

// receiptKeys are the receipts' verification keys, the signing one first:
// the local key file's, or the Vault transit key's versions.
func receiptKeys(ctx context.Context, g *globals, cfg *config.Config, stderr io.Writer) ([]receipts.Public, error) {
	if cfg.ReceiptsSigner() != config.ReceiptsVaultTransit {
		priv, err := receipts.LoadKey(cfg.ReceiptsKeyFile(), false)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("receipts: no key at %s yet: sluice serve makes it at its first start", cfg.ReceiptsKeyFile())
		}
		if err != nil {
			return nil, err
		}
		return receipts.NewSigner(priv).Keys(ctx)
	}
	log, err := g.logger(stderr) // Vault's login, never a secret
	if err != nil {
		return nil, err
	}
	src, err := creds.Open(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer creds.Close(src)
	v, ok := src.(*creds.Vault)
	if !ok {
		return nil, errors.New("receipts.signer vault-transit: the credential source is not secrets.vault")
	}
	keys, err := receipts.NewKeySigner(vault.NewTransitEd25519(v.Client(), cfg.Receipts.TransitKey)).Keys(ctx)
	if err != nil {
		return nil, fmt.Errorf("receipts.transit_key %q: %w", cfg.Receipts.TransitKey, err)
	}
	return keys, nil
}
