package gateway

import (
	"context"
	"net/http"

	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/mcp"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// newMCPDoor mounts the MCP door (gateway/mcp) on the sandbox socket. Its
// hooks are the pipeline's own entrances: the list is Tools (GET
// /v1/tools's), every tools/call is Call with transport mcp, and
// sluice.await_hold is Poll. The door decides, sends and audits nothing
// itself.
func (s *Server) newMCPDoor() *mcp.Door {
	g := s.cfg.Gateway
	d := mcp.New(mcp.Deps{
		Identify: func(r *http.Request) (wire.Identity, bool) { return ingress.IdentityFrom(r.Context()) },
		Tools:    s.Tools,
		Call:     s.Call,
		Poll:     s.Poll,
		Remote:   s.mcpRemote, // mcp_remote.go
		Title: func(name string) string {
			if t, ok := s.catalog.Tool(name); ok {
				return t.Summary
			}
			return ""
		},
		Output: func(name string, body []byte) bool {
			t, ok := s.catalog.Tool(name)
			return ok && t.MatchesOutput(body)
		},
		HoldWait:        g.HoldWait.Std(),
		Aliases:         g.MCP.ToolNames == "aliases",
		MaxMessageBytes: g.MCP.MaxMessageBytes,
		Logger:          s.log,
	})
	s.mcpDoor.Store(d)
	return d
}

// mcpChanged tells the MCP door that what callers may list may have
// changed (a policy reload): open sessions whose list changed get
// notifications/tools/list_changed.
func (s *Server) mcpChanged() {
	if d := s.mcpDoor.Load(); d != nil {
		go d.Changed(context.Background())
	}
}
