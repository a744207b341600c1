package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

// mintCmd is `sluice sessions mint`: a per-run token for a hosted sandbox
// (gateway.hosted), from POST /api/v1/sessions/{session}/tokens.
func mintCmd(g *globals, admin, tokenFile *string) *cobra.Command {
	var agent, session, user, sandbox, ttl, proxy string
	var asJSON bool
	var egress []string
	cmd := &cobra.Command{
		Use:   "mint --agent A --session S [--user U] [--ttl 1h] [--sandbox NAME] [--egress HOST,…] [--proxy HOST:PORT] [--json]",
		Short: "Mint a per-run token for a hosted sandbox (E2B, Daytona, Modal)",
		Long: `Mint a per-run token that identifies one (agent, session, user) on the
gateway's hosted listener (gateway.hosted). Only a session token
(gateway.session_tokens_sha256) may mint. The token is bound to the session:
` + "`sluice sessions end S`" + ` ends it; it expires after --ttl (default 1h, at most
gateway.hosted.max_token_ttl).

Prints the token alone on stdout (TOKEN=$(sluice sessions mint …)); with
--proxy HOST:PORT (the hosted listener as the sandbox reaches it), the
HTTPS_PROXY and HTTP_PROXY settings for the sandbox instead; --json prints the
whole answer (token, identity, token_id, expires). The token is a secret: hand
it only to the sandbox it is for.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if agent == "" || session == "" {
				return errors.New("sessions mint: --agent and --session are required")
			}
			if proxy != "" {
				if _, port, err := net.SplitHostPort(proxy); err != nil {
					return fmt.Errorf("sessions mint: --proxy: want host:port: %w", err)
				} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
					return fmt.Errorf("sessions mint: --proxy: bad port %q", port)
				}
			}
			c, err := newAdminClient(g, *admin, *tokenFile, time.Minute)
			if err != nil {
				return fmt.Errorf("sessions mint: %w", err)
			}
			req := map[string]any{"agent": agent, "user": user, "sandbox": sandbox, "ttl": ttl}
			if len(egress) > 0 {
				req["egress"] = egress
			}
			body, _ := json.Marshal(req)
			var out struct {
				Token struct {
					Token   string    `json:"token"`
					Session string    `json:"session"`
					Agent   string    `json:"agent"`
					User    string    `json:"user,omitempty"`
					Sandbox string    `json:"sandbox"`
					Egress  string    `json:"egress,omitempty"`
					TokenID string    `json:"token_id"`
					Expires time.Time `json:"expires"`
				} `json:"token"`
			}
			if err := c.do("POST", "/api/v1/sessions/"+url.PathEscape(session)+"/tokens", body, &out); err != nil {
				return fmt.Errorf("sessions mint: %w", err)
			}
			t, w := out.Token, cmd.OutOrStdout()
			switch {
			case asJSON:
				b, _ := json.MarshalIndent(t, "", "  ")
				fmt.Fprintf(w, "%s\n", b)
			case proxy != "":
				u := url.URL{Scheme: "https", User: url.UserPassword(t.Session, t.Token), Host: proxy}
				fmt.Fprintf(w, "HTTPS_PROXY=%s\nHTTP_PROXY=%s\n", u.String(), u.String())
			default:
				fmt.Fprintln(w, t.Token)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s for session %s (agent %s, user %s, sandbox %s) expires %s\n",
				clean(t.TokenID), clean(t.Session), clean(t.Agent), clean(t.User), clean(t.Sandbox), t.Expires.Format(time.RFC3339))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&agent, "agent", "", "the agent (agents[].name)")
	f.StringVar(&session, "session", "", "the session the token is bound to")
	f.StringVar(&user, "user", "", "the person the session acts for")
	f.StringVar(&sandbox, "sandbox", "", "the sandbox's name (default: the session)")
	f.StringVar(&ttl, "ttl", "", "lifetime, e.g. 1h (default 1h)")
	f.StringVar(&proxy, "proxy", "", "print HTTPS_PROXY/HTTP_PROXY for the hosted listener at HOST:PORT")
	f.BoolVar(&asJSON, "json", false, "print the whole answer as JSON")
	f.StringSliceVar(&egress, "egress", nil, "narrow the agent's egress allowlist for this run (hosts, as sandboxd --egress; never wider)")
	return cmd
}
