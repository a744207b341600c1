package gateway

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/catalog"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/gateway/extauthz"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/tracing"
	"github.com/sluice-gw/sluice/policy"
)

// envoyDoor is the root's side of the Envoy door (gateway/extauthz): the
// hooks the door is given (its Deps) are the pipeline (call, in
// decide-only mode), the catalogue's request→tool matcher, and raw
// egress's decision, audited here. The door itself never decides.
type envoyDoor struct {
	cfg        *config.Config
	log        *slog.Logger
	tel        *telemetry                   // the Check spans, the audit failure counter
	connectors map[string]*catalog.Upstream // the catalogue's, by slug
	call       func(ctx context.Context, r call.Request) call.Outcome
	decide     func(ctx context.Context, in *policy.Input) policy.Decision
	session    func(ctx context.Context, session string) *refusal.Error // an ended session refuses
	append     func(ctx context.Context, rec audit.Record, written bool) (audit.Record, error)
}

// serve starts gateway.ext_authz's gRPC listener (Check, and ADS when xds
// is set) and returns the function that stops it, the listener's address
// and the ADS server (nil without xds); off, it returns a no-op.
func (d *envoyDoor) serve(ctx context.Context) (stop func(), addr string, x *extauthz.XDS, err error) {
	e := d.cfg.Gateway.ExtAuthz
	if e == nil {
		return func() {}, "", nil, nil
	}
	l, opts, err := extauthz.Listen(e, d.log)
	if err != nil {
		return nil, "", nil, fmt.Errorf("gateway.ext_authz: %w", err)
	}
	xctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if e.XDS != nil {
		x = extauthz.NewXDS(xctx, d.log)
		if err := x.Update(ctx, d.cfg); err != nil {
			cancel()
			l.Close()
			return nil, "", nil, fmt.Errorf("gateway.ext_authz.xds: %w", err)
		}
	}
	g := extauthz.NewGRPC(opts, extauthz.NewAuthz(d.deps()), x)
	addr = l.Addr().String()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := g.Serve(l); err != nil {
			d.log.Error("ext_authz: serve", "err", err)
		}
	}()
	d.log.Info("ext_authz serving", "listen", e.Listen, "xds", x != nil)
	return func() {
		cancel() // ends ADS streams, so GracefulStop does not wait on them
		t := time.AfterFunc(5*time.Second, g.Stop)
		g.GracefulStop()
		t.Stop()
		<-done
	}, addr, x, nil
}

// extAuthzProblems is what `sluice validate` finds in gateway.ext_authz
// beyond its syntax: certificates that do not load, an xDS snapshot that
// would not validate.
func extAuthzProblems(cfg *config.Config) []error {
	e := cfg.Gateway.ExtAuthz
	if e == nil {
		return nil
	}
	var errs []error
	if _, unix := e.UnixPath(); !unix {
		if _, err := extauthz.ServerTLS(e); err != nil {
			errs = append(errs, err)
		}
	}
	if e.XDS != nil {
		if _, err := extauthz.Resources(cfg); err != nil {
			errs = append(errs, fmt.Errorf("gateway.ext_authz.xds: %w", err))
		}
	}
	return errs
}

func (d *envoyDoor) deps() extauthz.Deps {
	e := d.cfg.Gateway.ExtAuthz
	return extauthz.Deps{
		Log:        d.log,
		Principals: e.Principals,
		HoldWait:   e.HoldWait.Std(),
		Match:      d.envoyRoutes(),                // extauthz_route.go
		Call:       d.tel.tracedCheck(d.envoyCall), // calltrace.go
		Egress:     d.tel.tracedEgressCheck(d.envoyEgress),
		Refused:    d.envoyRefused,
	}
}

// matchTool maps a request to a connector's tool: the host (and port,
// when the authority names one; port is 0 otherwise) of its base_url, and
// the operation its spec has for method and path, among the connectors
// slugs (those on host, envoyRoutes). Of two connectors on one host, the
// one with the longer base path that matches wins; a tie is ambiguous. A
// connector's host with no such operation is NoOperation, never raw
// egress.
func (d *envoyDoor) matchTool(slugs []string, host string, port int, method, path, query string) (extauthz.Match, extauthz.Found) {
	var best extauthz.Match
	bestLen, found := -1, extauthz.NoConnector
	for _, slug := range slugs {
		up := d.connectors[slug]
		b := up.Conn.BaseURL
		if b == nil || !strings.EqualFold(b.Hostname(), host) {
			continue
		}
		if port != 0 && port != basePort(b.Scheme, b.Port()) {
			continue
		}
		if found == extauthz.NoConnector {
			found = extauthz.NoOperation
		}
		tool, params, ok := up.Conn.Match(method, path, query)
		if !ok {
			continue
		}
		switch l := len(strings.TrimRight(b.EscapedPath(), "/")); {
		case l > bestLen:
			best, bestLen, found = extauthz.Match{Connector: slug, Tool: tool.Name, PathParams: params}, l, extauthz.Matched
		case l == bestLen:
			found = extauthz.Ambiguous
		}
	}
	return best, found
}

func basePort(scheme, port string) int {
	if n, err := strconv.Atoi(port); err == nil {
		return n
	}
	if scheme == "https" {
		return 443
	}
	return 80
}

// envoyCall decides a request that is a connector's tool through the one
// pipeline, in decide-only mode: the request is the one Envoy holds, on
// the connector's base URL, and an allow hands back the credential
// headers to attach.
func (d *envoyDoor) envoyCall(ctx context.Context, r *extauthz.Request, m extauthz.Match, wait time.Duration) extauthz.Verdict {
	if r.BodyTruncated {
		// Envoy would send a body the policy never saw: decide on what is
		// sent, or not at all.
		return d.envoyRefuse(ctx, r, refusal.New(http.StatusRequestEntityTooLarge, refusal.SchemaViolation,
			"the request body is larger than Envoy sends to the gateway (with_request_body.max_request_bytes); a tool call is decided on its whole body"))
	}
	up := d.connectors[m.Connector]
	u := up.Conn.BaseURL.Scheme + "://" + up.Conn.BaseURL.Host + r.Path
	if r.RawQuery != "" {
		u += "?" + r.RawQuery
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u, bytes.NewReader(r.Body))
	if err != nil {
		return d.envoyRefuse(ctx, r, refusal.New(http.StatusBadRequest, refusal.BadRequest, "the request cannot be rebuilt on the connector's base URL"))
	}
	if len(r.Body) == 0 {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	req.Header = r.Headers // the pipeline decides and attaches on its own copy (toolinput.Formed clones it)
	hw := wait
	if hw <= 0 {
		hw = -1 // no time left under Envoy's deadline: answer with the hold at once
	}
	o := d.call(ctx, call.Request{
		Identity: r.Identity, Tool: m.Tool, Transport: call.Envoy, Mode: call.Decide,
		HTTP: req, HoldWait: hw, Envoy: r.Envoy, TraceParent: r.Headers.Get("traceparent"),
	})
	return verdict(o)
}

// verdict is a pipeline outcome in the door's terms.
func verdict(o call.Outcome) extauthz.Verdict {
	v := extauthz.Verdict{RequestID: o.RequestID, Status: o.Status}
	switch {
	case o.Refusal != nil:
		v.Status, v.Code, v.Message, v.RetryAfter = o.Refusal.Status, string(o.Refusal.Code), o.Refusal.Message, o.Refusal.RetryAfter
		if v.Status == http.StatusTooManyRequests && v.RetryAfter <= 0 {
			v.RetryAfter = holdRetryAfter // too many pending holds: try again when some are decided
		}
		if o.Hold != nil {
			v.HoldID, v.HoldState = o.Hold.ID, o.Hold.State
			if o.Hold.RequestID != "" {
				v.RequestID = o.Hold.RequestID
			}
		}
	case o.Attach != nil:
		v.Allow = true
		v.Set = make([]extauthz.Header, 0, len(o.Attach))
		for k, vs := range o.Attach {
			v.Set = append(v.Set, extauthz.Header{Name: k, Value: strings.Join(vs, ", ")})
		}
		slices.SortFunc(v.Set, func(a, b extauthz.Header) int { return strings.Compare(a.Name, b.Name) })
		v.Remove = o.Remove
	case o.Hold != nil && o.Status == http.StatusAccepted:
		v.HoldID, v.HoldState = o.Hold.ID, o.Hold.State
		v.Message = "held for a person's approval; send the same request again once it is approved"
		v.RetryAfter = holdRetryAfter
		if left := time.Until(o.Hold.Expires); left > 0 && left < v.RetryAfter {
			v.RetryAfter = left
		}
	default:
		v.Status, v.Code, v.Message = http.StatusInternalServerError, extauthz.CodeBug, "bug: a decided-only call ended without a decision"
	}
	return v
}

// holdRetryAfter is the Retry-After of a pending hold's 202.
const holdRetryAfter = 5 * time.Second

// envoyEgress decides a request to a host that is no connector's as raw
// egress (kind http, or connect for CONNECT), as the forward proxy would:
// the session's state, then policy (the agents' egress allowlists and the
// modules), audited before the answer. Raw egress is never held.
func (d *envoyDoor) envoyEgress(ctx context.Context, r *extauthz.Request, _ time.Duration) extauthz.Verdict {
	rec := d.envoyRecord(ctx, r)
	id, e := canonicalCaller(r.Identity)
	rec.Sandbox, rec.Agent, rec.Session, rec.User, rec.Egress = id.Sandbox, id.Agent, id.Session, id.User, id.Egress
	if e == nil {
		e = d.session(ctx, id.Session) // unknown state refuses too: raw egress is never held to re-check
	}
	if e == nil && egress.NarrowedOut(egress.CallerOf(id), r.Host) { // egress/narrow.go: the sandbox's narrowing, before policy
		nd := egress.NarrowDecision
		rec.Decision, rec.Decided = call.Decision{Action: nd.Action.String(), Rule: nd.Rule, Reason: nd.Reason, Revision: nd.Revision}, true
		e = refusal.New(http.StatusForbidden, refusal.EgressDenied, fmt.Sprintf("%s is not on sandbox %q's egress list (narrowed by sandboxd --egress)", r.Host, id.Sandbox))
	}
	if e == nil {
		in := &policy.Input{
			Version: policy.InputVersion, Kind: string(rec.Kind),
			Caller:  egress.CallerOf(id),
			Request: policy.Request{Method: r.Method, Host: r.Host, Port: r.Port, Path: r.Path, Query: r.Query, Headers: r.Headers},
			Envoy:   r.Envoy, Time: time.Now().UTC(),
		}
		if rec.Kind == call.KindConnect {
			in.Request.Path, in.Request.Query, in.Request.Headers = "", nil, nil
		} else if len(r.Body) > 0 && !r.BodyTruncated && utf8.Valid(r.Body) {
			in.Request.Body = string(r.Body)
		}
		dec := d.decide(ctx, in)
		rec.Decision, rec.Decided = call.Decision{Action: dec.Action.String(), Rule: dec.Rule, Reason: dec.Reason, Revision: dec.Revision}, true
		switch dec.Action {
		case policy.Allow:
		case policy.Ask:
			e = refusal.New(http.StatusForbidden, refusal.EgressDenied, "raw egress cannot be held for approval; it was not sent")
		default:
			msg := fmt.Sprintf("%s is not on agent %q's egress allowlist", r.Host, id.Agent)
			if dec.Rule != "default" {
				msg = "blocked by policy"
				if dec.Reason != "" {
					msg += ": " + dec.Reason
				}
			}
			e = refusal.New(http.StatusForbidden, refusal.EgressDenied, msg)
		}
	}
	if e != nil {
		rec.Status = e.Status
	} else {
		rec.Status = http.StatusOK
	}
	if ae := d.auditRecord(ctx, rec, e); ae != nil {
		e, rec.Status = ae, ae.Status
	}
	d.logRecord(rec, e)
	if e != nil {
		return extauthz.Verdict{Status: e.Status, Code: string(e.Code), Message: e.Message, RetryAfter: e.RetryAfter, RequestID: rec.RequestID}
	}
	return extauthz.Verdict{Allow: true, RequestID: rec.RequestID}
}

// envoyRefused audits a request the door refused before the pipeline.
func (d *envoyDoor) envoyRefused(ctx context.Context, r *extauthz.Request, v extauthz.Verdict) string {
	e := refusal.New(v.Status, refusal.Code(v.Code), v.Message)
	rec := d.envoyRecord(ctx, r)
	rec.Sandbox, rec.Agent, rec.Session, rec.User, rec.Egress = r.Identity.Sandbox, r.Identity.Agent, r.Identity.Session, r.Identity.User, r.Identity.Egress
	rec.Status = v.Status
	if ae := d.auditRecord(ctx, rec, e); ae != nil {
		e = ae
	}
	d.logRecord(rec, e)
	return rec.RequestID
}

// envoyRefuse refuses a mapped request before the pipeline ran, audited.
func (d *envoyDoor) envoyRefuse(ctx context.Context, r *extauthz.Request, e *refusal.Error) extauthz.Verdict {
	v := extauthz.Verdict{Status: e.Status, Code: string(e.Code), Message: e.Message}
	v.RequestID = d.envoyRefused(ctx, r, v)
	return v
}

// envoyRecord starts the record of a Check the pipeline does not run:
// raw egress or a refusal before it. Its trace is ctx's (the Check's
// server span, when tracing is on), as a tool call's is.
func (d *envoyDoor) envoyRecord(ctx context.Context, r *extauthz.Request) *call.Record {
	rec := &call.Record{RequestID: refusal.NewRequestID(), Start: time.Now(), Kind: call.KindHTTP, Transport: call.Envoy, DestHost: r.Host, Port: r.Port,
		TraceID: tracing.TraceID(ctx)}
	if r.Method == http.MethodConnect {
		rec.Kind = call.KindConnect
	}
	return rec
}

// auditRecord writes rec's decision record; an audit log that cannot be
// written refuses (503 audit_unavailable).
func (d *envoyDoor) auditRecord(ctx context.Context, rec *call.Record, refused *refusal.Error) *refusal.Error {
	var code refusal.Code
	if refused != nil {
		code = refused.Code
	}
	fs := rec.Fields(call.EventDecision, code)
	sorted := make([]audit.Field, len(fs))
	for i, f := range fs {
		sorted[i] = audit.Field{Key: f.Key, Value: f.Value}
	}
	if _, err := d.append(ctx, audit.Record{RequestID: rec.RequestID, Event: call.EventDecision, Sorted: sorted}, false); err != nil {
		d.tel.Audits.Add(ctx, 1)
		return refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; nothing is let through until it can").Wrap(err)
	}
	return nil
}

func (d *envoyDoor) logRecord(rec *call.Record, e *refusal.Error) {
	msg, level, attrs := rec.Line(e, rec.Reason(e))
	d.log.LogAttrs(context.Background(), level, msg, attrs...)
}
