package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// routeCalls lets a call use either a tool's name or its alias, whichever
// is not listed (the SDK routes by the listed name), and sends a call of a
// tool this caller does not list to the pipeline too: it is the pipeline
// that refuses it (unknown_tool, not_granted, policy_block), as a tool
// result, with its audit record, never the SDK with a protocol error.
func (m *Door) routeCalls(c *caller) sdk.Middleware {
	return func(next sdk.MethodHandler) sdk.MethodHandler {
		return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
			r, ok := req.(*sdk.CallToolRequest)
			if !ok || r.Params == nil {
				return next(ctx, method, req)
			}
			if listed, ok := (*c.names.Load())[r.Params.Name]; ok {
				r.Params.Name = listed
			}
			c.mu.Lock()
			_, listed := c.listed[r.Params.Name]
			c.mu.Unlock()
			if listed {
				return next(ctx, method, req)
			}
			return m.callHandler(c.id)(ctx, r)
		}
	}
}

// callHandler runs a tools/call through Deps.Call. The arguments document
// is passed as the client sent it: the pipeline validates it against the
// same schema the list showed.
func (m *Door) callHandler(id wire.Identity) sdk.ToolHandler {
	return func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		args := req.Params.Arguments
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		stop := m.progress(ctx, req, "the call is in progress (held for approval, or the upstream has not answered yet)")
		out := m.deps.Call(ctx, id, req.Params.Name, args)
		stop()
		return toolResult(out), nil
	}
}

// awaitArgs are sluice.await_hold's arguments.
type awaitArgs struct {
	HoldID      string   `json:"hold_id"`
	WaitSeconds *float64 `json:"wait_seconds,omitempty"`
}

func awaitHoldTool(max time.Duration) *sdk.Tool {
	secs := math.Max(1, math.Floor(max.Seconds()))
	return &sdk.Tool{
		Name:  AwaitHoldTool,
		Title: "Wait for a held call",
		Description: "Waits for a call that sluice held for a person's approval and returns its result once it is decided. " +
			"A tool result that says a call is pending names its hold_id; call this with it to keep waiting. " +
			fmt.Sprintf("Each wait is at most %g seconds; call again while the hold is pending.", secs),
		InputSchema: map[string]any{
			"type":                 "object",
			"additionalProperties": false,
			"required":             []any{"hold_id"},
			"properties": map[string]any{
				"hold_id":      map[string]any{"type": "string", "minLength": 1, "maxLength": 128},
				"wait_seconds": map[string]any{"type": "number", "minimum": 0, "maximum": secs},
			},
		},
		Annotations: &sdk.ToolAnnotations{Title: "Wait for a held call", ReadOnlyHint: true, IdempotentHint: true},
	}
}

// awaitHandler waits, bounded by Deps.HoldWait, for one of id's holds.
func (m *Door) awaitHandler(id wire.Identity) sdk.ToolHandler {
	return func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		var a awaitArgs
		dec := json.NewDecoder(bytesReader(req.Params.Arguments))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&a); err != nil || a.HoldID == "" || len(a.HoldID) > 128 {
			msg := "arguments: hold_id (a string) is required"
			if err != nil {
				msg = "arguments: " + err.Error()
			}
			return toolResult(Outcome{Code: "schema_violation", Message: msg}), nil
		}
		wait := m.deps.HoldWait
		if a.WaitSeconds != nil {
			if w := time.Duration(*a.WaitSeconds * float64(time.Second)); w >= 0 && w < wait {
				wait = w
			}
		}
		stop := m.progress(ctx, req, "waiting for a person to decide hold "+a.HoldID)
		out := m.deps.AwaitHold(ctx, id, a.HoldID, wait)
		stop()
		return toolResult(out), nil
	}
}

// progress sends notifications/progress every Deps.Progress while a call
// waits, when the client sent a progress token; stop ends it.
func (m *Door) progress(ctx context.Context, req *sdk.CallToolRequest, msg string) (stop func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func() {}
	}
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(m.deps.Progress)
		defer t.Stop()
		for n := 1; ; n++ {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: token, Progress: float64(n), Message: msg}); err != nil {
				return
			}
		}
	}()
	return func() { close(done); <-ended }
}

// toolResult maps an outcome to the tool result: a refusal and a pending
// hold are isError results whose text names the code and reason (the
// spec's tool errors, which the model sees); a success carries the
// result document, isError when the upstream answered with an error.
func toolResult(out Outcome) *sdk.CallToolResult {
	switch {
	case out.HoldID != "":
		text := fmt.Sprintf("approval_pending: the call is held for a person's approval as hold %s and is still pending; call %s with {\"hold_id\":%q} to keep waiting for its result",
			out.HoldID, AwaitHoldTool, out.HoldID)
		return &sdk.CallToolResult{
			IsError:           true,
			Content:           []sdk.Content{&sdk.TextContent{Text: text}},
			StructuredContent: map[string]any{"hold": map[string]any{"id": out.HoldID, "status": "pending"}, "request_id": out.RequestID},
		}
	case out.Code != "":
		text := out.Code + ": " + out.Message
		if out.RequestID != "" {
			text += " (request_id " + out.RequestID + ")"
		}
		return &sdk.CallToolResult{
			IsError:           true,
			Content:           []sdk.Content{&sdk.TextContent{Text: text}},
			StructuredContent: map[string]any{"error": map[string]any{"code": out.Code, "message": out.Message, "request_id": out.RequestID}},
		}
	}
	res := &sdk.CallToolResult{
		IsError: out.UpstreamStatus >= 400,
		Content: []sdk.Content{&sdk.TextContent{Text: string(out.Result)}},
	}
	var doc map[string]any
	if json.Unmarshal(out.Result, &doc) == nil {
		res.StructuredContent = doc
	}
	return res
}
