// Package remotes runs the remote MCP servers (provider: mcp connectors)
// the root's catalog holds: their listing loops and how a listing carries
// the connector's credential (Runs, Header), MCP authorization (a
// person's token for the listing, the OAuth client, validate's look), and
// the audit records of a list change or a refused authorization. It
// neither decides nor calls a tool: a call's send is the root pipeline's.
package remotes

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/mcpremote"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
)

// EventToolsChanged is the audit event of a remote MCP server's tool
// list changing: the tools added, removed and changed (a changed tool is a
// new tool: nothing granted for the old one applies).
const EventToolsChanged = "mcp_tools_changed"

// Credential is a provider: mcp connector's credential with its
// default place: Authorization: Bearer <secret>.
func Credential(cc config.Connector) config.Connector {
	if cc.Credential != nil && cc.Credential.Header == "" {
		cr := *cc.Credential
		cr.Header, cr.Prefix = "Authorization", "Bearer "
		cc.Credential = &cr
	}
	return cc
}

// Append writes one audit record (the root's one audit write).
type Append func(ctx context.Context, rec audit.Record, written bool) (audit.Record, error)

// Server is a remote MCP server as it is listed: its Remote, its
// connector's configuration, base URL and credential plan (nil without a
// credential), and whether it speaks MCP authorization.
type Server struct {
	Remote    *mcpremote.Remote
	Connector config.Connector
	BaseURL   *url.URL
	Plan      *creds.Plan
	OAuth     bool
}

// Runs are the remote servers' listing loops.
type Runs struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   sync.WaitGroup

	Append  Append // a list change is audited
	Log     *slog.Logger
	Changed func() // the MCP door's sessions are told
	// OAuthHeader lists a remote with MCP authorization with a connected
	// person's token (OAuthHeader, oauth.go).
	OAuthHeader func(s Server) func(ctx context.Context) (http.Header, error)
}

// Start lists each remote MCP server once (bounded by
// gateway.upstream_timeout; a server that is down leaves its tools
// unavailable and the gateway serves the rest), then keeps each list
// fresh until Close.
func (rr *Runs) Start(ctx context.Context, servers []Server, src creds.Source) {
	if len(servers) == 0 {
		return
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rr.mu.Lock()
	rr.cancel = cancel
	rr.mu.Unlock()
	var first sync.WaitGroup
	for _, s := range servers {
		r := s.Remote
		header := Header(src, s)
		if s.OAuth && rr.OAuthHeader != nil {
			header = rr.OAuthHeader(s) // a connected person's token (oauth.go)
		}
		r.SetHooks(header, rr.remoteChanged, rr.Log)
		first.Add(1)
		rr.done.Add(1)
		go func() {
			defer rr.done.Done()
			r.Refresh(rctx)
			first.Done()
			r.Run(rctx)
		}()
	}
	first.Wait()
}

// Stop ends the listing loops and closes the remote sessions.
func (rr *Runs) Stop() {
	rr.mu.Lock()
	cancel := rr.cancel
	rr.cancel = nil
	rr.mu.Unlock()
	if cancel != nil {
		cancel()
		rr.done.Wait()
	}
}

// Header is how a remote server's listing requests carry the
// connector's credential: fetched from creds as for a call and attached by
// the same plan. A listing has no caller: a per-user credential ({user})
// is fetched for the connector's list_user, a service identity, and
// without one the remote cannot be listed, which its unavailable reason
// says.
func Header(src creds.Source, s Server) func(ctx context.Context) (http.Header, error) {
	cc := s.Connector.Credential
	if cc == nil {
		return nil
	}
	var caller policy.Caller
	if cc.PerUser() {
		if s.Connector.ListUser == "" {
			return func(context.Context) (http.Header, error) {
				return nil, fmt.Errorf("the credential for connector %s is per user ({user} in its Vault path) and a listing acts for no user; set list_user to a service identity to list this server's tools", s.Connector.Slug)
			}
		}
		caller.User = s.Connector.ListUser
	}
	return func(ctx context.Context) (http.Header, error) {
		secret, err := src.Credential(ctx, creds.Ref{Connector: s.Connector.Slug, Secret: cc.Secret, Vault: cc.Vault, Caller: caller})
		if err != nil {
			return nil, fmt.Errorf("the credential for connector %s is unavailable", s.Connector.Slug)
		}
		req, _ := http.NewRequest(http.MethodPost, s.BaseURL.String(), nil)
		if _, err := creds.Attach(req, s.Plan, &connectors.Tool{Connector: s.Connector.Slug}, secret); err != nil {
			return nil, fmt.Errorf("the credential for connector %s cannot be attached: %v", s.Connector.Slug, err)
		}
		return http.Header{cc.Header: req.Header.Values(cc.Header)}, nil
	}
}

// remoteChanged audits a remote server's list change and tells the MCP
// door, whose sessions then get notifications/tools/list_changed.
func (rr *Runs) remoteChanged(ctx context.Context, c mcpremote.Change) {
	if !c.Empty() {
		f := map[string]any{"connector": c.Connector, "added": nonNil(c.Added), "removed": nonNil(c.Removed), "changed": nonNil(c.Changed), "fingerprints": c.Fingerprints}
		if _, err := rr.Append(ctx, audit.Record{RequestID: refusal.NewRequestID(), Event: EventToolsChanged, Fields: f}, false); err != nil {
			// The list is already swapped: a changed tool is refused its
			// old grants whether or not this record was written.
			rr.Log.Error("audit: the remote MCP server's tool change could not be recorded", "connector", c.Connector, "err", err)
		}
		rr.Log.Info("mcp remote: tools changed", "connector", c.Connector, "added", c.Added, "removed", c.Removed, "changed", c.Changed)
	}
	rr.Changed()
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
