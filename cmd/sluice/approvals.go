package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// adminClient talks to the gateway's admin API with an approver token.
// newAdminClient is the admin API client of the CLI's admin verbs: the
// base URL is admin, else http:// + gateway.admin_listen from the
// config; the token is tokenFile's content, else $SLUICE_TOKEN.
func newAdminClient(g *globals, admin, tokenFile string, timeout time.Duration) (*adminClient, error) {
	base := admin
	if base == "" {
		lc, err := g.loadConfig()
		if err != nil {
			return nil, err
		}
		base = "http://" + lc.Gateway.AdminListen
	}
	tok := os.Getenv("SLUICE_TOKEN")
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		tok = string(b)
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return nil, errors.New("no token: use --token-file or set SLUICE_TOKEN")
	}
	return &adminClient{admin: strings.TrimRight(base, "/"), token: tok, http: &http.Client{Timeout: timeout}}, nil
}

type adminClient struct {
	admin string
	token string
	http  *http.Client
}

func approvalsCmd(g *globals) *cobra.Command {
	var admin, tokenFile string
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "List and decide held calls through the admin API",
		Long: `List and decide calls that policy holds for approval ("ask"), through the
gateway's admin API. Authenticate with an approver token: --token-file, or the
SLUICE_TOKEN environment variable. The token's SHA-256 is configured as
approvers.users[].token_sha256 (make one with: head -c 32 /dev/urandom | base64;
hash it with: printf %s TOKEN | sha256sum).

The admin address is --admin, else http:// + gateway.admin_listen from the config.`,
	}
	cmd.PersistentFlags().StringVar(&admin, "admin", "", "the admin API's base URL (default: http://ADMIN_LISTEN from the config)")
	cmd.PersistentFlags().StringVar(&tokenFile, "token-file", "", "file holding the approver token (default: $SLUICE_TOKEN)")
	client := func() (*adminClient, error) { return newAdminClient(g, admin, tokenFile, 2*time.Minute) }

	var status string
	list := &cobra.Command{
		Use:   "list",
		Short: "List holds, newest first (default: pending ones)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return fmt.Errorf("approvals list: %w", err)
			}
			q := "/api/v1/holds"
			if status != "all" {
				q += "?status=" + status
			}
			var out struct {
				Holds []apiHold `json:"holds"`
			}
			if err := c.do("GET", q, nil, &out); err != nil {
				return fmt.Errorf("approvals list: %w", err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATUS\tTOOL\tAGENT\tUSER\tAGE\tEXPIRES IN")
			for _, h := range out.Holds {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.ID, h.Status, clean(h.Tool), clean(h.Caller.Agent), clean(h.Caller.User),
					time.Since(h.Created).Round(time.Second), time.Until(h.Expires).Round(time.Second))
			}
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&status, "status", "pending", "comma-separated statuses, or all")

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one hold: exactly the request that approval would send",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return fmt.Errorf("approvals show: %w", err)
			}
			var out struct {
				Hold json.RawMessage `json:"hold"`
			}
			if err := c.do("GET", "/api/v1/holds/"+args[0], nil, &out); err != nil {
				return fmt.Errorf("approvals show: %w", err)
			}
			var buf bytes.Buffer
			if err := json.Indent(&buf, out.Hold, "", "  "); err != nil {
				return fmt.Errorf("approvals show: %w", err)
			}
			// JSON escapes every control character; the terminal sees no raw escape.
			fmt.Fprintln(cmd.OutOrStdout(), buf.String())
			return nil
		},
	}

	var reason, ttl string
	var always bool
	var maxUses int
	decide := func(verb string) *cobra.Command {
		dc := &cobra.Command{
			Use:   verb + " ID",
			Short: strings.ToUpper(verb[:1]) + verb[1:] + " a held call",
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if verb == "deny" && strings.TrimSpace(reason) == "" {
					return errors.New("approvals deny: --reason is required")
				}
				c, err := client()
				if err != nil {
					return fmt.Errorf("approvals %s: %w", verb, err)
				}
				if verb == "approve" && ttl != "" && !always {
					return errors.New("approvals approve: --ttl needs --always")
				}
				if verb == "approve" && maxUses != 0 && !always {
					return errors.New("approvals approve: --max-uses needs --always")
				}
				in := map[string]any{"reason": reason}
				if verb == "approve" && always {
					in["always"] = true
					if ttl != "" {
						in["ttl"] = ttl
					}
					if maxUses != 0 {
						in["max_uses"] = maxUses
					}
				}
				body, _ := json.Marshal(in)
				var out struct {
					Hold  apiHold   `json:"hold"`
					Grant *apiGrant `json:"grant"`
				}
				if err := c.do("POST", "/api/v1/holds/"+args[0]+"/"+verb, body, &out); err != nil {
					return fmt.Errorf("approvals %s: %w", verb, err)
				}
				msg := fmt.Sprintf("%s: %s", out.Hold.ID, out.Hold.Status)
				if out.Hold.Result != nil {
					msg += fmt.Sprintf(" (the agent gets HTTP %d)", out.Hold.Result.HTTPStatus)
				}
				if g := out.Grant; g != nil {
					msg += fmt.Sprintf("\ngrant %s: exactly this call from agent %s for user %s is sent without asking until %s",
						g.ID, clean(g.Agent), clean(g.User), g.Expires.Local().Format(time.RFC3339))
					if g.MaxUses > 0 {
						msg += fmt.Sprintf(", at most %d times", g.MaxUses)
					}
				}
				fmt.Fprintln(cmd.OutOrStdout(), msg)
				return nil
			},
		}
		dc.Flags().StringVar(&reason, "reason", "", "why (recorded in the audit log; required to deny)")
		if verb == "approve" {
			dc.Flags().BoolVar(&always, "always", false, "also always allow this exact call (same agent, user, tool and request) until the grant expires or is revoked")
			dc.Flags().StringVar(&ttl, "ttl", "", "how long --always lasts (default 8h, at most 24h)")
			dc.Flags().IntVar(&maxUses, "max-uses", 0, "how many calls --always lets through (default: any number until it expires)")
		}
		return dc
	}

	var grantStatus string
	grants := &cobra.Command{
		Use:   "grants",
		Short: "List \"always allow\" grants, newest first (default: active ones)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return fmt.Errorf("approvals grants: %w", err)
			}
			var out struct {
				Grants []apiGrant `json:"grants"`
			}
			if err := c.do("GET", "/api/v1/grants?status="+url.QueryEscape(grantStatus), nil, &out); err != nil {
				return fmt.Errorf("approvals grants: %w", err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTOOL\tAGENT\tUSER\tBY\tHOLD\tEXPIRES IN\tUSES\tREVOKED BY")
			for _, g := range out.Grants {
				uses := fmt.Sprintf("%d", g.Uses)
				if g.MaxUses > 0 {
					uses = fmt.Sprintf("%d of %d", g.Uses, g.MaxUses)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.ID, clean(g.Tool), clean(g.Agent), clean(g.User), clean(g.By), g.Hold,
					time.Until(g.Expires).Round(time.Second), uses, clean(g.RevokedBy))
			}
			return tw.Flush()
		},
	}
	grants.Flags().StringVar(&grantStatus, "status", "active", "active or all")

	revoke := &cobra.Command{
		Use:   "revoke GRANT_ID",
		Short: "Revoke an \"always allow\" grant: the call asks again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return fmt.Errorf("approvals revoke: %w", err)
			}
			var out struct {
				Grant apiGrant `json:"grant"`
			}
			if err := c.do("DELETE", "/api/v1/grants/"+url.PathEscape(args[0]), nil, &out); err != nil {
				return fmt.Errorf("approvals revoke: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: revoked by %s\n", out.Grant.ID, clean(out.Grant.RevokedBy))
			return nil
		},
	}
	cmd.AddCommand(list, show, decide("approve"), decide("deny"), grants, revoke)
	return cmd
}

// apiGrant is the part of the admin API's grant this command prints.
type apiGrant struct {
	ID        string    `json:"id"`
	Agent     string    `json:"agent"`
	User      string    `json:"user"`
	Tool      string    `json:"tool"`
	Hold      string    `json:"hold"`
	By        string    `json:"granted_by"`
	Expires   time.Time `json:"expires"`
	RevokedBy string    `json:"revoked_by"`
	MaxUses   int       `json:"max_uses"`
	Uses      int       `json:"uses"`
}

// apiHold is the part of the admin API's hold this command prints.
type apiHold struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Tool   string `json:"tool"`
	Caller struct {
		Agent string `json:"agent"`
		User  string `json:"user"`
	} `json:"caller"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	Result  *struct {
		HTTPStatus int `json:"http_status"`
	} `json:"result"`
}

// clean makes control characters in agent-controlled text visible.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) {
			return '?'
		}
		return r
	}, s)
}

func (c *adminClient) do(method, path string, body []byte, out any) error {
	req, err := http.NewRequest(method, c.admin+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil && e.Error.Code != "" {
			return fmt.Errorf("%d %s: %s", resp.StatusCode, e.Error.Code, e.Error.Message)
		}
		return fmt.Errorf("the admin API answered %d", resp.StatusCode)
	}
	return json.Unmarshal(raw, out)
}
