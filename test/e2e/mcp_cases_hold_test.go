//go:build linux

package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// mcpCall is one tools/call over cs (the go-sdk client, on the sandbox
// socket); progress asks for progress notifications, which takes the
// call through the SDK's stream instead of the door's fast path.
func mcpCall(t *testing.T, e *gwenv.Env, cs *sdk.ClientSession, tool string, args map[string]any, progress bool) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &sdk.CallToolParams{Name: tool, Arguments: args}
	if progress {
		p.SetProgressToken("p-" + tool)
	}
	r, err := cs.CallTool(ctx, p)
	if err != nil {
		t.Fatalf("tools/call %s: %v (want a tool result)", tool, err)
	}
	e.Keep([]byte(toolText(r)))
	return r
}

// heldHold is the hold id of an approval_pending result, failing t
// otherwise.
func heldHold(t *testing.T, r *sdk.CallToolResult) string {
	t.Helper()
	hold, _ := structured(t, r)["hold"].(map[string]any)
	hid, _ := hold["id"].(string)
	if !r.IsError || !strings.HasPrefix(toolText(r), "approval_pending: ") || hid == "" {
		t.Fatalf("not held: %v %s", r.IsError, toolText(r))
	}
	return hid
}

// toolCode is the refusal code a tool result's text begins with.
func toolCode(r *sdk.CallToolResult) string {
	if !r.IsError {
		return ""
	}
	c, _, _ := strings.Cut(toolText(r), ":")
	return c
}

// refunds counts the upstream's POST /refunds requests since n requests.
func refunds(e *gwenv.Env, n int) (count int, bodies []string) {
	for _, q := range e.Up.Requests()[n:] {
		if q.Path == "/refunds" {
			count++
			bodies = append(bodies, q.Body)
		}
	}
	return count, bodies
}

// TestMCPHoldCases replays THREATS E4, E8 and D17 over MCP with the go-sdk
// client on the sandbox socket: the tool result's code and the audit
// record (transport mcp) for each.
func TestMCPHoldCases(t *testing.T) {
	requireHost(t)
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	withApprovers(d, gwenv.CarolToken)
	d.Gateway()["hold_wait"] = "200ms"
	d.Gateway()["session_tokens_sha256"] = []string{fmt.Sprintf("%x", sha256.Sum256([]byte(icptSessionToken)))}
	g := e.Start(d, e.Write(d))

	t.Run("E4 other arguments after approval", func(t *testing.T) {
		c := casebook.Expect(t, "E4", "over MCP: a refund of 7 held and approved; the agent calls the tool with 7000, await_hold with extra arguments, then re-sends 7000 and the approved arguments re-ordered under Sluice-Hold over POST",
			"MCP has no re-send with arguments: 7000 is a new hold (isError approval_pending, hold_created decision ask audited transport mcp), await_hold with arguments isError schema_violation, await_hold returns the approved call's result; the POST re-send of 7000 409 args_mismatch (audited), the re-ordered identical one the stored result; exactly one refund upstream, of amount 7")
		cs := mcpConnect(t, g, agentA, nil)
		before := len(e.Up.Requests())
		hid := heldHold(t, mcpCall(t, e, cs, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 7, "reason": "e4"}}, false))
		if st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"ok"}`); st != http.StatusOK {
			t.Fatalf("approve: %d %s", st, code)
		}
		other := mcpCall(t, e, cs, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 7000, "reason": "e4"}}, false)
		otherHold := heldHold(t, other)
		f := auditFields(t, g, "hold_created", ridOf(t, other)) // an ask's decision record
		extra := mcpCall(t, e, cs, "sluice.await_hold", map[string]any{"hold_id": hid, "arguments": map[string]any{"body": map[string]any{"amount": 7000}}}, false)
		w := mcpCall(t, e, cs, "sluice.await_hold", map[string]any{"hold_id": hid}, false)
		hdr := http.Header{"Sluice-Hold": {hid}}
		bad := g.Do(agentA, http.MethodPost, "/v1/tools/tickets.create_refund", `{"body":{"amount":7000,"reason":"e4"}}`, hdr)
		same := g.Do(agentA, http.MethodPost, "/v1/tools/tickets.create_refund", `{ "body" : { "reason" : "e4", "amount" : 7 } }`, hdr)
		e.Keep(bad.Body)
		e.Keep(same.Body)
		mismatch := auditFields(t, g, "decision", bad.RequestID)
		sent, bodies := refunds(e, before)
		c.Observef("7000 over MCP: %s (a new hold %v, decision %v transport %v); await_hold with arguments: %s; await_hold isError %v; POST 7000 %d %s (audit code %v); POST re-ordered %d; refunds upstream %d %v",
			toolCode(other), otherHold != hid, f["decision"], f["transport"], toolCode(extra), w.IsError, bad.Status, bad.Code, mismatch["code"], same.Status, sent, bodies)
		if f["decision"] != "ask" || f["transport"] != "mcp" || otherHold == hid {
			t.Errorf("the call with other arguments: decision %v transport %v, hold %s (approved %s)", f["decision"], f["transport"], otherHold, hid)
		}
		if toolCode(extra) != "schema_violation" {
			t.Errorf("await_hold with arguments: %q", toolText(extra))
		}
		if w.IsError || bad.Status != http.StatusConflict || bad.Code != "args_mismatch" || mismatch["code"] != "args_mismatch" || same.Status != http.StatusOK {
			t.Errorf("await_hold %v %q; POST 7000 %d %s; POST re-ordered %d %s", w.IsError, toolText(w), bad.Status, bad.Body, same.Status, same.Body)
		}
		if sent != 1 || !strings.Contains(bodies[0], `"amount":7`) || strings.Contains(bodies[0], "7000") {
			t.Errorf("refunds upstream %d %v; want exactly the approved one", sent, bodies)
		}
		_, _, _ = g.AdminDo(http.MethodPost, "/api/v1/holds/"+otherHold+"/deny", gwenv.CarolToken, `{"reason":"cleanup"}`)
	})

	t.Run("E8 self-approval under another spelling", func(t *testing.T) {
		c := casebook.Expect(t, "E8", "over MCP: sessions whose user is Carol, CAROL and ｃａｒｏｌ (full width) hold refunds; the approver carol approves each",
			"403 self_approval_forbidden each, audited hold_self_approval_refused by carol; hold_created (the ask's decision) records user carol, transport mcp; nothing sent")
		before := len(e.Up.Requests())
		var obs []string
		for _, user := range []string{"Carol", "CAROL", "ｃａｒｏｌ"} {
			id := wire.Identity{Sandbox: "sb-e8", Agent: "agent-a", Session: "s-e8", User: user}
			cs := mcpConnect(t, g, id, nil)
			r := mcpCall(t, e, cs, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 5, "reason": "mine"}}, user == "CAROL")
			hid := heldHold(t, r)
			f := auditFields(t, g, "hold_created", ridOf(t, r))
			st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"mine"}`)
			g.For(t).AwaitAuditFields("hold_self_approval_refused", map[string]any{"hold": hid, "by": "carol"})
			obs = append(obs, fmt.Sprintf("%s: approve %d %s, decision user %v transport %v", user, st, code, f["user"], f["transport"]))
			if st != http.StatusForbidden || code != "self_approval_forbidden" || f["user"] != "carol" || f["transport"] != "mcp" {
				t.Errorf("%q: approve %d %s; decision user %v transport %v", user, st, code, f["user"], f["transport"])
			}
		}
		sent, _ := refunds(e, before)
		c.Observef("%s; refunds upstream %d", strings.Join(obs, "; "), sent)
		if sent != 0 {
			t.Errorf("%d refunds sent", sent)
		}
	})

	t.Run("E8 hold ownership and grants under another spelling", func(t *testing.T) {
		c := casebook.Expect(t, "E8", "over MCP: session S-OWN of user Alice holds a refund; carol approves it with always; a session spelt s-own of user ａｌｉｃｅ awaits it and repeats the call; agent-b awaits it too",
			"the other spelling awaits the hold as its own and gets the result, its repeat runs under the grant (grant_used, isError false); agent-b gets not_found; one refund per run call")
		owner := wire.Identity{Sandbox: "sb-own", Agent: "agent-a", Session: "S-OWN", User: "Alice"}
		spelt := wire.Identity{Sandbox: "sb-own", Agent: "agent-a", Session: "s-own", User: "ａｌｉｃｅ"}
		cs1, cs2, csB := mcpConnect(t, g, owner, nil), mcpConnect(t, g, spelt, nil), mcpConnect(t, g, agentB, nil)
		before := len(e.Up.Requests())
		args := map[string]any{"body": map[string]any{"amount": 9, "reason": "own"}}
		hid := heldHold(t, mcpCall(t, e, cs1, "tickets.create_refund", args, false))
		foreign := mcpCall(t, e, csB, "sluice.await_hold", map[string]any{"hold_id": hid}, false)
		st, code, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"ok","always":true,"ttl":"1h"}`)
		grant, _ := body["grant"].(map[string]any)
		if st != http.StatusOK || grant == nil {
			t.Fatalf("approve always: %d %s", st, code)
		}
		w := mcpCall(t, e, cs2, "sluice.await_hold", map[string]any{"hold_id": hid}, false)
		again := mcpCall(t, e, cs2, "tickets.create_refund", args, true)
		used := g.For(t).AwaitAuditFields("grant_used", map[string]any{"grant": grant["id"]})
		sent, _ := refunds(e, before)
		c.Observef("agent-b: %s; ａｌｉｃｅ/s-own await_hold isError %v, repeat isError %v %.40q; grant_used %v; refunds upstream %d",
			toolCode(foreign), w.IsError, again.IsError, toolText(again), used != nil, sent)
		if toolCode(foreign) != "not_found" {
			t.Errorf("agent-b awaited another sandbox's hold: %q", toolText(foreign))
		}
		if w.IsError || again.IsError || sent != 2 {
			t.Errorf("the canonical owner: await %v %q, repeat %v %q, %d refunds", w.IsError, toolText(w), again.IsError, toolText(again), sent)
		}
	})

	t.Run("D17 ended session over an open MCP session", func(t *testing.T) {
		c := casebook.Expect(t, "D17", "over MCP: a session d17-live is open and calls; the operator ends D17-LIVE; the open MCP session calls again (fast path and SDK stream), and a new one spelt ｄ17-live (full width) calls",
			"the end closes the session's connections (a client holding the event stream is closed); each later call isError session_ended, audited decision code session_ended with transport mcp, nothing sent; control: the first call sent")
		id := wire.Identity{Sandbox: "sb-d17", Agent: "agent-a", Session: "d17-live", User: "alice"}
		streaming := mcpConnect(t, g, id, nil)
		cs := mcpConnectNoStream(t, g, id)
		if r := mcpCall(t, e, cs, "tickets.list_tickets", map[string]any{}, false); r.IsError {
			t.Fatalf("control: %s", toolText(r))
		}
		st, _, m := g.AdminDo(http.MethodPost, "/api/v1/sessions/D17-LIVE/end", icptSessionToken, "")
		if sess, _ := m["session"].(map[string]any); st != http.StatusOK || sess["session"] != "d17-live" {
			t.Fatalf("end D17-LIVE: %d %v", st, m)
		}
		before := len(e.Up.Requests())
		full := id
		full.Session = "ｄ17-live"
		cs2 := mcpConnectNoStream(t, g, full)
		var obs []string
		for i, r := range []*sdk.CallToolResult{
			mcpCall(t, e, cs, "tickets.list_tickets", map[string]any{}, false),
			mcpCall(t, e, cs, "tickets.list_tickets", map[string]any{}, true),
			mcpCall(t, e, cs2, "tickets.list_tickets", map[string]any{}, false),
		} {
			f := auditFields(t, g, "decision", ridOf(t, r))
			obs = append(obs, fmt.Sprintf("#%d %s (audit code %v transport %v)", i, toolCode(r), f["code"], f["transport"]))
			if toolCode(r) != "session_ended" || f["code"] != "session_ended" || f["transport"] != "mcp" {
				t.Errorf("call #%d after the end: %q, audit code %v transport %v", i, toolText(r), f["code"], f["transport"])
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, serr := streaming.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.list_tickets", Arguments: map[string]any{}})
		cancel()
		sent := len(e.Up.Requests()) - before
		c.Observef("%s; the client holding the event stream: %v; upstream requests %d", strings.Join(obs, "; "), serr != nil, sent)
		if sent != 0 {
			t.Errorf("%d requests sent for an ended session", sent)
		}
	})

	t.Run("D17 ambiguous identity never reaches the door", func(t *testing.T) {
		c := casebook.Expect(t, "D17", "over MCP: the go-sdk client connects on identities whose user mixes Latin and Cyrillic (\u0430lice, alice\u0441); one with a zero-width joiner (al\u200dice) the relay's encoder refuses to send",
			"the socket refuses the connection before /mcp (400 identity_required, logged with the reason); no MCP session, no audit record for the user, nothing sent")
		before := len(e.Up.Requests())
		var obs []string
		if _, err := wire.Encode(wire.Identity{Sandbox: "sb-d17b", Agent: "agent-a", Session: "d17-b", User: "al\u200dice"}); err == nil {
			t.Error("the relay's encoder sends a user with a zero-width joiner")
		}
		for _, user := range []string{"\u0430lice", "alice\u0441"} {
			id := wire.Identity{Sandbox: "sb-d17b", Agent: "agent-a", Session: "d17-b", User: user}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			hc := g.Client(id)
			_, err := sdk.NewClient(&sdk.Implementation{Name: "e2e-go", Version: "1"}, nil).Connect(ctx, &sdk.StreamableClientTransport{Endpoint: "http://sluice/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
			cancel()
			obs = append(obs, fmt.Sprintf("%q: %v", user, err))
			if err == nil || !strings.Contains(err.Error(), "Bad Request") {
				t.Errorf("connect as %q: %v; want the socket's 400", user, err)
			}
			if recs := g.AuditEvent("decision", user); len(recs) != 0 {
				t.Errorf("%d decision records for %q", len(recs), user)
			}
		}
		g.For(t).AwaitLog("ambiguous identity refused", func(m map[string]any) bool {
			return m["msg"] == "sandbox socket: refused connection with an ambiguous identity"
		})
		c.Observef("%s; upstream requests %d", strings.Join(obs, "; "), len(e.Up.Requests())-before)
		if len(e.Up.Requests()) != before {
			t.Error("a request was sent")
		}
	})
}

// mcpConnectNoStream is mcpConnect without the standalone event stream:
// each call is a POST of its own.
func mcpConnectNoStream(t *testing.T, g *gwenv.Gateway, id wire.Identity) *sdk.ClientSession {
	t.Helper()
	return mcpConnectTransport(t, g, id, nil, true)
}

// ridOf is the request id a tool result names (refusals and results).
func ridOf(t *testing.T, r *sdk.CallToolResult) string {
	t.Helper()
	if m := ridRe.FindStringSubmatch(toolText(r)); m != nil {
		return m[1]
	}
	if rid, _ := structured(t, r)["request_id"].(string); rid != "" {
		return rid
	}
	t.Fatalf("no request_id in %q", toolText(r))
	return ""
}

// TestMCPHoldExpiry is THREATS E6 over MCP: a hold nobody decided within
// its hold_ttl is approval_expired for the agent's sluice.await_hold and
// 410 for the approver, and was never sent.
func TestMCPHoldExpiry(t *testing.T) {
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	withApprovers(d, gwenv.CarolToken)
	d.Gateway()["hold_wait"] = "200ms"
	d.Rule("tickets.create_refund")["hold_ttl"] = "5s"
	g := e.Start(d, e.Write(d))
	c := casebook.Expect(t, "E6", "over MCP: a refund held with hold_ttl 5s; the agent awaits it with sluice.await_hold past the expiry; carol approves after",
		"await_hold isError approval_pending before, approval_expired after; approve 410; hold_expired audited, the hold_created record transport mcp; nothing upstream")
	cs := mcpConnect(t, g, agentA, nil)
	r := mcpCall(t, e, cs, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 3, "reason": "e6"}}, false)
	hid := heldHold(t, r)
	f := auditFields(t, g, "hold_created", ridOf(t, r))
	ctl := mcpCall(t, e, cs, "sluice.await_hold", map[string]any{"hold_id": hid}, false)
	var w *sdk.CallToolResult
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		w = mcpCall(t, e, cs, "sluice.await_hold", map[string]any{"hold_id": hid}, true)
		if toolCode(w) != "approval_pending" {
			break
		}
	}
	st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"late"}`)
	exp := g.AwaitAuditFields("hold_expired", map[string]any{"hold": hid})
	c.Observef("control await %s; after expiry %s; approve %d %s; hold_expired %v; decision %v transport %v; upstream requests %d",
		toolCode(ctl), toolCode(w), st, code, exp != nil, f["decision"], f["transport"], len(e.Up.Requests()))
	if toolCode(ctl) != "approval_pending" || toolCode(w) != "approval_expired" || st != http.StatusGone || f["transport"] != "mcp" || len(e.Up.Requests()) != 0 {
		t.Errorf("control %q, after expiry %q, approve %d %s, transport %v, upstream %d", toolText(ctl), toolText(w), st, code, f["transport"], len(e.Up.Requests()))
	}
}

// TestMCPUsageWindowRule is THREATS E12 over MCP: "the 4th refund today
// asks" raced by 8 concurrent tools/calls on one MCP session, half on the
// door's fast path and half on the SDK's stream (a progress token), then
// a restart: exactly 3 sent and 5 held, and after the restart the 9th is
// held and one past 1000 in the day is policy_block, audited with its
// input.usage and transport mcp.
func TestMCPUsageWindowRule(t *testing.T) {
	requireHost(t)
	c := casebook.Expect(t, "E12", "over MCP: 8 concurrent refunds on one session (4 fast path, 4 SDK stream) against \"the 4th refund today asks\", then a restart",
		"exactly 3 sent (isError false) and 5 isError approval_pending, hold_created under refunds_per_day; after a restart the 9th isError approval_pending and one past 1000 isError policy_block, audited with input.usage.user.day.sum 1040 and transport mcp")
	e := newEnv(t)
	d := usageConfig(t, e)
	d.Gateway()["hold_wait"] = "200ms"
	path := e.Write(d)
	g := e.Start(d, path)
	cs := mcpConnect(t, g, agentA, nil)

	var mu sync.Mutex
	outcome := map[string]int{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mcpCall(t, e, cs, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 10, "reason": fmt.Sprintf("r%d", i)}}, i%2 == 1)
			k := toolCode(r)
			if k == "" {
				k = "sent"
			}
			mu.Lock()
			outcome[k]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	sent, _ := refunds(e, 0)
	held := len(g.AuditEvent("hold_created", "refunds_per_day"))
	if outcome["sent"] != 3 || outcome["approval_pending"] != 5 || len(outcome) != 2 || sent != 3 || held != 5 {
		t.Fatalf("8 concurrent refunds over MCP: %v, %d sent upstream, %d hold_created; want 3 sent, 5 held", outcome, sent, held)
	}

	g.Stop()
	g = e.Start(d, path)
	cs = mcpConnect(t, g, agentA, nil)
	ninth := mcpCall(t, e, cs, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 10, "reason": "after restart"}}, false)
	big := mcpCall(t, e, cs, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 950, "reason": "big"}}, true)
	f := auditFields(t, g, "decision", ridOf(t, big))
	in, _ := f["input"].(map[string]any)
	usage, _ := in["usage"].(map[string]any)
	user, _ := usage["user"].(map[string]any)
	day, _ := user["day"].(map[string]any)
	sentAfter, _ := refunds(e, 0)
	c.Observef("outcomes %v, %d hold_created; after restart: 9th %s, 950 %s (rule %v, day sum %v, transport %v); refunds upstream %d",
		outcome, held, toolCode(ninth), toolCode(big), f["rule"], day["sum"], f["transport"], sentAfter)
	if toolCode(ninth) != "approval_pending" || toolCode(big) != "policy_block" || f["rule"] != "refund_sum_per_day" || day["sum"] != float64(1040) || f["transport"] != "mcp" || sentAfter != 3 {
		t.Errorf("after the restart: 9th %q, 950 %q; audit rule %v sum %v transport %v; %d sent", toolText(ninth), toolText(big), f["rule"], day["sum"], f["transport"], sentAfter)
	}
}
