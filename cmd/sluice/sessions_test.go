package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
)

func TestSessionsEnd(t *testing.T) {
	cfgPath := demoConfig(t)
	setSecret(t, cfgPath, "sessions-secret-value")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Approvers.Users = []config.User{{Name: "bob", Groups: []string{"finance"}, TokenSHA256: tokenSHA256("tok-bob")}}
	cfg.Gateway.SessionTokensSHA256 = []string{tokenSHA256("tok-sandboxd")}
	srv := startAdminGateway(t, cfg)
	h, _, err := srv.Holds().Create(context.Background(), holds.Hold{
		Tool: "tickets.create_refund", Args: []byte(`{}`),
		Request:   holds.Request{Method: "POST", URL: cfg.Connectors[0].BaseURL + "/refunds"},
		Caller:    holds.Caller{Sandbox: "sb", Agent: cfg.Agents[0].Name, Session: "sess-1", User: "alice"},
		Approvers: []string{"group:finance"}, Rule: "policies[2]", Expires: time.Now().Add(time.Hour), RequestID: "r",
	})
	if err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(tokFile, []byte("tok-sandboxd\n"), 0o600); err != nil {
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
		{"no token", "", []string{"sess-1"}, nil, "no token"},
		{"wrong token", "nope", []string{"sess-1"}, nil, "401 unauthenticated"},
		{"no id", "tok-bob", nil, nil, "accepts 1 arg"},
		{"end with the session token", "", []string{"sess-1", "--token-file", tokFile},
			[]string{"session sess-1 ended", "by session_token[0]", "1 pending holds expired", h.ID}, ""},
		{"end again as an approver", "tok-bob", []string{"sess-1"}, []string{"by session_token[0]", h.ID}, ""},
		{"a session with nothing pending", "tok-bob", []string{"sess-2"}, []string{"session sess-2 ended", "by bob", "0 pending holds expired"}, ""},
		{"a malformed id", "tok-bob", []string{"a b"}, nil, "400 bad_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SLUICE_TOKEN", tc.env)
			out, _, err := cli(t, "", append([]string{"sessions", "--admin", admin, "end"}, tc.args...)...)
			checkCLI(t, out, err, tc.want, tc.wantErr)
		})
	}
	got, err := srv.Holds().Get(context.Background(), h.ID)
	if err != nil || got.Status != holds.Expired {
		t.Fatalf("hold after the end: %v %v, want expired", got.Status, err)
	}
}
