package gateway

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

// catalog is the loaded tools and, per tool, how to reach its API.
type catalog struct {
	tools      map[string]*connectors.Tool
	aliases    map[string]*connectors.Tool // Tool.Alias → tool
	list       []*connectors.Tool
	connectors map[string]*upstream
	remotes    map[string]*mcpremote.Remote // provider: mcp connectors by slug; their tools change (mcp_remote.go)
}

// upstream is one connector's provisioned destination.
type upstream struct {
	cfg       config.Connector
	conn      *connectors.Connector
	allow     []netip.Prefix
	transport http.RoundTripper          // guarded *http.Transport; a remote MCP server's *mcpremote.Remote
	creds     *creds.Plan                // how the credential is attached; nil without one
	oauth     *oauth.Client              // credential.oauth2, resolved against the spec (creds.OAuthClient)
	scrub     atomic.Pointer[scrubCache] // the scrubber of the last credential attached
}

// Tool finds a tool by its name or its function-safe alias.
func (c *catalog) Tool(name string) (*connectors.Tool, bool) {
	if t, ok := c.tools[name]; ok {
		return t, true
	}
	if t, ok := c.aliases[name]; ok {
		return t, true
	}
	return c.remoteTool(name)
}
func (c *catalog) Tools() []*connectors.Tool { return c.withRemotes() }

// loadCatalogWith loads every connector's spec and decides how its credential
// is attached (newCredPlan); sl adds validate's strictness and defect
// report to each load. errs refuse serve; warns are printed.
func loadCatalogWith(ctx context.Context, cfg *config.Config, d *guard.Dialer, sl specLoad) (c *catalog, warns []error, err error) {
	c = &catalog{tools: map[string]*connectors.Tool{}, aliases: map[string]*connectors.Tool{}, connectors: map[string]*upstream{}}
	var errs []error
	local := creds.ExistingLocal(cfg)
	for i, cc := range cfg.Connectors {
		key := fmt.Sprintf("connectors[%d]", i)
		allow := allowPrivate(cc)
		if cc.Provider == "mcp" {
			errs = append(errs, c.addRemote(ctx, key, cc, d, allow, cfg, local)...) // mcp_remote.go
			continue
		}
		spec := guard.SpecClient(d, allow, cfg.Gateway.UpstreamTimeout.Std())
		conn, err := connectors.Load(ctx, connectors.Options{Slug: cc.Slug, Spec: cc.Spec, BaseURL: cc.BaseURL, Client: spec, Strict: cc.Strict || sl.strict, Defects: sl.defects})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.spec: %w", key, err))
			continue
		}
		if conn.BaseURL == nil {
			errs = append(errs, fmt.Errorf("%s.base_url: the spec names no server; set base_url", key))
			continue
		}
		u := &upstream{cfg: cc, conn: conn, allow: allow}
		if cc.Credential != nil && conn.BaseURL.Scheme == "http" && !creds.PlaintextOK(conn.BaseURL.Hostname(), u.allow) {
			errs = append(errs, fmt.Errorf("%s.base_url: a credential is sent over plain http only to an address inside allow_private; use https", key))
			continue
		}
		if cc.Credential != nil && cc.Credential.OAuth2 != nil {
			var oerrs []error
			if u.oauth, oerrs = creds.OAuthClient(key, cc, conn, u.allow); len(oerrs) > 0 {
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
			u.creds = plan
		}
		u.transport = guard.NewDirect(d, u.allow, guard.Transport(d, u.allow, cfg.Gateway.UpstreamTimeout.Std(), cfg.Gateway.MaxConnections))
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

// oauthClients are the connectors' OAuth clients in slug order, each with
// the transport its provider is reached through (connections.New).
func (c *catalog) oauthClients() []connections.Client {
	var out []connections.Client
	for _, slug := range slices.Sorted(maps.Keys(c.connectors)) {
		u := c.connectors[slug]
		if u.oauth == nil {
			continue
		}
		tr := u.transport
		if r, ok := tr.(*mcpremote.Remote); ok {
			tr = r.Transport() // a remote MCP server's send is a tools/call; its authorization server is reached plainly
		}
		out = append(out, connections.Client{Slug: slug, OAuth: u.oauth, Transport: tr, ClientSecret: u.cfg.Credential.OAuth2.ClientSecret})
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
	cat, _, err := loadCatalog(ctx, cfg, guard.New(guard.Options{}))
	if err != nil {
		return nil, err
	}
	tool, ok := cat.Tool(call.Tool)
	if !ok {
		return nil, toolinput.UnknownTool(call.Tool)
	}
	return toolinput.Build(ctx, cfg, tool, cat.connectors[tool.Connector].conn.BaseURL, call)
}

// ToolExample returns example arguments for a tool (name or alias), made
// from its argument schema (connectors.Tool.Example), for `sluice policy
// input --example`. They are only a starting point: ToolCallInput still
// validates them as the gateway would, and says what a pattern or format
// rejected.
func ToolExample(ctx context.Context, cfg *config.Config, name string) ([]byte, error) {
	cat, _, err := loadCatalog(ctx, cfg, guard.New(guard.Options{}))
	if err != nil {
		return nil, err
	}
	tool, ok := cat.Tool(name)
	if !ok {
		return nil, toolinput.UnknownTool(name)
	}
	return tool.Example()
}
