package mcp

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestDoorOverSDK drives the door with the official Go SDK client: the
// list (with hints), an allowed call, a refusal, a held call's progress
// and pending result, sluice.await_hold, aliases, and list_changed after
// Changed. The hooks stand in for the pipeline (the e2e suite runs the
// real one); what is tested here is the door's protocol mapping, under
// the race detector.
func TestDoorOverSDK(t *testing.T) {
	var blocked atomic.Bool
	schema := json.RawMessage(`{"type":"object","properties":{"body":{}}}`)
	var mu sync.Mutex
	var got []call.Request
	d := New(Deps{
		Identify: func(r *http.Request) (wire.Identity, bool) {
			return wire.Identity{Sandbox: "sb", Agent: "a", Session: "s", User: "u"}, true
		},
		Tools: func(context.Context, wire.Identity) ([]call.Tool, *refusal.Error) {
			ts := []call.Tool{{Name: "t.get", Alias: "t_get", Method: "GET", Schema: schema, Description: "get"},
				{Name: "t.del", Alias: "t_del", Method: "DELETE", Schema: schema}}
			if blocked.Load() {
				ts = ts[:1]
			}
			return ts, nil
		},
		Call: func(ctx context.Context, r call.Request) call.Outcome {
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
			switch r.Tool {
			case "t.get":
				return call.Outcome{RequestID: "r1", Status: 200, Reply: &call.Reply{Status: 200, Body: json.RawMessage(`{"ok":true}`)}}
			case "t.ask":
				r.Progress(call.Progress{Hold: "h1", Bound: time.Second})
				r.Progress(call.Progress{Hold: "h1", Waited: 500 * time.Millisecond, Bound: time.Second})
				return call.Outcome{RequestID: "r2", Status: 202, Hold: &call.Hold{ID: "h1", State: "pending", RequestID: "r2"}}
			}
			e := refusal.New(http.StatusForbidden, refusal.PolicyBlock, "blocked by policy: no")
			return call.Outcome{RequestID: "r3", Status: e.Status, Refusal: e}
		},
		Poll: func(_ context.Context, _ wire.Identity, hold string, wait time.Duration) call.Outcome {
			if hold != "h1" || wait > time.Second {
				e := refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold")
				return call.Outcome{Status: 404, Refusal: e}
			}
			return call.Outcome{Status: 200, Answer: []byte(`{"status":201,"headers":{},"body":"made","request_id":"r2"}`)}
		},
		HoldWait: time.Second,
		Progress: 10 * time.Millisecond,
	})
	srv := httptest.NewServer(d)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	changed := make(chan struct{}, 4)
	var progress atomic.Int32
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "1"}, &sdk.ClientOptions{
		ToolListChangedHandler:      func(context.Context, *sdk.ToolListChangedRequest) { changed <- struct{}{} },
		ProgressNotificationHandler: func(context.Context, *sdk.ProgressNotificationClientRequest) { progress.Add(1) },
	}).Connect(ctx, &sdk.StreamableClientTransport{Endpoint: srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	hints := map[string]*sdk.ToolAnnotations{}
	for _, tl := range lt.Tools {
		hints[tl.Name] = tl.Annotations
	}
	if len(hints) != 3 || hints["t.get"] == nil || !hints["t.get"].ReadOnlyHint || hints["t.del"] == nil || hints["t.del"].DestructiveHint == nil || !*hints["t.del"].DestructiveHint || hints[AwaitHoldTool] == nil {
		t.Fatalf("tools/list: %v", hints)
	}

	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "t_get", Arguments: map[string]any{}}) // the alias
	if err != nil || r.IsError || !strings.Contains(r.Content[0].(*sdk.TextContent).Text, `"ok":true`) {
		t.Fatalf("allowed call by alias: %v %+v", err, r)
	}
	mu.Lock()
	if got[0].Tool != "t.get" || got[0].Transport != call.MCP || string(got[0].Args) != "{}" {
		t.Errorf("the pipeline got %+v", got[0])
	}
	mu.Unlock()
	r, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "t.del", Arguments: map[string]any{}})
	if err != nil || !r.IsError || r.Content[0].(*sdk.TextContent).Text != "policy_block: blocked by policy: no (request_id r3)" {
		t.Fatalf("refusal: %v %+v", err, r)
	}
	// Not listed at all: still the pipeline's to refuse, as a tool result.
	p := &sdk.CallToolParams{Name: "t.ask", Arguments: map[string]any{}}
	p.SetProgressToken("tok")
	r, err = cs.CallTool(ctx, p)
	if err != nil || !r.IsError || !strings.HasPrefix(r.Content[0].(*sdk.TextContent).Text, "approval_pending: ") {
		t.Fatalf("pending hold: %v %+v", err, r)
	}
	for deadline := time.Now().Add(2 * time.Second); progress.Load() == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	if progress.Load() == 0 {
		t.Error("no progress notification for a held call with a progress token")
	}
	r, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: AwaitHoldTool, Arguments: map[string]any{"hold_id": "h1", "wait_seconds": 0.5}})
	if err != nil || r.IsError || !strings.Contains(r.Content[0].(*sdk.TextContent).Text, `"status":201`) {
		t.Fatalf("await_hold: %v %+v", err, r)
	}
	r, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: AwaitHoldTool, Arguments: map[string]any{"hold": "h1"}})
	if err != nil || !r.IsError || !strings.HasPrefix(r.Content[0].(*sdk.TextContent).Text, "schema_violation: ") {
		t.Fatalf("await_hold with bad arguments: %v %+v", err, r)
	}

	blocked.Store(true)
	d.Changed(ctx)
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no list_changed after Changed removed a tool")
	}
	lt, err = cs.ListTools(ctx, nil)
	if err != nil || len(lt.Tools) != 2 {
		t.Fatalf("after Changed: %v %d tools", err, len(lt.Tools))
	}
}
