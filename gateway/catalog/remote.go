package catalog

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/checks"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/mcpremote"
	"github.com/sluice-gw/sluice/gateway/remotes"
	"github.com/sluice-gw/sluice/vault"
)

// addRemote provisions a provider: mcp connector: its guarded transport,
// its credential plan and the Remote that lists its tools (started by
// remotes.Runs.Start). Its upstream's transport is the Remote: a call's send is
// a tools/call.
func (c *Catalog) addRemote(ctx context.Context, key string, cc config.Connector, d *guard.Dialer, allow []netip.Prefix, cfg *config.Config, local func() *vault.Local) []error {
	cc = remotes.Credential(cc)
	u, err := url.Parse(cc.URL)
	if err != nil || u.Host == "" {
		return []error{fmt.Errorf("%s.url: not a URL", key)}
	}
	if cc.Credential != nil && u.Scheme == "http" && !creds.PlaintextOK(u.Hostname(), allow) {
		return []error{fmt.Errorf("%s.url: a credential is sent over plain http only to an address inside allow_private; use https", key)}
	}
	conn := &connectors.Connector{Slug: cc.Slug, BaseURL: u}
	up := &Upstream{Config: cc, Conn: conn, Allow: allow}
	if cc.Credential != nil {
		plan, perrs, _ := creds.NewPlan(key, cc, conn, creds.StoredShape(ctx, cfg, cc, local))
		if len(perrs) > 0 {
			return perrs
		}
		up.Creds = plan
		if cc.Credential.OAuth2 != nil {
			up.OAuth = remotes.OAuthClient(cc, allow) // MCP authorization
		}
	}
	guarded := guard.Transport(d, allow, cfg.Gateway.UpstreamTimeout.Std(), cfg.Gateway.MaxConnections)
	refresh := cc.Refresh.Std()
	if refresh == 0 {
		refresh = config.DefaultMCPRefresh
	}
	var header string
	if cc.Credential != nil {
		header = cc.Credential.Header
	}
	r := mcpremote.New(mcpremote.Options{Slug: cc.Slug, URL: u, Transport: guarded, CredHeader: header, Refresh: refresh, Timeout: cfg.Gateway.UpstreamTimeout.Std(),
		MaxResponseBytes: cfg.Gateway.MaxResponseBytes, PerCredential: up.OAuth != nil})
	up.Transport = r
	c.connectors[cc.Slug] = up
	if c.remotes == nil {
		c.remotes = map[string]*mcpremote.Remote{}
	}
	c.remotes[cc.Slug] = r
	return nil
}

// remoteTool finds a remote MCP server's tool by name or alias.
func (c *Catalog) remoteTool(name string) (*connectors.Tool, bool) {
	if len(c.remotes) == 0 {
		return nil, false
	}
	// A tool's name and alias both start with its slug (then "." or "_").
	for slug, r := range c.remotes {
		if strings.HasPrefix(name, slug) {
			if t, ok := r.Current().Tool(name); ok {
				return t, true
			}
		}
	}
	return nil, false
}

// withRemotes is the static tool list with the remote servers' current
// tools, sorted by name.
func (c *Catalog) withRemotes() []*connectors.Tool {
	if len(c.remotes) == 0 {
		return c.list
	}
	all := slices.Clone(c.list)
	for _, r := range c.remotes {
		all = append(all, r.Current().List()...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	return all
}

// Remote finds a remote MCP server's tool by name or alias: the gateway's
// tool and what the server listed for it (the MCP door re-exposes its
// title, schemas and annotations).
func (c *Catalog) Remote(name string) (*connectors.Tool, *mcpremote.Tool, bool) {
	t, ok := c.Tool(name)
	if !ok {
		return nil, nil, false
	}
	r := c.remotes[t.Connector]
	if r == nil {
		return nil, nil, false
	}
	rt, ok := r.Current().Tools[t.Name]
	return t, rt, ok
}

// IsRemote says whether connector slug is a remote MCP server, whose
// tools are known only once it is listed.
func (c *Catalog) IsRemote(slug string) bool { return c.remotes[slug] != nil }

// CheckRemotes is validate's look at each remote MCP server: listed once
// (with the credential from the local store; Vault is not logged in to),
// its tools returned by slug for validate to show, and a remote that
// cannot be listed or a tool it lists that cannot be re-exposed reported
// as a warning: serve starts without them and keeps trying.
func (c *Catalog) CheckRemotes(ctx context.Context, cfg *config.Config) (map[string]*connectors.Connector, []error) {
	listed := map[string]*connectors.Connector{}
	var warns []error
	local := creds.ExistingLocal(cfg)
	for i, cc := range cfg.Connectors {
		r := c.remotes[cc.Slug]
		if r == nil {
			continue
		}
		key := fmt.Sprintf("connectors[%d]", i)
		up := c.connectors[cc.Slug]
		if cc.Credential != nil && cc.Credential.OAuth2 != nil {
			warns = append(warns, remotes.CheckOAuth(ctx, key, cc, up.Allow, r.Transport())) // listed with a person's token: not by validate
			continue
		}
		var header func(context.Context) (http.Header, error)
		if cc.Credential != nil {
			st := local()
			if cfg.Secrets.Backend != "local" || cc.Credential.Secret == "" || st == nil {
				warns = append(warns, checks.Warnf("%s: the remote MCP server is not listed by validate (its credential is not in the local store); serve lists it", key))
				continue
			}
			header = remotes.Header(creds.Local{Store: st}, remotes.Server{Connector: up.Config, BaseURL: up.Conn.BaseURL, Plan: up.Creds})
		}
		r.SetHooks(header, nil, nil)
		r.Refresh(ctx)
		r.Close()
		set := r.Current()
		if set.Unavailable != "" {
			warns = append(warns, checks.Warnf("%s.url: the remote MCP server cannot be listed: %s; serve starts without its tools and tries again", key, set.Unavailable))
			continue
		}
		for _, sk := range set.Skipped {
			warns = append(warns, checks.Warnf("%s: remote tool left out: %s", key, sk))
		}
		listed[cc.Slug] = set.Conn
	}
	return listed, warns
}

// Unavailable lists the remote MCP servers among agentConnectors whose
// tools cannot be listed now, each with why (GET /v1/tools shows it to
// agents granted the connector; the log says it when it starts).
func (c *Catalog) Unavailable(agentConnectors []string) []map[string]string {
	var out []map[string]string
	for _, slug := range slices.Sorted(maps.Keys(c.remotes)) {
		if !slices.Contains(agentConnectors, slug) {
			continue
		}
		if set := c.remotes[slug].Current(); set.Unavailable != "" {
			out = append(out, map[string]string{"connector": slug, "reason": set.Unavailable, "since": set.When.UTC().Format(time.RFC3339)})
		}
	}
	return out
}

// mcpOAuth says whether up is a remote MCP server with MCP authorization.
func mcpOAuth(up *Upstream) bool {
	return up != nil && up.Config.Provider == "mcp" && up.OAuth != nil
}

// Kick lists connector's remote MCP server again soon (after a person
// connected it: its listing may have waited for that).
func (c *Catalog) Kick(connector string) {
	if r := c.remotes[connector]; r != nil && mcpOAuth(c.connectors[connector]) {
		r.Kick()
	}
}

// RemoteServers are the catalog's remote MCP servers as remotes.Runs
// lists them.
func (c *Catalog) RemoteServers() []remotes.Server {
	out := make([]remotes.Server, 0, len(c.remotes))
	for slug, r := range c.remotes {
		up := c.connectors[slug]
		out = append(out, remotes.Server{Remote: r, Connector: up.Config, BaseURL: up.Conn.BaseURL, Plan: up.Creds, OAuth: mcpOAuth(up)})
	}
	return out
}
