package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/catalog"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/gateway/grants"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/limits"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/scrub"
	"github.com/sluice-gw/sluice/gateway/sessions"
	"github.com/sluice-gw/sluice/gateway/toolinput"
	"github.com/sluice-gw/sluice/gateway/usage"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// sandboxHandler serves the sandbox side. Nothing else is routed here: the
// admin API and the review UI live only on the admin listener.
func (s *Server) sandboxHandler() http.Handler {
	mux := http.NewServeMux()
	toolAPI{list: s.tools, unavailable: s.catalog.Unavailable, agent: s.cfg.Agent, call: s.Call, poll: s.Poll}.route(mux) // toolapi.go
	mux.Handle("/mcp", s.newMCPDoor())                                                                                    // gateway.go: the same listing and pipeline over MCP
	eg := s.newRawEgress()                                                                                                // gateway.go: package egress
	mux.HandleFunc("POST /v1/dns", eg.ServeDNS)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "no such endpoint on the sandbox socket"), refusal.NewRequestID())
	})
	return s.tel.httpServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { // calltrace.go
		if r.Method == http.MethodConnect || r.URL.IsAbs() {
			eg.ServeProxy(w, r) // raw egress: forward proxy and CONNECT
			return
		}
		mux.ServeHTTP(w, r)
	}))
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
		if e := egress.CheckNarrowing(ctx, s.audit.append, rid, id, agent.Egress); e != nil {
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
		in := toolinput.Input(id.Sandbox, id.Agent, id.Session, id.User, t, nil, nil, now)
		in.Findings = []policy.Finding{} // nothing is sent: no scan (and no decision-log event: policylife.Life.DecisionExport)
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

// toolCall is one call's state as it moves through the pipeline; its
// record is what the audit records and the canonical line are made of.
type toolCall struct {
	req       call.Request
	rec       call.Record
	held      *holds.Hold     // an approved hold being executed (executeHold), else nil
	decision  policy.Decision // the policy's (or a grant's) decision; rec.Decision is its recorded form
	connector string
	event     string // the event a refusal is audited under: decision; result for an approved hold's execution
	audited   bool   // the outcome is already in the audit log
	presync   bool   // the next record need only reach the file; a later one syncs
	answered  bool   // the upstream answered over HTTP (a hold's re-send after a crash needs to know)
	leaseID   string // the Vault lease of the credential attached (creds.Attachment), for a receipt

	holdID string    // the hold this call made or names (calltrace.go)
	trace  callTrace // the call's root and running stage spans (calltrace.go)
}

// decide sets the call's decision and its recorded form.
func (c *toolCall) decide(d policy.Decision) {
	c.decision, c.rec.Decided = d, true
	c.rec.Decision = call.Decision{Action: d.Action.String(), Rule: d.Rule, Reason: d.Reason, Revision: d.Revision}
}

// Call runs one tool call through the pipeline, whatever door it came
// through: limit → resolve → validate → decide → grant/hold → credential →
// send → scrub → audit. Every stage passes the call on or ends it with a
// refusal; every outcome is audited before anything is sent and before the
// answer leaves, and written as one canonical tool_call line. An approved
// hold is executed by this same function (executeHold).
func (s *Server) Call(ctx context.Context, r call.Request) call.Outcome {
	o, _ := s.run(ctx, r, nil)
	return o
}

// run is Call, and with held the execution of an approved hold: then the
// identity, tool and request are the hold's, nothing is limited, held or
// granted again, and a refusal is the call's result record.
func (s *Server) run(ctx context.Context, r call.Request, held *holds.Hold) (call.Outcome, *toolCall) {
	c := &toolCall{req: r, held: held, event: call.EventDecision}
	c.rec.RequestID, c.rec.Start, c.rec.Kind, c.rec.Transport, c.rec.Tool = r.RequestID, time.Now(), call.KindToolCall, r.Transport, r.Tool
	if c.rec.RequestID == "" {
		c.rec.RequestID = refusal.NewRequestID()
	}
	if held != nil {
		// Not from a door: from an approval. Its record names no transport.
		c.event, c.rec.Transport, c.rec.Tool = call.EventResult, "", held.Tool
		c.req.Identity = wire.Identity{Sandbox: held.Caller.Sandbox, Agent: held.Caller.Agent, Session: held.Caller.Session, User: held.Caller.User, Egress: held.Caller.Egress}
	} else if c.rec.Transport == "" {
		c.rec.Transport = call.HTTP
	}
	ctx = s.tel.startCall(ctx, c)

	o, e := s.pipeline(ctx, c)
	if e != nil {
		c.rec.Status = e.Status
		if err := s.record(ctx, c, c.event, e); err != nil {
			e = err
			c.rec.Status = e.Status
		}
		o = call.Outcome{Status: e.Status, Refusal: e}
	} else {
		c.rec.Status = o.Status
	}
	s.tel.endCall(c, e)
	s.logCall(c, e)
	o.RequestID = c.rec.RequestID
	if c.rec.Decided {
		o.Decision, o.Rule = c.rec.Decision.Action, c.rec.Decision.Rule
	}
	return o, c
}

// pipeline is the call's stages, top to bottom. A refusal it returns is
// the call's own (run audits and logs it); an outcome carries the answer.
func (s *Server) pipeline(ctx context.Context, c *toolCall) (call.Outcome, *refusal.Error) {
	// Identity: checked and canonical here, whatever the door did
	// (THREATS E8): hold ownership, grants and ended sessions compare the
	// canonical forms.
	id, e := canonicalCaller(c.req.Identity)
	c.rec.Sandbox, c.rec.Agent, c.rec.Session, c.rec.User, c.rec.Egress = id.Sandbox, id.Agent, id.Session, id.User, id.Egress
	if c.held == nil && ingress.HostedFrom(ctx) { // the connection's, never the request's
		c.rec.Listener = call.ListenerHosted
	}
	if e != nil {
		return call.Outcome{}, e
	}

	// An ended session is refused here; when its state cannot be read,
	// nothing is sent (below) and an ask's hold re-checks at execution. A
	// hold created while its session was being ended is never sent.
	sessErr := sessions.Refusal(ctx, s.store, id.Session)
	if sessErr != nil && (sessErr.Code == refusal.SessionEnded || c.held != nil) {
		return call.Outcome{}, sessErr
	}

	// Limit: the agent's rate limit, per sandbox, before any work for the
	// call (one bucket across replicas on a shared store). An approved
	// hold was limited when it was made.
	agent := s.cfg.Agent(id.Agent)
	s.tel.stage(c, stageLimit)
	if c.held == nil {
		if agent != nil && agent.RateLimit != nil && !limits.SharedOn(s.store) {
			if ok, wait := s.limits.Allow(c.caller(), agent.RateLimit, time.Now()); !ok {
				e := refusal.New(http.StatusTooManyRequests, refusal.RateLimited, fmt.Sprintf("agent %q may make %g tool calls per second per sandbox (burst %d); retry later", id.Agent, agent.RateLimit.PerSecond, agent.RateLimit.Burst))
				e.RetryAfter = wait
				return call.Outcome{}, e
			}
		}
		if e := s.sharedLimits.Take(ctx, s.store, c.caller(), agent); e != nil {
			return call.Outcome{}, e
		}
	}

	// Resolve: the tool, and the agent's grant of its connector.
	s.tel.stage(c, stageResolve)
	tool, ok := s.catalog.Tool(c.rec.Tool)
	if !ok {
		msg := fmt.Sprintf("no tool is named %q", c.rec.Tool)
		if c.held != nil {
			msg += " any more"
		}
		return call.Outcome{}, refusal.New(http.StatusNotFound, refusal.UnknownTool, msg)
	}
	c.rec.Tool = tool.Name // a call by alias is decided, held and audited under the tool's name
	c.connector = tool.Connector
	if agent == nil || !slices.Contains(agent.Connectors, tool.Connector) {
		return call.Outcome{}, refusal.New(http.StatusForbidden, refusal.NotGranted, fmt.Sprintf("agent %q is not granted connector %q", id.Agent, tool.Connector))
	}
	up := s.catalog.Upstream(tool.Connector)

	// Validate: the arguments, before any policy runs, and the request
	// they make (an approved hold's is the stored one, exactly).
	s.tel.stage(c, stageValidate)
	args, req, e := s.validate(ctx, c, tool, up)
	if e != nil {
		return call.Outcome{}, e
	}
	c.rec.DestHost = req.URL.Hostname()

	// Decide.
	dctx := s.tel.stage(c, stageDecide)
	in := toolinput.Input(id.Sandbox, id.Agent, id.Session, id.User, tool, args, req, time.Now().UTC())
	in.Envoy = c.req.Envoy
	uc := usage.Call{Tool: tool.Name, Agent: c.rec.Agent, User: c.rec.User, Session: c.rec.Session, New: c.held == nil, Args: args}
	hash := func() (string, error) { hr, err := c.holdRequest(req); return hr.Hash(), err }
	if e := usage.Input(dctx, s.store, s.cfg.Usage, uc, hash, in); e != nil { // input.usage
		return call.Outcome{}, e
	}
	c.decide(s.Decide(dctx, in))
	c.recordInput(s.cfg.Audit, in) // recordinput.go: the decision record carries its input
	if s.tel.tracing {
		trace.SpanFromContext(dctx).SetAttributes(attrDecision.String(c.rec.Decision.Action), attrRule.String(s.tel.RuleLabel(c.decision.Rule)))
	}
	if c.held == nil { // an approved hold's ask was counted when it was held
		s.tel.Decisions.Add(ctx, 1, s.tel.DecisionAttrs(c.rec.Decision.Action, s.tel.RuleLabel(c.decision.Rule)))
		s.usage.Count(id.Agent, tool.Name, c.rec.Decision.Action)
	}

	// Grant or hold.
	s.tel.stage(c, stageGrant)
	switch {
	case c.decision.Action == policy.Block:
		msg := "blocked by policy"
		if c.held != nil {
			msg += " (evaluated again at approval)"
		}
		if c.decision.Reason != "" {
			msg += ": " + c.decision.Reason
		}
		return call.Outcome{}, refusal.New(http.StatusForbidden, refusal.PolicyBlock, msg)
	case c.held != nil:
		// Allow, or ask again: a person approved exactly this request.
		// An idempotency-keyed operation is sent with the key: the
		// agent's own value when the approved request has one, else the
		// hold's ID. The ID is stable and stored, so a re-send after a
		// crash carries the same key and the upstream answers it with its
		// first reply instead of acting twice. It is added after the
		// decision, which saw the request exactly as it was approved.
		if hk := c.held.IdempotencyHeader; hk != "" && req.Header.Get(hk) == "" {
			req.Header.Set(hk, c.held.ID)
		}
	case c.decision.Action == policy.Ask:
		// An "always allow" grant for exactly this call turns ask into
		// allow (gateway/grants); otherwise the call is held.
		g := grants.Call{RequestID: c.rec.RequestID, Caller: c.caller(), Tool: tool.Name, HoldID: c.req.HoldID, Decision: c.decision,
			Request: func() (holds.Request, error) { return c.holdRequest(req) }}
		d, granted, e := grants.Use(ctx, s.holds, s.audit.record, g)
		if e != nil {
			return call.Outcome{}, e
		}
		if granted {
			c.decide(d)
		}
		if !granted && c.req.Mode == call.Decide {
			// A call the gateway only decides cannot be sent at approval:
			// the approval lets the same request through once (holdcall.go).
			if granted, e = s.releaseHold(ctx, c, tool, req); e != nil {
				return call.Outcome{}, e
			}
		}
		if !granted {
			o, e := s.holdCall(ctx, c, tool, args, req)
			if e != nil || c.req.Mode != call.Decide || o.Hold == nil || o.Hold.State != string(holds.Approved) {
				return o, e
			}
			// Approved while this check waited: released like a retry.
			if granted, e = s.releaseHold(ctx, c, tool, req); e != nil || !granted {
				return o, e
			}
		}
		fallthrough
	default: // allow
		if sessErr != nil {
			return call.Outcome{}, sessErr
		}
	}

	// A person's OAuth connection missing, with on_missing: hold: held
	// until they connect (holdcall.go).
	if o, e, held := s.holdForConnection(ctx, c, tool, up, args, req); held {
		return o, e
	}

	// Credential, attached here where the caller never sees it.
	var before http.Header
	var query string
	if c.req.Mode == call.Decide {
		before, query = req.Header.Clone(), req.URL.RawQuery
	}
	scr, e := s.credential(s.tel.stage(c, stageCredential), c, tool, up, req)
	if e != nil {
		return call.Outcome{}, e
	}
	if c.req.Mode == call.Decide {
		return s.handOver(ctx, c, req, before, query)
	}

	// Send, scrub, audit.
	reply, e := s.send(ctx, c, up, req, scr)
	if e != nil {
		return call.Outcome{}, e
	}
	return call.Outcome{Status: http.StatusOK, Reply: reply}, nil
}

// canonicalCaller checks a call's identity (wire's rules: a sandbox and
// an agent, no control characters) and puts its user and session in
// canonical form (package ident). An identity that fails either is
// refused: it is a door's bug or an ambiguous name, never guessed at.
func canonicalCaller(id wire.Identity) (wire.Identity, *refusal.Error) {
	if err := id.Validate(); err != nil {
		// A door's bug, or a name no relay would have passed: wire's
		// message names the field, never more than the caller sent.
		return id, refusal.New(http.StatusForbidden, refusal.IdentityRequired, "the call carries no valid identity: "+strings.TrimPrefix(err.Error(), "wire: "))
	}
	for _, f := range []struct {
		name  string
		v     *string
		canon func(string) (string, error)
	}{{"user", &id.User, ident.Person}, {"session", &id.Session, ident.Canonical}} {
		if *f.v == "" {
			continue
		}
		c, err := f.canon(*f.v)
		if err != nil {
			return id, refusal.New(http.StatusForbidden, refusal.IdentityRequired, fmt.Sprintf("the identity's %s is ambiguous: %v", f.name, err))
		}
		*f.v = c
	}
	return id, nil
}

// validate decodes and checks the call's arguments and builds the request
// they make, with headers only the gateway may set removed. An approved
// hold's request is rebuilt exactly as stored; a door's formed request
// (Request.HTTP) must be the tool's operation on its connector.
func (s *Server) validate(ctx context.Context, c *toolCall, tool *connectors.Tool, up *catalog.Upstream) (*connectors.Args, *http.Request, *refusal.Error) {
	if c.held != nil {
		return storedRequest(ctx, c.held)
	}
	body := []byte(c.req.Args)
	if c.req.Body != nil {
		b, err := io.ReadAll(io.LimitReader(c.req.Body, connectors.MaxArgsBytes+1))
		if err != nil {
			return nil, nil, refusal.New(http.StatusBadRequest, refusal.SchemaViolation, "arguments could not be read")
		}
		body = b
	}
	if len(body) > connectors.MaxArgsBytes {
		return nil, nil, refusal.New(http.StatusBadRequest, refusal.SchemaViolation, fmt.Sprintf("arguments: larger than %d bytes", connectors.MaxArgsBytes))
	}
	formed := c.req.HTTP != nil
	if formed && c.req.Mode != call.Decide {
		return nil, nil, refusal.New(http.StatusInternalServerError, refusal.SchemaViolation, "bug: a formed request is decided only, never sent by the gateway")
	}
	var args *connectors.Args
	var err error
	var req *http.Request
	switch {
	case !formed && c.req.IdempotencyKey == "":
		// Exactly what `sluice policy eval --tool` prepares (gateway/toolinput).
		var a connectors.Args
		a, req, err = toolinput.Prepare(ctx, tool, up.Conn.BaseURL, body)
		args = &a
	case !formed || len(bytes.TrimSpace(body)) > 0:
		if len(bytes.TrimSpace(body)) == 0 {
			body = []byte("{}")
		}
		var a connectors.Args
		if a, err = connectors.DecodeArgs(body); err == nil {
			toolinput.StripHeaders(&a)
			toolinput.Idempotency(&a, tool, c.req.IdempotencyKey)
			err = tool.Validate(a)
		}
		args = &a
		switch {
		case err != nil:
		case formed:
			req, err = toolinput.Formed(ctx, c.req.HTTP, tool, up.Conn.BaseURL)
		default:
			req, err = tool.NewRequest(ctx, up.Conn.BaseURL, *args)
		}
	default: // a formed request without arguments
		req, err = toolinput.Formed(ctx, c.req.HTTP, tool, up.Conn.BaseURL)
	}
	if err != nil {
		var ae *connectors.ArgError
		if errors.As(err, &ae) {
			return nil, nil, refusal.New(http.StatusBadRequest, refusal.SchemaViolation, ae.Error())
		}
		return nil, nil, refusal.New(http.StatusBadRequest, refusal.SchemaViolation, "arguments: "+err.Error())
	}
	return args, req, nil
}

// send audits the decision, sends req upstream and audits the result.
func (s *Server) send(ctx context.Context, c *toolCall, up *catalog.Upstream, req *http.Request, scr *scrub.Scrubber) (*call.Reply, *refusal.Error) {
	// The decision is in the audit file before anything leaves the gateway
	// (it survives our crash); the result's fsync makes both durable before
	// the answer is released.
	c.presync = true
	if e := s.record(ctx, c, call.EventDecision, nil); e != nil {
		return nil, e
	}

	// Upstream, through the guard.
	uctx := s.tel.stage(c, stageSend)
	res, e := s.roundTrip(uctx, c, up, req, scr)
	if e != nil {
		c.rec.Status = e.Status
		if err := s.record(ctx, c, call.EventResult, e); err != nil {
			return nil, err
		}
		c.audited = true
		return nil, e
	}
	c.rec.Status = http.StatusOK
	if c.rec.Reflected {
		s.tel.Reflected.Add(ctx, 1)
		if e := s.record(ctx, c, call.EventSecretReflected, nil); e != nil {
			return nil, e
		}
	}
	if e := s.record(ctx, c, call.EventResult, nil); e != nil {
		return nil, e
	}
	return res, nil
}

// handOver ends a call the gateway only decides (call.Decide): the
// credential headers credential() put on req are handed to the sender,
// and the decision is made durable first (audit before send). A
// credential that goes anywhere but a header cannot be handed over as
// headers: the call is refused rather than sent without it.
func (s *Server) handOver(ctx context.Context, c *toolCall, req *http.Request, before http.Header, query string) (call.Outcome, *refusal.Error) {
	if req.URL.RawQuery != query {
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "this connector's credential goes in the query, and a decided-only call can be handed only headers")
	}
	attach, remove := http.Header{}, []string(nil)
	for k, vs := range req.Header {
		if !slices.Equal(before[k], vs) {
			attach[k] = slices.Clone(vs)
		}
	}
	for k := range before {
		if _, ok := req.Header[k]; !ok {
			remove = append(remove, k)
		}
	}
	slices.Sort(remove)
	c.rec.Status = http.StatusOK
	if e := s.record(ctx, c, call.EventDecision, nil); e != nil {
		return call.Outcome{}, e
	}
	c.audited = true
	return call.Outcome{Status: http.StatusOK, Attach: attach, Remove: remove}, nil
}

func (s *Server) roundTrip(ctx context.Context, c *toolCall, up *catalog.Upstream, req *http.Request, scr *scrub.Scrubber) (*call.Reply, *refusal.Error) {
	timeout := s.cfg.Gateway.UpstreamTimeout.Std()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ctx, cspan := s.tel.clientSpan(ctx, req, pathTemplate(s.catalog, c.rec.Tool))
	defer cspan.End()
	req = req.WithContext(httptraceDial(ctx, &c.rec))
	resp, err := up.Transport.RoundTrip(req)
	if err != nil {
		endClientSpan(cspan, 0, err)
		var de *guard.DeniedError
		if errors.As(err, &de) {
			if de.Addr.IsValid() {
				c.rec.SetResolvedIP(de.Addr.String())
			}
			return nil, refusal.New(http.StatusForbidden, refusal.EgressDenied, fmt.Sprintf("destination %s is not allowed (%s)", de.Host, de.Class)).Wrap(err)
		}
		return nil, refusal.New(http.StatusBadGateway, refusal.UpstreamError, "the upstream could not be reached").Wrap(err)
	}
	defer resp.Body.Close()
	c.answered = true
	c.rec.UpstreamStatus = resp.StatusCode
	s.tel.UpstreamAnswered(c.connector, "tool_call", resp.StatusCode)
	if resp.StatusCode < 100 || resp.StatusCode > 599 {
		// Go's client takes any three digits; a status outside HTTP's
		// range is a broken or hostile upstream (THREATS F6).
		return nil, refusal.New(http.StatusBadGateway, refusal.UpstreamError, fmt.Sprintf("the upstream answered with an invalid status %d", resp.StatusCode))
	}
	limit := s.cfg.Gateway.MaxResponseBytes
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	endClientSpan(cspan, resp.StatusCode, err)
	if err != nil {
		return nil, refusal.New(http.StatusBadGateway, refusal.UpstreamError, "the upstream reply could not be read").Wrap(err)
	}
	if int64(len(raw)) > limit {
		return nil, refusal.New(http.StatusBadGateway, refusal.UpstreamError, fmt.Sprintf("the upstream reply is larger than %d bytes", limit))
	}
	s.tel.stage(c, stageScrub)
	if scr != nil {
		// The one check both tool calls and intercepted requests pass
		// (THREATS D11): codings undone or refused, opaque bodies refused,
		// headers and body scrubbed, Content-Length the scrubbed body's.
		var err error
		if raw, c.rec.Reflected, err = scr.Reply(resp.Header, raw, limit); err != nil {
			c.rec.UpstreamErr = catalog.ReplyReason(err)
			return nil, refusal.New(http.StatusBadGateway, refusal.UpstreamError, err.Error()).Wrap(err)
		}
	}
	res := &call.Reply{Status: resp.StatusCode, Headers: catalog.ResponseHeaders(resp.Header)}
	switch {
	case len(raw) == 0:
		res.Body = nil
	case catalog.IsJSON(resp.Header.Get("Content-Type")) && json.Valid(raw):
		res.Body = json.RawMessage(raw)
	case utf8.Valid(raw):
		res.Body = string(raw)
	default:
		res.Body, res.BodyEncoding = base64.StdEncoding.EncodeToString(raw), "base64"
	}
	return res, nil
}

// record appends the call's audit record for event. It returns the
// refusal to answer with instead when the record cannot be made durable:
// audit failure closes.
func (s *Server) record(ctx context.Context, c *toolCall, event string, refused *refusal.Error) *refusal.Error {
	if c.audited {
		return nil // the refusal was recorded as the call's result
	}
	var code refusal.Code
	if refused != nil {
		code = refused.Code
	}
	sorted := call.AppendFields(make([]audit.Field, 0, 20), &c.rec, event, code)
	actx, span := s.tel.span(ctx, "sluice.audit")
	defer span.End()
	written := c.presync
	c.presync = false
	if _, err := s.audit.append(actx, audit.Record{RequestID: c.rec.RequestID, Event: event, Sorted: sorted}, written); err != nil {
		// The call's one tool_call line (logCall) names the cause.
		s.tel.Audits.Add(ctx, 1)
		return refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; no call is served until it can").Wrap(err)
	}
	return nil
}

// logCall writes the one canonical decision line of a call.
func (s *Server) logCall(c *toolCall, refused *refusal.Error) {
	reason := c.rec.Reason(refused)
	s.tel.ObserveLatency(c.rec.Decision.Action, time.Since(c.rec.Start).Seconds())
	if refused != nil && refused.Code == refusal.AuditUnavailable && !s.repeats.Allow(call.LineToolCall, reason) {
		return // the same refusal was logged in this interval: counted (gateway/logcap)
	}
	msg, level, attrs := c.rec.Line(refused, reason)
	s.log.LogAttrs(context.Background(), level, msg, attrs...)
}

// credential attaches the connector's credential to req, where the caller
// never sees it, and returns the scrubber for the reply.
func (s *Server) credential(ctx context.Context, c *toolCall, tool *connectors.Tool, up *catalog.Upstream, req *http.Request) (*scrub.Scrubber, *refusal.Error) {
	cc := up.Config.Credential
	if cc == nil {
		return nil, nil
	}
	att, e := s.attacher.Attach(ctx, creds.Call{Tool: tool, Caller: c.caller(), Cred: cc, Plan: up.Creds}, req)
	if e != nil {
		return nil, e
	}
	c.rec.Credential, c.leaseID = att.Where, att.LeaseID
	scr := up.Scrubber(att.Forms)
	if scr.Ignored() > 0 {
		// Too short to find in a reply without mangling it: refuse
		// rather than risk reflecting it unscrubbed.
		return nil, refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the credential for this connector is too short to be protected; store a longer one")
	}
	// The reply must be readable to be scrubbed: ask for it uncoded (an
	// absent Accept-Encoding means any coding, RFC 9110 12.5.3), and
	// whole: a range could hold part of the secret.
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Del("Range")
	req.Header.Del("If-Range")
	return scr, nil
}

// caller is the call's canonical identity as policy sees it.
func (c *toolCall) caller() policy.Caller {
	return policy.Caller{Sandbox: c.rec.Sandbox, Agent: c.rec.Agent, Session: c.rec.Session, User: c.rec.User, Egress: c.rec.Egress}
}
