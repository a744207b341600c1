package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/h1"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// forward proxies one absolute-form request.
func (e *Proxy) forward(w http.ResponseWriter, r *http.Request, c *egressCall, id wire.Identity) {
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
	c.DestHost, c.Port = host, port
	path, ee := c.path(r)
	if ee != nil {
		e.refuse(w, c, ee)
		return
	}
	if ee := refuseDoH(c); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	if e.d.Interceptor.credentialed(host) {
		// THREATS D5: a placeholder never crosses plain http, so a host
		// with a secret bound to it is reached over CONNECT only.
		c.Event = "plaintext_credentialed_host"
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
	gc := e.d.Config.Gateway
	body, text, ee := proxiedBody(w, r, h1.BodyLimit{Timeout: gc.RequestBodyTimeout.Std(), MinRate: gc.RequestBodyMinRate}) // forward_body.go: read, decoded and bounded before the decision
	if ee != nil {
		e.refuse(w, c, ee)
		return
	}
	if ee := e.decide(ctx, c, policy.Request{Method: r.Method, Host: host, Port: port, Path: path.decoded, Query: r.URL.Query(), Headers: hdr, Body: text}); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	if ee := e.record(ctx, c, call.EventDecision, nil, true); ee != nil {
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
	// Exactly the bytes that were decided on (forward_body.go), with
	// their length: never the rest of the client's stream.
	out.Body, out.ContentLength, out.TransferEncoding = nil, 0, nil
	if len(body) > 0 {
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	resp, err := e.upstreams.roundTrip(ctx, c.caller, addr, &out)
	if err != nil {
		e.refuse(w, c, upstreamRefusal(c, err))
		return
	}
	c.SetResolvedIP(resp.remote)
	defer resp.body.Close()
	c.UpstreamStatus = resp.status
	e.d.UpstreamAnswered("", "proxy", resp.status)
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
	c.Status = resp.status
	w.WriteHeader(resp.status)
	if n > 0 {
		m, _ := w.Write(buf[:n])
		c.BytesDown.Add(int64(m))
	}
	if rerr == nil {
		if resp.body.mode == bodyLength {
			m, _ := io.CopyBuffer(writerOnly{w}, resp.body, buf)
			c.BytesDown.Add(m)
		} else {
			// A body of unknown length is a stream (server-sent events,
			// a long poll): each piece goes to the client as it comes,
			// as in an intercepted tunnel (copyResponse); only the end of
			// the answer waits for the result record below.
			if n > 0 {
				_ = http.NewResponseController(w).Flush()
			}
			c.BytesDown.Add(flushEach(w, resp.body, buf))
		}
	}
	// A body that broke its framing after the answer was committed
	// cannot be refused any more: the client's connection is dropped,
	// so that it sees a cut answer rather than a complete-looking one.
	if berr := resp.body.failed(); berr != nil {
		c.UpstreamErr = "broken_body"
		ee := egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psProtocol, "the upstream's response broke its framing")
		ee.Wrap(berr)
		_ = e.record(context.WithoutCancel(ctx), c, call.EventResult, ee.Error, false)
		e.logLine(c, ee)
		panic(http.ErrAbortHandler)
	}
	// The answer is released when the handler returns (the server holds
	// up to its buffer's worth of it until then): its result record is
	// written first, and fsynced first with audit.sync: always. If that
	// fails, the connection is dropped rather than the answer released.
	if ee := e.record(context.WithoutCancel(ctx), c, call.EventResult, nil, false); ee != nil {
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
		c.UpstreamErr = "response_timeout"
		ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psTimeout, "the destination did not answer in time")
	case upProtocol, upBodyBroken:
		c.UpstreamErr = "malformed_response"
		ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psProtocol, "the destination's response was malformed or ambiguously framed; it was not relayed")
	case upSend:
		c.UpstreamErr = "send_failed"
		ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psConnect, "the request could not be sent to the destination")
	default:
		c.UpstreamErr = "closed_without_answer"
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
			c.SetResolvedIP(de.Addr.String())
		}
		ee := egressRefuse(http.StatusForbidden, refusal.EgressDenied, psIPDenied, fmt.Sprintf("destination %s is not allowed (%s)", de.Host, de.Class))
		ee.Wrap(err)
		return ee
	}
	var dnsErr *net.DNSError
	var rc *dns.RcodeError
	if errors.As(err, &dnsErr) || errors.As(err, &rc) || errors.Is(err, dns.ErrNoUpstream) {
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
// (toolinput.StripHeaders). Policy decides on the stripped header.
func stripRequestHeaders(h http.Header) {
	stripHopByHop(h)
	for k := range h {
		if IsForwardingField(k) {
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

// IsForwardingField reports whether a field name, in any case, is one of
// forwardingFields or starts with X-Forwarded (X-Forwarded-For, -Host,
// -Proto, …, and the bare X-Forwarded) or X-Envoy- (Envoy trusts those from
// an internal peer).
func IsForwardingField(name string) bool {
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
