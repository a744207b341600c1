package egress

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/h1"
	"github.com/sluice-gw/sluice/gateway/mitm"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/scrub"
	"github.com/sluice-gw/sluice/policy"
)

// PlaceholderPrefix starts every placeholder: sluice:secret:NAME:RANDOM.
const PlaceholderPrefix = "sluice:secret:"

// Audit events of placeholders seen where they are not substituted.
const (
	evHostMismatch   = "placeholder_host_mismatch"
	evNotSubstituted = "placeholder_not_substituted"
	// evConnectionElsewhere refuses a request (errConnectionElsewhere).
	evConnectionElsewhere = "placeholder_connection_elsewhere"
)

// Interceptor is TLS interception of chosen CONNECT hosts and the
// placeholders bound to raw egress (egress.intercept, egress.placeholders).
type Interceptor struct {
	ca    *mitm.Authority
	hosts []string
	roots *x509.CertPool // nil: the system roots
	phs   []binding
}

// binding is one egress.placeholders entry with its placeholder.
type binding struct {
	cfg   config.Placeholder
	token string
}

// NewInterceptor loads (creating at first start) the CA and the
// placeholder key under egress.intercept.ca_dir. Nil when neither
// interception nor placeholders are configured.
func NewInterceptor(cfg *config.Config) (*Interceptor, error) {
	ic := cfg.Egress.Intercept
	if len(ic.Hosts) == 0 && len(cfg.Egress.Placeholders) == 0 {
		return nil, nil
	}
	ca, err := mitm.LoadOrCreate(ic.CADir, mitm.Options{})
	if err != nil {
		return nil, fmt.Errorf("egress.intercept.ca_dir: %w", err)
	}
	key, err := mitm.LoadOrCreateHMACKey(ic.CADir)
	if err != nil {
		return nil, fmt.Errorf("egress.intercept.ca_dir: %w", err)
	}
	in := &Interceptor{ca: ca, hosts: ic.Hosts}
	if ic.UpstreamCAFile != "" {
		pemData, err := os.ReadFile(ic.UpstreamCAFile)
		if err != nil {
			return nil, fmt.Errorf("egress.intercept.upstream_ca_file: %w", err)
		}
		in.roots = x509.NewCertPool()
		if !in.roots.AppendCertsFromPEM(pemData) {
			return nil, errors.New("egress.intercept.upstream_ca_file: no PEM certificate in the file")
		}
	}
	for _, p := range cfg.Egress.Placeholders {
		p.Secret = p.Name() // a connection's: its OAuth token's name, oauth2.SLUG
		in.phs = append(in.phs, binding{cfg: p, token: placeholderFor(key, p.Secret)})
	}
	return in, nil
}

// placeholderFor derives NAME's placeholder: stable per deployment (the
// key lives beside the CA), so sandboxd can be told it ahead of time, and
// unguessable without the key.
func placeholderFor(key []byte, name string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("sluice placeholder v1\x00" + name))
	return PlaceholderPrefix + name + ":" + hex.EncodeToString(m.Sum(nil)[:16])
}

// hostListed reports whether host is in list (exact names or "*.domain",
// which matches names under domain).
func hostListed(list []string, host string) bool {
	for _, h := range list {
		if h == host {
			return true
		}
		if d, ok := strings.CutPrefix(h, "*."); ok && strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// intercepts reports whether a tunnel to host is terminated: the host is
// in egress.intercept.hosts or the connect decision carries the
// obligation intercept: true.
func (in *Interceptor) intercepts(host string, d policy.Decision) bool {
	if in == nil {
		return false
	}
	if v, ok := d.Obligations["intercept"].(bool); ok && v {
		return true
	}
	return hostListed(in.hosts, host)
}

// credentialed reports whether any placeholder is bound to host.
func (in *Interceptor) credentialed(host string) bool {
	if in == nil {
		return false
	}
	for _, b := range in.phs {
		if hostListed(b.cfg.Hosts, host) {
			return true
		}
	}
	return false
}

// plan is what to do with the placeholders of one request.
type plan struct {
	subst  *binding // the binding substituted in its header, if any
	events []string // audit events for placeholders left alone
}

// errPlaceholderCRLF is D6: a placeholder next to a CR or LF.
var errPlaceholderCRLF = errors.New("a placeholder is next to a CR or LF")

// errConnectionElsewhere is D19: the placeholder of a person's OAuth
// connection in the header or target of a request to a host it is not
// bound to. Refused, not sent on unchanged as a secret's placeholder is:
// a person's token stands for their account, and its placeholder going
// anywhere else is an agent trying to move it.
var errConnectionElsewhere = errors.New("an OAuth connection's placeholder is not bound to this host")

// planFor finds every placeholder in hdr and the request target and
// decides which one, if any, is substituted: only the declared header's
// value, exactly prefix+placeholder, toward a bound host.
func (in *Interceptor) planFor(host string, hdr http.Header, target string) (plan, error) {
	var p plan
	if in == nil {
		return p, nil
	}
	unescaped, err := url.PathUnescape(target)
	if err != nil {
		unescaped = target
	}
	for i := range in.phs {
		b := &in.phs[i]
		bound := hostListed(b.cfg.Hosts, host)
		elsewhere := func() error {
			if bound {
				p.events = append(p.events, evNotSubstituted)
				return nil
			}
			p.events = append(p.events, evHostMismatch)
			if b.cfg.Connection != "" {
				return errConnectionElsewhere
			}
			return nil
		}
		if strings.Contains(target, b.token) || strings.Contains(unescaped, b.token) {
			if strings.ContainsAny(unescaped, "\r\n") {
				return p, errPlaceholderCRLF
			}
			if err := elsewhere(); err != nil {
				return p, err
			}
		}
		for k, vs := range hdr {
			for _, v := range vs {
				if !strings.Contains(v, b.token) {
					continue
				}
				if strings.ContainsAny(v, "\r\n") {
					return p, errPlaceholderCRLF
				}
				if bound && http.CanonicalHeaderKey(b.cfg.Header) == k && len(vs) == 1 && v == b.cfg.Prefix+b.token && p.subst == nil {
					p.subst = b
					continue
				}
				if err := elsewhere(); err != nil {
					return p, err
				}
			}
		}
	}
	return p, nil
}

// tokenDetector passes a body through and notes which placeholders went
// by, across read boundaries.
type tokenDetector struct {
	r      io.ReadCloser
	tokens []string
	tail   []byte
	seen   []atomic.Bool
	done   func() // called once, at EOF or Close
	once   sync.Once
}

func newTokenDetector(r io.ReadCloser, in *Interceptor, done func()) *tokenDetector {
	d := &tokenDetector{r: r, seen: make([]atomic.Bool, len(in.phs)), done: done}
	for _, b := range in.phs {
		d.tokens = append(d.tokens, b.token)
	}
	return d
}

func (d *tokenDetector) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if n > 0 {
		buf := append(d.tail, p[:n]...)
		keep := 0
		for i, t := range d.tokens {
			if bytes.Contains(buf, []byte(t)) {
				d.seen[i].Store(true)
			}
			keep = max(keep, len(t)-1)
		}
		if len(buf) > keep {
			buf = buf[len(buf)-keep:]
		}
		d.tail = append(d.tail[:0], buf...)
	}
	if err != nil && d.done != nil {
		d.once.Do(d.done)
	}
	return n, err
}

func (d *tokenDetector) Close() error {
	err := d.r.Close()
	if d.done != nil {
		d.once.Do(d.done)
	}
	return err
}

// events returns the audit events of the placeholders the body carried.
func (d *tokenDetector) events(in *Interceptor, host string) []string {
	var ev []string
	for i := range d.seen {
		if !d.seen[i].Load() {
			continue
		}
		if hostListed(in.phs[i].cfg.Hosts, host) {
			ev = append(ev, evNotSubstituted)
		} else {
			ev = append(ev, evHostMismatch)
		}
	}
	return ev
}

// replayConn reads the bytes already consumed (the ClientHello) first.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// oneConnListener hands out one connection, then blocks until it is closed.
type oneConnListener struct {
	conn net.Conn
	once sync.Once
	done chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.conn })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// intercepted is the Proxy's side of a tunnel it intercepts: the TLS it
// terminates, each request inside (decided, with placeholders swapped, and
// scrubbed) and WebSocket upgrades (intercept_ws.go).
type intercepted struct{ *Proxy }

// intercept terminates the tunnel's TLS with a leaf for the CONNECT host
// and serves every HTTP request in it through interceptRequest. Upstream
// connections go to exactly the classified address, over TLS verified
// against the system roots (or egress.intercept.upstream_ca_file).
func (e intercepted) intercept(ctx context.Context, tunnel *egressCall, conn net.Conn, r io.Reader, addr netip.Addr) error {
	in := e.d.Interceptor
	leaf, err := in.ca.Leaf(tunnel.DestHost)
	if err != nil {
		return err
	}
	tconn := tls.Server(&replayConn{Conn: conn, r: r}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	hctx, cancel := context.WithTimeout(ctx, e.hello)
	err = tconn.HandshakeContext(hctx)
	cancel()
	if err != nil {
		return fmt.Errorf("intercept: handshake: %w", err)
	}
	_ = conn.SetDeadline(time.Time{})
	dialAddr := netip.AddrPortFrom(addr, uint16(tunnel.Port)).String()
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return e.dialer.DialContext(ctx, "tcp", dialAddr, nil) // never allow_private
		},
		TLSClientConfig:        &tls.Config{RootCAs: in.roots, ServerName: tunnel.DestHost, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    e.hello,
		DisableCompression:     true,
		ForceAttemptHTTP2:      true, // HTTP/2 when the upstream offers it (gRPC needs it end to end)
		MaxIdleConnsPerHost:    2,
		IdleConnTimeout:        e.idle,
		ResponseHeaderTimeout:  e.d.Config.Gateway.UpstreamTimeout.Std(),
		MaxResponseHeaderBytes: 64 << 10,
	}
	defer tr.CloseIdleConnections()
	ln := &oneConnListener{conn: tconn, done: make(chan struct{})}
	var closed sync.Once
	var switched sync.WaitGroup // WebSocket relays, which outlive Serve
	defer switched.Wait()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e.interceptRequest(w, r, tunnel, tr, &switched)
		}),
		ReadHeaderTimeout: e.hello,
		IdleTimeout:       e.idle,
		MaxHeaderBytes:    64 << 10,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: interceptStreams},
		ErrorLog:          log.New(io.Discard, "", 0),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				closed.Do(func() { close(ln.done) })
			}
		},
	}
	_ = srv.Serve(ln)
	return nil
}

// interceptRequest decides and sends one request of an intercepted tunnel.
func (e intercepted) interceptRequest(w http.ResponseWriter, r *http.Request, tunnel *egressCall, tr *http.Transport, switched *sync.WaitGroup) {
	ctx := r.Context()
	in := e.d.Interceptor
	c := newEgressCall(refusal.NewRequestID(), time.Now(), call.KindHTTP)
	c.setCaller(tunnel.caller)
	c.Listener = tunnel.Listener // the tunnel's connection's
	c.TraceID = tunnel.TraceID   // a request inside the tunnel is in the tunnel's trace
	c.DestHost, c.Port = tunnel.DestHost, tunnel.Port
	c.SetResolvedIP(tunnel.ResolvedIP())
	if err := checkProxyRequest(r); err != nil {
		e.refuse(w, c, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "malformed request: "+err.Error()))
		return
	}
	if !strings.HasPrefix(r.RequestURI, "/") {
		e.refuse(w, c, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "only origin-form request targets are served inside a tunnel"))
		return
	}
	if h, p, err := parseTarget(r.Host, strconv.Itoa(tunnel.Port)); err != nil || h != tunnel.DestHost || p != tunnel.Port {
		c.Event = "host_mismatch"
		e.refuse(w, c, egressRefuse(http.StatusForbidden, refusal.EgressDenied, psDenied, "the Host header does not name the CONNECT host"))
		return
	}
	path, ee := c.path(r)
	if ee != nil {
		e.refuse(w, c, ee)
		return
	}
	hdr := r.Header.Clone()
	stripRequestHeaders(hdr)
	if headerToken(r.Header, "Te", "trailers") {
		hdr.Set("Te", "trailers") // the one TE that survives a hop: gRPC asks for it
	}
	key := wsKey(r)
	if key != "" {
		if err := checkWSHandshake(r); err != nil {
			e.refuse(w, c, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "malformed request: "+err.Error()))
			return
		}
		hdr.Set("Upgrade", "websocket") // policy sees what is asked for
	}
	if ee := e.decide(ctx, c, policy.Request{Method: r.Method, Host: c.DestHost, Port: c.Port, Path: path.decoded, Query: r.URL.Query(), Headers: hdr}); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	pl, err := in.planFor(c.DestHost, hdr, r.RequestURI)
	if errors.Is(err, errConnectionElsewhere) {
		// Its own record (the decision record's reason is the rule's),
		// then the refusal's.
		ee := egressRefuse(http.StatusForbidden, refusal.EgressDenied, psDenied, err.Error())
		if aerr := e.record(ctx, c, evConnectionElsewhere, ee.Error, true); aerr != nil {
			ee = aerr
		}
		e.refuse(w, c, ee)
		return
	}
	if err != nil {
		c.Event = "placeholder_crlf"
		ee := egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "malformed request: "+err.Error())
		e.refuse(w, c, ee)
		return
	}
	var scr *scrub.Scrubber
	if b := pl.subst; b != nil {
		sec, err := e.d.Credential(ctx, b.cfg.Secret, c.caller)
		if err != nil {
			ee := egressRefuse(http.StatusServiceUnavailable, refusal.CredentialUnavailable, psDenied, "the secret bound to this placeholder is unavailable")
			ee.Wrap(err)
			e.refuse(w, c, ee)
			return
		}
		v := sec.Reveal()
		if len(v) == 0 || bytes.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			c.Event = "secret_crlf"
			e.refuse(w, c, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "the secret bound to this placeholder cannot be sent in a header"))
			return
		}
		scr = scrub.New(v)
		if scr.Ignored() > 0 {
			e.refuse(w, c, egressRefuse(http.StatusServiceUnavailable, refusal.CredentialUnavailable, psDenied, "the secret bound to this placeholder is too short to be protected"))
			return
		}
		hdr.Set(b.cfg.Header, b.cfg.Prefix+string(v))
		// The reply must be readable to be scrubbed: uncoded (an absent
		// Accept-Encoding means any coding, RFC 9110 12.5.3) and whole (a
		// range could hold part of the secret).
		hdr.Set("Accept-Encoding", "identity")
		hdr.Del("Range")
		hdr.Del("If-Range")
	}
	if ee := e.record(ctx, c, call.EventDecision, nil, true); ee != nil {
		e.refuse(w, c, ee)
		return
	}
	for _, ev := range pl.events {
		if ee := e.record(ctx, c, ev, nil, true); ee != nil {
			e.refuse(w, c, ee)
			return
		}
	}
	authority := c.DestHost
	if c.Port != 443 {
		authority = net.JoinHostPort(c.DestHost, strconv.Itoa(c.Port))
	}
	out := r.Clone(httptraceEgress(ctx, c))
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host, out.URL.User = "https", authority, nil
	if err := path.setOn(out.URL); err != nil { // exactly the path policy decided on
		e.refuse(w, c, egressRefuse(http.StatusInternalServerError, refusal.SchemaViolation, psBadRequest, err.Error()))
		return
	}
	out.Host = authority
	out.Header = hdr
	if key != "" {
		wsUpgradeHeaders(hdr, scr != nil)
	}
	if r.ContentLength == 0 {
		out.Body = nil
	} else if len(in.phs) > 0 {
		// The body streams upstream; the placeholders it carried are
		// audited once it has been read to the end (or abandoned).
		var det *tokenDetector
		det = newTokenDetector(r.Body, in, func() {
			for _, ev := range det.events(in, c.DestHost) {
				_ = e.record(context.WithoutCancel(ctx), c, ev, nil, false)
			}
		})
		out.Body = det
	}
	var bb *h1.BoundedBody // the inner request's body bound (B10)
	if out.Body != nil && out.Body != http.NoBody {
		gc := e.d.Config.Gateway
		bb = h1.Bound(out.Body, http.NewResponseController(w),
			h1.BodyLimit{Timeout: gc.RequestBodyTimeout.Std(), MinRate: gc.RequestBodyMinRate})
		out.Body = bb
	}
	resp, err := tr.RoundTrip(out)
	if err != nil {
		ee := dialRefusal(c, err)
		if bb != nil && bb.TimedOut() {
			c.Event = "request_timeout"
			ee = egressRefuse(http.StatusRequestTimeout, refusal.RequestTimeout, psBadRequest, fmt.Sprintf(
				"the request body did not arrive in time: %s plus a second per %d bytes (gateway.request_body_timeout, gateway.request_body_min_rate)",
				bb.Limit().Timeout, bb.Limit().MinRate))
			w.Header().Set("Connection", "close")
		}
		c.Status = ee.Status
		_ = e.record(context.WithoutCancel(ctx), c, call.EventResult, ee.Error, false)
		e.logLine(c, ee)
		w.Header().Set("Proxy-Status", fmt.Sprintf("%s; error=%s", proxyStatusN, ee.proxyStatus))
		refusal.Write(w, ee.Error, c.RequestID)
		return
	}
	c.UpstreamStatus = resp.StatusCode
	e.d.UpstreamAnswered("", "intercept", resp.StatusCode)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		e.relayWebSocket(w, c, key, resp, scr, switched)
		return
	}
	defer resp.Body.Close()
	stripHopByHop(resp.Header)
	reflected := false
	var body []byte
	if scr != nil {
		limit := e.d.Config.Gateway.MaxResponseBytes
		body, err = io.ReadAll(io.LimitReader(resp.Body, limit+1))
		if err != nil || int64(len(body)) > limit {
			e.upstreamFailed(w, c, fmt.Sprintf("the upstream reply could not be read whole (limit %d bytes) to be checked for the secret", limit))
			return
		}
		// The one check tool calls pass too (THREATS D11).
		var bf bool
		if body, bf, err = scr.Reply(resp.Header, body, limit); err != nil {
			c.UpstreamErr = scrub.ReplyReason(err)
			e.upstreamFailed(w, c, err.Error())
			return
		}
		tf := scr.Header(resp.Trailer)
		reflected = bf || tf
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	c.Status = resp.StatusCode
	if reflected {
		e.d.Reflected.Add(ctx, 1)
		if ee := e.record(ctx, c, call.EventSecretReflected, nil, false); ee != nil {
			e.refuse(w, c, ee)
			return
		}
	}
	w.WriteHeader(resp.StatusCode)
	if scr != nil {
		n, _ := w.Write(body)
		c.BytesDown.Add(int64(n))
	} else {
		c.BytesDown.Add(copyResponse(w, resp.Body, resp.ContentLength < 0))
	}
	// Trailers (gRPC's status) are known once the body is read; a
	// scrubbed reply's were scrubbed with it.
	for k, vs := range resp.Trailer {
		if !isHopByHop(k) {
			w.Header()[http.TrailerPrefix+k] = vs
		}
	}
	// As in forward: the decision was written before the dial and the
	// answer is relayed, so the result's fsync gates nothing.
	go func() { _ = e.record(context.WithoutCancel(ctx), c, call.EventResult, nil, false) }()
	e.logLine(c, nil)
}

// upstreamFailed answers 502 for a reply that cannot be relayed safely.
func (e intercepted) upstreamFailed(w http.ResponseWriter, c *egressCall, msg string) {
	ee := egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psConnect, msg)
	c.Status = ee.Status
	_ = e.record(context.Background(), c, call.EventResult, ee.Error, false)
	e.logLine(c, ee)
	w.Header().Set("Proxy-Status", fmt.Sprintf("%s; error=%s", proxyStatusN, ee.proxyStatus))
	refusal.Write(w, ee.Error, c.RequestID)
}

// CACertPEM is the interception CA's certificate in PEM, for sandbox
// trust stores; nil when interception is off.
func (in *Interceptor) CACertPEM() []byte {
	if in == nil {
		return nil
	}
	return in.ca.CertPEM()
}

// Placeholder is one entry of GET /api/v1/placeholders.
type Placeholder struct {
	Secret      string   `json:"secret"`
	Placeholder string   `json:"placeholder"`
	Hosts       []string `json:"hosts"`
	Header      string   `json:"header"`
	Prefix      string   `json:"prefix,omitempty"`
}

// Placeholders lists the egress.placeholders entries with the placeholder
// each stands as; empty when none are configured.
func (in *Interceptor) Placeholders() []Placeholder {
	views := []Placeholder{}
	if in != nil {
		for _, b := range in.phs {
			views = append(views, Placeholder{Secret: b.cfg.Secret, Placeholder: b.token, Hosts: b.cfg.Hosts, Header: b.cfg.Header, Prefix: b.cfg.Prefix})
		}
	}
	return views
}
