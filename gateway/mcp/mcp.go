// Package mcp is the gateway's Model Context Protocol door: streamable
// HTTP at /mcp on the sandbox socket, built on the official Go SDK.
//
// It is a thin door. It decides nothing and sends nothing upstream: the
// tools it lists and every tools/call go through the hooks in Deps, which
// the gateway fills with its one call pipeline (validate, Rego, hold,
// credential, guarded dial, scrub, audit). What the door owns is the
// protocol: the JSON-RPC gate in front of the SDK (gate.go), one SDK
// server per caller identity so that tools/list is that caller's list and
// list_changed reaches exactly its sessions, and the mapping of an
// outcome to a tool result (refusals are isError results naming their
// code, per the spec's split between protocol and tool errors).
//
// The caller's identity comes only from the connection (Deps.Identify, the
// relayed identity preamble), never from MCP metadata or headers; an
// Mcp-Session-Id is honoured only on connections of the identity that
// opened it.
package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// AwaitHoldTool is the tool an agent calls to keep waiting for a held call.
const AwaitHoldTool = "sluice.await_hold"

// DefaultMaxMessageBytes bounds one JSON-RPC message (a POST body).
const DefaultMaxMessageBytes = 4 << 20

// Deps is what the door takes from the gateway: the pipeline's own
// entrances (Server.Tools, Server.Call, Server.Poll), which the root fills
// in when it mounts /mcp. Identify, Tools, Call and Poll are required.
type Deps struct {
	// Identify returns the identity the connection carries (the relayed
	// preamble); ok is false when it has none, and the request is refused.
	Identify func(r *http.Request) (wire.Identity, bool)
	// Tools lists what id is granted and not blocked from outright
	// (exactly GET /v1/tools).
	Tools func(ctx context.Context, id wire.Identity) ([]call.Tool, *refusal.Error)
	// Call runs one call through the pipeline, which audits and logs it.
	Call func(ctx context.Context, r call.Request) call.Outcome
	// Poll waits up to wait for one of id's holds.
	Poll func(ctx context.Context, id wire.Identity, hold string, wait time.Duration) call.Outcome
	// Title is a tool's short title from its spec (summary), "" for none.
	Title func(tool string) string
	// Output reports whether body, a JSON reply body, is valid under the
	// tool's OutputSchema (connectors.Tool.MatchesOutput); nil means no
	// reply is ever sent as structuredContent of a tool with one.
	Output func(tool string, body []byte) bool
	// Remote says whether tool (a name or alias) is a remote MCP server's
	// tool (a provider: mcp connector) and how that server describes it:
	// it is listed with the remote's schemas and annotations, its
	// arguments are passed to the pipeline as the body of its request,
	// and its result is the remote's (scrubbed). nil: no tool is remote.
	Remote func(tool string) (Remote, bool)
	// HoldWait bounds one wait of sluice.await_hold (gateway.hold_wait);
	// a tools/call waits gateway.hold_wait too (the pipeline's default).
	HoldWait time.Duration
	// Aliases lists the function-safe aliases instead of the tool names.
	Aliases bool
	// MaxMessageBytes bounds a POST body (0: DefaultMaxMessageBytes).
	MaxMessageBytes int64
	// Progress is how often a held call reports progress (0: 2s).
	Progress time.Duration
	Logger   *slog.Logger
}

// Remote is how a remote MCP server describes one of its tools.
type Remote struct {
	Name         string // the gateway's tool name
	Title        string
	Description  string
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	Annotations  *sdk.ToolAnnotations
}

// remote is Deps.Remote, false when unset.
func (m *Door) remote(tool string) (Remote, bool) {
	if m.deps.Remote == nil {
		return Remote{}, false
	}
	return m.deps.Remote(tool)
}

// Door is the /mcp handler.
type Door struct {
	deps Deps
	log  *slog.Logger
	sdk  *sdk.StreamableHTTPHandler

	mu      sync.Mutex
	servers map[wire.Identity]*caller
	owners  map[string]wire.Identity // Mcp-Session-Id → the identity that opened it
	// fastSessions are the initialized sessions whose tools/calls the
	// fast path (fast.go) may take, by Mcp-Session-Id.
	fastSessions map[string]*fastSession
	noFast       bool // tests: every message goes to the SDK
	fastCalls    atomic.Int64
}

// caller is one identity's SDK server and the tools it lists.
type caller struct {
	id      wire.Identity
	srv     *sdk.Server
	mu      sync.Mutex        // serialises refreshes
	listed  map[string]string // MCP name → fingerprint of what is listed
	created time.Time
	// names maps the name not listed (the alias, or the tool name when
	// aliases are listed) to the listed one: a call accepts either.
	names atomic.Pointer[map[string]string]
	// fast maps each listed tool the fast path may call (every listed
	// tool but sluice.await_hold) to its typed name: the tool name when
	// it is listed with an outputSchema, else "".
	fast atomic.Pointer[map[string]string]
}

// New makes the door. It lists nothing until a caller connects.
func New(d Deps) *Door {
	if d.MaxMessageBytes <= 0 {
		d.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if d.Progress <= 0 {
		d.Progress = 2 * time.Second
	}
	if d.HoldWait <= 0 {
		d.HoldWait = 30 * time.Second
	}
	log := d.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Door{deps: d, log: log, servers: map[wire.Identity]*caller{}, owners: map[string]wire.Identity{}, fastSessions: map[string]*fastSession{}}
	m.sdk = sdk.NewStreamableHTTPHandler(m.serverFor, &sdk.StreamableHTTPOptions{
		// The gate (gate.go) already bounded the body; the SDK's bound
		// stays as a second line at the same size.
		MaxRequestBodyBytes: d.MaxMessageBytes,
		Logger:              log,
		// Its DNS-rebinding guard stays on (DisableLocalhostProtection
		// false): it applies to any TCP listener the door is mounted on.
	})
	return m
}

// serverFor is the SDK's getServer: the caller's own server, made on its
// first session. The gate has identified the request already.
func (m *Door) serverFor(r *http.Request) *sdk.Server {
	id, ok := m.deps.Identify(r)
	if !ok {
		return nil
	}
	m.mu.Lock()
	c := m.servers[id]
	if c == nil {
		c = &caller{id: id, listed: map[string]string{}, created: time.Now()}
		empty := map[string]string{}
		c.names.Store(&empty)
		noFast := map[string]string{}
		c.fast.Store(&noFast)
		c.srv = sdk.NewServer(&sdk.Implementation{Name: "sluice", Title: "sluice gateway"}, &sdk.ServerOptions{
			Logger:       m.log,
			Capabilities: &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{ListChanged: true}},
			// A session id is bound to the identity that opened it: the
			// gate refuses it on any other identity's connection.
			GetSessionID: func() string {
				sid := newSessionID()
				m.mu.Lock()
				m.owners[sid] = id
				m.mu.Unlock()
				return sid
			},
		})
		c.srv.AddReceivingMiddleware(m.routeCalls(c))
		m.servers[id] = c
	}
	m.mu.Unlock()
	// The SDK asks for the server on every request; the list is made when
	// a session opens (a POST without a session id) and re-made on
	// Changed, not per call. Outside m.mu: Tools runs the policy.
	if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" {
		m.refresh(r.Context(), c)
	}
	return c.srv
}

// Changed re-lists every connected caller's tools (a policy reload, a
// grant change); the SDK sends notifications/tools/list_changed to the
// sessions whose list changed. Callers with no session left are dropped.
func (m *Door) Changed(ctx context.Context) {
	m.mu.Lock()
	cs := make([]*caller, 0, len(m.servers))
	for id, c := range m.servers {
		if !hasSessions(c.srv) && time.Since(c.created) > time.Minute {
			delete(m.servers, id)
			continue
		}
		cs = append(cs, c)
	}
	live := map[string]bool{}
	for _, c := range cs {
		for ss := range c.srv.Sessions() {
			live[ss.ID()] = true
		}
	}
	for sid := range m.owners {
		if !live[sid] {
			delete(m.owners, sid)
		}
	}
	m.mu.Unlock()
	for _, c := range cs {
		m.refresh(ctx, c)
	}
}

func hasSessions(s *sdk.Server) bool {
	for range s.Sessions() {
		return true
	}
	return false
}

// refresh makes c's server list exactly what Deps.Tools lists for it now.
// A tool the door cannot list (a schema that is not an object, a name
// taken twice) is left out and logged with its reason; the rest are listed.
func (m *Door) refresh(ctx context.Context, c *caller) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tools, rerr := m.deps.Tools(ctx, c.id)
	if rerr != nil {
		// Fail closed: list nothing rather than a stale list.
		m.log.Warn("mcp: tools could not be listed; the list is empty until they can", "agent", c.id.Agent, "sandbox", c.id.Sandbox, "code", string(rerr.Code))
		tools = nil
	}
	want := map[string]*sdk.Tool{}
	prints := map[string]string{}
	typed := map[string]string{} // listed name → tool name, for a tool listed with an outputSchema
	for _, t := range tools {
		st, err := m.sdkTool(t)
		if err == nil && want[st.Name] != nil {
			err = fmt.Errorf("the name %s is listed twice", st.Name)
		}
		if err != nil {
			m.log.Warn("mcp: tool left out of tools/list", "tool", t.Name, "reason", err.Error())
			continue
		}
		want[st.Name] = st
		typed[st.Name] = t.Name
		b, _ := json.Marshal(st)
		prints[st.Name] = string(b)
	}
	if _, taken := want[AwaitHoldTool]; taken {
		m.log.Warn("mcp: tool left out of tools/list", "tool", AwaitHoldTool, "reason", "the name of the built-in tool")
	}
	want[AwaitHoldTool] = awaitHoldTool(m.deps.HoldWait)
	prints[AwaitHoldTool] = "builtin"
	names := map[string]string{}
	for _, t := range tools {
		listed, other := t.Name, t.Alias
		if m.deps.Aliases {
			listed, other = t.Alias, t.Name
		}
		if _, ok := want[listed]; ok && other != "" && other != listed {
			names[other] = listed
		}
	}
	c.names.Store(&names)
	var gone []string
	for name := range c.listed {
		if _, ok := want[name]; !ok {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		c.srv.RemoveTools(gone...)
	}
	for name, st := range want {
		if c.listed[name] == prints[name] {
			continue
		}
		switch {
		case name == AwaitHoldTool:
			c.srv.AddTool(st, m.awaitHandler(c.id))
		case st.OutputSchema != nil:
			c.srv.AddTool(st, m.callHandler(c.id, typed[name]))
		default:
			c.srv.AddTool(st, m.callHandler(c.id, ""))
		}
	}
	c.listed = prints
	fast := map[string]string{}
	for name, st := range want {
		switch {
		case name == AwaitHoldTool:
		case st.OutputSchema != nil:
			fast[name] = typed[name]
		default:
			fast[name] = ""
		}
	}
	c.fast.Store(&fast)
}

// sdkTool renders t as MCP lists it: its JSON Schema as inputSchema, its
// success reply's schema as outputSchema when that is an object schema
// (MCP's rule; an array or scalar reply is listed without one, and its
// client then expects no structuredContent), its spec's summary as title,
// and hints from its HTTP method.
func (m *Door) sdkTool(t call.Tool) (*sdk.Tool, error) {
	if rt, ok := m.remote(t.Name); ok {
		return m.remoteTool(t, rt)
	}
	var schema map[string]any
	if err := json.Unmarshal(t.Schema, &schema); err != nil {
		return nil, fmt.Errorf("inputSchema is not a JSON object: %w", err)
	}
	if schema["type"] != "object" {
		return nil, fmt.Errorf(`inputSchema must have type "object" (MCP), has %v`, schema["type"])
	}
	name := t.Name
	if m.deps.Aliases && t.Alias != "" {
		name = t.Alias
	}
	var title string
	if m.deps.Title != nil {
		title = m.deps.Title(t.Name)
	}
	st := &sdk.Tool{Name: name, Title: title, Description: t.Description, InputSchema: schema}
	if len(t.OutputSchema) > 0 {
		var out map[string]any
		if json.Unmarshal(t.OutputSchema, &out) == nil && out["type"] == "object" {
			st.OutputSchema = out
		}
	}
	a := &sdk.ToolAnnotations{Title: title}
	switch t.Method {
	case http.MethodGet, http.MethodHead:
		a.ReadOnlyHint = true
	case http.MethodDelete:
		yes := true
		a.DestructiveHint = &yes
	default:
		no := false
		a.DestructiveHint = &no
	}
	switch t.Method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete:
		a.IdempotentHint = true
	}
	st.Annotations = a
	return st, nil
}

// remoteTool renders a remote MCP server's tool as that server lists it:
// its inputSchema, outputSchema, title and annotations (a copy: the door
// owns what it lists), under the gateway's name.
func (m *Door) remoteTool(t call.Tool, rt Remote) (*sdk.Tool, error) {
	var in, out map[string]any
	if err := json.Unmarshal(rt.InputSchema, &in); err != nil || in["type"] != "object" {
		return nil, fmt.Errorf(`the remote inputSchema must have type "object" (MCP)`)
	}
	name := t.Name
	if m.deps.Aliases && t.Alias != "" {
		name = t.Alias
	}
	st := &sdk.Tool{Name: name, Title: rt.Title, Description: rt.Description, InputSchema: in}
	if len(rt.OutputSchema) > 0 {
		if json.Unmarshal(rt.OutputSchema, &out) == nil && out["type"] == "object" {
			st.OutputSchema = out
		}
	}
	if rt.Annotations != nil {
		a := *rt.Annotations
		st.Annotations = &a
	}
	return st, nil
}

func newSessionID() string {
	var b [18]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
