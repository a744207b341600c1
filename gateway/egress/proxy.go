package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Proxy is the forward proxy (absolute-form HTTP and CONNECT) and the
// DNS answerer of the sandbox socket. Raw egress is decided by policy
// (kinds http, connect, dns), dialled through the guard with no
// allow_private — it never reaches an internal address — and audited like
// a tool call.
type Proxy struct {
	d         Deps
	dialer    *guard.Dialer
	res       *dns.Resolver // nil without dns.upstreams
	upstreams *upstreamPool // absolute-form requests: connections per caller and destination
	ports     map[int]bool  // CONNECT ports
	idle      time.Duration
	hello     time.Duration

	mu      sync.Mutex
	tunnels map[string]int // open tunnels and proxied requests per sandbox
	live    liveTunnels    // egress_live.go: ended when the server stops

	subs *subdomains

	decisionAttrs decisionOpts
	decisions     egressDecisions // egress_decisions.go

	copyLoop atomic.Bool  // tests and benchmarks: relay every tunnel with splice
	direct   atomic.Int64 // tunnels relayed by relayTCP
	bulk     atomic.Int64 // relayTCP directions moved to the bulk buffers

	tunnelGauge metric.Int64UpDownCounter
	dnsAnswers  metric.Int64Counter
	exfil       metric.Int64Counter
}

// New provisions raw egress. With dns.upstreams configured the
// proxy's guarded dialer resolves with the same resolver as the DNS
// answerer; otherwise with the gateway's dialer's resolver.
func New(d Deps) *Proxy {
	cfg := d.Config
	e := &Proxy{
		d:       d,
		dialer:  d.Dialer,
		ports:   map[int]bool{443: true},
		idle:    cfg.Egress.IdleTimeout.Std(),
		hello:   cfg.Egress.HandshakeTimeout.Std(),
		tunnels: map[string]int{},
		subs:    newSubdomains(cfg.DNS.SubdomainThreshold, cfg.DNS.SubdomainWindow.Std()),
	}
	for _, p := range cfg.Egress.ConnectPorts {
		e.ports[p] = true
	}
	if len(cfg.DNS.Upstreams) > 0 {
		e.res = dns.NewResolver(cfg.DNS.Upstreams, cfg.DNS.Timeout.Std(), cfg.DNS.CacheMax)
		e.dialer = guard.New(guard.Options{Resolver: e.res})
	}
	e.upstreams = newUpstreamPool(upstreamOptions{
		dial: func(ctx context.Context, addr string) (net.Conn, error) {
			return e.dialer.DialContext(ctx, "tcp", addr, nil) // never allow_private
		},
		idle:             90 * time.Second,
		maxIdlePerHost:   16,
		maxIdlePerCaller: 64,
		headerTimeout:    cfg.Gateway.UpstreamTimeout.Std(),
	})
	d.AtClose(e.upstreams.closeIdle) // idle upstream connections close when the server stops
	d.AtClose(e.live.closeAll)       // open tunnels end, and write their records, before the audit log closes
	m := d.Meter
	e.tunnelGauge, _ = m.Int64UpDownCounter("sluice.egress.active", metric.WithDescription("Open CONNECT tunnels and proxied requests."))
	e.dnsAnswers, _ = m.Int64Counter("sluice.dns.answers", metric.WithDescription("DNS answers of POST /v1/dns by rcode."))
	e.exfil, _ = m.Int64Counter("sluice.dns.exfiltration_signals", metric.WithDescription("DNS exfiltration signals: callers that asked for more unique names under one base domain than dns.subdomain_threshold, and (signal=label_entropy) questions whose leftmost label has high entropy."))
	// Zero-valued from the start (telemetry.zero): the families exist
	// before their first event.
	e.tunnelGauge.Add(context.Background(), 0)
	e.exfil.Add(context.Background(), 0)
	e.dnsAnswers.Add(context.Background(), 0, metric.WithAttributes(attribute.String("rcode", "NOERROR")))
	return e
}

// ServeProxy handles absolute-form requests and CONNECT.
func (e *Proxy) ServeProxy(w http.ResponseWriter, r *http.Request) {
	c := newEgressCall(refusal.NewRequestID(), time.Now(), call.KindHTTP)
	if r.Method == http.MethodConnect {
		c.Kind = call.KindConnect
	}
	traceFrom(c, r.Context()) // egress_trace.go: the request's server span
	id, ok := e.d.Identity(r.Context())
	if !ok {
		e.refuse(w, c, egressRefuse(http.StatusForbidden, refusal.IdentityRequired, psDenied, "bug: connection has no identity"))
		return
	}
	c.setCaller(CallerOf(id))
	c.setListener(r.Context(), e.d.Hosted)
	if c.Kind == "connect" {
		e.connect(w, r, c, id)
		return
	}
	e.forward(w, r, c, id)
}

// ServeDNS answers POST /v1/dns: one DNS question in application/dns-message,
// decided for the caller. The answer is always 200 with a DNS message; the
// rcode says what happened. With Content-Type DNSStreamType the request
// is a stream of questions answered as they come (dns_stream.go).
func (e *Proxy) ServeDNS(w http.ResponseWriter, r *http.Request) { answerer{e}.serve(w, r) }

// acquire takes a tunnel slot for the caller's sandbox.
func (e *Proxy) acquire(id wire.Identity) (release func(), ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.tunnels[id.Sandbox] >= e.d.Config.Egress.MaxTunnelsPerCaller {
		return nil, false
	}
	e.tunnels[id.Sandbox]++
	e.tunnelGauge.Add(context.Background(), 1)
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			if e.tunnels[id.Sandbox]--; e.tunnels[id.Sandbox] <= 0 {
				delete(e.tunnels, id.Sandbox)
			}
			e.mu.Unlock()
			e.tunnelGauge.Add(context.Background(), -1)
		})
	}, true
}

// checkProxyRequest applies the framing checks Go's server leaves to the
// handler (THREATS F1-F4): one Content-Length at most, never together with
// Transfer-Encoding, no userinfo, no fragment, plain http only (https goes
// through CONNECT).
func checkProxyRequest(r *http.Request) error {
	if len(r.Header.Values("Content-Length")) > 1 {
		return errors.New("more than one Content-Length")
	}
	if len(r.TransferEncoding) > 0 && len(r.Header.Values("Content-Length")) > 0 {
		return errors.New("both Transfer-Encoding and Content-Length")
	}
	if len(r.TransferEncoding) > 1 || len(r.TransferEncoding) == 1 && r.TransferEncoding[0] != "chunked" {
		return errors.New("unsupported Transfer-Encoding")
	}
	if r.URL.User != nil || strings.Contains(r.URL.Host, "@") {
		return errors.New("userinfo in the request target")
	}
	if r.URL.Fragment != "" {
		return errors.New("fragment in the request target")
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			for i := 0; i < len(v); i++ {
				if b := v[i]; b < 0x20 && b != '\t' || b == 0x7f {
					return fmt.Errorf("control character in header %s", k)
				}
			}
		}
	}
	return nil
}

// parseTarget canonicalises an absolute-form or CONNECT target.
func parseTarget(authority, defaultPort string) (host string, port int, err error) {
	h, p, err := guard.ParseAuthority(authority, defaultPort)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("bug(): port %q passed ParseAuthority: %w", p, err)
	}
	return h, n, nil
}

// decide asks policy about c and turns a non-allow into a refusal. It is
// the one decision point of every proxied request, CONNECT, request and
// WebSocket upgrade inside an intercepted tunnel: an ended session is
// refused here first (sessionGate), before policy and before anything is
// sent or a credential attached.
func (e *Proxy) decide(ctx context.Context, c *egressCall, req policy.Request) *egressError {
	if ee := e.sessionGate(ctx, c); ee != nil {
		return ee
	}
	if ee := e.narrowGate(ctx, c, req.Host); ee != nil {
		return ee
	}
	c.decide(e.decideCached(ctx, c, &req))
	e.d.Decisions.Add(ctx, 1, e.decisionAttrs.get(c.decision.Action.String(), e.d.RuleLabel(c.decision.Rule)))
	if c.decision.Action == policy.Allow {
		return nil
	}
	msg := fmt.Sprintf("%s is not on agent %q's egress allowlist", req.Host, c.caller.Agent)
	if c.decision.Rule != "default" {
		msg = "blocked by policy"
		if c.decision.Reason != "" {
			msg += ": " + c.decision.Reason
		}
	}
	if c.decision.Action == policy.Ask {
		msg = "raw egress cannot be held for approval; it was not sent"
	}
	return egressRefuse(http.StatusForbidden, refusal.EgressDenied, psDenied, msg)
}

// sessionGate refuses egress of c's caller when its session has ended, or
// when whether it has cannot be read (fail closed). decide (every proxied
// request, CONNECT, intercepted request and WebSocket upgrade) and the DNS
// answerer call it before policy; the DNS fast path leaves an ended
// session's questions to the full path, which answers REFUSED. The
// refusal's code is session_ended (or session_unavailable), and it is the
// reason in the audit record.
func (e *Proxy) sessionGate(ctx context.Context, c *egressCall) *egressError {
	aerr := e.d.Session(ctx, c.caller.Session)
	if aerr == nil {
		return nil
	}
	c.Event = string(aerr.Code)
	return &egressError{Error: aerr, proxyStatus: psDenied}
}

// endedDuring is the refusal a tunnel's result record carries when the
// tunnel ended because its session was ended while it was open (the end
// closed it, sessionConns), nil otherwise.
func (e *Proxy) endedDuring(ctx context.Context, c *egressCall) *egressError {
	if c.caller.Session == "" {
		return nil
	}
	if aerr := e.d.Session(ctx, c.caller.Session); aerr == nil || aerr.Code != refusal.SessionEnded {
		return nil // live, or unreadable: the tunnel's own outcome stands
	}
	c.UpstreamErr = string(refusal.SessionEnded)
	return &egressError{Error: refusal.New(http.StatusForbidden, refusal.SessionEnded, "this session was ended; its tunnel was closed"), proxyStatus: psDenied}
}

// narrowGate refuses host for c when the sandbox's narrowing leaves it
// out, recording the decision on c for the audit record.
func (e *Proxy) narrowGate(ctx context.Context, c *egressCall, host string) *egressError {
	if !NarrowedOut(c.caller, host) {
		return nil
	}
	c.decide(NarrowDecision)
	e.d.Decisions.Add(ctx, 1, e.decisionAttrs.get(NarrowDecision.Action.String(), e.d.RuleLabel(narrowRule)))
	return egressRefuse(http.StatusForbidden, refusal.EgressDenied, psDenied,
		fmt.Sprintf("%s is not on sandbox %q's egress list (narrowed by sandboxd --egress)", host, c.caller.Sandbox))
}

// decideCached asks policy about c with request req through the decision
// cache. On a miss the input document goes to the current engine exactly
// as without the cache.
func (e *Proxy) decideCached(ctx context.Context, c *egressCall, req *policy.Request) policy.Decision {
	eng := e.d.Engine()
	v := eng.Version()
	now := time.Now()
	k := egressDecisionKey{caller: c.caller, kind: c.Kind.String(), req: requestKey(req)}
	if d, ok := e.decisions.get(eng, v, k, now); ok {
		return d
	}
	d := eng.Decide(ctx, &policy.Input{Version: policy.InputVersion, Kind: c.Kind.String(), Caller: c.caller, Request: *req, Time: now.UTC()})
	e.decisions.put(eng, v, k, d, now)
	return d
}

// refuse answers a refusal before any tunnel exists, audited.
func (e *Proxy) refuse(w http.ResponseWriter, c *egressCall, ee *egressError) {
	c.Status = ee.Status
	if aerr := e.record(context.Background(), c, call.EventDecision, ee.Error, false); aerr != nil {
		ee = aerr
	}
	e.logLine(c, ee)
	w.Header().Set("Proxy-Status", fmt.Sprintf("%s; error=%s", proxyStatusN, ee.proxyStatus))
	w.Header().Set("Connection", "close")
	refusal.Write(w, ee.Error, c.RequestID)
}

// record appends c's audit record. presync only writes (the result's
// fsync makes it durable); a record that cannot be written refuses.
func (e *Proxy) record(ctx context.Context, c *egressCall, event string, ref *refusal.Error, presync bool) *egressError {
	var code refusal.Code
	if ref != nil {
		code = ref.Code
	}
	traceFrom(c, ctx) // egress_trace.go
	return e.recordFields(ctx, c, event, call.AppendFields(make([]audit.Field, 0, 19), &c.Record, event, code), presync)
}

// recordFields is record with the fields given (in increasing key order).
func (e *Proxy) recordFields(ctx context.Context, c *egressCall, event string, f []audit.Field, presync bool) *egressError {
	if _, err := e.d.Append(ctx, audit.Record{RequestID: c.RequestID, Event: event, Sorted: f}, presync); err != nil {
		e.d.AuditFailures.Add(ctx, 1)
		// Some callers log no refusal after a failed result record (the
		// answer is already out): this line names the cause, once per
		// interval while it repeats (logcap.go).
		if e.d.Repeats("audit: record not durable; refusing raw egress", err.Error()) {
			e.d.Log.Error("audit: record not durable; refusing raw egress", call.KeyRequestID, c.RequestID, "err", err)
		}
		ee := egressRefuse(http.StatusServiceUnavailable, refusal.AuditUnavailable, psDenied, "the audit log cannot be written; no egress is served until it can")
		ee.Wrap(err)
		return ee
	}
	return nil
}

// logLine writes the one canonical decision line of a request or tunnel.
func (e *Proxy) logLine(c *egressCall, ee *egressError) {
	var ref *refusal.Error
	if ee != nil {
		ref = ee.Error
	}
	reason := c.Reason(ref)
	if ref != nil && ref.Code == refusal.AuditUnavailable && !e.d.Repeats(call.LineEgress, reason) {
		return // the same refusal was logged in this interval: counted (logcap.go)
	}
	var buf [call.LineAttrs]slog.Attr
	msg, level, attrs := c.AppendLine(buf[:0], ref, reason)
	e.d.Log.LogAttrs(context.Background(), level, msg, attrs...)
}
