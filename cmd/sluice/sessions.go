package main

import (
	"fmt"
	"net/url"
	"time"

	"github.com/spf13/cobra"
)

func sessionsCmd(g *globals) *cobra.Command {
	var admin, tokenFile string
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "End agent sessions, or mint per-run tokens for hosted sandboxes, through the admin API",
		Long: `End agent sessions, or mint per-run tokens for hosted sandboxes, through the
gateway's admin API. Authenticate with an approver token or a session token
(gateway.session_tokens_sha256; minting takes a session token only):
--token-file, or the SLUICE_TOKEN environment variable.

The admin address is --admin, else http:// + gateway.admin_listen from the config.`,
	}
	cmd.PersistentFlags().StringVar(&admin, "admin", "", "the admin API's base URL (default: http://ADMIN_LISTEN from the config)")
	cmd.PersistentFlags().StringVar(&tokenFile, "token-file", "", "file holding the token (default: $SLUICE_TOKEN)")

	end := &cobra.Command{
		Use:   "end ID",
		Short: "End a session: refuse its later calls and expire its pending holds",
		Long: `End a session: every later tool call and proxy request carrying it is refused
403 session_ended, and its pending holds expire (the waiting agent gets 403
approval_expired). Ending a session twice is harmless and answers the same.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAdminClient(g, admin, tokenFile, time.Minute)
			if err != nil {
				return fmt.Errorf("sessions end: %w", err)
			}
			var out struct {
				Session struct {
					Session string    `json:"session"`
					Ended   time.Time `json:"ended"`
					EndedBy string    `json:"ended_by"`
					Holds   []string  `json:"holds_expired"`
				} `json:"session"`
			}
			if err := c.do("POST", "/api/v1/sessions/"+url.PathEscape(args[0])+"/end", nil, &out); err != nil {
				return fmt.Errorf("sessions end: %w", err)
			}
			s := out.Session
			fmt.Fprintf(cmd.OutOrStdout(), "session %s ended %s by %s; %d pending holds expired\n",
				clean(s.Session), s.Ended.Format(time.RFC3339), clean(s.EndedBy), len(s.Holds))
			for _, id := range s.Holds {
				fmt.Fprintf(cmd.OutOrStdout(), "  %s\n", clean(id))
			}
			return nil
		},
	}
	cmd.AddCommand(end, mintCmd(g, &admin, &tokenFile))
	return cmd
}
