//go:build linux

package e2e

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/scrub"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestMCPThreatCases asserts the THREATS cases that apply to tool calls
// (C, D, E) over MCP: the same pipeline answers them through the MCP door
// as through POST /v1/tools, and each refusal is a tool result naming its
// code with its audit record.
func TestMCPThreatCases(t *testing.T) {
	e := newEnv(t)
	write := teamPolicy(t, e)
	d := mainConfig(e, "sluice")
	withApprovers(d, gwenv.CarolToken)
	d.Gateway()["hold_wait"] = "200ms"
	d["rego"] = []string{"policies/"}
	g := e.Start(d, e.Write(d))
	cs := mcpConnect(t, g, agentA, nil)
	call := func(t *testing.T, tool string, args map[string]any) *sdk.CallToolResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("tools/call %s: %v (want a tool result)", tool, err)
		}
		e.Keep([]byte(toolText(r)))
		return r
	}
	ridOf := func(t *testing.T, r *sdk.CallToolResult) string {
		m := structured(t, r)
		if rid, ok := m["request_id"].(string); ok {
			return rid
		}
		if er, ok := m["error"].(map[string]any); ok {
			rid, _ := er["request_id"].(string)
			return rid
		}
		return ""
	}

	t.Run("C6 redirect to metadata", func(t *testing.T) {
		c := casebook.Expect(t, "C6", "over MCP: tools/call whose connector upstream answers 302 Location http://169.254.169.254/latest/meta-data/",
			"the 302 relayed as the tool result (isError false, status 302), exactly 1 upstream request: not followed, credential sent once")
		e.Up.SetMode(gwenv.ModeRedirect)
		defer e.Up.SetMode(gwenv.ModeOK)
		n := len(e.Up.Requests())
		r := call(t, "tickets.list_tickets", map[string]any{})
		sc := structured(t, r)
		got := len(e.Up.Requests()) - n
		c.Observef("isError %v, result status %v, upstream requests %d", r.IsError, sc["status"], got)
		if sc["status"] != float64(http.StatusFound) || got != 1 {
			t.Errorf("got %v %s, %d upstream requests; want the 302 relayed once", r.IsError, toolText(r), got)
		}
	})

	t.Run("D3 credential echo", func(t *testing.T) {
		c := casebook.Expect(t, "D3", "over MCP: tools/call tickets.echo_auth, the upstream reflects the injected X-Api-Key in its body and headers (plain and base64)",
			"tool result scrubbed to "+scrub.Replacement+", no form of the secret in it, audit secret_reflected with transport mcp")
		r := call(t, "tickets.echo_auth", map[string]any{})
		text := toolText(r)
		hits := 0
		for _, f := range e.SecretForms() {
			if strings.Contains(text, f) {
				hits++
			}
		}
		rid := ridOf(t, r)
		f := auditFields(t, g, "secret_reflected", rid)
		c.Observef("isError %v, carries %s: %v, secret forms in result: %d, audit secret_reflected transport %v", r.IsError, scrub.Replacement, strings.Contains(text, scrub.Replacement), hits, f["transport"])
		if hits != 0 || !strings.Contains(text, scrub.Replacement) || f["transport"] != "mcp" {
			t.Errorf("echo over MCP: %d secret forms, %q", hits, text)
		}
	})

	t.Run("E2 agent approves over MCP", func(t *testing.T) {
		c := casebook.Expect(t, "E2", "over MCP: the agent holds a refund, then calls tool sluice.approve_hold and the methods holds/approve and tools/call of /api/v1/holds/{id}/approve",
			"no MCP path approves: unknown_tool (isError, audited) and -32601 method not found; the hold stays pending, nothing upstream")
		n := len(e.Up.Requests())
		r := call(t, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 3, "reason": "e2"}})
		hold, _ := structured(t, r)["hold"].(map[string]any)
		hid, _ := hold["id"].(string)
		if hid == "" {
			t.Fatalf("refund not held: %s", toolText(r))
		}
		a := call(t, "sluice.approve_hold", map[string]any{"hold_id": hid})
		st, code, _ := mcpPost(t, g, agentA, `{"jsonrpc":"2.0","id":9,"method":"holds/approve","params":{"id":"`+hid+`"}}`, http.Header{"Mcp-Session-Id": {cs.ID()}})
		_, _, hm := g.AdminDo(http.MethodGet, "/api/v1/holds/"+hid, gwenv.CarolToken, "")
		h, _ := hm["hold"].(map[string]any)
		c.Observef("tool: isError %v %q; method: %d %v; hold %v; upstream requests %d", a.IsError, toolText(a), st, code, h["status"], len(e.Up.Requests())-n)
		if !a.IsError || !strings.HasPrefix(toolText(a), "unknown_tool: ") || st != http.StatusNotFound || code != -32601 || h["status"] != "pending" || len(e.Up.Requests()) != n {
			t.Errorf("an MCP path approved or was not refused as designed")
		}
		_, _, _ = g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/deny", gwenv.CarolToken, `{"reason":"cleanup"}`)
	})

	t.Run("E7 always-allow grant with other arguments", func(t *testing.T) {
		c := casebook.Expect(t, "E7", "over MCP: carol approves a refund of 42 with always: true; the agent repeats it byte for byte, then with amount 43",
			"the repeat runs without a hold (isError false); amount 43 is a new hold (isError approval_pending)")
		args := map[string]any{"body": map[string]any{"amount": 42, "reason": "monthly"}}
		r := call(t, "tickets.create_refund", args)
		hold, _ := structured(t, r)["hold"].(map[string]any)
		hid, _ := hold["id"].(string)
		if hid == "" {
			t.Fatalf("refund not held: %s", toolText(r))
		}
		if st, body, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"monthly","always":true,"ttl":"1h"}`); st != http.StatusOK {
			t.Fatalf("approve always: %d %s", st, body)
		}
		again := call(t, "tickets.create_refund", args)
		other := call(t, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 43, "reason": "monthly"}})
		c.Observef("repeat: isError %v %.60q; other args: isError %v %.60q", again.IsError, toolText(again), other.IsError, toolText(other))
		if again.IsError || structured(t, again)["status"] == nil {
			t.Errorf("the granted repeat did not run: %s", toolText(again))
		}
		if !other.IsError || !strings.HasPrefix(toolText(other), "approval_pending: ") {
			t.Errorf("other arguments did not make a new hold: %s", toolText(other))
		}
	})

	t.Run("E5 ask becomes block before approval", func(t *testing.T) {
		c := casebook.Expect(t, "E5", "over MCP: a refund is held, a Rego module blocking refunds is loaded (SIGHUP), then carol approves; the agent waits with sluice.await_hold",
			"the approved call is re-evaluated and refused: await_hold isError policy_block, nothing upstream")
		r := call(t, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 5, "reason": "e5"}})
		hold, _ := structured(t, r)["hold"].(map[string]any)
		hid, _ := hold["id"].(string)
		if hid == "" {
			t.Fatalf("refund not held: %s", toolText(r))
		}
		n := len(e.Up.Requests())
		reloaded := 0
		for _, m := range g.LogLines() {
			if m["msg"] == "policy: reloaded" {
				reloaded++
			}
		}
		write(`package sluice.policies.team

decisions contains {"action": "block", "rule": "team.no_refunds", "reason": "refunds are frozen"} if {
	input.tool == "tickets.create_refund"
}
`)
		g.Signal(syscall.SIGHUP)
		g.AwaitLog("policy: reloaded", func(m map[string]any) bool {
			if m["msg"] != "policy: reloaded" {
				return false
			}
			k := 0
			for _, l := range g.LogLines() {
				if l["msg"] == "policy: reloaded" {
					k++
				}
			}
			return k > reloaded
		})
		if st, body, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"ok"}`); st != http.StatusOK && st != http.StatusForbidden {
			t.Fatalf("approve: %d %s", st, body)
		}
		w := call(t, "sluice.await_hold", map[string]any{"hold_id": hid})
		c.Observef("await_hold: isError %v %q; upstream requests %d", w.IsError, toolText(w), len(e.Up.Requests())-n)
		if !w.IsError || !strings.HasPrefix(toolText(w), "policy_block: ") || len(e.Up.Requests()) != n {
			t.Errorf("the approved, now blocked call: %v %q, %d upstream requests", w.IsError, toolText(w), len(e.Up.Requests())-n)
		}
	})
}
