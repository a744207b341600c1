package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/refusal"
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
			if ir, ok := req.(*sdk.ServerRequest[*sdk.InitializeParams]); ok {
				res, err := next(ctx, method, req)
				if ires, ok := res.(*sdk.InitializeResult); ok && err == nil && ir.Session != nil {
					m.noteInitialize(c, ir.Session, ires)
				}
				return res, err
			}
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
			return m.callHandler(c.id, "")(ctx, r)
		}
	}
}

// callHandler runs a tools/call through the pipeline (Deps.Call) with
// transport mcp; the pipeline audits it and writes its one log line. The
// arguments document is passed as the client sent it: the pipeline
// validates it against the same schema the list showed. While an ask is
// held, the client gets progress notifications (when it sent a progress
// token) until gateway.hold_wait is up. typed is the tool's name when it
// is listed with an outputSchema, else "".
func (m *Door) callHandler(id wire.Identity, typed string) sdk.ToolHandler {
	return func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		p := m.progress(ctx, req)
		defer p.stop()
		return m.runCall(ctx, id, req.Params.Name, typed, req.Params.Arguments, metaTraceparent(req.Params.GetMeta()), p.report), nil
	}
}

// runCall is one tools/call of tool (the listed name) with args, the
// arguments document as the client sent it, through the pipeline, and
// its tool result. Both entrances use it: the SDK's tool handler and the
// fast path (fast.go), so a call's result is the same whichever served
// it. report relays a held call's progress (nil: none).
func (m *Door) runCall(ctx context.Context, id wire.Identity, tool, typed string, args json.RawMessage, traceParent string, report func(call.Progress)) *sdk.CallToolResult {
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	_, remote := m.remote(tool)
	if remote {
		// A remote tool's arguments are its request's body (mcpremote).
		args = append(append(json.RawMessage(`{"body":`), args...), '}')
	}
	o := m.deps.Call(ctx, call.Request{
		Identity:      id,
		Tool:          tool,
		Args:          args,
		Transport:     call.MCP,
		TraceParent:   traceParent, // trace.go
		Progress:      report,
		ProgressEvery: m.deps.Progress,
	})
	if remote {
		return remoteResult(o)
	}
	res := toolResult(o)
	if typed != "" {
		m.structured(res, o, typed)
	}
	return res
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
		dec := json.NewDecoder(bytes.NewReader(req.Params.Arguments))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&a); err != nil || a.HoldID == "" || len(a.HoldID) > 128 {
			msg := "arguments: hold_id (a string) is required"
			if err != nil {
				msg = "arguments: " + err.Error()
			}
			return toolResult(call.Outcome{Status: http.StatusBadRequest, Refusal: refusal.New(http.StatusBadRequest, refusal.SchemaViolation, msg)}), nil
		}
		wait := m.deps.HoldWait
		if a.WaitSeconds != nil {
			if w := time.Duration(*a.WaitSeconds * float64(time.Second)); w >= 0 && w < wait {
				wait = w
			}
		}
		p := m.progress(ctx, req)
		defer p.stop()
		if p.token != nil {
			go func() {
				// Poll reports nothing while it waits: the door ticks.
				t := time.NewTicker(m.deps.Progress)
				defer t.Stop()
				start := time.Now()
				for {
					select {
					case <-p.done:
						return
					case <-t.C:
						p.report(call.Progress{Hold: a.HoldID, Waited: time.Since(start), Bound: wait})
					}
				}
			}()
		}
		o := m.deps.Poll(ctx, id, a.HoldID, wait)
		if o.Hold != nil {
			if _, ok := m.remote(o.Hold.Tool); ok {
				return remoteResult(o), nil
			}
		}
		return toolResult(o), nil
	}
}

// progress relays a held call's progress reports to the client as
// notifications/progress, when the client sent a progress token. The
// pipeline reports on its waiting goroutine, which must not block on a
// slow client: a report is dropped when the previous one is still being
// sent.
type progress struct {
	token any
	ch    chan call.Progress
	done  chan struct{}
	ended chan struct{}
}

func (m *Door) progress(ctx context.Context, req *sdk.CallToolRequest) *progress {
	p := &progress{token: req.Params.GetProgressToken(), ch: make(chan call.Progress, 1), done: make(chan struct{}), ended: make(chan struct{})}
	if p.token == nil || req.Session == nil {
		close(p.ended)
		return p
	}
	go func() {
		defer close(p.ended)
		for n := 1; ; n++ {
			var r call.Progress
			select {
			case <-p.done:
				// A report made just before the call ended is still sent:
				// the result goes out only after this returns.
				select {
				case r = <-p.ch:
				default:
					return
				}
			case <-ctx.Done():
				return
			case r = <-p.ch:
			}
			msg := fmt.Sprintf("held for a person's approval as hold %s; waited %s of at most %s", r.Hold, r.Waited.Round(time.Second), r.Bound.Round(time.Second))
			params := &sdk.ProgressNotificationParams{ProgressToken: p.token, Progress: float64(n), Message: msg}
			if r.Bound > 0 {
				params.Progress, params.Total = r.Waited.Seconds(), r.Bound.Seconds()
				if params.Progress <= 0 {
					params.Progress = float64(n) / 1000 // strictly increasing (MCP: progress must increase)
				}
			}
			if err := req.Session.NotifyProgress(ctx, params); err != nil {
				return
			}
		}
	}()
	return p
}

// report is call.Request.Progress.
func (p *progress) report(r call.Progress) {
	if p.token == nil {
		return
	}
	select {
	case p.ch <- r:
	default:
	}
}

func (p *progress) stop() {
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	<-p.ended
}

// toolResult maps a pipeline outcome to the tool result: a refusal and a
// pending hold are isError results whose text names the code and reason
// (the spec's tool errors, which the model sees; protocol errors are for
// malformed messages only); a reply carries the result document, isError
// when the upstream answered with an error status.
func toolResult(o call.Outcome) *sdk.CallToolResult {
	switch {
	case o.Refusal != nil:
		rid := o.RequestID
		if o.Hold != nil && o.Hold.RequestID != "" {
			rid = o.Hold.RequestID
		}
		return refused(string(o.Refusal.Code), o.Refusal.Message, rid)
	case o.Reply != nil:
		b, err := json.Marshal(resultDoc{Body: o.Reply.Body, BodyEncoding: o.Reply.BodyEncoding, Headers: o.Reply.Headers, RequestID: o.RequestID, Status: o.Reply.Status})
		if err != nil {
			return refused(string(refusal.UpstreamError), "bug: the reply could not be encoded", o.RequestID)
		}
		return replied(b, o.Reply.Status)
	case o.Hold != nil && o.Status == http.StatusAccepted:
		text := fmt.Sprintf("approval_pending: the call is held for a person's approval as hold %s and is still pending; call %s with {\"hold_id\":%q} to keep waiting for its result",
			o.Hold.ID, AwaitHoldTool, o.Hold.ID)
		return &sdk.CallToolResult{
			IsError:           true,
			Content:           []sdk.Content{&sdk.TextContent{Text: text}},
			StructuredContent: map[string]any{"hold": map[string]any{"id": o.Hold.ID, "status": o.Hold.State, "expires": o.Hold.Expires}, "request_id": o.Hold.RequestID},
		}
	case o.Answer != nil:
		// A held call that already ran: its stored answer, as the HTTP
		// door would write it, passed on as stored (read for its status
		// or error only, not decoded and encoded again).
		var doc struct {
			Status int `json:"status"`
			Error  *struct {
				Code      string `json:"code"`
				Message   string `json:"message"`
				RequestID string `json:"request_id"`
			} `json:"error"`
		}
		if json.Unmarshal(o.Answer, &doc) == nil {
			if e := doc.Error; e != nil {
				return refused(e.Code, e.Message, e.RequestID)
			}
			if a := bytes.TrimSpace(o.Answer); len(a) > 0 && a[0] == '{' {
				return replied(a, doc.Status)
			}
		}
	}
	return refused(string(refusal.UpstreamError), "bug: the call's outcome could not be read", o.RequestID)
}

// remoteResult is a remote tool's outcome: the remote server's own
// result (its reply body, scrubbed by the pipeline), or the pipeline's
// refusal or pending hold as for any tool.
func remoteResult(o call.Outcome) *sdk.CallToolResult {
	var body json.RawMessage
	switch {
	case o.Refusal != nil:
	case o.Reply != nil:
		body, _ = o.Reply.Body.(json.RawMessage)
	case o.Answer != nil:
		var doc struct {
			Body json.RawMessage `json:"body"`
		}
		if json.Unmarshal(o.Answer, &doc) == nil && len(doc.Body) > 0 && doc.Body[0] == '{' {
			var e struct {
				Error json.RawMessage `json:"error"`
			}
			if json.Unmarshal(o.Answer, &e) != nil || len(e.Error) == 0 {
				body = doc.Body
			}
		}
	}
	if body == nil {
		return toolResult(o)
	}
	var res sdk.CallToolResult
	if err := json.Unmarshal(body, &res); err != nil {
		return refused(string(refusal.UpstreamError), "the remote server's result could not be read", o.RequestID)
	}
	return &res
}

func refused(code, msg, rid string) *sdk.CallToolResult {
	text := code + ": " + msg
	if rid != "" {
		text += " (request_id " + rid + ")"
	}
	return &sdk.CallToolResult{
		IsError:           true,
		Content:           []sdk.Content{&sdk.TextContent{Text: text}},
		StructuredContent: map[string]any{"error": map[string]any{"code": code, "message": msg, "request_id": rid}},
	}
}

// resultDoc is a sent call's result document, the HTTP door's 200 body;
// its fields are in the order encoding/json writes a map's keys, so the
// text is what it always was.
type resultDoc struct {
	Body         any                 `json:"body"`
	BodyEncoding string              `json:"body_encoding,omitempty"`
	Headers      map[string][]string `json:"headers"`
	RequestID    string              `json:"request_id"`
	Status       int                 `json:"status"`
}

// replied is a sent call's result: doc, the result document as JSON, is
// both the text and the structuredContent (encoded once, sent as is).
func replied(doc []byte, upstream int) *sdk.CallToolResult {
	return &sdk.CallToolResult{
		IsError:           upstream >= 400,
		Content:           []sdk.Content{&sdk.TextContent{Text: string(doc)}},
		StructuredContent: json.RawMessage(doc),
	}
}

// structured fits the result of a tool listed with an outputSchema to
// it: structuredContent is the upstream's reply body when the call
// succeeded and the body is JSON valid under the schema. Otherwise (a
// refusal, a pending hold, an error status: already isError) it is left
// out; and a reply that was sent and answered but does not fit the
// schema (not JSON, encoded, not 2xx, or not matching) is marked isError
// with a text saying so, because MCP requires a non-error result of such
// a tool to carry conforming structuredContent (the TypeScript SDK's
// client throws otherwise). The text says the call was sent, so an agent
// does not repeat a write; the upstream's reply is still in the content.
func (m *Door) structured(res *sdk.CallToolResult, o call.Outcome, tool string) {
	res.StructuredContent = nil
	if res.IsError || m.deps.Output == nil {
		return
	}
	if m.fitStructured(res, o, tool) {
		return
	}
	res.IsError = true
	res.Content = append(res.Content, &sdk.TextContent{Text: unfitReply})
}

// unfitReply is the note on a sent call whose reply does not fit the
// tool's outputSchema.
const unfitReply = "sluice: the call was sent and the upstream answered, but its reply does not match the response schema in the connector's spec (shown above as text); do not repeat the call on this account"

// fitStructured sets res.StructuredContent to the reply body when it fits
// the tool's outputSchema, and reports whether it did.
func (m *Door) fitStructured(res *sdk.CallToolResult, o call.Outcome, tool string) bool {
	var body []byte
	switch {
	case o.Refusal != nil:
		return false
	case o.Reply != nil:
		raw, ok := o.Reply.Body.(json.RawMessage)
		if !ok || o.Reply.BodyEncoding != "" || o.Reply.Status < 200 || o.Reply.Status > 299 {
			return false
		}
		body = raw
	case o.Answer != nil:
		// A held call that already ran: its stored answer's body.
		var doc struct {
			Status       int             `json:"status"`
			Body         json.RawMessage `json:"body"`
			BodyEncoding string          `json:"body_encoding"`
		}
		if json.Unmarshal(o.Answer, &doc) != nil || doc.BodyEncoding != "" || doc.Status < 200 || doc.Status > 299 {
			return false
		}
		body = doc.Body
	default:
		return false
	}
	if len(body) == 0 || !m.deps.Output(tool, body) {
		return false
	}
	res.StructuredContent = json.RawMessage(body)
	return true
}
