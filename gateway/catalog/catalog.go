// Package catalog is the gateway's tool catalog: every connector's loaded
// spec (or remote MCP server) and, per connector, how it is reached (its
// Upstream: the guarded transport, the credential plan, the OAuth client,
// the scrubber of the last credential attached). It is loaded once (Load)
// and read by the pipeline, the doors and validate through its methods;
// it neither decides, holds nor sends.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/connections"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/mcpremote"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/toolinput"
	"github.com/sluice-gw/sluice/policy"
)

// Catalog is the loaded tools and, per tool, how to reach its API.
type Catalog struct {
	tools      map[string]*connectors.Tool
	aliases    map[string]*connectors.Tool // Tool.Alias → tool
	list       []*connectors.Tool
	connectors map[string]*Upstream
	remotes    map[string]*mcpremote.Remote // provider: mcp connectors by slug; their tools change (remote.go)
}

// Upstream is one connector's provisioned destination. Load sets its
// fields; nothing changes them afterwards.
type Upstream struct {
	Config    config.Connector
	Conn      *connectors.Connector
	Allow     []netip.Prefix    // the connector's allow_private
	Transport http.RoundTripper // guard.Direct over a guarded *http.Transport; a remote MCP server's *mcpremote.Remote
	Creds     *creds.Plan       // how the credential is attached; nil without one
	OAuth     *oauth.Client     // credential.oauth2, resolved against the spec (creds.OAuthClient)

	scrub atomic.Pointer[scrubCache] // the scrubber of the last credential attached (reply.go)
}

// Tool finds a tool by its name or its function-safe alias.
func (c *Catalog) Tool(name string) (*connectors.Tool, bool) {
	if t, ok := c.tools[name]; ok {
		return t, true
	}
	if t, ok := c.aliases[name]; ok {
		return t, true
	}
	return c.remoteTool(name)
}

// Tools are every tool, the remote servers' current ones included, by name.
func (c *Catalog) Tools() []*connectors.Tool { return c.withRemotes() }

// Static finds a tool of a loaded spec by its exact name (no alias, no
// remote server's tool): what a policy's match may name at validate.
func (c *Catalog) Static(name string) (*connectors.Tool, bool) {
	t, ok := c.tools[name]
	return t, ok
}

// Upstream is connector slug's destination, nil when no such connector
// was loaded.
func (c *Catalog) Upstream(slug string) *Upstream { return c.connectors[slug] }

// Upstreams are the loaded connectors by slug (a copy of the index).
func (c *Catalog) Upstreams() map[string]*Upstream { return maps.Clone(c.connectors) }

// Slugs are the loaded connectors' slugs, sorted.
func (c *Catalog) Slugs() []string { return slices.Sorted(maps.Keys(c.connectors)) }

// CloseIdle closes every upstream's idle connections (the server's Close).
func (c *Catalog) CloseIdle() {
	for _, u := range c.connectors {
		if t, ok := u.Transport.(interface{ CloseIdleConnections() }); ok {
			t.CloseIdleConnections()
		}
	}
}

// Options say how Load loads each spec: Strict makes it all-or-nothing
// (validate --strict), Defects also reports defects outside the
// operations (what validate shows; serve does not pay for it).
type Options struct{ Strict, Defects bool }

// Load loads every connector's spec and decides how its credential is
// attached (creds.NewPlan); opts add validate's strictness and defect
// report to each load. err refuses serve; warns are printed.
func Load(ctx context.Context, cfg *config.Config, d *guard.Dialer, opts Options) (c *Catalog, warns []error, err error) {
	c = &Catalog{tools: map[string]*connectors.Tool{}, aliases: map[string]*connectors.Tool{}, connectors: map[string]*Upstream{}}
	var errs []error
	local := creds.ExistingLocal(cfg)
	for i, cc := range cfg.Connectors {
		key := fmt.Sprintf("connectors[%d]", i)
		allow := AllowPrivate(cc)
		if cc.Provider == "mcp" {
			errs = append(errs, c.addRemote(ctx, key, cc, d, allow, cfg, local)...) // remote.go
			continue
		}
		spec := guard.SpecClient(d, allow, cfg.Gateway.UpstreamTimeout.Std())
		conn, err := connectors.Load(ctx, connectors.Options{Slug: cc.Slug, Spec: cc.Spec, BaseURL: cc.BaseURL, Client: spec, Strict: cc.Strict || opts.Strict, Defects: opts.Defects})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.spec: %w", key, err))
			continue
		}
		if conn.BaseURL == nil {
			errs = append(errs, fmt.Errorf("%s.base_url: the spec names no server; set base_url", key))
			continue
		}
		u := &Upstream{Config: cc, Conn: conn, Allow: allow}
		if cc.Credential != nil && conn.BaseURL.Scheme == "http" && !creds.PlaintextOK(conn.BaseURL.Hostname(), u.Allow) {
			errs = append(errs, fmt.Errorf("%s.base_url: a credential is sent over plain http only to an address inside allow_private; use https", key))
			continue
		}
		if cc.Credential != nil && cc.Credential.OAuth2 != nil {
			var oerrs []error
			if u.OAuth, oerrs = creds.OAuthClient(key, cc, conn, u.Allow); len(oerrs) > 0 {
				errs = append(errs, oerrs...)
				continue
			}
		}
		if cc.Credential != nil {
			plan, perrs, pwarns := creds.NewPlan(key, cc, conn, creds.StoredShape(ctx, cfg, cc, local))
			warns = append(warns, pwarns...)
			if len(perrs) > 0 {
				errs = append(errs, perrs...)
				continue
			}
			u.Creds = plan
		}
		u.Transport = guard.NewDirect(d, u.Allow, guard.Transport(d, u.Allow, cfg.Gateway.UpstreamTimeout.Std(), cfg.Gateway.MaxConnections))
		c.connectors[cc.Slug] = u
		for _, t := range conn.Tools {
			if other, dup := c.aliases[t.Alias]; dup { // slugs differ, so aliases do too; checked anyway
				errs = append(errs, fmt.Errorf("%s: tool %s has the alias %s of tool %s", key, t.Name, t.Alias, other.Name))
				continue
			}
			c.tools[t.Name] = t
			c.aliases[t.Alias] = t
			c.list = append(c.list, t)
		}
	}
	sort.Slice(c.list, func(i, j int) bool { return c.list[i].Name < c.list[j].Name })
	return c, warns, errors.Join(errs...)
}

// OAuthClients are the connectors' OAuth clients in slug order, each with
// the transport its provider is reached through (connections.New).
func (c *Catalog) OAuthClients() []connections.Client {
	var out []connections.Client
	for _, slug := range c.Slugs() {
		u := c.connectors[slug]
		if u.OAuth == nil {
			continue
		}
		tr := u.Transport
		if r, ok := tr.(*mcpremote.Remote); ok {
			tr = r.Transport() // a remote MCP server's send is a tools/call; its authorization server is reached plainly
		}
		out = append(out, connections.Client{Slug: slug, OAuth: u.OAuth, Transport: tr, ClientSecret: u.Config.Credential.OAuth2.ClientSecret})
	}
	return out
}

// ToolCallInput builds the policy input the gateway builds for call, with
// the functions POST /v1/tools/{tool} runs: the catalog loaded as serve
// loads it, the tool found by name or alias, and the rest as the pipeline
// does it (toolinput.Build). A call the gateway would refuse before its
// decision (unknown_tool, not_granted, schema_violation) is a
// *toolinput.RefusedError; a configuration that serve would refuse is an
// error too.
func ToolCallInput(ctx context.Context, cfg *config.Config, call toolinput.Call) (*policy.Input, error) {
	cat, _, err := Load(ctx, cfg, guard.New(guard.Options{}), Options{})
	if err != nil {
		return nil, err
	}
	tool, ok := cat.Tool(call.Tool)
	if !ok {
		return nil, toolinput.UnknownTool(call.Tool)
	}
	return toolinput.Build(ctx, cfg, tool, cat.connectors[tool.Connector].Conn.BaseURL, call)
}

// ToolExample returns example arguments for a tool (name or alias), made
// from its argument schema (connectors.Tool.Example), for `sluice policy
// input --example`. They are only a starting point: ToolCallInput still
// validates them as the gateway would, and says what a pattern or format
// rejected.
func ToolExample(ctx context.Context, cfg *config.Config, name string) ([]byte, error) {
	cat, _, err := Load(ctx, cfg, guard.New(guard.Options{}), Options{})
	if err != nil {
		return nil, err
	}
	tool, ok := cat.Tool(name)
	if !ok {
		return nil, toolinput.UnknownTool(name)
	}
	return tool.Example()
}

// SpecClient is guard.SpecClient with a guard of its own, for commands that load
// a connector's spec without a running gateway (sluice validate, tools).
func SpecClient(cc config.Connector) *http.Client {
	return guard.SpecClient(guard.New(guard.Options{}), AllowPrivate(cc), 0)
}

// AllowPrivate is cc.AllowPrivate as prefixes (config.Validate checked them).
func AllowPrivate(cc config.Connector) []netip.Prefix {
	var allow []netip.Prefix
	for _, p := range cc.AllowPrivate {
		if pfx, err := config.ParseAllowPrivate(p); err == nil {
			allow = append(allow, pfx)
		}
	}
	return allow
}
