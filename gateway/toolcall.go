package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/scrub"
	"github.com/sluice-gw/sluice/policy"
)

// sandboxHandler serves the sandbox side. Nothing else is routed here: the
// admin API and the review UI live only on the admin listener.
func (s *Server) sandboxHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/tools", s.handleListTools)
	mux.HandleFunc("POST /v1/tools/{tool}", s.handleToolCall)
	mux.HandleFunc("GET /v1/holds/{id}", s.handlePollHold)
	mux.Handle("/mcp", s.newMCPDoor()) // mcp_door.go: the same listing and pipeline over MCP
	eg := s.newRawEgress()             // proxy.go, dnsanswer.go
	mux.HandleFunc("POST /v1/dns", eg.serveDNS)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, refuse(http.StatusNotFound, CodeNotFound, "no such endpoint on the sandbox socket"), newRequestID())
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect || r.URL.IsAbs() {
			eg.serveProxy(w, r) // raw egress: forward proxy and CONNECT
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// toolView is a tool as an agent sees it in GET /v1/tools.
type toolView struct {
	Name        string          `json:"name"`
	Alias       string          `json:"alias"` // function-safe: ^[a-zA-Z0-9_-]{1,64}$; a call may use it
	Description string          `json:"description,omitempty"`
	Method      string          `json:"method"`
	Path        string          `json:"path"`
	Risk        string          `json:"risk"`
	Schema      json.RawMessage `json:"schema"`
}

// handleListTools lists what the caller is granted and not blocked from
// (grantedTools, mcp_door.go).
func (s *Server) handleListTools(w http.ResponseWriter, r *http.Request) {
	rid := newRequestID()
	id, ok := identityFrom(r.Context())
	if !ok {
		writeError(w, refuse(http.StatusForbidden, CodeIdentityRequired, "no identity"), rid)
		return
	}
	tools, aerr := s.grantedTools(r.Context(), id)
	if aerr != nil {
		writeError(w, aerr, rid)
		return
	}
	views := []toolView{}
	for _, t := range tools {
		desc := t.Summary
		if desc == "" {
			desc = t.Description
		}
		views = append(views, toolView{Name: t.Name, Alias: t.Alias, Description: desc, Method: t.Method, Path: t.PathTemplate, Risk: t.Risk.String(), Schema: t.Schema})
	}
	writeJSON(w, http.StatusOK, map[string]any{"tools": views, "request_id": rid})
}

// call is one tool call's state as it moves through the pipeline; it is
// also what the canonical decision line and the audit record are made of.
type call struct {
	rid      string
	start    time.Time
	caller   policy.Caller
	tool     string
	decision policy.Decision
	decided  bool
	destHost string
	destIP   atomicString // written by dial callbacks that may outlive the request
	status   int          // the gateway's answer to the agent
	// upstreamStatus is the status the upstream answered (0: none); a
	// relayed 401 is the gateway's 200 carrying the upstream's 401.
	upstreamStatus int
	connector      string
	cred           string // where the credential went, never its value
	reflect        bool
	// upstreamErr says why the upstream's reply was not relayed
	// (encoded_reply, opaque_reply …), as in raw egress's records.
	upstreamErr string
	audited     bool       // the outcome is already in the audit log
	presync     bool       // the next record need only reach the file; a later one syncs
	held        *heldReply // the call was held: this is the answer
	answered    bool       // the upstream answered over HTTP (a hold's re-send after a crash needs to know)
}

// handleToolCall runs the pipeline. Each stage either passes the call on or
// returns a refusal; every outcome is audited before the answer leaves.
func (s *Server) handleToolCall(w http.ResponseWriter, r *http.Request) {
	c := &call{rid: newRequestID(), start: time.Now()}
	ctx, span := s.tel.tracer.Start(r.Context(), "sluice.tool_call", trace.WithAttributes(attribute.String("request_id", c.rid)))
	defer span.End()
	res, aerr := s.runCall(ctx, c, r)
	if aerr == nil && c.held != nil {
		c.status = c.held.status
		writeRaw(w, c.held.status, c.held.body)
		s.logCall(c, nil)
		return
	}
	if aerr != nil {
		c.status = aerr.Status
		if err := s.record(ctx, c, "decision", aerr); err != nil {
			aerr = err
			c.status = aerr.Status
		}
		s.logCall(c, aerr)
		writeError(w, aerr, c.rid)
		return
	}
	res.RequestID = c.rid
	writeJSON(w, http.StatusOK, res)
	s.logCall(c, nil)
}

// result is the 200 answer: the upstream's reply, scrubbed.
type result struct {
	Status       int                 `json:"status"`
	Headers      map[string][]string `json:"headers"`
	Body         any                 `json:"body"`
	BodyEncoding string              `json:"body_encoding,omitempty"` // "base64" when the body is not text
	RequestID    string              `json:"request_id"`
}

func (s *Server) runCall(ctx context.Context, c *call, r *http.Request) (*result, *apiError) {
	id, ok := identityFrom(ctx)
	if !ok {
		return nil, refuse(http.StatusForbidden, CodeIdentityRequired, "bug: connection has no identity")
	}
	c.caller = policy.Caller{Sandbox: id.Sandbox, Agent: id.Agent, Session: id.Session, User: id.User}
	c.tool = r.PathValue("tool")
	// An ended session is refused here; when its state cannot be read,
	// nothing is sent (below) and an ask's hold re-checks at execution.
	sessErr := s.sessionRefusal(ctx, id.Session)
	if sessErr != nil && sessErr.Code == CodeSessionEnded {
		return nil, sessErr
	}

	// The agent's rate limit, per sandbox, before any work for the call.
	agent := s.cfg.Agent(id.Agent)
	if agent != nil && agent.RateLimit != nil {
		if ok, wait := s.limits.allow(c.caller, agent.RateLimit, time.Now()); !ok {
			e := refuse(http.StatusTooManyRequests, CodeRateLimited, fmt.Sprintf("agent %q may make %g tool calls per second per sandbox (burst %d); retry later", id.Agent, agent.RateLimit.PerSecond, agent.RateLimit.Burst))
			e.retryAfter = wait
			return nil, e
		}
	}

	// Tool and grant.
	tool, ok := s.catalog.Tool(c.tool)
	if !ok {
		return nil, refuse(http.StatusNotFound, CodeUnknownTool, fmt.Sprintf("no tool is named %q", c.tool))
	}
	c.tool = tool.Name // a call by alias is decided, held and audited under the tool's name
	c.connector = tool.Connector
	if agent == nil || !slices.Contains(agent.Connectors, tool.Connector) {
		return nil, refuse(http.StatusForbidden, CodeNotGranted, fmt.Sprintf("agent %q is not granted connector %q", id.Agent, tool.Connector))
	}
	up := s.catalog.connectors[tool.Connector]

	// Arguments, validated before any policy runs.
	_, vspan := s.tel.tracer.Start(ctx, "sluice.validate")
	body, err := io.ReadAll(io.LimitReader(r.Body, connectors.MaxArgsBytes+1))
	if err != nil {
		vspan.End()
		return nil, refuse(http.StatusBadRequest, CodeSchemaViolation, "arguments could not be read")
	}
	if len(body) > connectors.MaxArgsBytes {
		vspan.End()
		return nil, refuse(http.StatusBadRequest, CodeSchemaViolation, fmt.Sprintf("arguments: larger than %d bytes", connectors.MaxArgsBytes))
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	args, err := connectors.DecodeArgs(body)
	if err == nil {
		stripHeaderArgs(&args)
		err = tool.Validate(args)
	}
	var req *http.Request
	if err == nil {
		req, err = tool.NewRequest(ctx, up.conn.BaseURL, args)
	}
	vspan.End()
	if err != nil {
		var ae *connectors.ArgError
		if errors.As(err, &ae) {
			return nil, refuse(http.StatusBadRequest, CodeSchemaViolation, ae.Error())
		}
		return nil, refuse(http.StatusBadRequest, CodeSchemaViolation, "arguments: "+err.Error())
	}
	c.destHost = req.URL.Hostname()

	// Decision.
	dctx, dspan := s.tel.tracer.Start(ctx, "sluice.decide")
	in := s.input(id.Sandbox, id.Agent, id.Session, id.User, tool, &args, req, time.Now().UTC())
	c.decision, c.decided = s.Decide(dctx, in), true
	dspan.SetAttributes(attribute.String("decision", c.decision.Action.String()), attribute.String("rule", s.tel.ruleLabel(c.decision.Rule)))
	dspan.End()
	s.tel.decisions.Add(ctx, 1, metric.WithAttributes(attribute.String("action", c.decision.Action.String()), attribute.String("rule", s.tel.ruleLabel(c.decision.Rule))))
	s.count(id.Agent, tool.Name, c.decision.Action.String())
	switch c.decision.Action {
	case policy.Allow:
		if sessErr != nil {
			return nil, sessErr
		}
	case policy.Ask:
		// An "always allow" grant for exactly this call turns ask into allow (gateway/grants.go).
		granted, aerr := s.useGrant(ctx, c, r, tool, req)
		if aerr != nil {
			return nil, aerr
		}
		if !granted {
			return nil, s.holdCall(ctx, c, r, tool, args, req)
		}
		if sessErr != nil {
			return nil, sessErr
		}
	default:
		msg := "blocked by policy"
		if c.decision.Reason != "" {
			msg += ": " + c.decision.Reason
		}
		return nil, refuse(http.StatusForbidden, CodePolicyBlock, msg)
	}

	scr, aerr := s.credential(ctx, c, tool, up, req)
	if aerr != nil {
		return nil, aerr
	}
	return s.send(ctx, c, up, req, scr)
}

// credential attaches the connector's credential to req, where the caller
// never sees it, and returns the scrubber for the reply.
func (s *Server) credential(ctx context.Context, c *call, tool *connectors.Tool, up *upstream, req *http.Request) (*scrub.Scrubber, *apiError) {
	var scr *scrub.Scrubber
	if cc := up.cfg.Credential; cc != nil {
		ref := CredentialRef{Connector: tool.Connector, Secret: cc.Secret, Vault: cc.Vault, Caller: c.caller, Tool: tool.Name}
		if cc.Vault != nil && cc.Vault.TransitKey != "" {
			h, err := RequestHash(req)
			if err != nil {
				e := refuse(http.StatusServiceUnavailable, CodeCredentialUnavailable, "the request cannot be hashed for its per-call token")
				e.cause = err
				return nil, e
			}
			ref.RequestSHA256 = h
		}
		cctx, cspan := s.tel.tracer.Start(ctx, "sluice.credential")
		secret, err := s.creds.Credential(cctx, ref)
		cspan.End()
		if err != nil {
			e := refuse(http.StatusServiceUnavailable, CodeCredentialUnavailable, "the credential for this connector is unavailable")
			e.cause = err
			return nil, e
		}
		att, err := attach(req, up.creds, tool, secret)
		if err != nil {
			e := refuse(http.StatusServiceUnavailable, CodeCredentialUnavailable, "the credential cannot be attached to this operation")
			e.cause = err
			return nil, e
		}
		c.cred = att.where
		scr = up.scrubber(att.forms)
		if scr.Ignored() > 0 {
			// Too short to find in a reply without mangling it: refuse
			// rather than risk reflecting it unscrubbed.
			return nil, refuse(http.StatusServiceUnavailable, CodeCredentialUnavailable, "the credential for this connector is too short to be protected; store a longer one")
		}
		// The reply must be readable to be scrubbed: ask for it
		// uncoded (an absent Accept-Encoding means any coding, RFC 9110
		// 12.5.3), and whole: a range could hold part of the secret.
		req.Header.Set("Accept-Encoding", "identity")
		req.Header.Del("Range")
		req.Header.Del("If-Range")
	}
	return scr, nil
}

// scrubCache is an upstream's scrubber for one credential. Preparing a
// scrubber (every encoding of the secret) costs more per call than
// scrubbing a small reply, and a connector's credential rarely changes.
type scrubCache struct {
	forms [][]byte // what the scrubber was made from
	scr   *scrub.Scrubber
}

// scrubber returns the scrubber for forms, made once per credential: a
// changed credential (rotated, per-call, per-session) makes a new one.
func (u *upstream) scrubber(forms [][]byte) *scrub.Scrubber {
	if c := u.scrub.Load(); c != nil && sameForms(c.forms, forms) {
		return c.scr
	}
	scr := scrub.New(forms...)
	kept := make([][]byte, len(forms))
	for i, f := range forms {
		kept[i] = bytes.Clone(f)
	}
	u.scrub.Store(&scrubCache{forms: kept, scr: scr})
	return scr
}

// sameForms compares in constant time for equal lengths: the forms are
// secrets.
func sameForms(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	same := 1
	for i := range a {
		same &= subtle.ConstantTimeCompare(a[i], b[i])
	}
	return same == 1
}

// send audits the decision, sends req upstream and audits the result.
func (s *Server) send(ctx context.Context, c *call, up *upstream, req *http.Request, scr *scrub.Scrubber) (*result, *apiError) {

	// The decision is in the audit file before anything leaves the gateway
	// (it survives our crash); the result's fsync makes both durable before
	// the answer is released.
	c.presync = true
	if aerr := s.record(ctx, c, "decision", nil); aerr != nil {
		return nil, aerr
	}

	// Upstream, through the guard.
	uctx, uspan := s.tel.tracer.Start(ctx, "sluice.upstream")
	defer uspan.End()
	res, aerr := s.roundTrip(uctx, c, up, req, scr)
	if aerr != nil {
		c.status = aerr.Status
		if err := s.record(ctx, c, "result", aerr); err != nil {
			return nil, err
		}
		c.audited = true
		return nil, aerr
	}
	c.status = http.StatusOK
	if c.reflect {
		s.tel.reflected.Add(ctx, 1)
		if aerr := s.record(ctx, c, "secret_reflected", nil); aerr != nil {
			return nil, aerr
		}
	}
	if aerr := s.record(ctx, c, "result", nil); aerr != nil {
		return nil, aerr
	}
	return res, nil
}

// stripHeaderArgs removes headers that only the gateway may set: identity,
// client-address claims (isForwardingField, as on every egress path),
// hop-by-hop and framing headers, and content codings and ranges the
// scrubber could not see through.
func stripHeaderArgs(a *connectors.Args) {
	for k := range a.Headers {
		lk := strings.ToLower(k)
		switch {
		case strings.HasPrefix(lk, "x-sluice-"), strings.HasPrefix(lk, "sluice-"), strings.HasPrefix(lk, "proxy-"),
			isForwardingField(lk),
			lk == "host", lk == "connection", lk == "keep-alive", lk == "te", lk == "trailer",
			lk == "transfer-encoding", lk == "upgrade", lk == "content-length", lk == "accept-encoding",
			lk == "range", lk == "if-range":
			delete(a.Headers, k)
		}
	}
}

func (s *Server) roundTrip(ctx context.Context, c *call, up *upstream, req *http.Request, scr *scrub.Scrubber) (*result, *apiError) {
	timeout := s.cfg.Gateway.UpstreamTimeout.Std()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req = req.WithContext(httptraceDial(ctx, c))
	resp, err := up.transport.RoundTrip(req)
	if err != nil {
		var de *guard.DeniedError
		if errors.As(err, &de) {
			if de.Addr.IsValid() {
				c.destIP.Store(de.Addr.String())
			}
			e := refuse(http.StatusForbidden, CodeEgressDenied, fmt.Sprintf("destination %s is not allowed (%s)", de.Host, de.Class))
			e.cause = err
			return nil, e
		}
		e := refuse(http.StatusBadGateway, CodeUpstreamError, "the upstream could not be reached")
		e.cause = err
		return nil, e
	}
	defer resp.Body.Close()
	c.answered = true
	c.upstreamStatus = resp.StatusCode
	s.tel.upstreamAnswered(c.connector, "tool_call", resp.StatusCode)
	if resp.StatusCode < 100 || resp.StatusCode > 599 {
		// Go's client takes any three digits; a status outside HTTP's
		// range is a broken or hostile upstream (THREATS F6).
		return nil, refuse(http.StatusBadGateway, CodeUpstreamError, fmt.Sprintf("the upstream answered with an invalid status %d", resp.StatusCode))
	}
	limit := s.cfg.Gateway.MaxResponseBytes
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		e := refuse(http.StatusBadGateway, CodeUpstreamError, "the upstream reply could not be read")
		e.cause = err
		return nil, e
	}
	if int64(len(raw)) > limit {
		return nil, refuse(http.StatusBadGateway, CodeUpstreamError, fmt.Sprintf("the upstream reply is larger than %d bytes", limit))
	}
	if scr != nil {
		// The one check both tool calls and intercepted requests pass
		// (THREATS D11): codings undone or refused, opaque bodies refused,
		// headers and body scrubbed, Content-Length the scrubbed body's.
		var err error
		if raw, c.reflect, err = scr.Reply(resp.Header, raw, limit); err != nil {
			c.upstreamErr = replyReason(err)
			e := refuse(http.StatusBadGateway, CodeUpstreamError, err.Error())
			e.cause = err
			return nil, e
		}
	}
	hdr := responseHeaders(resp.Header)
	res := &result{Status: resp.StatusCode, Headers: hdr}
	switch {
	case len(raw) == 0:
		res.Body = nil
	case isJSON(resp.Header.Get("Content-Type")) && json.Valid(raw):
		res.Body = json.RawMessage(raw)
	case utf8.Valid(raw):
		res.Body = string(raw)
	default:
		res.Body, res.BodyEncoding = base64.StdEncoding.EncodeToString(raw), "base64"
	}
	return res, nil
}

// responseHeaders copies the end-to-end headers of an upstream reply.
func responseHeaders(h http.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, vs := range h {
		switch k {
		case "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
			continue
		}
		out[k] = slices.Clone(vs)
	}
	return out
}

// replyReason is the stable reason of a reply scrub.Reply refused.
func replyReason(err error) string {
	var re *scrub.ReplyError
	if errors.As(err, &re) {
		return re.Reason
	}
	return "unreadable_reply"
}

func isJSON(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.TrimSpace(strings.ToLower(ct))
	return ct == "application/json" || strings.HasSuffix(ct, "+json")
}

// input builds the policy input document (rego/README.md). The request part
// is taken before any credential is attached.
func (s *Server) input(sandbox, agent, session, user string, t *connectors.Tool, args *connectors.Args, req *http.Request, now time.Time) *policy.Input {
	in := &policy.Input{
		Version:   policy.InputVersion,
		Kind:      "tool_call",
		Caller:    policy.Caller{Sandbox: sandbox, Agent: agent, Session: session, User: user},
		Connector: t.Connector,
		Tool:      t.Name,
		Operation: policy.Operation{ID: t.OperationID, Method: t.Method, Path: t.PathTemplate, Risk: t.Risk.String(), Tags: t.Tags},
		Time:      now,
	}
	if args != nil {
		in.Args = map[string]any{"path": orEmpty(args.Path), "query": orEmpty(args.Query), "headers": orEmpty(args.Headers), "body": args.Body}
	}
	if req != nil {
		in.Request = policy.Request{Method: req.Method, Host: req.URL.Host, Path: req.URL.Path, Query: req.URL.Query(), Headers: req.Header.Clone()}
	}
	return in
}

func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// record appends the call's audit record. It returns the refusal to send
// instead when the record cannot be made durable: audit failure closes.
func (s *Server) record(ctx context.Context, c *call, event string, refusal *apiError) *apiError {
	if c.audited {
		return nil // the refusal was recorded as the call's result
	}
	f := map[string]any{
		"sandbox": c.caller.Sandbox, "agent": c.caller.Agent, "session": c.caller.Session, "user": c.caller.User,
		"tool": c.tool,
	}
	if c.decided {
		f["decision"], f["rule"], f["reason"] = c.decision.Action.String(), c.decision.Rule, c.decision.Reason
	}
	if c.destHost != "" {
		f["dest_host"] = c.destHost
	}
	if ip := c.destIP.Load(); ip != "" {
		f["resolved_ip"] = ip
	}
	if c.cred != "" {
		f["credential"] = c.cred
	}
	if c.status != 0 {
		f["status"] = c.status
	}
	if c.upstreamStatus != 0 {
		f["upstream_status"] = c.upstreamStatus
	}
	if refusal != nil {
		f["code"] = string(refusal.Code)
	}
	if c.upstreamErr != "" {
		f["upstream_error"] = c.upstreamErr
	}
	if event == "result" || event == "secret_reflected" {
		f["secret_reflected"] = c.reflect
		f["duration_ms"] = time.Since(c.start).Milliseconds()
	}
	actx, span := s.tel.tracer.Start(ctx, "sluice.audit")
	defer span.End()
	written := c.presync
	c.presync = false
	if _, err := s.appendAudit(actx, audit.Record{RequestID: c.rid, Event: event, Fields: f}, written); err != nil {
		// The call's one tool_call line (logCall) names the cause.
		s.tel.audits.Add(ctx, 1)
		e := refuse(http.StatusServiceUnavailable, CodeAuditUnavailable, "the audit log cannot be written; no call is served until it can")
		e.cause = err
		return e
	}
	return nil
}

// logCall writes the one canonical decision line of a call.
func (s *Server) logCall(c *call, refusal *apiError) {
	d := time.Since(c.start)
	decision, rule, reason := "", c.decision.Rule, c.decision.Reason
	if c.decided {
		decision = c.decision.Action.String()
	}
	level := slog.LevelInfo
	if refusal != nil {
		reason = string(refusal.Code)
		if refusal.cause != nil {
			reason += ": " + refusal.cause.Error()
		}
		if refusal.Status >= 500 {
			level = slog.LevelWarn
		}
	} else if c.reflect {
		reason = "secret_reflected"
	}
	s.tel.latency.WithLabelValues(decision).Observe(d.Seconds())
	if refusal != nil && refusal.Code == CodeAuditUnavailable && !s.repeats.allow("tool_call", reason) {
		return // the same refusal was logged in this interval: counted (logcap.go)
	}
	s.log.LogAttrs(context.Background(), level, "tool_call",
		slog.String("request_id", c.rid),
		slog.String("decision", decision),
		slog.String("reason", reason),
		slog.String("rule", rule),
		slog.String("agent", c.caller.Agent),
		slog.String("session", c.caller.Session),
		slog.String("user", c.caller.User),
		slog.String("sandbox", c.caller.Sandbox),
		slog.String("tool", c.tool),
		slog.String("dest_host", c.destHost),
		slog.String("resolved_ip", c.destIP.Load()),
		slog.Int("status", c.status),
		slog.Int("upstream_status", c.upstreamStatus),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000),
	)
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
