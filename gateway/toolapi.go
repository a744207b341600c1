package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// The sandbox socket's tool API is a front door over the pipeline: it
// takes the identity from the connection and the call from the request,
// hands both to Call (or Poll, or Tools), and writes the outcome. It
// decides nothing itself.

// handleListTools is GET /v1/tools.
func (s *Server) handleListTools(w http.ResponseWriter, r *http.Request) {
	rid := refusal.NewRequestID()
	id, ok := ingress.IdentityFrom(r.Context())
	if !ok {
		refusal.Write(w, refusal.New(http.StatusForbidden, refusal.IdentityRequired, "no identity"), rid)
		return
	}
	tools, e := s.tools(r.Context(), rid, id)
	if e != nil {
		refusal.Write(w, e, rid)
		return
	}
	out := map[string]any{"tools": tools, "request_id": rid}
	if agent := s.cfg.Agent(id.Agent); agent != nil {
		if un := s.Unavailable(agent.Connectors); len(un) > 0 {
			out["unavailable"] = un // remote MCP servers that cannot be listed now (mcp_remote.go)
		}
	}
	refusal.WriteJSON(w, http.StatusOK, out)
}

// handleToolCall is POST /v1/tools/{tool}: the body is the arguments
// document; Sluice-Hold names the hold a re-send is for.
func (s *Server) handleToolCall(w http.ResponseWriter, r *http.Request) {
	id, ok := ingress.IdentityFrom(r.Context())
	if !ok {
		// The pipeline refuses, audits and logs a call without identity.
		id = wire.Identity{}
	}
	writeOutcome(w, s.Call(r.Context(), call.Request{
		Identity: id, Tool: r.PathValue("tool"), Body: r.Body, Transport: call.HTTP,
		HoldID: r.Header.Get("Sluice-Hold"), TraceParent: r.Header.Get("traceparent"),
	}))
}

// handlePollHold is GET /v1/holds/{id}?wait=30s.
func (s *Server) handlePollHold(w http.ResponseWriter, r *http.Request) {
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
	writeOutcome(w, s.Poll(r.Context(), id, r.PathValue("id"), wait))
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

// Tools lists the tools id's agent is granted and not blocked from, as
// every door offers them. A tool the policy would block outright (with
// nothing of the call known but its name) is left out; ask and allow
// tools are listed. An agent that is not configured is refused, not
// answered with an empty list, so a misnamed agent shows at once.
func (s *Server) Tools(ctx context.Context, id wire.Identity) ([]call.Tool, *refusal.Error) {
	return s.tools(ctx, refusal.NewRequestID(), id)
}

// tools is Tools with the request ID an audited refusal is recorded under.
func (s *Server) tools(ctx context.Context, rid string, id wire.Identity) ([]call.Tool, *refusal.Error) {
	id, e := canonicalCaller(id)
	if e != nil {
		return nil, e
	}
	agent := s.cfg.Agent(id.Agent)
	if agent == nil {
		return nil, refusal.New(http.StatusForbidden, refusal.UnknownAgent, fmt.Sprintf("agent %q is not configured on this gateway (agents[])", id.Agent))
	}
	if id.Egress != "" {
		if e := s.checkNarrowing(ctx, rid, id, agent.Egress); e != nil { // narrow.go
			return nil, e
		}
	}
	views := []call.Tool{}
	now := time.Now().UTC()
	for _, t := range s.catalog.Tools() {
		if !slices.Contains(agent.Connectors, t.Connector) {
			continue
		}
		// Decided as a call with no arguments yet: a tool that policy
		// blocks whatever the arguments are is not offered at all.
		in := toolInput(id.Sandbox, id.Agent, id.Session, id.User, t, nil, nil, now)
		in.Findings = []policy.Finding{} // nothing is sent: no scan (and no decision-log event: decisionexport.go)
		if s.Decide(ctx, in).Action == policy.Block {
			continue
		}
		desc := t.Summary
		if desc == "" {
			desc = t.Description
		}
		v := call.Tool{Name: t.Name, Alias: t.Alias, Description: desc, Method: t.Method, Path: t.PathTemplate, Risk: t.Risk.String(), Schema: t.Schema}
		if t.OutputReady() { // compiled on the first list: a schema that does not compile is not shown
			v.OutputSchema = t.OutputSchema
		}
		views = append(views, v)
	}
	return views, nil
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(bytes.TrimRight(body, "\n"), '\n'))
}
