package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Proxy-Status error types (RFC 9209 section 2.3) used in refusals.
const (
	psDenied     = "http_request_denied"
	psBadRequest = "http_request_error"
	psIPDenied   = "destination_ip_prohibited"
	psDNS        = "dns_error"
	psConnect    = "connection_refused"
	psTLS        = "tls_protocol_error"
	psTimeout    = "http_response_timeout"
	psProtocol   = "http_protocol_error"
	proxyStatusN = "sluice"
)

// rawEgress is the forward proxy (absolute-form HTTP and CONNECT) and the
// DNS answerer of the sandbox socket. Raw egress is decided by policy
// (kinds http, connect, dns), dialled through the guard with no
// allow_private — it never reaches an internal address — and audited like
// a tool call.
type rawEgress struct {
	s         *Server
	dialer    *guard.Dialer
	res       *resolver     // nil without dns.upstreams
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
	bulk     atomic.Int64 // relayTCP directions handed to splice(2)

	tunnelGauge metric.Int64UpDownCounter
	dnsAnswers  metric.Int64Counter
	exfil       metric.Int64Counter
}

// newRawEgress provisions raw egress. With dns.upstreams configured the
// proxy's guarded dialer resolves with the same resolver as the DNS
// answerer; otherwise with the gateway's dialer's resolver.
func (s *Server) newRawEgress() *rawEgress {
	cfg := s.cfg
	e := &rawEgress{
		s:       s,
		dialer:  s.dialer,
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
		e.res = newResolver(cfg.DNS.Upstreams, cfg.DNS.Timeout.Std(), cfg.DNS.CacheMax)
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
	s.stop.atClose(e.upstreams.closeIdle) // idle upstream connections close when the server stops
	s.stop.atClose(e.live.closeAll)       // open tunnels end, and write their records, before the audit log closes
	m := s.tel.provider.Meter("sluice/gateway/egress")
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

// egressCall is one proxied request, tunnel or DNS question.
type egressCall struct {
	rid      string
	start    time.Time
	kind     string
	caller   policy.Caller
	destHost string
	port     int
	destIP   atomicString
	decision policy.Decision
	decided  bool
	status   int // the gateway's answer to the sandbox
	// upstreamStatus is the status the upstream answered (0: none).
	upstreamStatus int
	event          string // an extra audit event for the refusal (sni_mismatch …)
	// upstreamErr says why an allowed request's upstream answer was not
	// relayed, or was cut (malformed_response, response_timeout …).
	upstreamErr string
	bytesUp     atomic.Int64
	bytesDn     atomic.Int64
}

// egressError is a refusal of raw egress: the JSON error plus the RFC 9209
// Proxy-Status error type.
type egressError struct {
	*refusal.Error
	proxyStatus string
}

func egressRefuse(status int, code refusal.Code, ps, msg string) *egressError {
	return &egressError{Error: refusal.New(status, code, msg), proxyStatus: ps}
}

// serveProxy handles absolute-form requests and CONNECT.
func (e *rawEgress) serveProxy(w http.ResponseWriter, r *http.Request) {
	c := &egressCall{rid: refusal.NewRequestID(), start: time.Now(), kind: "http"}
	if r.Method == http.MethodConnect {
		c.kind = "connect"
	}
	id, ok := identityFrom(r.Context())
	if !ok {
		e.refuse(w, c, egressRefuse(http.StatusForbidden, refusal.IdentityRequired, psDenied, "bug: connection has no identity"))
		return
	}
	c.caller = policy.Caller{Sandbox: id.Sandbox, Agent: id.Agent, Session: id.Session, User: id.User}
	if c.kind == "connect" {
		e.connect(w, r, c, id)
		return
	}
	e.forward(w, r, c, id)
}

// acquire takes a tunnel slot for the caller's sandbox.
func (e *rawEgress) acquire(id wire.Identity) (release func(), ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.tunnels[id.Sandbox] >= e.s.cfg.Egress.MaxTunnelsPerCaller {
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
func (e *rawEgress) decide(ctx context.Context, c *egressCall, req policy.Request) *egressError {
	if ee := e.sessionGate(ctx, c); ee != nil {
		return ee
	}
	c.decision, c.decided = e.decideCached(ctx, c, &req), true // egress_decisions.go
	e.s.tel.decisions.Add(ctx, 1, e.decisionAttrs.get(c.decision.Action.String(), e.s.tel.ruleLabel(c.decision.Rule)))
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

// forward proxies one absolute-form request.
func (e *rawEgress) forward(w http.ResponseWriter, r *http.Request, c *egressCall, id wire.Identity) {
	ctx := r.Context()
	if err := checkProxyRequest(r); err != nil {
		e.refuse(w, c, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "malformed proxy request: "+err.Error()))
		return
	}
	if r.URL.Scheme != "http" {
		e.refuse(w, c, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "only http:// is proxied in absolute form; use CONNECT for https"))
		return
	}
	host, port, err := parseTarget(r.URL.Host, "80")
	if err != nil {
		e.refuse(w, c, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "bad request target: "+err.Error()))
		return
	}
	c.destHost, c.port = host, port
	path, ee := c.path(r)
	if ee != nil {
		e.refuse(w, c, ee)
		return
	}
	if ee := refuseDoH(c); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	if e.s.icpt.credentialed(host) {
		// THREATS D5: a placeholder never crosses plain http, so a host
		// with a secret bound to it is reached over CONNECT only.
		c.event = "plaintext_credentialed_host"
		e.refuse(w, c, egressRefuse(http.StatusForbidden, refusal.EgressDenied, psDenied, "a secret is bound to "+host+"; plain http:// to it is refused, use https"))
		return
	}
	release, ok := e.acquire(id)
	if !ok {
		e.refuse(w, c, egressRefuse(http.StatusTooManyRequests, refusal.RateLimited, psDenied, "too many open tunnels and proxied requests for this sandbox"))
		return
	}
	defer release()
	// The request's own header map, stripped in place: the server took what
	// it needs from it (Connection: close, Expect) when it read the head.
	hdr := r.Header
	stripRequestHeaders(hdr)
	if ee := e.decide(ctx, c, policy.Request{Method: r.Method, Host: host, Port: port, Path: path.decoded, Query: r.URL.Query(), Headers: hdr}); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	if ee := e.record(ctx, c, "decision", nil, true); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	authority := addr
	if port == 80 {
		authority = host
		if strings.Contains(host, ":") {
			authority = "[" + host + "]"
		}
	}
	// A shallow copy with its own URL, the stripped header and the
	// client's body, as with Clone, without copying the rest.
	out := *r
	u := *r.URL
	u.Host, u.User = authority, nil
	if err := path.setOn(&u); err != nil { // exactly the path policy decided on
		e.refuse(w, c, egressRefuse(http.StatusInternalServerError, refusal.SchemaViolation, psBadRequest, err.Error()))
		return
	}
	out.URL, out.RequestURI, out.Host, out.Header = &u, "", authority, hdr
	if r.ContentLength == 0 {
		out.Body = nil
	}
	resp, err := e.upstreams.roundTrip(ctx, c.caller, addr, &out)
	if err != nil {
		e.refuse(w, c, upstreamRefusal(c, err))
		return
	}
	c.destIP.Store(resp.remote)
	defer resp.body.Close()
	c.upstreamStatus = resp.status
	e.s.tel.upstreamAnswered("", "proxy", resp.status)
	// The start of the body is read before the answer is committed: a
	// response whose framing breaks at once (a bad first chunk, a small
	// body shorter than its Content-Length) is still refused with a 502.
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	n, rerr := resp.body.prefetch(buf)
	if rerr != nil && rerr != io.EOF {
		e.refuse(w, c, upstreamRefusal(c, rerr))
		return
	}
	stripHopByHop(resp.header)
	wh := w.Header()
	for k, vs := range resp.header {
		wh[k] = vs
	}
	c.status = resp.status
	w.WriteHeader(resp.status)
	if n > 0 {
		m, _ := w.Write(buf[:n])
		c.bytesDn.Add(int64(m))
	}
	if rerr == nil {
		if resp.body.mode == bodyLength {
			m, _ := io.CopyBuffer(writerOnly{w}, resp.body, buf)
			c.bytesDn.Add(m)
		} else {
			// A body of unknown length is a stream (server-sent events,
			// a long poll): each piece goes to the client as it comes,
			// as in an intercepted tunnel (copyResponse); only the end of
			// the answer waits for the result record below.
			if n > 0 {
				_ = http.NewResponseController(w).Flush()
			}
			c.bytesDn.Add(flushEach(w, resp.body, buf))
		}
	}
	// A body that broke its framing after the answer was committed
	// cannot be refused any more: the client's connection is dropped,
	// so that it sees a cut answer rather than a complete-looking one.
	if berr := resp.body.failed(); berr != nil {
		c.upstreamErr = "broken_body"
		ee := egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psProtocol, "the upstream's response broke its framing")
		ee.Wrap(berr)
		_ = e.record(context.WithoutCancel(ctx), c, "result", ee.Error, false)
		e.logLine(c, ee)
		panic(http.ErrAbortHandler)
	}
	// The answer is released when the handler returns (the server holds
	// up to its buffer's worth of it until then): its result record is
	// written first, and fsynced first with audit.sync: always. If that
	// fails, the connection is dropped rather than the answer released.
	if ee := e.record(context.WithoutCancel(ctx), c, "result", nil, false); ee != nil {
		e.logLine(c, ee)
		panic(http.ErrAbortHandler)
	}
	e.logLine(c, nil)
}

// copyBufs are the buffers responses are relayed through.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// writerOnly hides a ResponseWriter's ReadFrom, so that io.CopyBuffer
// uses the buffer it is given.
type writerOnly struct{ io.Writer }

// upstreamRefusal maps a failed upstream exchange (or its dial) to a
// refusal.
func upstreamRefusal(c *egressCall, err error) *egressError {
	var ue *upstreamError
	if !errors.As(err, &ue) {
		return dialRefusal(c, err)
	}
	var ee *egressError
	switch ue.kind {
	case upTimeout:
		c.upstreamErr = "response_timeout"
		ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psTimeout, "the destination did not answer in time")
	case upProtocol, upBodyBroken:
		c.upstreamErr = "malformed_response"
		ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psProtocol, "the destination's response was malformed or ambiguously framed; it was not relayed")
	case upSend:
		c.upstreamErr = "send_failed"
		ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psConnect, "the request could not be sent to the destination")
	default:
		c.upstreamErr = "closed_without_answer"
		ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psConnect, "the destination closed the connection without an answer")
	}
	ee.Wrap(err)
	return ee
}

// dialRefusal maps a guarded dial's failure to a refusal.
func dialRefusal(c *egressCall, err error) *egressError {
	var de *guard.DeniedError
	if errors.As(err, &de) {
		if de.Addr.IsValid() {
			c.destIP.Store(de.Addr.String())
		}
		ee := egressRefuse(http.StatusForbidden, refusal.EgressDenied, psIPDenied, fmt.Sprintf("destination %s is not allowed (%s)", de.Host, de.Class))
		ee.Wrap(err)
		return ee
	}
	var dnsErr *net.DNSError
	var rc *rcodeError
	if errors.As(err, &dnsErr) || errors.As(err, &rc) || errors.Is(err, errNoUpstream) {
		ee := egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psDNS, "the destination's name could not be resolved")
		ee.Wrap(err)
		return ee
	}
	ee := egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psConnect, "the destination could not be reached")
	ee.Wrap(err)
	return ee
}

// hopByHop are removed from both directions (RFC 9110 7.6.1), with every
// Proxy-* header: the proxy never forwards or adds credentials of its own.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func stripHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopByHop {
		delete(h, k) // canonical keys, as Go's parsers store them
	}
	for k := range h {
		if isProxyField(k) {
			delete(h, k)
		}
	}
}

// stripRequestHeaders removes, from a request the sandbox sent, the
// hop-by-hop fields and every field in which a client claims where the
// request came from or what it was before a proxy rewrote it (THREATS F8):
// an upstream that trusts them would take the sandbox's word for its
// address, scheme or path. The forward proxy and intercepted tunnels call
// it; tool calls drop the same names from their header arguments
// (stripHeaderArgs). Policy decides on the stripped header.
func stripRequestHeaders(h http.Header) {
	stripHopByHop(h)
	for k := range h {
		if isForwardingField(k) {
			delete(h, k)
		}
	}
}

// forwardingFields are, in lower case, the fields proxies, CDNs and load
// balancers write to tell the origin about the client or the original
// request; a sandbox sets none of them.
var forwardingFields = map[string]bool{
	"forwarded": true, "via": true, "x-real-ip": true, "x-client-ip": true, "client-ip": true,
	"true-client-ip": true, "cf-connecting-ip": true, "cf-connecting-ipv6": true, "fastly-client-ip": true,
	"x-cluster-client-ip": true, "x-originating-ip": true, "x-remote-ip": true, "x-remote-addr": true,
	"x-proxyuser-ip": true, "x-host": true, "x-original-host": true, "x-original-url": true,
	"x-rewrite-url": true, "x-original-uri": true, "x-http-method-override": true, "x-http-method": true,
	"x-method-override": true, "x-appengine-user-ip": true, "x-azure-clientip": true, "x-azure-socketip": true,
}

// isForwardingField reports whether a field name, in any case, is one of
// forwardingFields or starts with X-Forwarded (X-Forwarded-For, -Host,
// -Proto, …, and the bare X-Forwarded) or X-Envoy- (Envoy trusts those from
// an internal peer).
func isForwardingField(name string) bool {
	l := strings.ToLower(name)
	return forwardingFields[l] || strings.HasPrefix(l, "x-forwarded") || strings.HasPrefix(l, "x-envoy-")
}

// isProxyField reports whether a field name starts with "Proxy-", in any
// case: such fields are for this hop only.
func isProxyField(name string) bool {
	return len(name) >= len("proxy-") && strings.EqualFold(name[:len("proxy-")], "proxy-")
}

// isHopByHop reports whether a field name, in any case, is one
// stripHopByHop removes whatever Connection says (RFC 9110 7.6.1).
func isHopByHop(name string) bool {
	for _, h := range hopByHop {
		if strings.EqualFold(h, name) {
			return true
		}
	}
	return isProxyField(name)
}

// connect serves CONNECT host:port: port and policy first, then the
// destination is resolved and every address classified (403 before any
// 200), then the tunnel is answered, the client's ClientHello read and its
// SNI held to the CONNECT host, and only then exactly the classified
// address is dialled and the hello replayed to it.
func (e *rawEgress) connect(w http.ResponseWriter, r *http.Request, c *egressCall, id wire.Identity) {
	ctx := r.Context()
	// The request target as sent (authority-form, RFC 9112 3.2.3), not Go's
	// parse of it: userinfo, a path or a second authority are refused here.
	host, port, err := parseTarget(r.RequestURI, "")
	if err != nil {
		e.refuse(w, c, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "bad CONNECT target: "+err.Error()))
		return
	}
	c.destHost, c.port = host, port
	if ee := refuseDoH(c); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	if !e.ports[port] {
		e.refuse(w, c, egressRefuse(http.StatusForbidden, refusal.EgressDenied, psDenied, fmt.Sprintf("CONNECT to port %d is not allowed (443 and egress.connect_ports only)", port)))
		return
	}
	release, ok := e.acquire(id)
	if !ok {
		e.refuse(w, c, egressRefuse(http.StatusTooManyRequests, refusal.RateLimited, psDenied, "too many open tunnels for this sandbox"))
		return
	}
	defer release()
	if ee := e.decide(ctx, c, policy.Request{Method: http.MethodConnect, Host: host, Port: port}); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	addr, err := e.classify(ctx, host)
	if err != nil {
		e.refuse(w, c, dialRefusal(c, err))
		return
	}
	c.destIP.Store(addr.String())
	if ee := e.record(ctx, c, "decision", nil, true); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		e.refuse(w, c, egressRefuse(http.StatusInternalServerError, refusal.UpstreamError, psDenied, "bug(): connection cannot be taken over"))
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	lt := e.live.add(conn)
	defer lt.done() // after the result record below
	c.status = http.StatusOK
	_ = conn.SetDeadline(time.Now().Add(e.hello))
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	hello, sni, err := readClientHello(brw.Reader)
	actx := context.WithoutCancel(ctx)
	if err == nil && sni != host {
		err = fmt.Errorf("SNI %q is not the CONNECT host", sni)
	}
	if err != nil {
		c.event = "sni_mismatch"
		ee := egressRefuse(http.StatusForbidden, refusal.EgressDenied, psTLS, "the TLS ClientHello does not name the CONNECT host")
		ee.Wrap(err)
		_ = e.record(actx, c, "sni_mismatch", ee.Error, false)
		e.logLine(c, ee)
		return
	}
	if e.s.icpt.intercepts(host, c.decision) {
		// TLS interception (intercept.go): every request in the tunnel is
		// decided, credentialed and audited on its own.
		c.event = "intercepted"
		// Read past the server's bufio.Reader: its connReader would take
		// the inner server's read-deadline aborts for a dead connection
		// and cancel ctx.
		buffered, _ := brw.Reader.Peek(brw.Reader.Buffered())
		ierr := e.intercept(ctx, c, conn, io.MultiReader(bytes.NewReader(hello), bytes.NewReader(buffered), conn), addr)
		ee := e.endedDuring(actx, c)
		if ierr != nil && ee == nil {
			ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psTLS, "the intercepted tunnel could not be set up")
			ee.Wrap(ierr)
		}
		var ref *refusal.Error
		if ee != nil {
			ref = ee.Error
		}
		_ = e.record(actx, c, "result", ref, false)
		e.logLine(c, ee)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, e.s.cfg.Gateway.UpstreamTimeout.Std())
	up, err := e.dialer.DialContext(dctx, "tcp", netip.AddrPortFrom(addr, uint16(port)).String(), nil)
	cancel()
	if err != nil {
		ee := dialRefusal(c, err)
		_ = e.record(actx, c, "result", ee.Error, false)
		e.logLine(c, ee)
		return
	}
	defer up.Close()
	lt.dialled(up)
	defer e.s.sessConns.add(c.caller.Session, up)() // the end of the session closes the upstream too
	_ = conn.SetDeadline(time.Time{})
	if _, err := up.Write(hello); err != nil {
		return
	}
	c.bytesUp.Add(int64(len(hello)))
	e.tunnel(conn, brw.Reader, up, c)
	ee := e.endedDuring(actx, c)
	var ref *refusal.Error
	if ee != nil {
		ref = ee.Error
	}
	_ = e.record(actx, c, "result", ref, false)
	e.logLine(c, ee)
}

// classify resolves host once and checks every address; one refused
// address refuses the name. It returns the address to dial.
func (e *rawEgress) classify(ctx context.Context, host string) (netip.Addr, error) {
	if c := guard.NameClass(host); c != guard.Public {
		return netip.Addr{}, &guard.DeniedError{Host: host, Class: c}
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		var lookup guard.Resolver = net.DefaultResolver
		if e.res != nil {
			lookup = e.res
		}
		lctx, cancel := context.WithTimeout(ctx, e.s.cfg.Gateway.UpstreamTimeout.Std())
		defer cancel()
		addrs, err = lookup.LookupNetIP(lctx, "ip", host)
		if err != nil {
			return netip.Addr{}, err
		}
	}
	if len(addrs) == 0 {
		return netip.Addr{}, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	for _, a := range addrs {
		if err := e.dialer.Check(host, a, nil); err != nil {
			return netip.Addr{}, err
		}
	}
	// Prefer IPv4: the namespaces sluice runs in often have no IPv6 route.
	for _, a := range addrs {
		if a.Unmap().Is4() {
			return a.Unmap(), nil
		}
	}
	return addrs[0], nil
}

// splice copies both ways until either side closes or nothing moves in
// either direction for idle, when the watchdog closes both connections.
func splice(client net.Conn, clientR io.Reader, up net.Conn, idle time.Duration, upN, dnN *atomic.Int64) {
	act := newActivity()
	done := make(chan struct{}, 2)
	go func() { _, _ = copyCounted(up, clientR, upN, act.touch); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = copyCounted(client, up, dnN, act.touch); closeWrite(client); done <- struct{}{} }()
	awaitRelay(done, idle, func() bool { return act.idleFor(idle) }, func() { client.Close(); up.Close() }, false)
}

// tunnel relays an answered CONNECT's bytes until either side is done or
// the tunnel idles out. A handed-off sandbox TCP socket and a TCP upstream
// are relayed socket to socket (relayTCP) once the bytes already buffered
// above the sandbox's socket are sent; anything else by splice.
func (e *rawEgress) tunnel(conn net.Conn, br *bufio.Reader, up net.Conn, c *egressCall) {
	ic, _ := conn.(*identConn)
	var client, upstream *net.TCPConn
	if ic != nil {
		client, _ = ic.Conn.(*net.TCPConn)
	}
	upstream, _ = up.(*net.TCPConn)
	if client == nil || upstream == nil || e.copyLoop.Load() || !hasTCPInfo(client) || !hasTCPInfo(upstream) {
		splice(conn, br, up, e.idle, &c.bytesUp, &c.bytesDn)
		return
	}
	// The server's reader first (after Hijack it holds every byte the
	// server took off the connection), then the connection's own.
	pending, _ := br.Peek(br.Buffered())
	pending = append(pending[:len(pending):len(pending)], ic.detach()...)
	if len(pending) > 0 {
		if _, err := upstream.Write(pending); err != nil {
			return
		}
		c.bytesUp.Add(int64(len(pending)))
	}
	e.direct.Add(1)
	relayTCP(ic, client, upstream, e.idle, &c.bytesUp, &c.bytesDn, &e.bulk)
}

// relayTCP is splice between two TCP sockets read and written directly.
// Small exchanges, a request and its answer, are copied through a buffer:
// for them the kernel's splice(2) costs more than read and write. A
// direction whose read fills the whole buffer is a bulk transfer: the
// rest of it is left to io.Copy, which moves the bytes with splice(2) and
// never through this process (bulk counts such directions). Such a copy
// reports its count only when it ends, so for it the idle watchdog asks
// the kernel whether data still arrives (TCP_INFO's last_data_recv on its
// source socket). When nothing has moved either way for idle, closer (for
// a handed-off socket the identConn, which also ends the lease) and up
// are closed.
func relayTCP(closer net.Conn, client, up *net.TCPConn, idle time.Duration, upN, dnN, bulk *atomic.Int64) {
	act := newActivity()
	var kernelUp, kernelDn atomic.Bool
	cp := func(dst, src *net.TCPConn, n *atomic.Int64, kernel *atomic.Bool) {
		defer func() { _ = dst.CloseWrite() }()
		buf := make([]byte, 32<<10)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				act.touch()
				if _, werr := dst.Write(buf[:k]); werr != nil {
					return
				}
				n.Add(int64(k))
			}
			if err != nil {
				return
			}
			if k == len(buf) {
				kernel.Store(true)
				bulk.Add(1)
				m, _ := io.Copy(dst, src)
				n.Add(m)
				return
			}
		}
	}
	done := make(chan struct{}, 2)
	go func() { cp(up, client, upN, &kernelUp); done <- struct{}{} }()
	go func() { cp(client, up, dnN, &kernelDn); done <- struct{}{} }()
	stalled := func() bool {
		return act.idleFor(idle) &&
			(!kernelUp.Load() || recvIdle(client) >= idle) &&
			(!kernelDn.Load() || recvIdle(up) >= idle)
	}
	awaitRelay(done, idle, stalled, func() { closer.Close(); up.Close() }, false)
}

// recvIdle is how long ago c last received data, per the kernel. A socket
// whose TCP_INFO cannot be read (closed) counts as idle.
func recvIdle(c *net.TCPConn) time.Duration {
	info, err := tcpInfo(c)
	if err != nil {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(info.Last_data_recv) * time.Millisecond
}

// hasTCPInfo says whether the kernel answers TCP_INFO for c, which
// relayTCP's idle watchdog depends on.
func hasTCPInfo(c *net.TCPConn) bool {
	_, err := tcpInfo(c)
	return err == nil
}

func tcpInfo(c *net.TCPConn) (*unix.TCPInfo, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var info *unix.TCPInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return nil, err
	}
	return info, ierr
}

func closeWrite(c net.Conn) {
	type cw interface{ CloseWrite() error }
	if x, ok := c.(cw); ok {
		_ = x.CloseWrite()
		return
	}
	if ic, ok := c.(*identConn); ok {
		closeWrite(ic.Conn)
		return
	}
	_ = c.Close()
}

// refuse answers a refusal before any tunnel exists, audited.
func (e *rawEgress) refuse(w http.ResponseWriter, c *egressCall, ee *egressError) {
	c.status = ee.Status
	if aerr := e.record(context.Background(), c, "decision", ee.Error, false); aerr != nil {
		ee = aerr
	}
	e.logLine(c, ee)
	w.Header().Set("Proxy-Status", fmt.Sprintf("%s; error=%s", proxyStatusN, ee.proxyStatus))
	w.Header().Set("Connection", "close")
	refusal.Write(w, ee.Error, c.rid)
}

// record appends c's audit record. presync only writes (the result's
// fsync makes it durable); a record that cannot be written refuses.
func (e *rawEgress) record(ctx context.Context, c *egressCall, event string, ref *refusal.Error, presync bool) *egressError {
	f := c.auditFields(event, ref)
	if _, err := e.s.appendAudit(ctx, audit.Record{RequestID: c.rid, Event: event, Sorted: f}, presync); err != nil {
		e.s.tel.audits.Add(ctx, 1)
		// Some callers log no refusal after a failed result record (the
		// answer is already out): this line names the cause, once per
		// interval while it repeats (logcap.go).
		if e.s.repeats.allow("audit: record not durable; refusing raw egress", err.Error()) {
			e.s.log.Error("audit: record not durable; refusing raw egress", "request_id", c.rid, "err", err)
		}
		ee := egressRefuse(http.StatusServiceUnavailable, refusal.AuditUnavailable, psDenied, "the audit log cannot be written; no egress is served until it can")
		ee.Wrap(err)
		return ee
	}
	return nil
}

// auditFields are the fields of c's audit record for event, in increasing
// key order (audit.Record.Sorted): every proxied request writes two of
// these records, and a map per record was its largest allocation.
func (c *egressCall) auditFields(event string, ref *refusal.Error) []audit.Field {
	f := make([]audit.Field, 0, 18)
	f = append(f, audit.Field{Key: "agent", Value: c.caller.Agent})
	if event == "result" {
		f = append(f, audit.Field{Key: "bytes_down", Value: c.bytesDn.Load()}, audit.Field{Key: "bytes_up", Value: c.bytesUp.Load()})
	}
	if ref != nil {
		f = append(f, audit.Field{Key: "code", Value: string(ref.Code)})
	}
	if c.decided {
		f = append(f, audit.Field{Key: "decision", Value: c.decision.Action.String()})
	}
	f = append(f, audit.Field{Key: "dest_host", Value: c.destHost})
	if event == "result" {
		f = append(f, audit.Field{Key: "duration_ms", Value: time.Since(c.start).Milliseconds()})
	}
	f = append(f, audit.Field{Key: "kind", Value: c.kind})
	if c.port != 0 {
		f = append(f, audit.Field{Key: "port", Value: c.port})
	}
	switch {
	case c.decided:
		f = append(f, audit.Field{Key: "reason", Value: c.decision.Reason})
	case c.event != "":
		f = append(f, audit.Field{Key: "reason", Value: c.event}) // a refusal before policy (doh_refused …)
	}
	if ip := c.destIP.Load(); ip != "" {
		f = append(f, audit.Field{Key: "resolved_ip", Value: ip})
	}
	if c.decided {
		f = append(f, audit.Field{Key: "rule", Value: c.decision.Rule})
	}
	f = append(f, audit.Field{Key: "sandbox", Value: c.caller.Sandbox}, audit.Field{Key: "session", Value: c.caller.Session})
	if c.status != 0 {
		f = append(f, audit.Field{Key: "status", Value: c.status})
	}
	if c.upstreamErr != "" {
		f = append(f, audit.Field{Key: "upstream_error", Value: c.upstreamErr})
	}
	if c.upstreamStatus != 0 {
		f = append(f, audit.Field{Key: "upstream_status", Value: c.upstreamStatus})
	}
	f = append(f, audit.Field{Key: "user", Value: c.caller.User})
	return f
}

// logLine writes the one canonical decision line of a request or tunnel.
func (e *rawEgress) logLine(c *egressCall, ee *egressError) {
	decision, reason := "", c.decision.Reason
	if c.decided {
		decision = c.decision.Action.String()
	}
	level := slog.LevelInfo
	if ee != nil {
		reason = string(ee.Code)
		if c.event != "" {
			reason = c.event
		}
		if ee.Cause() != nil {
			reason += ": " + ee.Cause().Error()
		}
		if ee.Status >= 500 {
			level = slog.LevelWarn
		}
		if ee.Code == refusal.AuditUnavailable && !e.s.repeats.allow("egress", reason) {
			return // the same refusal was logged in this interval: counted (logcap.go)
		}
	}
	e.s.log.LogAttrs(context.Background(), level, "egress",
		slog.String("request_id", c.rid),
		slog.String("kind", c.kind),
		slog.String("decision", decision),
		slog.String("reason", reason),
		slog.String("rule", c.decision.Rule),
		slog.String("agent", c.caller.Agent),
		slog.String("session", c.caller.Session),
		slog.String("user", c.caller.User),
		slog.String("sandbox", c.caller.Sandbox),
		slog.String("dest_host", c.destHost),
		slog.Int("port", c.port),
		slog.String("resolved_ip", c.destIP.Load()),
		slog.Int("status", c.status),
		slog.Int("upstream_status", c.upstreamStatus),
		slog.Int64("bytes_up", c.bytesUp.Load()),
		slog.Int64("bytes_down", c.bytesDn.Load()),
		slog.Float64("duration_ms", float64(time.Since(c.start).Microseconds())/1000),
	)
}

// readClientHello reads one TLS ClientHello (possibly over several
// records) and returns the bytes read, to be replayed upstream, and its
// one server name. A missing, empty, repeated or unparsable SNI is an error.
func readClientHello(r *bufio.Reader) ([]byte, string, error) {
	var raw, hs []byte
	for {
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(r, hdr); err != nil {
			return nil, "", fmt.Errorf("client hello: read record: %w", err)
		}
		if hdr[0] != 0x16 || hdr[1] != 3 {
			return nil, "", errors.New("client hello: not a TLS handshake record")
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > 1<<14 {
			return nil, "", errors.New("client hello: bad record length")
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, "", fmt.Errorf("client hello: read record: %w", err)
		}
		raw = append(append(raw, hdr...), body...)
		hs = append(hs, body...)
		if len(hs) >= 4 {
			want := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
			if want > 64<<10 {
				return nil, "", errors.New("client hello: too long")
			}
			if len(hs) >= want {
				sni, err := parseClientHelloSNI(hs[:want])
				return raw, sni, err
			}
		}
		if len(raw) > 64<<10 {
			return nil, "", errors.New("client hello: too long")
		}
	}
}

// parseClientHelloSNI parses a ClientHello handshake message (RFC 8446
// 4.1.2) and returns its server_name (RFC 6066 3), canonicalised like a
// CONNECT host.
func parseClientHelloSNI(m []byte) (string, error) {
	bad := func(what string) (string, error) { return "", errors.New("client hello: " + what) }
	p := cursor(m)
	typ, ok := p.u8()
	if !ok || typ != 1 {
		return bad("not a ClientHello")
	}
	body, ok := p.u24Bytes()
	if !ok || len(p) != 0 {
		return bad("bad handshake length")
	}
	if _, ok := body.bytes(2 + 32); !ok { // legacy_version, random
		return bad("truncated")
	}
	if _, ok := body.u8Bytes(); !ok { // legacy_session_id
		return bad("truncated session id")
	}
	if _, ok := body.u16Bytes(); !ok { // cipher_suites
		return bad("truncated cipher suites")
	}
	if _, ok := body.u8Bytes(); !ok { // legacy_compression_methods
		return bad("truncated compression methods")
	}
	exts, ok := body.u16Bytes()
	if !ok {
		return bad("no extensions")
	}
	var name string
	found := false
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.u16Bytes()
		if !ok1 || !ok2 {
			return bad("truncated extension")
		}
		if typ != 0 {
			continue
		}
		if found {
			return bad("two server_name extensions")
		}
		found = true
		list, ok := data.u16Bytes()
		if !ok || len(data) != 0 {
			return bad("malformed server_name")
		}
		for len(list) > 0 {
			nt, ok1 := list.u8()
			hn, ok2 := list.u16Bytes()
			if !ok1 || !ok2 {
				return bad("malformed server_name list")
			}
			if nt != 0 {
				continue
			}
			if name != "" {
				return bad("more than one host name in server_name")
			}
			if len(hn) == 0 {
				return bad("empty server name")
			}
			name = string(hn)
		}
	}
	if name == "" {
		return bad("no server name")
	}
	if strings.HasSuffix(name, ".") {
		return bad("server name ends in a dot (RFC 6066 3)")
	}
	host, _, err := guard.ParseAuthority(name, "443")
	if err != nil || strings.Contains(name, ":") {
		return bad("server name is not a host name")
	}
	return host, nil
}

// cursor reads big-endian fields off a byte slice.
type cursor []byte

func (c *cursor) bytes(n int) ([]byte, bool) {
	if n < 0 || len(*c) < n {
		return nil, false
	}
	b := (*c)[:n]
	*c = (*c)[n:]
	return b, true
}

func (c *cursor) u8() (int, bool) {
	b, ok := c.bytes(1)
	if !ok {
		return 0, false
	}
	return int(b[0]), true
}

func (c *cursor) u16() (int, bool) {
	b, ok := c.bytes(2)
	if !ok {
		return 0, false
	}
	return int(b[0])<<8 | int(b[1]), true
}

func (c *cursor) u8Bytes() (cursor, bool) {
	n, ok := c.u8()
	if !ok {
		return nil, false
	}
	b, ok := c.bytes(n)
	return b, ok
}

func (c *cursor) u16Bytes() (cursor, bool) {
	n, ok := c.u16()
	if !ok {
		return nil, false
	}
	b, ok := c.bytes(n)
	return b, ok
}

func (c *cursor) u24Bytes() (cursor, bool) {
	b, ok := c.bytes(3)
	if !ok {
		return nil, false
	}
	return c.bytes(int(b[0])<<16 | int(b[1])<<8 | int(b[2]))
}

// httptraceEgress records the address actually dialled for a proxied request.
func httptraceEgress(ctx context.Context, c *egressCall) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if info.Conn == nil {
				return
			}
			if a, ok := info.Conn.RemoteAddr().(*net.TCPAddr); ok {
				c.destIP.Store(a.AddrPort().Addr().Unmap().String())
			} else if host, _, err := net.SplitHostPort(info.Conn.RemoteAddr().String()); err == nil {
				c.destIP.Store(host)
			}
		},
	})
}

// egressAllowlists maps each agent to its agents[].egress list for policy.
func egressAllowlists(cfg *config.Config) map[string][]string {
	m := make(map[string][]string, len(cfg.Agents))
	for _, a := range cfg.Agents {
		m[a.Name] = a.Egress
	}
	return m
}
