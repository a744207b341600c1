package gateway

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/catalog"
	"github.com/sluice-gw/sluice/gateway/extauthz"
	"github.com/sluice-gw/sluice/gateway/metrics"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/tracing"
)

// A tool call's trace: one root span per call (a child of the sandbox
// socket's HTTP server span when it came over HTTP), and one child span
// per pipeline stage, in order. What the sandbox sent as its trace
// context is a link on the root, never its parent (THREATS F13); no span
// carries an argument value, a header value or a secret, only names the
// gateway chose (THREATS F14). With tracing off nothing here allocates.

// telemetry is the gateway's metric instruments (gateway/metrics) and
// its tracer: spans go to Options.Tracing's provider (none: tracing is
// off and no span is made).
type telemetry struct {
	*metrics.Gateway
	tracer trace.Tracer
	// tracing: spans are exported (an SDK provider was given); off, the
	// pipeline starts none.
	tracing bool
}

// newTelemetry builds the instruments; tp is the provider spans go to,
// nil when tracing is off.
func newTelemetry(tp trace.TracerProvider) (*telemetry, error) {
	m, err := metrics.New()
	if err != nil {
		return nil, err
	}
	t := &telemetry{Gateway: m, tracer: noop.NewTracerProvider().Tracer("sluice/gateway")}
	if tp != nil {
		t.tracer, t.tracing = tp.Tracer("sluice/gateway"), true
	}
	return t, nil
}

// The stages of the pipeline, as span names.
const (
	stageLimit      = "sluice.limit"
	stageResolve    = "sluice.resolve"
	stageValidate   = "sluice.validate"
	stageDecide     = "sluice.decide"
	stageGrant      = "sluice.grant"
	stageHold       = "sluice.hold"
	stageCredential = "sluice.credential"
	stageSend       = "sluice.send"
	stageScrub      = "sluice.scrub"
)

// sluice's own span attributes.
const (
	attrTool      = attribute.Key("sluice.tool")
	attrDecision  = attribute.Key("sluice.decision")
	attrRule      = attribute.Key("sluice.rule")
	attrHoldID    = attribute.Key("sluice.hold_id")
	attrTransport = attribute.Key("sluice.transport")
	attrRequestID = attribute.Key("sluice.request_id")
	attrCode      = attribute.Key("sluice.code")
)

// noSpan is the span of a stage when tracing is off.
var noSpan trace.Span = noop.Span{}

// The start options every call span and every upstream client span
// share, built once (a call's own, links, only when it has some).
var (
	callSpanOpts   = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	clientSpanOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// callTrace is a call's open spans: its root's context and the stage now
// running.
type callTrace struct {
	root  context.Context
	span  trace.Span
	stage trace.Span
}

// startCall starts the call's root span and records its trace ID. The
// sandbox's traceparent is a link when the root has no parent in this
// process (the HTTP server span carries it otherwise) or when it came in
// an MCP request's _meta; an approved hold's execution links to the span
// that created the hold.
func (t *telemetry) startCall(ctx context.Context, c *toolCall) context.Context {
	if !t.tracing {
		c.trace = callTrace{root: ctx, span: noSpan, stage: noSpan}
		return ctx
	}
	var links []trace.Link
	// An MCP tools/call's traceparent is in its _meta, which the HTTP
	// server span above it never saw: linked here, like any other.
	if !trace.SpanContextFromContext(ctx).IsValid() || c.req.Transport == call.MCP {
		if l, ok := tracing.SandboxLink(c.req.TraceParent); ok {
			links = append(links, l)
		}
	}
	if c.held != nil {
		if l, ok := tracing.HoldLink(c.held.TraceParent); ok {
			links = append(links, l)
		}
	}
	// Its attributes are set once, in endCall (each SetAttributes on a
	// span that has some grows its slice).
	opts := callSpanOpts
	if len(links) > 0 {
		opts = []trace.SpanStartOption{callSpanOpts[0], trace.WithLinks(links...)}
	}
	ctx, span := t.tracer.Start(ctx, "sluice.tool_call", opts...)
	c.trace = callTrace{root: ctx, span: span, stage: noSpan}
	c.rec.TraceID = tracing.TraceID(ctx)
	return ctx
}

// stage ends the call's running stage span and starts the next, a child
// of the root; the context it returns is the new stage's, for the work
// done in it.
func (t *telemetry) stage(c *toolCall, name string) context.Context {
	c.trace.stage.End()
	if !t.tracing {
		return c.trace.root
	}
	ctx, span := t.tracer.Start(c.trace.root, name)
	c.trace.stage = span
	return ctx
}

// span starts a span that is not a stage (an audit write), a child of
// ctx's; none with tracing off.
func (t *telemetry) span(ctx context.Context, name string) (context.Context, trace.Span) {
	if !t.tracing {
		return ctx, noSpan
	}
	return t.tracer.Start(ctx, name)
}

// endCall ends the running stage and the root, with the outcome: the
// decision, its rule, the hold, the status and the refusal's code. Only
// names the gateway chose: the tool is named once it resolved (before, it
// is the caller's text), a refusal by its code (its message may quote an
// argument).
func (t *telemetry) endCall(c *toolCall, refused *refusal.Error) {
	c.trace.stage.End()
	c.trace.stage = noSpan
	if !t.tracing {
		return
	}
	span := c.trace.span
	attrs := make([]attribute.KeyValue, 0, 9)
	attrs = append(attrs, attrRequestID.String(c.rec.RequestID), attrTransport.String(string(c.rec.Transport)))
	if c.connector != "" {
		attrs = append(attrs, attrTool.String(c.rec.Tool))
	}
	if c.rec.Decided {
		attrs = append(attrs, attrDecision.String(c.rec.Decision.Action), attrRule.String(t.RuleLabel(c.decision.Rule)))
	}
	if c.holdID != "" {
		attrs = append(attrs, attrHoldID.String(c.holdID))
	}
	if c.held != nil {
		attrs = append(attrs, attrHoldID.String(c.held.ID))
	}
	attrs = append(attrs, attribute.Int("sluice.status", c.rec.Status))
	if refused != nil {
		attrs = append(attrs, attrCode.String(string(refused.Code)))
		span.SetStatus(codes.Error, string(refused.Code))
	}
	span.SetAttributes(attrs...)
	span.End()
}

// upstreamSpan is the HTTP client span of the request to the upstream
// and the attributes it gets when it ends: set once, with the status
// (each SetAttributes on a span that has some grows its slice).
type upstreamSpan struct {
	trace.Span
	attrs [5]attribute.KeyValue
	n     int
}

// clientSpan starts the HTTP client span of the request to the upstream
// (OTel HTTP client conventions: named by its method, the operation's
// path template as url.template, never the URL filled in with the
// arguments: template, the tool's PathTemplate) and puts its context on the request's headers in place of
// anything the sandbox set.
func (t *telemetry) clientSpan(ctx context.Context, req *http.Request, template string) (context.Context, upstreamSpan) {
	if !t.tracing {
		tracing.Inject(ctx, req.Header) // removes a sandbox's
		return ctx, upstreamSpan{Span: noSpan}
	}
	var u upstreamSpan
	u.attrs[0], u.attrs[1] = semconv.HTTPRequestMethodKey.String(req.Method), semconv.ServerAddressKey.String(req.URL.Hostname())
	u.n = 2
	if p := req.URL.Port(); p != "" {
		if n, err := strconv.Atoi(p); err == nil {
			u.attrs[u.n] = semconv.ServerPortKey.Int(n)
			u.n++
		}
	}
	if template != "" {
		u.attrs[u.n] = semconv.URLTemplateKey.String(template)
		u.n++
	}
	ctx, u.Span = t.tracer.Start(ctx, req.Method, clientSpanOpts...)
	tracing.Inject(ctx, req.Header)
	return ctx, u
}

// endClientSpan records the upstream's status (0: no answer) with the
// span's other attributes and ends the client span.
func endClientSpan(u upstreamSpan, status int, err error) {
	attrs := u.attrs[:u.n]
	if status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCodeKey.Int(status))
	}
	u.SetAttributes(attrs...)
	switch {
	case err != nil:
		u.SetStatus(codes.Error, "no answer")
	case status >= 500:
		u.SetStatus(codes.Error, "")
	}
	u.End()
}

// httpServer wraps the sandbox socket's handler in its request metric
// and server spans (tracing.Server).
func (t *telemetry) httpServer(next http.Handler) http.Handler {
	var tr trace.Tracer
	if t.tracing {
		tr = t.tracer
	}
	return tracing.Server(next, tr, t.ServerDuration, t.ServerAttrs)
}

// checkMethod is the ext_authz RPC, as OTel's RPC conventions name it.
const checkMethod = "envoy.service.auth.v3.Authorization/Check"

// checkSpan starts the server span of one ext_authz Check (OTel RPC
// conventions), a new root: the checked request's traceparent is a link
// (THREATS F13), as on the sandbox socket. The pipeline's call span is
// its child.
func (t *telemetry) checkSpan(ctx context.Context, r *extauthz.Request) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.RPCSystemNameKey.String("grpc"), semconv.RPCMethodKey.String(checkMethod))}
	if l, ok := tracing.SandboxLink(r.Headers.Get(tracing.HeaderTraceparent)); ok {
		opts = append(opts, trace.WithLinks(l))
	}
	return t.tracer.Start(ctx, checkMethod, opts...)
}

// endCheckSpan records the verdict: the HTTP status Envoy answers (or
// lets through, 200) and the refusal's code.
func endCheckSpan(span trace.Span, v extauthz.Verdict) {
	attrs := []attribute.KeyValue{attribute.Int("sluice.status", v.Status), attribute.Bool("sluice.allow", v.Allow)}
	if v.Code != "" {
		attrs = append(attrs, attrCode.String(v.Code))
	}
	if v.HoldID != "" {
		attrs = append(attrs, attrHoldID.String(v.HoldID))
	}
	span.SetAttributes(attrs...)
	span.End()
}

// tracedCheck wraps the ext_authz door's tool-call hook in its Check
// span; with tracing off it is the hook itself.
func (t *telemetry) tracedCheck(call func(context.Context, *extauthz.Request, extauthz.Match, time.Duration) extauthz.Verdict) func(context.Context, *extauthz.Request, extauthz.Match, time.Duration) extauthz.Verdict {
	if !t.tracing {
		return call
	}
	return func(ctx context.Context, r *extauthz.Request, m extauthz.Match, wait time.Duration) extauthz.Verdict {
		ctx, span := t.checkSpan(ctx, r)
		v := call(ctx, r, m, wait)
		endCheckSpan(span, v)
		return v
	}
}

// tracedEgressCheck is tracedCheck for the door's raw-egress hook.
func (t *telemetry) tracedEgressCheck(egress func(context.Context, *extauthz.Request, time.Duration) extauthz.Verdict) func(context.Context, *extauthz.Request, time.Duration) extauthz.Verdict {
	if !t.tracing {
		return egress
	}
	return func(ctx context.Context, r *extauthz.Request, wait time.Duration) extauthz.Verdict {
		ctx, span := t.checkSpan(ctx, r)
		v := egress(ctx, r, wait)
		endCheckSpan(span, v)
		return v
	}
}

// pathTemplate is tool's path template, "" when cat has no such tool.
func pathTemplate(cat *catalog.Catalog, tool string) string {
	if t, ok := cat.Tool(tool); ok {
		return t.PathTemplate
	}
	return ""
}
