//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// mcpConnect opens an MCP session with the official Go SDK client over
// the sandbox socket as id (the identity is the connection's preamble).
func mcpConnect(t *testing.T, g *gwenv.Gateway, id wire.Identity, opts *sdk.ClientOptions) *sdk.ClientSession {
	t.Helper()
	return mcpConnectTransport(t, g, id, opts, false)
}

// mcpConnectTransport is mcpConnect, without the client's standalone
// event stream when noStream.
func mcpConnectTransport(t *testing.T, g *gwenv.Gateway, id wire.Identity, opts *sdk.ClientOptions, noStream bool) *sdk.ClientSession {
	t.Helper()
	c := sdk.NewClient(&sdk.Implementation{Name: "e2e-go", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc := g.Client(id)
	hc.Timeout = 0 // the standalone event stream stays open
	cs, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: "http://sluice/mcp", HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: noStream}, nil)
	if err != nil {
		t.Fatalf("mcp connect as %s: %v", id.Agent, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// toolText is a tool result's text content.
func toolText(r *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// structured is a tool result's structuredContent as a map.
func structured(t *testing.T, r *sdk.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(r.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

// TestMCPGoClientListsAndCalls: the Go SDK's client lists agent-a's
// tools (granted, minus the ones its policy blocks outright) with their
// schemas and annotations, calls an allowed tool through the pipeline
// (the upstream answers, with the credential attached outside), gets
// refusals as isError results naming their code, and agent-b sees none.
func TestMCPGoClientListsAndCalls(t *testing.T) {
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	g := e.Start(d, e.Write(d))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cs := mcpConnect(t, g, agentA, nil)
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	tools := map[string]*sdk.Tool{}
	for _, tl := range lt.Tools {
		tools[tl.Name] = tl
	}
	for _, want := range []string{"tickets.list_tickets", "tickets.get_ticket", "tickets.create_refund", "sluice.await_hold"} {
		if tools[want] == nil {
			t.Errorf("tools/list lacks %s (has %v)", want, keys(tools))
		}
	}
	if tools["tickets.delete_ticket"] != nil {
		t.Error("tools/list offers tickets.delete_ticket, which the policy blocks outright")
	}
	if lt := tools["tickets.list_tickets"]; lt != nil {
		if lt.Annotations == nil || !lt.Annotations.ReadOnlyHint {
			t.Errorf("list_tickets (GET) annotations %+v: want readOnlyHint", lt.Annotations)
		}
		s, _ := lt.InputSchema.(map[string]any)
		if s["type"] != "object" {
			t.Errorf("list_tickets inputSchema %v: want a JSON Schema object", lt.InputSchema)
		}
	}
	// get_ticket's spec declares its 200 reply (Ticket): it is the
	// outputSchema; list_tickets declares none.
	if gt := tools["tickets.get_ticket"]; gt != nil {
		out, _ := gt.OutputSchema.(map[string]any)
		if out["type"] != "object" || fmt.Sprint(out["required"]) != "[id method]" {
			t.Errorf("get_ticket outputSchema %v: want the Ticket object schema", gt.OutputSchema)
		}
	}
	if lt := tools["tickets.list_tickets"]; lt != nil && lt.OutputSchema != nil {
		t.Errorf("list_tickets outputSchema %v: its spec declares no reply schema", lt.OutputSchema)
	}
	if rf := tools["tickets.create_refund"]; rf != nil && (rf.Annotations == nil || rf.Annotations.ReadOnlyHint) {
		t.Errorf("create_refund (POST) annotations %+v: want not readOnly", rf.Annotations)
	}

	// Allowed: the upstream's answer, and the call's one decision line.
	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.list_tickets", Arguments: map[string]any{}})
	if err != nil {
		t.Fatalf("tools/call list_tickets: %v", err)
	}
	e.Keep([]byte(toolText(r)))
	sc := structured(t, r)
	if r.IsError || sc["status"] != float64(200) {
		t.Fatalf("list_tickets over MCP: isError %v, %s; want the upstream's 200", r.IsError, toolText(r))
	}
	rid, _ := sc["request_id"].(string)
	line := g.AwaitLog("the call's decision line", func(m map[string]any) bool { return m["msg"] == "tool_call" && m["request_id"] == rid })
	if line["decision"] != "allow" || line["agent"] != "agent-a" || line["transport"] != "mcp" {
		t.Errorf("decision line for %s: %v; want allow for agent-a, transport mcp", rid, line)
	}
	if f := auditFields(t, g, "result", rid); f["transport"] != "mcp" || f["agent"] != "agent-a" {
		t.Errorf("audit result record of the MCP call: %v; want transport mcp", f)
	}
	if n := len(e.Up.Requests()); n != 1 {
		t.Fatalf("upstream saw %d requests, want 1", n)
	}

	// A tool with an outputSchema: the upstream's body, valid under it, is
	// the structuredContent, beside the text of the whole result.
	r, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.get_ticket", Arguments: map[string]any{"path": map[string]any{"id": "t-9"}}})
	if err != nil {
		t.Fatalf("tools/call get_ticket: %v", err)
	}
	if sc, _ := r.StructuredContent.(map[string]any); r.IsError || sc["id"] != "t-9" || sc["method"] != "GET" || len(sc) != 2 || !strings.Contains(toolText(r), `"status":200`) {
		t.Errorf("get_ticket over MCP: isError %v, structuredContent %v, text %s; want the Ticket body and the result text", r.IsError, r.StructuredContent, toolText(r))
	}

	// The alias is accepted too.
	if a := aliasOf(t, g, "tickets.list_tickets"); a != "" {
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: a, Arguments: map[string]any{}})
		if err != nil || r.IsError {
			t.Errorf("call by alias %s: %v %s", a, err, toolText(r))
		}
	}

	// Blocked: an isError result naming policy_block and the rule's reason;
	// nothing upstream.
	before := len(e.Up.Requests())
	r, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.delete_ticket", Arguments: map[string]any{"path": map[string]any{"id": "T-1"}}})
	if err != nil {
		t.Fatalf("tools/call delete_ticket: %v (want a tool result, not a protocol error)", err)
	}
	if !r.IsError || !strings.HasPrefix(toolText(r), "policy_block: ") || !strings.Contains(toolText(r), "deleting tickets is not for agents") {
		t.Errorf("blocked call: isError %v %q; want isError naming policy_block and the reason", r.IsError, toolText(r))
	}
	brid, _ := structured(t, r)["error"].(map[string]any)["request_id"].(string)
	if f := auditFields(t, g, "decision", brid); f["code"] != "policy_block" || f["agent"] != "agent-a" || f["transport"] != "mcp" {
		t.Errorf("audit record of the blocked MCP call: %v; want code policy_block for agent-a over mcp", f)
	}
	// Bad arguments: schema_violation, nothing upstream.
	r, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.list_tickets", Arguments: map[string]any{"nonsense": 1}})
	if err != nil || !r.IsError || !strings.HasPrefix(toolText(r), "schema_violation: ") {
		t.Errorf("bad arguments: %v isError %v %q; want isError schema_violation", err, r != nil && r.IsError, toolText(r))
	}
	if n := len(e.Up.Requests()); n != before {
		t.Errorf("refused calls reached the upstream (%d requests, want %d)", n, before)
	}

	// agent-b is granted nothing: only the built-in tool is listed.
	csb := mcpConnect(t, g, agentB, nil)
	ltb, err := csb.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ltb.Tools) != 1 || ltb.Tools[0].Name != "sluice.await_hold" {
		var names []string
		for _, tl := range ltb.Tools {
			names = append(names, tl.Name)
		}
		t.Errorf("agent-b lists %v; want only sluice.await_hold", names)
	}
	r, err = csb.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.list_tickets", Arguments: map[string]any{}})
	if err == nil && !r.IsError {
		t.Errorf("agent-b called a tool it is not granted: %s", toolText(r))
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// aliasOf is the tool's function-safe alias as GET /v1/tools lists it.
func aliasOf(t *testing.T, g *gwenv.Gateway, tool string) string {
	t.Helper()
	r := g.Do(agentA, http.MethodGet, "/v1/tools", "", nil)
	var l struct {
		Tools []struct{ Name, Alias string } `json:"tools"`
	}
	_ = json.Unmarshal(r.Body, &l)
	for _, x := range l.Tools {
		if x.Name == tool {
			return x.Alias
		}
	}
	return ""
}

// TestMCPHoldProgressApproval: an ask call over MCP stays open and sends
// progress notifications while it waits; approved through the admin API it
// returns the upstream's result. A denied one is isError with the
// approver's reason; one still pending after hold_wait is isError with the
// hold id, and sluice.await_hold returns its result once approved.
func TestMCPHoldProgressApproval(t *testing.T) {
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	withApprovers(d, gwenv.CarolToken)
	d.Gateway()["hold_wait"] = "6s"
	g := e.Start(d, e.Write(d))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	var mu sync.Mutex
	progress := map[any]int{}
	first := make(chan struct{}, 8)
	cs := mcpConnect(t, g, agentA, &sdk.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *sdk.ProgressNotificationClientRequest) {
		mu.Lock()
		progress[r.Params.ProgressToken]++
		mu.Unlock()
		select {
		case first <- struct{}{}:
		default:
		}
	}})
	pending := func() string {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			st, _, m := g.AdminDo(http.MethodGet, "/api/v1/holds?status=pending", gwenv.CarolToken, "")
			if st != http.StatusOK {
				continue
			}
			hs, _ := m["holds"].([]any)
			for _, h := range hs {
				if hm, _ := h.(map[string]any); hm["status"] == "pending" {
					return hm["id"].(string)
				}
			}
		}
		t.Fatal("no pending hold appeared")
		return ""
	}
	refund := func(token string) *sdk.CallToolParams {
		p := &sdk.CallToolParams{Name: "tickets.create_refund", Arguments: map[string]any{"body": map[string]any{"amount": 5, "reason": "dup"}}}
		if token != "" {
			p.SetProgressToken(token)
		}
		return p
	}

	// 1. ask → progress → approval → the upstream's result.
	done := make(chan *sdk.CallToolResult, 1)
	go func() {
		r, err := cs.CallTool(ctx, refund("p1"))
		if err != nil {
			t.Errorf("ask call: %v", err)
		}
		done <- r
	}()
	id := pending()
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		t.Fatal("no progress notification while the call was held")
	}
	if st, body, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+id+"/approve", gwenv.CarolToken, `{"reason":"ok"}`); st != http.StatusOK {
		t.Fatalf("approve: %d %s", st, body)
	}
	r := <-done
	if r == nil || r.IsError || structured(t, r)["status"] == nil {
		t.Fatalf("approved ask over MCP: %+v; want the upstream's result", r)
	}
	e.Keep([]byte(toolText(r)))
	mu.Lock()
	if progress["p1"] == 0 {
		t.Errorf("progress notifications for token p1: 0")
	}
	mu.Unlock()

	// 2. ask → deny with a reason → isError approval_denied naming it.
	go func() {
		r, _ := cs.CallTool(ctx, refund(""))
		done <- r
	}()
	id = pending()
	if st, body, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+id+"/deny", gwenv.CarolToken, `{"reason":"not this one"}`); st != http.StatusOK {
		t.Fatalf("deny: %d %s", st, body)
	}
	r = <-done
	if r == nil || !r.IsError || !strings.HasPrefix(toolText(r), "approval_denied: ") || !strings.Contains(toolText(r), "not this one") {
		t.Fatalf("denied ask over MCP: %+v %q; want isError approval_denied with the reason", r, toolText(r))
	}

	// 3. still pending after hold_wait → isError with the hold id; then
	// sluice.await_hold returns the result once approved.
	r, err := cs.CallTool(ctx, refund(""))
	if err != nil {
		t.Fatal(err)
	}
	hold, _ := structured(t, r)["hold"].(map[string]any)
	hid, _ := hold["id"].(string)
	if !r.IsError || hid == "" || !strings.Contains(toolText(r), "sluice.await_hold") || !strings.Contains(toolText(r), hid) {
		t.Fatalf("pending ask: isError %v %q; want isError naming the hold and sluice.await_hold", r.IsError, toolText(r))
	}
	go func() {
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "sluice.await_hold", Arguments: map[string]any{"hold_id": hid}})
		if err != nil {
			t.Errorf("await_hold: %v", err)
		}
		done <- r
	}()
	time.Sleep(300 * time.Millisecond)
	if st, body, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"ok"}`); st != http.StatusOK {
		t.Fatalf("approve: %d %s", st, body)
	}
	r = <-done
	if r == nil || r.IsError {
		t.Fatalf("await_hold after approval: %+v", r)
	}
	e.Keep([]byte(toolText(r)))
	// Another sandbox cannot wait on (or learn of) agent-a's hold.
	csb := mcpConnect(t, g, agentB, nil)
	rb, err := csb.CallTool(ctx, &sdk.CallToolParams{Name: "sluice.await_hold", Arguments: map[string]any{"hold_id": hid, "wait_seconds": 0}})
	if err != nil || !rb.IsError || !strings.HasPrefix(toolText(rb), "not_found: ") {
		t.Errorf("agent-b awaiting agent-a's hold: %v %q; want isError not_found", err, toolText(rb))
	}
}

// auditFields waits for the audit record event of request rid and returns
// its fields.
func auditFields(t *testing.T, g *gwenv.Gateway, event, rid string) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, r := range g.AuditRecords() {
			if r["event"] == event && r["request_id"] == rid {
				f, _ := r["fields"].(map[string]any)
				return f
			}
		}
	}
	t.Fatalf("no audit record %s for request %s", event, rid)
	return nil
}

// mcpPost POSTs one raw message to /mcp as id and returns the status and
// the JSON-RPC error's code and message.
func mcpPost(t *testing.T, g *gwenv.Gateway, id wire.Identity, body string, hdr http.Header) (int, float64, string) {
	t.Helper()
	h := http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"}}
	for k, v := range hdr {
		h[k] = v
	}
	r := g.Do(id, http.MethodPost, "/mcp", body, h)
	var m struct {
		JSONRPC string `json:"jsonrpc"`
		Error   struct {
			Code    float64 `json:"code"`
			Message string  `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.Body, &m); err != nil || m.JSONRPC != "2.0" {
		t.Errorf("POST /mcp %.60q: %d %q is not a JSON-RPC answer", body, r.Status, r.Body)
	}
	return r.Status, m.Error.Code, m.Error.Message
}

// TestMCPBadInput: malformed JSON-RPC, a batch, an unknown method, an
// oversized message and a session id another sandbox opened are refused
// with JSON-RPC errors naming what was wrong, and nothing reaches the
// upstream.
func TestMCPBadInput(t *testing.T) {
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	d.Gateway()["mcp"] = map[string]any{"max_message_bytes": 4096}
	g := e.Start(d, e.Write(d))
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"tickets.list_tickets","arguments":{}}}`
	for _, tc := range []struct {
		name, body string
		status     int
		code       float64
		says       string
	}{
		{"not JSON", `{"jsonrpc":"2.0","id":1,"method":`, 400, -32700, "not valid JSON"},
		{"batch (removed in MCP 2025-06-18)", "[" + call + "," + call + "]", 400, -32600, "batches are not accepted"},
		{"not an object", `"tools/call"`, 400, -32600, "JSON-RPC 2.0 object"},
		{"wrong version", `{"jsonrpc":"1.0","id":1,"method":"ping"}`, 400, -32600, `jsonrpc: must be "2.0"`},
		{"unknown method", `{"jsonrpc":"2.0","id":1,"method":"resources/list"}`, 404, -32601, `method "resources/list" is not offered`},
		{"oversized", `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"` + strings.Repeat("x", 5000) + `"}}`, 413, -32600, "larger than 4096 bytes"},
		{"object id", `{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}`, 400, -32600, "id: must be a string or an integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, code, msg := mcpPost(t, g, agentA, tc.body, nil)
			if st != tc.status || code != tc.code || !strings.Contains(msg, tc.says) {
				t.Errorf("%d %v %q; want %d %v naming %q", st, code, msg, tc.status, tc.code, tc.says)
			}
		})
	}

	// A session id opened by agent-a is not agent-b's: refused, as an
	// unknown one is, and the call is not run.
	cs := mcpConnect(t, g, agentA, nil)
	sid := cs.ID()
	if sid == "" {
		t.Fatal("the gateway assigned no session id")
	}
	e9 := casebook.Expect(t, "E9", "agent-a's Mcp-Session-Id presented by agent-b, by another sandbox of agent-a, and an unknown id, each with a tools/call of tickets.list_tickets",
		"404 JSON-RPC -32001 (one answer for foreign and unknown), no tool_call line, no upstream request; the owner's session still works")
	var seen []string
	defer func() { e9.Observe(strings.Join(seen, "; ")) }()
	for _, tc := range []struct {
		name string
		id   wire.Identity
		sid  string
	}{{"another sandbox's session", agentB, sid}, {"same agent, another session", wire.Identity{Sandbox: "sb-other", Agent: agentA.Agent, Session: "s-other", User: agentA.User, Host: agentA.Host}, sid}, {"unknown session", agentA, "00ff"}} {
		st, code, msg := mcpPost(t, g, tc.id, call, http.Header{"Mcp-Session-Id": {tc.sid}})
		seen = append(seen, fmt.Sprintf("%s: %d %v", tc.name, st, code))
		if st != http.StatusNotFound || code != -32001 || !strings.Contains(msg, "was opened by this sandbox") {
			t.Errorf("%s: %d %v %q; want 404 -32001", tc.name, st, code, msg)
		}
	}
	if n := len(e.Up.Requests()); n != 0 {
		t.Errorf("refused MCP messages reached the upstream: %d requests", n)
	}
	calls := 0
	for _, m := range g.LogLines() {
		if m["msg"] == "tool_call" {
			calls++
			t.Errorf("a refused MCP message ran a call: %v", m)
		}
	}
	seen = append(seen, fmt.Sprintf("upstream requests %d, tool_call lines %d", len(e.Up.Requests()), calls))
	// Control: the owner's own session still works.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// An identity claimed in the call's _meta is ignored: the call is the
	// connection's (agent-a's), never agent-b's.
	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.list_tickets", Arguments: map[string]any{},
		Meta: sdk.Meta{"sluice/identity": map[string]any{"agent": "agent-b", "sandbox": "sb-2", "user": "bob"}}})
	if err != nil || r.IsError {
		t.Fatalf("the owner's call on its session: %v", err)
	}
	rid, _ := structured(t, r)["request_id"].(string)
	line := g.AwaitLog("the owner's call", func(m map[string]any) bool { return m["msg"] == "tool_call" && m["request_id"] == rid })
	seen = append(seen, fmt.Sprintf("owner's call with _meta claiming agent-b: isError %v, decided for %v", r.IsError, line["agent"]))
	if line["agent"] != "agent-a" || line["user"] != "alice" {
		t.Errorf("the call was decided for %v/%v; the identity must be the connection's", line["agent"], line["user"])
	}
}

// TestMCPListChangedOnReload: a policy reload that blocks a tool outright
// sends notifications/tools/list_changed to the open session, whose next
// tools/list leaves the tool out; a call of it is still the pipeline's to
// refuse (isError policy_block), not a protocol error.
func TestMCPListChangedOnReload(t *testing.T) {
	e := newEnv(t)
	write := teamPolicy(t, e)
	d := mainConfig(e, "sluice")
	d["rego"] = []string{"policies/"}
	g := e.Start(d, e.Write(d))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	changed := make(chan struct{}, 8)
	cs := mcpConnect(t, g, agentA, &sdk.ClientOptions{ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) {
		changed <- struct{}{}
	}})
	has := func(name string) bool {
		lt, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		for _, tl := range lt.Tools {
			if tl.Name == name {
				return true
			}
		}
		return false
	}
	if !has("tickets.list_tickets") {
		t.Fatal("list_tickets not listed before the reload")
	}
	write(`package sluice.policies.team

decisions contains {"action": "block", "rule": "team.no_listing", "reason": "listing is paused"} if {
	input.tool == "tickets.list_tickets"
}
`)
	g.Signal(syscall.SIGHUP)
	select {
	case <-changed:
	case <-time.After(20 * time.Second):
		t.Fatal("no notifications/tools/list_changed after a reload that changed the list")
	}
	if has("tickets.list_tickets") {
		t.Error("list_tickets still listed after the reload blocked it")
	}
	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.list_tickets", Arguments: map[string]any{}})
	if err != nil || !r.IsError || !strings.HasPrefix(toolText(r), "policy_block: ") || !strings.Contains(toolText(r), "listing is paused") {
		t.Errorf("call of the delisted tool: %v %q; want isError policy_block with the reason", err, toolText(r))
	}
	if n := len(e.Up.Requests()); n != 0 {
		t.Errorf("the upstream saw %d requests, want 0", n)
	}
}

// TestMCPCancelLeavesHoldPending: an MCP client that cancels its held
// call (notifications/cancelled) leaves the hold pending for a person, as
// an HTTP client's disconnect does; approved, it runs once, and
// sluice.await_hold returns its result.
func TestMCPCancelLeavesHoldPending(t *testing.T) {
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	withApprovers(d, gwenv.CarolToken)
	d.Gateway()["hold_wait"] = "20s"
	g := e.Start(d, e.Write(d))
	cs := mcpConnect(t, g, agentA, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(cctx, &sdk.CallToolParams{Name: "tickets.create_refund", Arguments: map[string]any{"body": map[string]any{"amount": 9, "reason": "cancel"}}})
		done <- err
	}()
	var hid string
	for deadline := time.Now().Add(10 * time.Second); hid == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, _, m := g.AdminDo(http.MethodGet, "/api/v1/holds?status=pending", gwenv.CarolToken, "")
		if hs, _ := m["holds"].([]any); len(hs) > 0 {
			hid, _ = hs[0].(map[string]any)["id"].(string)
		}
	}
	if hid == "" {
		t.Fatal("no pending hold")
	}
	stop() // the SDK sends notifications/cancelled
	if err := <-done; err == nil {
		t.Fatal("the cancelled call returned a result")
	}
	time.Sleep(500 * time.Millisecond)
	_, _, m := g.AdminDo(http.MethodGet, "/api/v1/holds/"+hid, gwenv.CarolToken, "")
	if h, _ := m["hold"].(map[string]any); h["status"] != "pending" {
		t.Fatalf("after the client cancelled, the hold is %v; want pending", h["status"])
	}
	if n := len(e.Up.Requests()); n != 0 {
		t.Fatalf("%d upstream requests before any approval", n)
	}
	if st, body, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"ok"}`); st != http.StatusOK {
		t.Fatalf("approve: %d %s", st, body)
	}
	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "sluice.await_hold", Arguments: map[string]any{"hold_id": hid}})
	if err != nil || r.IsError {
		t.Fatalf("await_hold after approval: %v %q", err, toolText(r))
	}
	e.Keep([]byte(toolText(r)))
	if n := len(e.Up.Requests()); n != 1 {
		t.Errorf("the approved call reached the upstream %d times, want once", n)
	}
}

// teamPolicy makes policies/team.rego in e's directory holding a module that
// blocks only a tool nobody has (so it changes nothing yet), and returns the
// function that rewrites it for a later reload.
func teamPolicy(t *testing.T, e *gwenv.Env) func(src string) {
	t.Helper()
	dir := filepath.Join(e.Dir, "policies")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mod := filepath.Join(dir, "team.rego")
	write := func(src string) {
		if err := os.WriteFile(mod, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("package sluice.policies.team\n\ndecisions contains d if {\n\tinput.tool == \"tickets.nothing\"\n\td := {\"action\": \"block\", \"rule\": \"team.none\"}\n}\n")
	return write
}
