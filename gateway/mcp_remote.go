package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/checks"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/mcp"
	"github.com/sluice-gw/sluice/gateway/mcpremote"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/vault"
)

// EventMCPToolsChanged is the audit event of a remote MCP server's tool
// list changing: the tools added, removed and changed (a changed tool is a
// new tool: nothing granted for the old one applies).
const EventMCPToolsChanged = "mcp_tools_changed"

// mcpCredential is a provider: mcp connector's credential with its
// default place: Authorization: Bearer <secret>.
func mcpCredential(cc config.Connector) config.Connector {
	if cc.Credential != nil && cc.Credential.Header == "" {
		cr := *cc.Credential
		cr.Header, cr.Prefix = "Authorization", "Bearer "
		cc.Credential = &cr
	}
	return cc
}

// addRemote provisions a provider: mcp connector: its guarded transport,
// its credential plan and the Remote that lists its tools (started by
// remoteRuns.start). Its upstream's transport is the Remote: a call's send is
// a tools/call.
func (c *catalog) addRemote(ctx context.Context, key string, cc config.Connector, d *guard.Dialer, allow []netip.Prefix, cfg *config.Config, local func() *vault.Local) []error {
	cc = mcpCredential(cc)
	u, err := url.Parse(cc.URL)
	if err != nil || u.Host == "" {
		return []error{fmt.Errorf("%s.url: not a URL", key)}
	}
	if cc.Credential != nil && u.Scheme == "http" && !creds.PlaintextOK(u.Hostname(), allow) {
		return []error{fmt.Errorf("%s.url: a credential is sent over plain http only to an address inside allow_private; use https", key)}
	}
	conn := &connectors.Connector{Slug: cc.Slug, BaseURL: u}
	up := &upstream{cfg: cc, conn: conn, allow: allow}
	if cc.Credential != nil {
		plan, perrs, _ := creds.NewPlan(key, cc, conn, creds.StoredShape(ctx, cfg, cc, local))
		if len(perrs) > 0 {
			return perrs
		}
		up.creds = plan
		if cc.Credential.OAuth2 != nil {
			up.oauth = mcpOAuthClient(cc, allow) // MCP authorization (mcp_oauth.go)
		}
	}
	guarded := newTransport(d, allow, cfg.Gateway.UpstreamTimeout.Std(), cfg.Gateway.MaxConnections)
	refresh := cc.Refresh.Std()
	if refresh == 0 {
		refresh = config.DefaultMCPRefresh
	}
	var header string
	if cc.Credential != nil {
		header = cc.Credential.Header
	}
	r := mcpremote.New(mcpremote.Options{Slug: cc.Slug, URL: u, Transport: guarded, CredHeader: header, Refresh: refresh, Timeout: cfg.Gateway.UpstreamTimeout.Std(),
		MaxResponseBytes: cfg.Gateway.MaxResponseBytes, PerCredential: up.oauth != nil})
	up.transport = r
	c.connectors[cc.Slug] = up
	if c.remotes == nil {
		c.remotes = map[string]*mcpremote.Remote{}
	}
	c.remotes[cc.Slug] = r
	return nil
}

// remoteTool finds a remote MCP server's tool by name or alias.
func (c *catalog) remoteTool(name string) (*connectors.Tool, bool) {
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
func (c *catalog) withRemotes() []*connectors.Tool {
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

// remoteInfo is the remote tool a gateway tool is, if it is one.
func (c *catalog) remoteInfo(t *connectors.Tool) (*mcpremote.Tool, bool) {
	r := c.remotes[t.Connector]
	if r == nil {
		return nil, false
	}
	rt, ok := r.Current().Tools[t.Name]
	return rt, ok
}

// remoteRuns is the remote servers' listing loops.
type remoteRuns struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   sync.WaitGroup

	audit   auditLog // a list change is audited
	log     *slog.Logger
	changed func() // the MCP door's sessions are told (mcpChanged)
	// oauthHeader lists a remote with MCP authorization with a connected
	// person's token (remoteOAuthHeader, mcp_oauth.go).
	oauthHeader func(up *upstream) func(ctx context.Context) (http.Header, error)
}

// start lists each remote MCP server once (bounded by
// gateway.upstream_timeout; a server that is down leaves its tools
// unavailable and the gateway serves the rest), then keeps each list
// fresh until Close.
func (rr *remoteRuns) start(ctx context.Context, cat *catalog, src CredentialSource) {
	if len(cat.remotes) == 0 {
		return
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rr.mu.Lock()
	rr.cancel = cancel
	rr.mu.Unlock()
	var first sync.WaitGroup
	for slug, r := range cat.remotes {
		up := cat.connectors[slug]
		header := remoteHeader(src, up)
		if isMCPOAuth(up) && rr.oauthHeader != nil {
			header = rr.oauthHeader(up) // a connected person's token (mcp_oauth.go)
		}
		r.SetHooks(header, rr.remoteChanged, rr.log)
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

// stop ends the listing loops and closes the remote sessions.
func (rr *remoteRuns) stop() {
	rr.mu.Lock()
	cancel := rr.cancel
	rr.cancel = nil
	rr.mu.Unlock()
	if cancel != nil {
		cancel()
		rr.done.Wait()
	}
}

// remoteHeader is how a remote server's listing requests carry the
// connector's credential: fetched from creds as for a call and attached by
// the same plan. A listing has no caller: a per-user credential ({user})
// is fetched for the connector's list_user, a service identity, and
// without one the remote cannot be listed, which its unavailable reason
// says.
func remoteHeader(src CredentialSource, up *upstream) func(ctx context.Context) (http.Header, error) {
	cc := up.cfg.Credential
	if cc == nil {
		return nil
	}
	var caller policy.Caller
	if cc.PerUser() {
		if up.cfg.ListUser == "" {
			return func(context.Context) (http.Header, error) {
				return nil, fmt.Errorf("the credential for connector %s is per user ({user} in its Vault path) and a listing acts for no user; set list_user to a service identity to list this server's tools", up.cfg.Slug)
			}
		}
		caller.User = up.cfg.ListUser
	}
	return func(ctx context.Context) (http.Header, error) {
		secret, err := src.Credential(ctx, CredentialRef{Connector: up.cfg.Slug, Secret: cc.Secret, Vault: cc.Vault, Caller: caller})
		if err != nil {
			return nil, fmt.Errorf("the credential for connector %s is unavailable", up.cfg.Slug)
		}
		req, _ := http.NewRequest(http.MethodPost, up.conn.BaseURL.String(), nil)
		if _, err := creds.Attach(req, up.creds, &connectors.Tool{Connector: up.cfg.Slug}, secret); err != nil {
			return nil, fmt.Errorf("the credential for connector %s cannot be attached: %v", up.cfg.Slug, err)
		}
		return http.Header{cc.Header: req.Header.Values(cc.Header)}, nil
	}
}

// checkRemotes is validate's look at each remote MCP server: listed once
// (with the credential from the local store; Vault is not logged in to),
// its tools returned by slug for validate to show, and a remote that
// cannot be listed or a tool it lists that cannot be re-exposed reported
// as a warning: serve starts without them and keeps trying.
func checkRemotes(ctx context.Context, cfg *config.Config, cat *catalog) (map[string]*connectors.Connector, []error) {
	listed := map[string]*connectors.Connector{}
	var warns []error
	local := creds.ExistingLocal(cfg)
	for i, cc := range cfg.Connectors {
		r := cat.remotes[cc.Slug]
		if r == nil {
			continue
		}
		key := fmt.Sprintf("connectors[%d]", i)
		up := cat.connectors[cc.Slug]
		if cc.Credential != nil && cc.Credential.OAuth2 != nil {
			warns = append(warns, checkMCPOAuth(ctx, key, cc, r.Transport())) // listed with a person's token: not by validate (mcp_oauth.go)
			continue
		}
		var header func(context.Context) (http.Header, error)
		if cc.Credential != nil {
			st := local()
			if cfg.Secrets.Backend != "local" || cc.Credential.Secret == "" || st == nil {
				warns = append(warns, checks.Warnf("%s: the remote MCP server is not listed by validate (its credential is not in the local store); serve lists it", key))
				continue
			}
			header = remoteHeader(creds.Local{Store: st}, up)
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

// remoteChanged audits a remote server's list change and tells the MCP
// door, whose sessions then get notifications/tools/list_changed.
func (rr *remoteRuns) remoteChanged(ctx context.Context, c mcpremote.Change) {
	if !c.Empty() {
		f := map[string]any{"connector": c.Connector, "added": nonNil(c.Added), "removed": nonNil(c.Removed), "changed": nonNil(c.Changed), "fingerprints": c.Fingerprints}
		if _, err := rr.audit.append(ctx, audit.Record{RequestID: refusal.NewRequestID(), Event: EventMCPToolsChanged, Fields: f}, false); err != nil {
			// The list is already swapped: a changed tool is refused its
			// old grants whether or not this record was written.
			rr.log.Error("audit: the remote MCP server's tool change could not be recorded", "connector", c.Connector, "err", err)
		}
		rr.log.Info("mcp remote: tools changed", "connector", c.Connector, "added", c.Added, "removed", c.Removed, "changed", c.Changed)
	}
	rr.changed()
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// mcpRemote is the MCP door's view of a remote tool (mcp.Deps.Remote).
func (c *catalog) mcpRemote(name string) (mcp.Remote, bool) {
	t, ok := c.Tool(name)
	if !ok {
		return mcp.Remote{}, false
	}
	rt, ok := c.remoteInfo(t)
	if !ok {
		return mcp.Remote{}, false
	}
	return mcp.Remote{Name: t.Name, Title: rt.Title, Description: rt.Description, InputSchema: rt.InputSchema, OutputSchema: rt.OutputSchema, Annotations: rt.Annotations}, true
}

// unavailable is Server.Unavailable.
func (c *catalog) unavailable(agentConnectors []string) []map[string]string {
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
