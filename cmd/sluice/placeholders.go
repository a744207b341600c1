package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// maxCAPEM bounds the interception CA certificate the CLI fetches.
const maxCAPEM = 64 << 10

func placeholdersCmd(g *globals) *cobra.Command {
	var admin, tokenFile, caOut string
	var env bool
	cmd := &cobra.Command{
		Use:   "placeholders",
		Short: "Print the egress placeholders, and save the interception CA, for sandboxes sluice did not make",
		Long: `Print the placeholders of egress.placeholders from the gateway's admin API
(GET /api/v1/placeholders): what a sandbox's environment carries instead of
each secret. sandboxd puts them into the sandboxes it makes; for sandboxes
another runtime made (pinned ones), put them there yourself:

  sluice placeholders --env --ca /etc/sluice/ca.pem > sluice.env

--env prints one VAR='placeholder' line per secret, named as sandboxd names
them (SLUICE_SECRET_<NAME>). --ca also saves the interception CA's
certificate (GET /ca.pem), for the sandbox's trust store. Placeholders are
not secrets, but only a session token (gateway.session_tokens_sha256) or an
approver's token may read them: --token-file, or SLUICE_TOKEN.

The admin address is --admin, else http:// + gateway.admin_listen from the config.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newAdminClient(g, admin, tokenFile, time.Minute)
			if err != nil {
				return fmt.Errorf("placeholders: %w", err)
			}
			var out struct {
				Placeholders []struct {
					Secret      string   `json:"secret"`
					Placeholder string   `json:"placeholder"`
					Hosts       []string `json:"hosts"`
					Header      string   `json:"header"`
					Prefix      string   `json:"prefix"`
				} `json:"placeholders"`
			}
			if err := c.do("GET", "/api/v1/placeholders", nil, &out); err != nil {
				return fmt.Errorf("placeholders: %w", err)
			}
			if caOut != "" {
				if err := saveCA(c, caOut); err != nil {
					return fmt.Errorf("placeholders: --ca: %w", err)
				}
			}
			w := cmd.OutOrStdout()
			if env {
				for _, p := range out.Placeholders {
					if !strings.HasPrefix(p.Placeholder, "sluice:secret:") || strings.ContainsAny(p.Placeholder, "'\\\x00\r\n") {
						return fmt.Errorf("placeholders: the gateway sent %q for %s, which is not a placeholder", clean(p.Placeholder), clean(p.Secret))
					}
					fmt.Fprintf(w, "%s='%s'\n", wire.PlaceholderEnvName(p.Secret), p.Placeholder)
				}
				return nil
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SECRET\tVARIABLE\tPLACEHOLDER\tHOSTS\tHEADER")
			for _, p := range out.Placeholders {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", clean(p.Secret), wire.PlaceholderEnvName(p.Secret), clean(p.Placeholder),
					clean(strings.Join(p.Hosts, ",")), clean(p.Header+": "+p.Prefix+"…"))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&admin, "admin", "", "the admin API's base URL (default: http://ADMIN_LISTEN from the config)")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "file holding a session or approver token (default: $SLUICE_TOKEN)")
	cmd.Flags().BoolVar(&env, "env", false, "print VAR='placeholder' lines for a sandbox's environment")
	cmd.Flags().StringVar(&caOut, "ca", "", "also save the interception CA certificate (PEM) to this file")
	return cmd
}

// saveCA fetches GET /ca.pem (public: a certificate) and writes it to path.
func saveCA(c *adminClient, path string) error {
	resp, err := c.http.Get(c.admin + "/ca.pem")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCAPEM+1))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /ca.pem answered %d (is TLS interception configured?)", resp.StatusCode)
	}
	if len(b) > maxCAPEM || !strings.HasPrefix(string(b), "-----BEGIN CERTIFICATE-----") {
		return fmt.Errorf("GET /ca.pem did not answer one PEM certificate")
	}
	return os.WriteFile(path, b, 0o644)
}
