//go:build linux

package attack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestCallIdentityD17 is THREATS D17 on the pipeline itself
// (gateway.Server.Call), the function every front door hands its calls
// to: the sandbox socket today, MCP and Envoy ext_authz next. Those doors
// take identities the socket's listener never saw, so the checks cannot
// live in the listener alone. Each case hands Call an identity as such a
// door would and asserts the designed refusal, its audit record with the
// code, and that the upstream (an httptest server on loopback) got
// nothing; the control reaches it. The gateway runs in-process from a
// config the real CLI provisioned (its secret store).
func TestCallIdentityD17(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"tickets":[]}`))
	}))
	t.Cleanup(up.Close)

	const token = "d17-approver-token"
	sum := sha256.Sum256([]byte(token))
	d := e.CoreConfig("d17")
	d.Gateway()["admin_listen"] = "127.0.0.1:0"
	d["connectors"] = []map[string]any{{
		"slug": "tickets", "spec": e.Spec, "base_url": up.URL,
		"allow_private": []string{"127.0.0.0/8"}, "credential": map[string]any{"secret": "tickets-key"},
	}}
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{"tickets"}}}
	d["policies"] = []map[string]any{{"match": "tickets.list_tickets", "action": "allow"}, {"match": "*", "action": "block"}}
	d["approvers"] = map[string]any{"users": []map[string]any{{"name": "olga", "groups": []string{"ops"}, "token_sha256": hex.EncodeToString(sum[:])}}}
	cfg, err := config.Load(e.Write(d))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	srv, err := gateway.New(context.Background(), cfg, gateway.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
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
		t.Fatalf("serve: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("gateway not ready after 20s")
	}

	// The operator ends session d17-ended on the admin API.
	req, _ := http.NewRequest("POST", "http://"+srv.AdminAddr()+"/api/v1/sessions/d17-ended/end", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("ending the session: %d", resp.StatusCode)
	}

	auditCode := func(rid string) (events []string, code any) {
		data, err := os.ReadFile(cfg.Audit.Path)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.Lines(string(data)) {
			var r struct {
				RequestID string         `json:"request_id"`
				Event     string         `json:"event"`
				Fields    map[string]any `json:"fields"`
			}
			if json.Unmarshal([]byte(l), &r) == nil && r.RequestID == rid {
				events, code = append(events, r.Event), r.Fields["code"]
			}
		}
		return events, code
	}
	id := func(session, user string) wire.Identity {
		return wire.Identity{Sandbox: "sb-d17", Agent: "agent-a", Session: session, User: user}
	}
	cases := []struct {
		threat string
		id     wire.Identity
		code   refusal.Code
	}{
		{"an ended session spelt in capitals (D17-ENDED)", id("D17-ENDED", "alice"), refusal.SessionEnded},
		{"an ended session in full-width letters", id("ｄ17-ended", "alice"), refusal.SessionEnded},
		{"a user name mixing Latin and Cyrillic letters", id("d17-live", "\u0430lice"), refusal.IdentityRequired},
		{"a user name with a zero-width joiner", id("d17-live", "al\u200dice"), refusal.IdentityRequired},
		{"a session id with a right-to-left override", id("d17-\u202elive", "alice"), refusal.IdentityRequired},
		{"no sandbox and no agent (a door that lost the identity)", wire.Identity{User: "alice"}, refusal.IdentityRequired},
	}
	for _, tc := range cases {
		t.Run(tc.threat, func(t *testing.T) {
			c := casebook.Expect(t, "D17", "a front door hands the call pipeline "+tc.threat,
				"403 "+string(tc.code)+", audited decision with code "+string(tc.code)+", 0 upstream requests")
			before := hits.Load()
			o := srv.Call(context.Background(), call.Request{Identity: tc.id, Tool: "tickets.list_tickets", Transport: call.MCP})
			events, code := auditCode(o.RequestID)
			got := ""
			if o.Refusal != nil {
				got = string(o.Refusal.Code)
			}
			c.Observef("%d %s, audit %v code %v, upstream requests %d", o.Status, got, events, code, hits.Load()-before)
			if o.Status != http.StatusForbidden || got != string(tc.code) {
				t.Errorf("outcome %d %q, want 403 %s", o.Status, got, tc.code)
			}
			if len(events) != 1 || events[0] != "decision" || code != string(tc.code) {
				t.Errorf("audit %v code %v, want one decision record with code %s", events, code, tc.code)
			}
			if n := hits.Load() - before; n != 0 {
				t.Errorf("%d requests reached the upstream, want 0", n)
			}
		})
	}
	t.Run("control", func(t *testing.T) {
		c := casebook.Expect(t, "D17", "control: the same call for a live session, the user spelt ALICE",
			"200 from the upstream, audited under the canonical user alice")
		before := hits.Load()
		o := srv.Call(context.Background(), call.Request{Identity: id("D17-Live", "ALICE"), Tool: "tickets.list_tickets", Transport: call.MCP})
		events, _ := auditCode(o.RequestID)
		c.Observef("%d, reply %v, audit %v, upstream requests %d", o.Status, o.Reply != nil, events, hits.Load()-before)
		if o.Status != http.StatusOK || o.Reply == nil || hits.Load()-before != 1 {
			t.Fatalf("outcome %+v, want the upstream's reply", o)
		}
		if !strings.Contains(logs.String(), `"user":"alice","sandbox":"sb-d17","tool":"tickets.list_tickets","transport":"mcp"`) {
			t.Errorf("no tool_call line for the canonical user alice with transport mcp:\n%s", logs.String())
		}
		if strings.Contains(logs.String(), e.Secret) {
			t.Error("the log contains the secret")
		}
	})
}
