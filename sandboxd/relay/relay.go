// Package relay opens a sandbox's only exits from the host side and relays
// them to the gateway: TCP listeners on 127.0.0.1 inside the sandbox's
// network namespace (the proxy/tool API port and the DNS port) and a
// per-sandbox Unix socket. Each accepted connection is handed to the
// gateway with one SLUICE-HANDOFF line and the connection's descriptor
// (SCM_RIGHTS), so the gateway reads and writes the sandbox's socket itself
// and sandboxd copies nothing; with Options.Copy, or once the gateway has
// refused a handoff, it is instead forwarded to the gateway's socket after
// one SLUICE-IDENTITY line and its bytes copied both ways. The listener a
// connection arrived on is its identity; no sluice code runs inside.
//
// The listeners are made by a host thread that briefly joins the sandbox's
// network namespace (setns) and leaves again; a socket keeps the namespace
// it was created in, so the sandbox sees 127.0.0.1:3128 and 127.0.0.1:53
// while every byte is handled by sandboxd outside it. The DNS port is
// answered by the dns stub, which forwards each question to the gateway's
// POST /v1/dns over the same identity-stamped socket.
package relay

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Defaults for zero-valued Options.
const (
	DefaultProxyPort   = 3128
	DefaultDNSPort     = 53
	DefaultMaxConns    = 64
	DefaultIdleTimeout = 5 * time.Minute
	DefaultDialTimeout = 5 * time.Second
)

// maxDNSAnswer bounds the body read from the gateway's /v1/dns.
const maxDNSAnswer = 65535

// Options say where to listen and whom to relay as.
type Options struct {
	NetNS    string        // the sandbox's network namespace: /proc/PID/ns/net or /run/netns/NAME
	Identity wire.Identity // sent as the preamble of every relayed connection
	Gateway  string        // the gateway's Unix socket (gateway.sandbox_socket)

	// GatewayAddr, when set, is a gateway on another host (its
	// gateway.relay_tls listener), reached over TLS with GatewayTLS
	// (wire.DialTLS) instead of Gateway. No descriptor crosses hosts:
	// every connection is copied.
	GatewayAddr string
	GatewayTLS  *tls.Config

	SocketPath string // host path of the per-sandbox Unix socket to create ("" = none); bind-mounted into the sandbox at /run/sluice/gateway.sock
	ProxyPort  int    // default 3128
	DNSPort    int    // default 53 (UDP and TCP), answered by the dns stub
	Logger     *slog.Logger

	MaxConns    int           // relayed connections open at once for this sandbox (a handed-off one until the gateway is done with it); more are closed at accept; default DefaultMaxConns
	IdleTimeout time.Duration // a copied connection with no bytes either way for this long is closed; default DefaultIdleTimeout (a handed-off connection's timeouts are the gateway's)

	// Copy relays every connection by copying its bytes through sandboxd
	// (the SLUICE-IDENTITY form) instead of handing it to the gateway. A
	// relay also switches to copying by itself the first time the gateway
	// answers a handoff with a refusal (a gateway that predates handoff).
	Copy bool

	// DNSCacheFor is how long the DNS stub reuses the gateway's positive
	// answer to an A or AAAA question (never past its TTL); 0 means
	// dns.DefaultCacheFor, a negative value asks the gateway every time.
	DNSCacheFor time.Duration
}

// Relay is one sandbox's set of listeners.
type Relay struct {
	opts   Options
	log    *slog.Logger
	sem    chan struct{}
	stub   *dns.Stub
	dnsFwd *dns.StreamForwarder
	client *http.Client
	tr     *http.Transport

	mu     sync.Mutex
	closed bool
	lns    []net.Listener
	pcs    []net.PacketConn
	conns  map[io.Closer]struct{} // accepted connections, leases, held sockets
	wg     sync.WaitGroup
	sockOK bool // SocketPath was created by us and must be removed

	copyOnly atomic.Bool // Options.Copy, or the gateway refused a handoff
}

// Open opens the listeners inside opts.NetNS and starts relaying. ctx bounds
// opening only; the relay runs until Close. Open fails closed: if any
// listener cannot be opened, none is left open.
func Open(ctx context.Context, opts Options) (*Relay, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("relay: open: %w", err)
	}
	if opts.NetNS == "" {
		return nil, errors.New("relay: open: netns is required")
	}
	if opts.Gateway == "" && opts.GatewayAddr == "" {
		return nil, errors.New("relay: open: gateway socket is required")
	}
	if opts.GatewayAddr != "" && opts.GatewayTLS == nil {
		return nil, errors.New("relay: open: a remote gateway needs its TLS configuration")
	}
	if err := notOwnNetNS(opts.NetNS); err != nil {
		return nil, fmt.Errorf("relay: open: %w", err)
	}
	if err := opts.Identity.Validate(); err != nil {
		return nil, fmt.Errorf("relay: open: %w", err)
	}
	if opts.ProxyPort == 0 {
		opts.ProxyPort = DefaultProxyPort
	}
	if opts.DNSPort == 0 {
		opts.DNSPort = DefaultDNSPort
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("sandbox", opts.Identity.Sandbox, "agent", opts.Identity.Agent)
	r := &Relay{
		opts:  opts,
		log:   log,
		sem:   make(chan struct{}, opts.MaxConns),
		conns: map[io.Closer]struct{}{},
	}
	r.copyOnly.Store(opts.Copy || opts.GatewayAddr != "")
	r.tr = &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return r.dialGateway(ctx) },
		MaxIdleConns:        2,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	r.client = &http.Client{Transport: r.tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// Questions stream to the gateway over a few kept connections, each
	// dialed with this sandbox's preamble; a gateway that refuses streams
	// gets one POST per question.
	r.dnsFwd = &dns.StreamForwarder{Dial: r.dialGateway, Fallback: r.forwardDNS}
	cacheFor := opts.DNSCacheFor
	if cacheFor == 0 {
		cacheFor = dns.DefaultCacheFor
	}
	r.stub = &dns.Stub{Forward: r.dnsFwd.Forward, Stream: r.dnsFwd, Logger: log, CacheFor: max(cacheFor, 0)}

	var proxy, dnsTCP net.Listener
	var dnsUDP net.PacketConn
	err := InNetNS(opts.NetNS, func() error {
		if err := loUp(); err != nil {
			return err
		}
		var err error
		if proxy, err = net.Listen("tcp", addr(opts.ProxyPort)); err != nil {
			return fmt.Errorf("relay: listen proxy: %w", err)
		}
		if dnsTCP, err = net.Listen("tcp", addr(opts.DNSPort)); err != nil {
			return fmt.Errorf("relay: listen dns tcp: %w", err)
		}
		if dnsUDP, err = net.ListenPacket("udp", addr(opts.DNSPort)); err != nil {
			return fmt.Errorf("relay: listen dns udp: %w", err)
		}
		return nil
	})
	for _, l := range []net.Listener{proxy, dnsTCP} {
		if l != nil {
			r.lns = append(r.lns, l)
		}
	}
	if dnsUDP != nil {
		r.pcs = append(r.pcs, dnsUDP)
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("relay: open: %w", err)
	}
	var sock net.Listener
	if opts.SocketPath != "" {
		if sock, err = r.listenSocket(opts.SocketPath); err != nil {
			r.Close()
			return nil, fmt.Errorf("relay: open: %w", err)
		}
		r.lns = append(r.lns, sock)
	}

	r.serve("proxy", proxy, r.handoffConn)
	if sock != nil {
		r.serve("socket", sock, r.handoffConn)
	}
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		if err := r.stub.ServeTCP(dnsTCP); err != nil {
			log.Error("relay: dns tcp stopped", "err", err)
		}
	}()
	go func() {
		defer r.wg.Done()
		// The stub's UDP server sets up its batch buffers (hundreds of
		// KB) as it starts: it starts with the first question, so a
		// sandbox that never asks one over UDP costs none of it.
		if !waitReadable(dnsUDP) {
			return // closed
		}
		if err := r.stub.ServeUDP(dnsUDP); err != nil {
			log.Error("relay: dns udp stopped", "err", err)
		}
	}()
	log.Info("relay open", "netns", opts.NetNS, "proxy_port", opts.ProxyPort, "dns_port", opts.DNSPort, "socket", opts.SocketPath)
	return r, nil
}

// waitReadable blocks until pc has something to read (or any error, such
// as being closed: then false), reading nothing.
func waitReadable(pc net.PacketConn) bool {
	sc, ok := pc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	waited := false
	err = rc.Read(func(uintptr) bool {
		if waited {
			return true
		}
		waited = true
		return false // wait for readiness, then return
	})
	return err == nil
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// listenSocket creates the per-sandbox Unix socket: mode 0666 (the sandbox's
// mapped uid must be able to connect) in a 0755 directory (nobody but root
// can replace it). A stale socket from an earlier run is replaced; any other
// file in the way is an error.
func (r *Relay) listenSocket(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("relay: socket dir: %w", err)
	}
	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("relay: socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("relay: socket %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("relay: socket: remove stale: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("relay: socket: %w", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	r.sockOK = true
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("relay: socket: chmod: %w", err)
	}
	return l, nil
}

func (r *Relay) serve(name string, l net.Listener, handle func(net.Conn)) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				r.log.Warn("relay: accept", "listener", name, "err", err)
				time.Sleep(20 * time.Millisecond)
				continue
			}
			select {
			case r.sem <- struct{}{}:
			default:
				r.log.Warn("relay: refused connection: too many open", "listener", name, "max_conns", r.opts.MaxConns)
				c.Close()
				continue
			}
			if !r.track(c) {
				c.Close()
				<-r.sem
				return
			}
			r.wg.Add(1)
			go func() {
				defer func() {
					r.untrack(c)
					c.Close()
					<-r.sem
					r.wg.Done()
				}()
				handle(c)
			}()
		}
	}()
}

// track registers c so Close can cut it; false once the relay is closed.
func (r *Relay) track(c io.Closer) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c io.Closer) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// dialGateway connects to the gateway socket and writes the preamble.
func (r *Relay) dialGateway(ctx context.Context) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultDialTimeout)
	defer cancel()
	var gc net.Conn
	var err error
	if r.opts.GatewayAddr != "" {
		gc, err = wire.DialTLS(ctx, r.opts.GatewayAddr, r.opts.GatewayTLS, r.opts.Identity)
	} else {
		gc, err = wire.Dial(ctx, r.opts.Gateway, r.opts.Identity)
	}
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	return gc, nil
}

// handoffConn passes c to the gateway (wire.Handoff) and waits until the
// gateway is done with it: the gateway closes the lease when it closes its
// copy of c, and only then are c's slot and the relay's copy released. The
// relay's own copy is kept so that Close can shut the socket down. A gateway
// that answers the handoff with bytes instead of serving it refused it
// before touching c, and the relay copies c's bytes instead; if the answer
// does not name handoffs (an older gateway reads the line as a malformed
// identity preamble), every later connection is copied straight away.
func (r *Relay) handoffConn(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok || r.copyOnly.Load() {
		r.relayConn(c)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultDialTimeout)
	lease, err := wire.Handoff(ctx, r.opts.Gateway, r.opts.Identity, sc)
	cancel()
	if err != nil {
		r.log.Warn("relay: gateway unreachable; answered 503", "err", fmt.Errorf("relay: %w", err))
		gatewayUnavailable(c)
		return
	}
	if !r.track(lease) {
		lease.Close()
		return
	}
	defer func() { r.untrack(lease); lease.Close() }()
	// The gateway reads and writes the socket now. The relay's descriptor
	// leaves Go's poller (held): registered, every segment the gateway
	// sends or receives on the socket would wake this process, a wake-up
	// per request for a socket it never touches again.
	h := hold(c)
	if h != nil {
		if !r.track(h) {
			h.Close()
			return
		}
		defer func() { r.untrack(h); h.Close() }()
	}
	var answer [512]byte
	n, _ := lease.Read(answer[:])
	if n == 0 {
		return // the gateway is done with c, or Close cut the lease
	}
	if h != nil {
		if c = h.conn(); c == nil || !r.track(c) {
			if c != nil {
				c.Close()
			}
			return
		}
		defer func() { r.untrack(c); c.Close() }()
	}
	// The gateway answered instead: read the rest of its (short) refusal;
	// it half-closes right after writing it.
	_ = lease.SetReadDeadline(time.Now().Add(time.Second))
	m, _ := io.ReadFull(lease, answer[n:])
	n += m
	line, _, _ := bytes.Cut(answer[:n], []byte("\r\n"))
	// A gateway that knows handoffs names them in its refusal: this one
	// connection could not be passed (say, no descriptor was free), so
	// only it is copied. Any other answer is a gateway that predates
	// handoff: copy from now on.
	if bytes.Contains(answer[:n], []byte(wire.HandoffPrefix[:len(wire.HandoffPrefix)-1])) {
		r.log.Warn("relay: gateway refused a handoff; copying this connection's bytes", "answer", string(line))
	} else if r.copyOnly.CompareAndSwap(false, true) {
		r.log.Warn("relay: gateway does not take handoffs; copying connection bytes from now on", "answer", string(line))
	}
	r.untrack(lease)
	lease.Close()
	r.relayConn(c)
}

// relayConn connects c to the gateway and copies both ways until both
// sides have finished or the connection has been idle for IdleTimeout.
func (r *Relay) relayConn(c net.Conn) {
	gc, err := r.dialGateway(context.Background())
	if err != nil {
		r.log.Warn("relay: gateway unreachable; answered 503", "err", err)
		gatewayUnavailable(c)
		return
	}
	if !r.track(gc) {
		gc.Close()
		return
	}
	defer func() { r.untrack(gc); gc.Close() }()
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	errc := make(chan error, 2)
	go func() { errc <- pipe(gc, c, r.opts.IdleTimeout, &last) }()
	go func() { errc <- pipe(c, gc, r.opts.IdleTimeout, &last) }()
	for range 2 {
		if err := <-errc; err != nil {
			// One direction failed or went idle: cut both.
			c.Close()
			gc.Close()
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				r.log.Info("relay: connection idle, closed")
			}
		}
	}
}

type closeWriter interface{ CloseWrite() error }

// pipe copies src to dst. On src's EOF it half-closes dst and returns nil;
// a read that times out ends the pipe only if neither direction has moved a
// byte for idle (last is shared by both directions).
func pipe(dst, src net.Conn, idle time.Duration, last *atomic.Int64) error {
	buf := make([]byte, 32<<10)
	for {
		src.SetReadDeadline(time.Now().Add(idle))
		n, err := src.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			dst.SetWriteDeadline(time.Now().Add(idle))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
			last.Store(time.Now().UnixNano())
		}
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			if cw, ok := dst.(closeWriter); ok {
				if err := cw.CloseWrite(); err != nil {
					return err
				}
				return nil
			}
			return io.EOF
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < idle {
			continue
		}
		return err
	}
}

// shutdown shuts c's socket down both ways, for every descriptor of it.
func shutdown(c io.Closer) {
	if h, ok := c.(*heldSocket); ok {
		h.shutdown()
		return
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

// heldSocket is the relay's descriptor of a socket handed to the gateway:
// a bare duplicate outside Go's poller, kept only so that Close can shut
// the socket down (and so that a refused handoff can still be copied).
type heldSocket struct {
	mu sync.Mutex
	fd int // -1 once closed or given back as a net.Conn
}

// hold duplicates c's descriptor and closes c, which takes c's socket out
// of this process's poller; nil (c untouched) if the duplicate fails.
func hold(c net.Conn) *heldSocket {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	fd, derr := -1, error(nil)
	if err := raw.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || derr != nil {
		return nil
	}
	_ = c.Close()
	return &heldSocket{fd: fd}
}

func (h *heldSocket) shutdown() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd >= 0 {
		_ = unix.Shutdown(h.fd, unix.SHUT_RDWR)
	}
}

func (h *heldSocket) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return nil
	}
	err := unix.Close(h.fd)
	h.fd = -1
	return err
}

// conn gives the descriptor back as a net.Conn (in the poller again), for
// a handoff the gateway refused; nil once closed.
func (h *heldSocket) conn() net.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return nil
	}
	f := os.NewFile(uintptr(h.fd), "handoff")
	h.fd = -1
	c, err := net.FileConn(f) // a duplicate of its own
	f.Close()
	if err != nil {
		return nil
	}
	return c
}

// forwardDNS POSTs one query to the gateway's /v1/dns over an
// identity-stamped connection. Anything but 200 with a DNS message is an
// error, which the stub turns into REFUSED.
func (r *Relay) forwardDNS(ctx context.Context, query []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://sluice/v1/dns", bytes.NewReader(query))
	if err != nil {
		return nil, fmt.Errorf("relay: dns request: %w", err)
	}
	req.Header.Set("Content-Type", "application/dns-message")
	req.Header.Set("Accept", "application/dns-message")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("relay: dns request: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDNSAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("relay: dns answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("relay: dns answer: gateway status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/dns-message" {
		return nil, fmt.Errorf("relay: dns answer: content type %q", ct)
	}
	if len(body) > maxDNSAnswer {
		return nil, errors.New("relay: dns answer: too large")
	}
	return body, nil
}

// Close closes every listener and every relayed connection, and removes the
// per-sandbox socket. It waits for the relay's goroutines.
func (r *Relay) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	var errs []error
	for _, l := range r.lns {
		if err := l.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, pc := range r.pcs {
		if err := pc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for c := range r.conns {
		// A handed-off connection's socket is also open in the gateway:
		// closing our descriptor alone would not end it, shutting the
		// socket down does (the gateway reads EOF, the sandbox sees the
		// connection end). Harmless for copied and lease connections.
		shutdown(c)
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	if r.dnsFwd != nil {
		r.dnsFwd.Close()
	}
	if r.tr != nil {
		r.tr.CloseIdleConnections()
	}
	if r.sockOK {
		if err := os.Remove(r.opts.SocketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("relay: close: %w", err)
	}
	r.log.Info("relay closed")
	return nil
}

// unavailableBody is the refusal a sandbox gets when the gateway cannot
// be reached (stopped, restarting, its socket gone): the error shape the
// gateway itself uses, so the agent's client reads one kind of refusal.
const unavailableBody = `{"error":{"code":"gateway_unavailable","message":"the sluice gateway cannot be reached; nothing was sent, try again later","request_id":""}}` + "\n"

// gatewayUnavailable answers c, whose client speaks HTTP on both of the
// relay's stream listeners, with 503 gateway_unavailable and closes it
// gently. It waits (briefly) for the request's first bytes before
// answering: an HTTP client that reads an answer on a connection it has
// not sent on yet takes it for a broken connection. Then its write side
// closes first and what remains is drained a little, so that the close
// does not become a reset that would lose the answer.
func gatewayUnavailable(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var first [4096]byte
	_, _ = c.Read(first[:])
	_ = c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s",
		len(unavailableBody), unavailableBody)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}
