package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
)

func TestApprovals(t *testing.T) {
	cfgPath := demoConfig(t)
	setSecret(t, cfgPath, "approvals-secret-value")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Approvers.Users = []config.User{
		{Name: "bob", Groups: []string{"finance"}, TokenSHA256: tokenSHA256("tok-bob")},
		{Name: "carol", TokenSHA256: tokenSHA256("tok-carol")},
	}
	srv := startAdminGateway(t, cfg)
	mk := func(amount string) string {
		h, _, err := srv.Holds().Create(context.Background(), holds.Hold{
			Tool: "tickets.create_refund", Args: []byte(`{"body":{"amount_cents":` + amount + `}}`),
			Request:   holds.Request{Method: "POST", URL: cfg.Connectors[0].BaseURL + "/refunds", Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"amount_cents":` + amount + `}`)},
			Caller:    holds.Caller{Sandbox: "sb", Agent: cfg.Agents[0].Name, Session: "s", User: "alice"},
			Approvers: []string{"group:finance"}, Rule: "policies[2]", Expires: time.Now().Add(time.Hour), RequestID: "r",
		})
		if err != nil {
			t.Fatal(err)
		}
		return h.ID
	}
	id1, id2, id3 := mk("1500"), mk("99"), mk("700")
	tokFile := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(tokFile, []byte("tok-bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	admin := "http://" + srv.AdminAddr()
	for _, tc := range []struct {
		name    string
		env     string
		args    []string
		want    []string
		wantErr string
	}{
		{"list pending", "", []string{"list", "--token-file", tokFile}, []string{id1, id2, "pending", "alice"}, ""},
		{"show", "", []string{"show", id1, "--token-file", tokFile}, []string{`"amount_cents": 1500`, `"url"`, "/refunds"}, ""},
		{"token from env", "tok-bob", []string{"list"}, []string{id1}, ""},
		{"no token", "", []string{"list"}, nil, "no token"},
		{"wrong token", "nope", []string{"list"}, nil, "401 unauthenticated"},
		{"not an approver", "tok-carol", []string{"approve", id1}, nil, "403 not_an_approver"},
		{"deny needs a reason", "tok-bob", []string{"deny", id2}, nil, "--reason is required"},
		{"deny", "tok-bob", []string{"deny", id2, "--reason", "duplicate"}, []string{id2 + ": denied"}, ""},
		{"deny twice", "tok-bob", []string{"deny", id2, "--reason", "again"}, nil, "409 conflict"},
		// The demo's upstream address listens on nothing: the approved call
		// is sent once and fails as the agent would see it.
		{"approve", "tok-bob", []string{"approve", id1, "--reason", "ok"}, []string{id1 + ": failed (the agent gets HTTP 502)"}, ""},
		{"show result", "tok-bob", []string{"show", id1}, []string{`"status": "failed"`, "upstream_error", `"decided_by": "bob"`}, ""},
		{"unknown", "tok-bob", []string{"show", "nope"}, nil, "404 not_found"},
		{"ttl needs always", "tok-bob", []string{"approve", id3, "--ttl", "1h"}, nil, "--ttl needs --always"},
		{"ttl over 24h", "tok-bob", []string{"approve", id3, "--always", "--ttl", "48h"}, nil, "400 bad_request"},
		{"non-approver cannot grant", "tok-carol", []string{"approve", id3, "--always"}, nil, "403 not_an_approver"},
		{"no grants yet", "tok-bob", []string{"grants"}, []string{"ID  "}, ""},
		{"approve always", "tok-bob", []string{"approve", id3, "--always", "--ttl", "2h"}, []string{id3 + ": failed", "grant ", "user alice"}, ""},
		{"grants", "tok-carol", []string{"grants"}, []string{id3, "tickets.create_refund", "alice", "bob"}, ""},
		{"revoke unknown", "tok-bob", []string{"revoke", "nope"}, nil, "404 not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SLUICE_TOKEN", tc.env)
			out, _, err := cli(t, "", append([]string{"approvals", "--admin", admin}, tc.args...)...)
			checkCLI(t, out, err, tc.want, tc.wantErr)
		})
	}
}

// TestApprovalsRevoke revokes the grant that approve --always made.
func TestApprovalsRevoke(t *testing.T) {
	cfgPath := demoConfig(t)
	setSecret(t, cfgPath, "approvals-secret-value")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Approvers.Users = []config.User{{Name: "bob", Groups: []string{"finance"}, TokenSHA256: tokenSHA256("tok-bob")}}
	srv := startAdminGateway(t, cfg)
	h, _, err := srv.Holds().Create(context.Background(), holds.Hold{
		Tool: "tickets.create_refund", Args: []byte(`{}`),
		Request:   holds.Request{Method: "POST", URL: cfg.Connectors[0].BaseURL + "/refunds"},
		Caller:    holds.Caller{Sandbox: "sb", Agent: cfg.Agents[0].Name, Session: "s", User: "alice"},
		Approvers: []string{"bob"}, Rule: "policies[2]", Expires: time.Now().Add(time.Hour), RequestID: "r",
	})
	if err != nil {
		t.Fatal(err)
	}
	_, g, err := srv.Holds().ApproveAlways(context.Background(), h.ID, holds.Person{Name: "bob"}, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_TOKEN", "tok-bob")
	admin := "http://" + srv.AdminAddr()
	out, _, err := cli(t, "", "approvals", "--admin", admin, "revoke", g.ID)
	if err != nil || !strings.Contains(out, g.ID+": revoked by bob") {
		t.Fatalf("revoke: %q, %v", out, err)
	}
	if _, _, err := cli(t, "", "approvals", "--admin", admin, "revoke", g.ID); err == nil || !strings.Contains(err.Error(), "409 conflict") {
		t.Fatalf("second revoke: %v, want 409 conflict", err)
	}
	out, _, err = cli(t, "", "approvals", "--admin", admin, "grants", "--status", "all")
	if err != nil || !strings.Contains(out, g.ID) || !strings.Contains(out, "bob") {
		t.Fatalf("grants --status all: %q, %v", out, err)
	}
	if gs, _ := srv.Holds().Grants(context.Background(), false, 0); len(gs) != 0 {
		t.Fatalf("active grants after revoke: %+v", gs)
	}
}

func TestCleanMakesControlsVisible(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "agent-a", "agent-a"},
		{"escape sequence", "a\x1b[31mb", "a?[31mb"},
		{"bidi override", "alice\u202egnp.exe", "alice?gnp.exe"},
		{"newline", "a\nb", "a?b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := clean(tc.in); got != tc.want {
				t.Fatalf("clean(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// startAdminGateway serves cfg in-process for the CLI tests that talk to
// the admin API, and stops it when the test ends.
func startAdminGateway(t *testing.T, cfg *config.Config) *gateway.Server {
	t.Helper()
	srv, err := gateway.New(context.Background(), cfg, gateway.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatal(err)
	}
	return srv
}

// tokenSHA256 is what approvers.users[].token_sha256 holds for tok.
func tokenSHA256(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}
