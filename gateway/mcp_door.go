package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/mcp"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// grantedTools is what id is granted and not blocked from: a tool the
// policy would block outright (with nothing of the call known but its
// name) is left out; ask and allow tools are listed. GET /v1/tools and
// the MCP door's tools/list are both this list.
func (s *Server) grantedTools(ctx context.Context, id wire.Identity) ([]*connectors.Tool, *apiError) {
	agent := s.cfg.Agent(id.Agent)
	if agent == nil {
		return nil, refuse(http.StatusForbidden, CodeUnknownAgent, "agent "+quote(id.Agent)+" is not configured on this gateway (agents[])")
	}
	var out []*connectors.Tool
	now := time.Now().UTC()
	for _, t := range s.catalog.list {
		if !slices.Contains(agent.Connectors, t.Connector) {
			continue
		}
		in := s.input(id.Sandbox, id.Agent, id.Session, id.User, t, nil, nil, now)
		if s.Decide(ctx, in).Action == policy.Block {
			continue
		}
		out = append(out, t)
	}
	return out, nil
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// newMCPDoor mounts the MCP door (gateway/mcp) on the sandbox socket, its
// hooks filled with the same listing and call pipeline as /v1/tools.
func (s *Server) newMCPDoor() *mcp.Door {
	g := s.cfg.Gateway
	d := mcp.New(mcp.Deps{
		Identify: func(r *http.Request) (wire.Identity, bool) { return identityFrom(r.Context()) },
		Tools: func(ctx context.Context, id wire.Identity) ([]mcp.Tool, error) {
			ts, aerr := s.grantedTools(ctx, id)
			if aerr != nil {
				return nil, aerr
			}
			out := make([]mcp.Tool, 0, len(ts))
			for _, t := range ts {
				desc := t.Description
				if desc == "" {
					desc = t.Summary
				}
				out = append(out, mcp.Tool{Name: t.Name, Alias: t.Alias, Title: t.Summary, Description: desc, Method: t.Method, InputSchema: t.Schema})
			}
			return out, nil
		},
		Call:            s.mcpCall,
		AwaitHold:       s.mcpAwaitHold,
		HoldWait:        g.HoldWait.Std(),
		Aliases:         g.MCP.ToolNames == "aliases",
		MaxMessageBytes: g.MCP.MaxMessageBytes,
		Logger:          s.log,
	})
	s.mcpDoor.Store(d)
	return d
}

// mcpChanged tells the MCP door that what callers may list may have
// changed (a policy reload): open sessions get list_changed.
func (s *Server) mcpChanged() {
	if d := s.mcpDoor.Load(); d != nil {
		go d.Changed(context.Background())
	}
}

// mcpCall runs one MCP tools/call through the tool-call pipeline, exactly
// as POST /v1/tools/{tool} with the same arguments document.
func (s *Server) mcpCall(ctx context.Context, id wire.Identity, tool string, args json.RawMessage) mcp.Outcome {
	r, err := http.NewRequestWithContext(context.WithValue(ctx, identityKey{}, id), http.MethodPost, "/v1/tools/"+tool, bytes.NewReader(args))
	if err != nil {
		return mcp.Outcome{Code: string(CodeUnknownTool), Message: "no tool is named " + quote(tool)}
	}
	r.SetPathValue("tool", tool)
	w := httptest.NewRecorder()
	s.handleToolCall(w, r)
	return outcome(w.Code, w.Body.Bytes())
}

// mcpAwaitHold is sluice.await_hold: GET /v1/holds/{id}?wait= for id.
func (s *Server) mcpAwaitHold(ctx context.Context, id wire.Identity, hold string, wait time.Duration) mcp.Outcome {
	r, err := http.NewRequestWithContext(context.WithValue(ctx, identityKey{}, id), http.MethodGet, "/v1/holds/x?wait="+wait.String(), nil)
	if err != nil {
		return mcp.Outcome{Code: string(CodeNotFound), Message: "no such hold"}
	}
	r.SetPathValue("id", hold)
	w := httptest.NewRecorder()
	s.handlePollHold(w, r)
	return outcome(w.Code, w.Body.Bytes())
}

// outcome reads the sandbox API's answer into the door's Outcome.
func outcome(status int, body []byte) mcp.Outcome {
	switch status {
	case http.StatusOK:
		var r struct {
			Status    int    `json:"status"`
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(body, &r)
		return mcp.Outcome{Result: body, UpstreamStatus: r.Status, RequestID: r.RequestID}
	case http.StatusAccepted:
		var h struct {
			Hold struct {
				ID string `json:"id"`
			} `json:"hold"`
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal(body, &h) == nil && h.Hold.ID != "" {
			return mcp.Outcome{HoldID: h.Hold.ID, RequestID: h.RequestID}
		}
	}
	var e errorBody
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		return mcp.Outcome{Code: string(e.Error.Code), Message: e.Error.Message, RequestID: e.Error.RequestID}
	}
	return mcp.Outcome{Code: string(CodeUpstreamError), Message: "bug: the call's answer could not be read"}
}
