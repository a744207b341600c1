// Package mcpremote makes a remote MCP server a connector (provider: mcp):
// the gateway is the server's MCP client (the official Go SDK, streamable
// HTTP), lists its tools, and re-exposes each as a tool of the ordinary
// tool model, so that a call to it runs the gateway's one pipeline
// (validate, Rego, hold, credential, guarded dial, scrub, audit) exactly
// as an OpenAPI operation's does.
//
// A remote tool becomes an operation of a connector built in memory:
// POST <url>/t/<fingerprint> whose JSON body is the tool's arguments,
// validated against the remote inputSchema. The fingerprint (SHA-256 of
// the tool's name, title, description, schemas and annotations) is in
// the request the pipeline decides on, holds and grants by, so a tool the
// remote changed is a new request: no "always allow" and no pending hold
// made for the old one carries over (the rug-pull). Remote's RoundTrip is
// the connector's "send": it turns that request into a tools/call on the
// remote session, refusing one whose fingerprint is no longer listed, and
// answers with the remote's CallToolResult as a JSON body, which the
// pipeline then scrubs of the credential like any reply.
//
// Every HTTP request to the remote goes through the connector's
// transport (the gateway's guarded dialer with the connector's
// allow_private); redirects are never followed. The credential is the
// pipeline's: a call's own request carries it in the configured header,
// which is copied onto that call's HTTP request only; listing uses the
// Header hook.
package mcpremote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/connectors"
)

// MaxTools bounds how many tools one remote server may list; the rest are
// skipped with a reason.
const MaxTools = 500

// maxSchemaBytes bounds one remote tool's input or output schema.
const maxSchemaBytes = 256 << 10

// Options configures one remote server.
type Options struct {
	Slug string
	URL  *url.URL
	// Transport is the connector's guarded transport: every request to
	// the remote (listing and calls) goes through it.
	Transport http.RoundTripper
	// CredHeader is the header the pipeline attaches the credential in
	// ("" when the connector has none); a call's value is copied from its
	// request onto the MCP request that carries it.
	CredHeader string
	// Header returns the headers listing requests carry (the connector's
	// credential, attached outside any call); nil for none.
	Header func(ctx context.Context) (http.Header, error)
	// Refresh is how often the list is fetched again besides the
	// remote's notifications/tools/list_changed.
	Refresh time.Duration
	// Changed is called after a listing that differs from the previous
	// one (the first listing included), outside any lock.
	Changed func(ctx context.Context, c Change)
	// MaxResponseBytes bounds the body of one answer to a POST (a listing
	// page or a tool result; default 16 MiB): a remote cannot make the
	// gateway hold more of it.
	MaxResponseBytes int64
	// Timeout bounds one connect or listing (default 15s).
	Timeout time.Duration
	Logger  *slog.Logger
	// PerCredential gives each call credential its own session: MCP
	// authorization binds a session to the user of the token that opened
	// it (a person's OAuth token), so one person's session is never used
	// with, or for, another's token (percred.go).
	PerCredential bool
}

// Tool is one remote tool as listed.
type Tool struct {
	Name         string // the gateway's name: <slug>.<remote name in snake_case>
	Remote       string // the remote's own name, which tools/call uses
	Fingerprint  string // hex SHA-256 of what the remote says the tool is
	Title        string
	Description  string
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	Annotations  *sdk.ToolAnnotations
}

// Set is one listing of the remote's tools.
type Set struct {
	// Conn is the in-memory connector whose tools are the listed remote
	// tools; nil when the remote could not be listed.
	Conn *connectors.Connector
	// Tools are the remote tools by gateway name.
	Tools map[string]*Tool
	// Unavailable says why the remote's tools cannot be listed ("" when
	// they are); its tools are then not offered.
	Unavailable string
	// Skipped names each remote tool left out, with why.
	Skipped []string
	// When the listing was made.
	When time.Time

	byFP    map[string]*Tool
	aliases map[string]*connectors.Tool
	tools   map[string]*connectors.Tool
}

// Change is what a listing changed: gateway tool names added, removed, or
// whose fingerprint changed, and the new unavailability.
type Change struct {
	Connector   string
	Added       []string
	Removed     []string
	Changed     []string
	Unavailable string
	// Fingerprints of the tools now listed, by gateway name.
	Fingerprints map[string]string
}

// Empty reports whether c changes nothing.
func (c Change) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0
}

// Remote is one remote MCP server: its client session and current list.
type Remote struct {
	opts   Options
	client *sdk.Client
	hc     *http.Client
	set    atomic.Pointer[Set]
	kick   chan struct{}

	mu sync.Mutex // guards cs and serialises listings
	cs *sdk.ClientSession

	creds credSessions // PerCredential: sessions by credential (percred.go)
}

// New makes a Remote; it connects nothing until Start or a call.
func New(o Options) *Remote {
	if o.Timeout <= 0 {
		o.Timeout = 15 * time.Second
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = 16 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Remote{opts: o, kick: make(chan struct{}, 1)}
	r.set.Store(&Set{Unavailable: "not listed yet", When: time.Now()})
	r.hc = &http.Client{
		Transport: &credTransport{r: r},
		// A redirect could send the credential, and the call, anywhere:
		// refuse to follow one (the guard would judge the new address,
		// but the remote was configured by its URL, not by where it points).
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errors.New("mcpremote: the remote answered with a redirect, which is not followed")
		},
	}
	r.client = sdk.NewClient(&sdk.Implementation{Name: "sluice", Title: "sluice gateway", Version: "1"}, &sdk.ClientOptions{
		Logger: o.Logger,
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) {
			select {
			case r.kick <- struct{}{}:
			default:
			}
		},
	})
	return r
}

// SetHooks sets Options.Header, Changed and Logger, which the gateway has
// only once its credential source and audit log are open; before Run.
func (r *Remote) SetHooks(header func(context.Context) (http.Header, error), changed func(context.Context, Change), log *slog.Logger) {
	r.opts.Header, r.opts.Changed = header, changed
	if log != nil {
		r.opts.Logger = log
	}
}

// Close closes the session, if one is open (Run closes it when its
// context ends).
func (r *Remote) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cs != nil {
		_ = r.cs.Close()
		r.cs = nil
	}
	r.creds.closeAll()
}

// Kick lists the remote again soon (a person connected the account its
// listing needs, say); Run does it.
func (r *Remote) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Slug is the connector's slug.
func (r *Remote) Slug() string { return r.opts.Slug }

// Current is the latest listing.
func (r *Remote) Current() *Set { return r.set.Load() }

// Tool finds a listed tool by gateway name or alias.
func (s *Set) Tool(name string) (*connectors.Tool, bool) {
	if t, ok := s.tools[name]; ok {
		return t, true
	}
	t, ok := s.aliases[name]
	return t, ok
}

// List is the listed tools, sorted by name.
func (s *Set) List() []*connectors.Tool {
	if s.Conn == nil {
		return nil
	}
	return s.Conn.Tools
}

// Run lists the remote again on every list_changed and every
// Refresh, until ctx ends. A listing that fails leaves the remote's tools
// unavailable with the reason, and the next tick tries again.
func (r *Remote) Run(ctx context.Context) {
	every := r.opts.Refresh
	if every <= 0 {
		every = 5 * time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.Close()
			return
		case <-t.C:
		case <-r.kick:
		}
		r.Refresh(ctx)
	}
}

// Refresh lists the remote's tools once and makes that the current set.
func (r *Remote) Refresh(ctx context.Context) {
	r.mu.Lock()
	next := r.list(ctx)
	prev := r.set.Swap(next)
	r.mu.Unlock()
	c := diff(r.opts.Slug, prev, next)
	if next.Unavailable != "" && prev.Unavailable != next.Unavailable {
		r.opts.Logger.Warn("mcp remote: tools unavailable", "connector", r.opts.Slug, "reason", next.Unavailable)
	}
	if (!c.Empty() || prev.Unavailable != next.Unavailable) && r.opts.Changed != nil {
		r.opts.Changed(ctx, c)
	}
}

// list fetches the tools (r.mu held) and builds their set.
func (r *Remote) list(ctx context.Context) *Set {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	session := r.sessionLocked
	if r.opts.Header != nil && (r.cs == nil || r.opts.PerCredential) {
		// The credential first: its own reason (no person connected, the
		// server's MCP authorization refused) says more than a failed connect.
		h, err := r.opts.Header(ctx)
		if err != nil {
			return &Set{Unavailable: "credential: " + shortErr(err), When: time.Now()}
		}
		if r.opts.PerCredential {
			// The listing's credential (a person's token) may be another
			// person's than last time: it lists in that credential's own
			// session, as a call would.
			if ch, ok := listingHeader(h); ok {
				lctx := context.WithValue(ctx, callHeaderKey{}, ch)
				session = func(context.Context) (*sdk.ClientSession, error) { return r.credSession(lctx) }
			}
		}
	}
	cs, err := session(ctx)
	if err != nil {
		return &Set{Unavailable: err.Error(), When: time.Now()}
	}
	var listed []*sdk.Tool
	var skipped []string
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			_ = cs.Close()
			if r.cs == cs {
				r.cs = nil
			}
			r.creds.drop(cs)
			return &Set{Unavailable: "tools/list: " + shortErr(err), When: time.Now()}
		}
		if len(listed) == MaxTools {
			skipped = append(skipped, fmt.Sprintf("%s: more than %d tools are listed", t.Name, MaxTools))
			continue
		}
		listed = append(listed, t)
	}
	s, err := build(ctx, r.opts.Slug, r.opts.URL, listed)
	if err != nil {
		return &Set{Unavailable: err.Error(), When: time.Now()}
	}
	s.Skipped = append(skipped, s.Skipped...)
	return s
}

// session returns the open session, connecting when there is none.
func (r *Remote) session(ctx context.Context) (*sdk.ClientSession, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sessionLocked(ctx)
}

func (r *Remote) sessionLocked(ctx context.Context) (*sdk.ClientSession, error) {
	if r.cs != nil {
		return r.cs, nil
	}
	if r.opts.Header != nil {
		// A credential that cannot be had is the reason, said plainly
		// rather than inside the transport's error of the first request.
		if _, err := r.opts.Header(ctx); err != nil {
			return nil, fmt.Errorf("credential: %w", err)
		}
	}
	cs, err := r.client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: r.opts.URL.String(), HTTPClient: r.hc, MaxRetries: -1}, nil)
	if err != nil {
		return nil, fmt.Errorf("connect: %s", shortErr(err))
	}
	r.cs = cs
	go func() {
		// A session the remote ended is dropped; the next use reconnects.
		_ = cs.Wait()
		r.mu.Lock()
		if r.cs == cs {
			r.cs = nil
		}
		r.mu.Unlock()
	}()
	return cs, nil
}

// shortErr is an error's text without anything a remote said that could
// be long; the guard's refusal and the status stay.
func shortErr(err error) string {
	s := err.Error()
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// remoteName is the shape of a remote tool name sluice re-exposes (MCP's
// recommended alphabet).
var remoteName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// build makes the set of listed: each tool an operation of an in-memory
// OpenAPI 3.1 document, loaded by the connectors package like any spec. A
// tool that cannot be re-exposed is skipped with its reason.
func build(ctx context.Context, slug string, base *url.URL, listed []*sdk.Tool) (*Set, error) {
	s := &Set{Tools: map[string]*Tool{}, byFP: map[string]*Tool{}, When: time.Now()}
	paths := map[string]any{}
	byOp := map[string]*Tool{}
	for _, lt := range listed {
		t, op, err := operation(slug, lt)
		if err == nil && byOp[t.Name] != nil {
			err = fmt.Errorf("its name is %s, as %q's", t.Name, byOp[t.Name].Remote)
		}
		if err != nil {
			s.Skipped = append(s.Skipped, fmt.Sprintf("%q: %v", lt.Name, err))
			continue
		}
		byOp[t.Name] = t
		paths["/t/"+t.Fingerprint] = map[string]any{"post": op}
	}
	doc := map[string]any{
		"openapi": "3.1.0",
		"info":    map[string]any{"title": slug + " (remote MCP server)", "version": "remote"},
		"paths":   paths,
	}
	data, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("bug: remote tools: %w", err)
	}
	conn, err := connectors.LoadData(ctx, slug, data, base.String())
	if err != nil {
		return nil, fmt.Errorf("remote tools: %w", err)
	}
	for _, p := range conn.Skipped {
		s.Skipped = append(s.Skipped, p.String())
	}
	s.Conn = conn
	s.tools, s.aliases = map[string]*connectors.Tool{}, map[string]*connectors.Tool{}
	for _, ct := range conn.Tools {
		t := byOp[ct.Name]
		if t == nil || strings.TrimPrefix(ct.PathTemplate, "/t/") != t.Fingerprint {
			return nil, fmt.Errorf("bug: remote tool %s was built from another operation", ct.Name)
		}
		s.Tools[t.Name], s.byFP[t.Fingerprint] = t, t
		s.tools[ct.Name], s.aliases[ct.Alias] = ct, ct
	}
	sort.Strings(s.Skipped)
	return s, nil
}

// operation renders one remote tool as an OpenAPI operation whose body is
// its arguments.
func operation(slug string, lt *sdk.Tool) (*Tool, map[string]any, error) {
	if !remoteName.MatchString(lt.Name) {
		return nil, nil, fmt.Errorf("a tool name must match %s", remoteName)
	}
	in, err := schemaJSON(lt.InputSchema)
	if err != nil {
		return nil, nil, fmt.Errorf("inputSchema: %w", err)
	}
	var out json.RawMessage
	if lt.OutputSchema != nil {
		if out, err = schemaJSON(lt.OutputSchema); err != nil {
			return nil, nil, fmt.Errorf("outputSchema: %w", err)
		}
	}
	var top map[string]any
	if err := json.Unmarshal(in, &top); err != nil || top["type"] != "object" {
		return nil, nil, errors.New(`inputSchema must be an object schema (type "object")`)
	}
	t := &Tool{Remote: lt.Name, Title: lt.Title, Description: lt.Description, InputSchema: in, OutputSchema: out, Annotations: lt.Annotations}
	t.Fingerprint = Fingerprint(lt.Name, lt.Title, lt.Description, in, out, lt.Annotations)
	// The connectors package names the tool: <slug>.<operationId in snake_case>.
	opID := lt.Name
	if t.Name = connectors.ToolName(slug, opID); t.Name == "" {
		return nil, nil, errors.New("the name has no letter or digit")
	}
	op := map[string]any{
		"operationId":   opID,
		"x-sluice-risk": "write", // the remote's readOnlyHint is its claim, not ours to rely on
		"requestBody": map[string]any{"required": true, "content": map[string]any{
			"application/json": map[string]any{"schema": json.RawMessage(in)},
		}},
		"responses": map[string]any{"200": map[string]any{"description": "the remote's tool result"}},
	}
	if lt.Title != "" {
		op["summary"] = lt.Title
	} else if lt.Annotations != nil && lt.Annotations.Title != "" {
		op["summary"] = lt.Annotations.Title
	}
	if lt.Description != "" {
		op["description"] = lt.Description
	}
	return t, op, nil
}

// schemaJSON is a remote schema as JSON, without $schema (the document is
// 2020-12, as MCP's default), with its references inside itself resolved,
// refused when it refers outside itself.
func schemaJSON(v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > maxSchemaBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxSchemaBytes)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errors.New("not a JSON object")
	}
	if s, ok := m["$schema"].(string); ok && s != "" && !strings.Contains(s, "2020-12") {
		return nil, fmt.Errorf("$schema %q: only JSON Schema 2020-12 is understood", s)
	}
	delete(m, "$schema")
	if bytes.Contains(b, []byte(`"$ref"`)) || bytes.Contains(b, []byte(`"$dynamicRef"`)) || bytes.Contains(b, []byte(`"$recursiveRef"`)) {
		// Its references resolve against the remote's document, not ours:
		// those inside the schema are inlined (refs.go), any other refused.
		if m, err = resolveRefs(m); err != nil {
			return nil, err
		}
	}
	out, err := json.Marshal(m)
	if err == nil && len(out) > maxSchemaBytes {
		return nil, fmt.Errorf("larger than %d bytes once its $ref are resolved", maxSchemaBytes)
	}
	return out, err
}

// Fingerprint is the identity of a remote tool's definition: its name and
// everything the remote says about it. encoding/json sorts map keys, so
// the same definition hashes the same across listings and restarts.
func Fingerprint(name, title, description string, in, out json.RawMessage, a *sdk.ToolAnnotations) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(name), []byte(title), []byte(description), canonical(in), canonical(out)} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	if a != nil {
		b, _ := json.Marshal(a)
		h.Write(canonical(b))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func canonical(b json.RawMessage) []byte {
	if len(b) == 0 {
		return nil
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return b
	}
	c, _ := json.Marshal(v)
	return c
}

// diff is what next changed from prev.
func diff(slug string, prev, next *Set) Change {
	c := Change{Connector: slug, Unavailable: next.Unavailable, Fingerprints: map[string]string{}}
	if next.Unavailable != "" {
		return c // an outage is not a change of the tools: they come back as they were, or are reported then
	}
	old := prev.Tools
	for name, t := range next.Tools {
		c.Fingerprints[name] = t.Fingerprint
		switch o, ok := old[name]; {
		case !ok:
			c.Added = append(c.Added, name)
		case o.Fingerprint != t.Fingerprint:
			c.Changed = append(c.Changed, name)
		}
	}
	for name := range old {
		if _, ok := next.Tools[name]; !ok {
			c.Removed = append(c.Removed, name)
		}
	}
	slices.Sort(c.Added)
	slices.Sort(c.Removed)
	slices.Sort(c.Changed)
	return c
}

// callHeader carries one call's credential header to its MCP request.
type callHeader struct{ name, value string }

type callHeaderKey struct{}

// credTransport puts the credential on each request to the remote: a
// call's own (from its context) or the listing credential, and sends it
// through the connector's guarded transport.
type credTransport struct{ r *Remote }

func (t *credTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if ch, ok := req.Context().Value(callHeaderKey{}).(callHeader); ok {
		req.Header.Set(ch.name, ch.value)
	} else if t.r.opts.Header != nil {
		h, err := t.r.opts.Header(req.Context())
		if err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, fmt.Errorf("credential: %w", err)
		}
		for k, vs := range h {
			req.Header[k] = vs
		}
	}
	resp, err := t.r.opts.Transport.RoundTrip(req)
	if err == nil && req.Method == http.MethodPost {
		resp.Body = &capped{rc: resp.Body, left: t.r.opts.MaxResponseBytes + 1} // exactly the bound is read whole
	}
	return resp, err
}

// capped fails a body that goes on past its bound.
type capped struct {
	rc   io.ReadCloser
	left int64
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, errors.New("mcpremote: the remote's answer is larger than the bound (gateway.max_response_bytes)")
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.rc.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *capped) Close() error { return c.rc.Close() }

// RoundTrip is the connector's send: req is the pipeline's checked
// request, POST <url>/t/<fingerprint> with the arguments as its body. It
// becomes a tools/call of the tool listed with that fingerprint; the
// answer is the remote's CallToolResult as JSON (409 with an isError
// result when the tool is no longer listed as it was: nothing is sent).
func (r *Remote) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(io.LimitReader(req.Body, connectors.MaxArgsBytes+1))
		req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("mcpremote: read the arguments: %w", err)
		}
		body = b
	}
	rest, ok := strings.CutPrefix(req.URL.EscapedPath(), strings.TrimRight(r.opts.URL.EscapedPath(), "/")+"/t/")
	if req.Method != http.MethodPost || !ok || !strings.EqualFold(req.URL.Host, r.opts.URL.Host) {
		return nil, fmt.Errorf("bug: mcpremote: %s %s is not a remote tool's request", req.Method, req.URL.Redacted())
	}
	t := r.set.Load().byFP[rest]
	if t == nil {
		return resultResponse(req, http.StatusConflict, errorResult("sluice: the remote tool was changed or removed since this call was checked (its definition's fingerprint is no longer listed); nothing was sent. List the tools again."))
	}
	if r.opts.CredHeader != "" {
		if v := req.Header.Get(r.opts.CredHeader); v != "" {
			ctx = context.WithValue(ctx, callHeaderKey{}, callHeader{r.opts.CredHeader, v})
		}
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	session := r.session
	if r.opts.PerCredential {
		session = r.credSession
	}
	cs, err := session(ctx)
	if err != nil {
		return nil, err
	}
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: t.Remote, Arguments: json.RawMessage(body)})
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, sdk.ErrConnectionClosed) {
			r.mu.Lock()
			if r.cs == cs {
				r.cs = nil
			}
			r.mu.Unlock()
			r.creds.drop(cs)
		}
		var we *jsonrpc.Error
		if errors.As(err, &we) {
			return resultResponse(req, http.StatusOK, errorResult("the remote server refused the call: "+we.Message))
		}
		return nil, fmt.Errorf("mcpremote: tools/call %s: %w", t.Remote, err)
	}
	return resultResponse(req, http.StatusOK, res)
}

func errorResult(text string) *sdk.CallToolResult {
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: text}}}
}

func resultResponse(req *http.Request, status int, res *sdk.CallToolResult) (*http.Response, error) {
	b, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("mcpremote: the remote's result: %w", err)
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", status, http.StatusText(status)), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(b)),
		ContentLength: int64(len(b)),
		Request:       req,
	}, nil
}
