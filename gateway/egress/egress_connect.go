package egress

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// connect serves CONNECT host:port: port and policy first, then the
// destination is resolved and every address classified (403 before any
// 200), then the tunnel is answered, the client's ClientHello read and its
// SNI held to the CONNECT host, and only then exactly the classified
// address is dialled and the hello replayed to it.
func (e *Proxy) connect(w http.ResponseWriter, r *http.Request, c *egressCall, id wire.Identity) {
	ctx := r.Context()
	// The request target as sent (authority-form, RFC 9112 3.2.3), not Go's
	// parse of it: userinfo, a path or a second authority are refused here.
	host, port, err := parseTarget(r.RequestURI, "")
	if err != nil {
		e.refuse(w, c, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "bad CONNECT target: "+err.Error()))
		return
	}
	c.DestHost, c.Port = host, port
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
	// What the tunnel holds is released when connect returns, or by the
	// relay once it has taken the tunnel over (below).
	var cleanup []func()
	defer func() { runCleanup(cleanup) }()
	cleanup = append(cleanup, release)
	if ee := e.decide(ctx, c, policy.Request{Method: http.MethodConnect, Host: host, Port: port}); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	addr, err := e.classify(ctx, host)
	if err != nil {
		e.refuse(w, c, dialRefusal(c, err))
		return
	}
	c.SetResolvedIP(addr.String())
	if ee := e.record(ctx, c, call.EventDecision, nil, true); ee != nil {
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
	cleanup = append(cleanup, func() { _ = conn.Close() })
	lt := e.live.add(conn)
	cleanup = append(cleanup, lt.done) // after the result record below
	c.Status = http.StatusOK
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
		c.Event = "sni_mismatch"
		ee := egressRefuse(http.StatusForbidden, refusal.EgressDenied, psTLS, "the TLS ClientHello does not name the CONNECT host")
		ee.Wrap(err)
		_ = e.record(actx, c, "sni_mismatch", ee.Error, false)
		e.logLine(c, ee)
		return
	}
	if e.d.Interceptor.intercepts(host, c.decision) {
		// TLS interception (intercept.go): every request in the tunnel is
		// decided, credentialed and audited on its own.
		c.Event = "intercepted"
		// Read past the server's bufio.Reader: its connReader would take
		// the inner server's read-deadline aborts for a dead connection
		// and cancel ctx.
		buffered, _ := brw.Reader.Peek(brw.Reader.Buffered())
		ierr := intercepted{e}.intercept(ctx, c, conn, io.MultiReader(bytes.NewReader(hello), bytes.NewReader(buffered), conn), addr)
		ee := e.endedDuring(actx, c)
		if ierr != nil && ee == nil {
			ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psTLS, "the intercepted tunnel could not be set up")
			ee.Wrap(ierr)
		}
		var ref *refusal.Error
		if ee != nil {
			ref = ee.Error
		}
		_ = e.record(actx, c, call.EventResult, ref, false)
		e.logLine(c, ee)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, e.d.Config.Gateway.UpstreamTimeout.Std())
	up, err := e.dialer.DialContext(dctx, "tcp", netip.AddrPortFrom(addr, uint16(port)).String(), nil)
	cancel()
	if err != nil {
		ee := dialRefusal(c, err)
		_ = e.record(actx, c, call.EventResult, ee.Error, false)
		e.logLine(c, ee)
		return
	}
	cleanup = append(cleanup, func() { _ = up.Close() })
	lt.dialled(up)
	cleanup = append(cleanup, e.d.Track(c.caller.Session, up)) // the end of the session closes the upstream too
	_ = conn.SetDeadline(time.Time{})
	if _, err := up.Write(hello); err != nil {
		return
	}
	c.BytesUp.Add(int64(len(hello)))
	// The relay runs on and the handler returns: what net/http holds for
	// a connection it serves (its buffers, the request, a stack grown by
	// the decision) is freed for as long as the tunnel is held.
	owned := cleanup
	cleanup = nil
	go func(br *bufio.Reader) { // an argument, not a capture: not kept alive past its use
		defer runCleanup(owned)
		e.tunnel(conn, br, up, c)
		ee := e.endedDuring(actx, c)
		var ref *refusal.Error
		if ee != nil {
			ref = ee.Error
		}
		_ = e.record(actx, c, call.EventResult, ref, false)
		e.logLine(c, ee)
	}(brw.Reader)
}

// runCleanup runs fs last first, as defers would.
func runCleanup(fs []func()) {
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// lookup resolves host, A and AAAA, with the gateway's resolver, which
// caches answers (negative ones too) for their TTL and shares one query
// among concurrent lookups of a name (dns.Resolver); without dns.upstreams
// it asks the system resolver every time.
func (e *Proxy) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if e.res == nil {
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}
	return e.res.LookupNetIP(ctx, "ip", host)
}

// classify resolves host (or reuses its live answer) and checks every
// address, on every tunnel; one refused address refuses the name. It
// returns the address to dial.
func (e *Proxy) classify(ctx context.Context, host string) (netip.Addr, error) {
	if c := guard.NameClass(host); c != guard.Public {
		return netip.Addr{}, &guard.DeniedError{Host: host, Class: c}
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		lctx, cancel := context.WithTimeout(ctx, e.d.Config.Gateway.UpstreamTimeout.Std())
		defer cancel()
		addrs, err = e.lookup(lctx, host)
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

// tunnel relays an answered CONNECT's bytes until either side is done or
// the tunnel idles out. A handed-off sandbox TCP socket (or a TCP
// listener's own connection) and a TCP upstream are relayed socket to socket (relayTCP) once the bytes already buffered
// above the sandbox's socket are sent; anything else by splice.
func (e *Proxy) tunnel(conn net.Conn, br *bufio.Reader, up net.Conn, c *egressCall) {
	ic, _ := conn.(sandboxConn)
	var client, upstream *net.TCPConn
	if ic != nil {
		client, _ = ic.Socket().(*net.TCPConn)
	} else {
		client, _ = conn.(*net.TCPConn) // a TCP listener's connection, taken over
	}
	upstream, _ = up.(*net.TCPConn)
	if client == nil || upstream == nil || e.copyLoop.Load() {
		// Past the server's reader once its bytes are taken, as interception
		// does: a held tunnel does not keep its 4 KiB buffer.
		var clientR io.Reader = conn
		if pending, _ := br.Peek(br.Buffered()); len(pending) > 0 {
			clientR = io.MultiReader(bytes.NewReader(bytes.Clone(pending)), conn)
		}
		splice(conn, clientR, up, e.idle, &c.BytesUp, &c.BytesDown)
		return
	}
	// The server's reader first (after Hijack it holds every byte the
	// server took off the connection), then the connection's own.
	pending, _ := br.Peek(br.Buffered())
	if ic != nil {
		pending = append(pending[:len(pending):len(pending)], ic.Detach()...)
	}
	if len(pending) > 0 {
		if _, err := upstream.Write(pending); err != nil {
			return
		}
		c.BytesUp.Add(int64(len(pending)))
	}
	e.direct.Add(1)
	relayTCP(conn, client, upstream, e.idle, &c.BytesUp, &c.BytesDown, &e.bulk)
}
