package gateway

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// toolAPI is the sandbox socket's tool API, a front door over the
// pipeline: it takes the identity from the connection and the call from
// the request, hands both to the pipeline function it was given (Call,
// Poll, or the tool list), and writes the outcome. It decides nothing
// itself.
type toolAPI struct {
	list        func(ctx context.Context, rid string, id wire.Identity) ([]call.Tool, *refusal.Error)
	unavailable func(agentConnectors []string) []map[string]string // remote MCP servers that cannot be listed now
	agent       func(name string) *config.Agent
	call        func(ctx context.Context, r call.Request) call.Outcome
	poll        func(ctx context.Context, id wire.Identity, hold string, wait time.Duration) call.Outcome
}

// route mounts the tool API on the sandbox socket's mux.
func (a toolAPI) route(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/tools", a.handleListTools)
	mux.HandleFunc("POST /v1/tools/{tool}", a.handleToolCall)
	mux.HandleFunc("GET /v1/holds/{id}", a.handlePollHold)
}

// handleListTools is GET /v1/tools.
func (a toolAPI) handleListTools(w http.ResponseWriter, r *http.Request) {
	rid := refusal.NewRequestID()
	id, ok := ingress.IdentityFrom(r.Context())
	if !ok {
		refusal.Write(w, refusal.New(http.StatusForbidden, refusal.IdentityRequired, "no identity"), rid)
		return
	}
	tools, e := a.list(r.Context(), rid, id)
	if e != nil {
		refusal.Write(w, e, rid)
		return
	}
	out := map[string]any{"tools": tools, "request_id": rid}
	if agent := a.agent(id.Agent); agent != nil {
		if un := a.unavailable(agent.Connectors); len(un) > 0 {
			out["unavailable"] = un // remote MCP servers that cannot be listed now (catalog.Unavailable)
		}
	}
	refusal.WriteJSON(w, http.StatusOK, out)
}

// handleToolCall is POST /v1/tools/{tool}: the body is the arguments
// document; Sluice-Hold names the hold a re-send is for.
func (a toolAPI) handleToolCall(w http.ResponseWriter, r *http.Request) {
	id, ok := ingress.IdentityFrom(r.Context())
	if !ok {
		// The pipeline refuses, audits and logs a call without identity.
		id = wire.Identity{}
	}
	writeOutcome(w, a.call(r.Context(), call.Request{
		Identity: id, Tool: r.PathValue("tool"), Body: r.Body, Transport: call.HTTP,
		HoldID: r.Header.Get("Sluice-Hold"), TraceParent: r.Header.Get("traceparent"),
	}))
}

// handlePollHold is GET /v1/holds/{id}?wait=30s.
func (a toolAPI) handlePollHold(w http.ResponseWriter, r *http.Request) {
	id, ok := ingress.IdentityFrom(r.Context())
	if !ok {
		refusal.Write(w, refusal.New(http.StatusForbidden, refusal.IdentityRequired, "no identity"), refusal.NewRequestID())
		return
	}
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.SchemaViolation, "wait must be a duration like 30s"), refusal.NewRequestID())
			return
		}
		wait = d
	}
	writeOutcome(w, a.poll(r.Context(), id, r.PathValue("id"), wait))
}

// writeOutcome writes an outcome as the sandbox socket's HTTP API answers:
// a hold's stored answer as stored, a refusal as the JSON error (a hold's
// carrying the hold's request ID), a pending hold as 202 with where to poll
// it, a reply as 200.
func writeOutcome(w http.ResponseWriter, o call.Outcome) {
	switch {
	case o.Answer != nil:
		writeRaw(w, o.Status, o.Answer)
	case o.Refusal != nil && o.Hold != nil:
		refusal.Write(w, o.Refusal, o.Hold.RequestID)
	case o.Refusal != nil:
		refusal.Write(w, o.Refusal, o.RequestID)
	case o.Hold != nil:
		refusal.WriteJSON(w, o.Status, map[string]any{
			"hold":       map[string]any{"id": o.Hold.ID, "status": o.Hold.State, "poll": o.Hold.Poll, "expires": o.Hold.Expires},
			"request_id": o.Hold.RequestID,
		})
	default:
		if b, ok := appendResult(make([]byte, 0, 256), o.Reply, o.RequestID); ok {
			writeRaw(w, http.StatusOK, b) // json.Marshal(replyBody(o)), without its second pass over the body
			return
		}
		refusal.WriteJSON(w, http.StatusOK, replyBody(o))
	}
}

// result is the 200 answer: the upstream's reply, scrubbed.
type result struct {
	*call.Reply
	RequestID string `json:"request_id"`
}

// replyBody is a sent call's answer as the HTTP API writes it (and an
// approved hold stores it).
func replyBody(o call.Outcome) result {
	return result{Reply: o.Reply, RequestID: o.RequestID}
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(bytes.TrimRight(body, "\n"), '\n'))
}
