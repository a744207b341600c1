// Package ingress is the sandbox socket: the one entrance every request of
// a sandbox passes. It accepts a connection only from a trusted relay
// (SO_PEERCRED uid, or relay mTLS on a TCP listener), reads the identity
// preamble or takes a handed-off socket, puts the identity in canonical
// form, caps open connections, and checks every request head byte for
// byte before Go's HTTP server parses it (StrictHeads). Identity comes
// from nowhere else: handlers read it with IdentityFrom.
//
// ingress imports no other entrance and nothing of the gateway root; its
// floors are gateway/refusal and gateway/h1.
package ingress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/gateway/h1"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// preambleTimeout bounds how long a relay may take to send its identity or
// handoff line.
const preambleTimeout = 5 * time.Second

// DefaultHandoffIdle closes a handed-off connection on which no byte has moved
// either way for this long (checked every DefaultHandoffIdle, so cut between one
// and two periods). It is the backstop the relay's idle timeout used to be
// (relay.DefaultIdleTimeout) for a request stalled mid-body or a response
// the sandbox stopped reading; the http.Server's header and keep-alive
// timeouts and the CONNECT tunnel's idle watchdog still apply first.
const DefaultHandoffIdle = 5 * time.Minute

// Conn is an accepted sandbox connection whose relay was trusted and
// whose identity preamble was read. Reads continue from the buffer that
// held the preamble so no request bytes are lost.
//
// For a handoff, Conn is the sandbox's own socket (a *net.TCPConn from the
// proxy port, a *net.UnixConn from the per-sandbox socket) and lease is the
// relay's Unix connection that passed it: both close together, which is
// how the relay learns the gateway is done, and the relay closing the lease
// closes the connection.
type Conn struct {
	net.Conn
	r  *bufio.Reader
	id wire.Identity

	base   *bufio.Reader // the reader over Conn itself; r may wrap it (strictHeads)
	lease  *net.UnixConn // nil unless handed off
	moved  atomic.Uint64 // Read and Write calls, for the idle watchdog
	tunnel atomic.Bool   // detached into a byte tunnel with its own idle watchdog
	idle   atomic.Pointer[time.Timer]
	closed atomic.Bool
	once   sync.Once
	// untrack removes the connection from the server's sessionConns; set
	// when the server takes the connection (Server.connContext).
	untrack atomic.Pointer[func()]

	release func() // gives back the connection's places under the caps (nil: none taken)
	relOnce sync.Once

	hosted *hostedState // a hosted sandbox's credential (hosted.go); nil for a relayed connection
	expiry *time.Timer  // closes a hosted connection when its token expires
}

func (c *Conn) Read(p []byte) (int, error) {
	if c.lease != nil {
		c.moved.Add(1)
	}
	return c.r.Read(p)
}

func (c *Conn) Write(p []byte) (int, error) {
	if c.lease != nil {
		c.moved.Add(1)
	}
	return c.Conn.Write(p)
}

// detach hands the connection to a byte tunnel that reads and writes
// its socket directly (raw egress's relayTCP): it returns the bytes its readers
// took from the socket that nobody has read yet, in order, which the
// tunnel must send first, and marks the connection a tunnel, so the
// listener's watchdog no longer cuts it for want of Read and Write calls
// (the tunnel's own idle watchdog does; Close still ends both). Nothing
// may read through c afterwards.
//
// r is base or, after strictHeads, a bufio.Reader over a headChecker
// over base; a CONNECT head put the checker in stPass, where it passes
// bytes through and holds none, so r's and then base's buffers are all
// there is.
func (c *Conn) Detach() []byte {
	c.tunnel.Store(true)
	var pending []byte
	if c.r != c.base {
		b, _ := c.r.Peek(c.r.Buffered())
		pending = append(pending, b...)
	}
	b, _ := c.base.Peek(c.base.Buffered())
	pending = append(pending, b...)
	return pending
}

// Identity is the relayed identity the connection was admitted with.
func (c *Conn) Identity() wire.Identity { return c.id }

// Socket is the connection's own socket beneath the readers that took
// its preamble (for a handoff, the sandbox's socket): a tunnel writes and
// half-closes it directly after Detach. Closing must still go through
// the Conn, which also ends a handoff's lease.
func (c *Conn) Socket() net.Conn { return c.Conn }

// OnClose sets f to run once when the connection closes (the server's
// registry of connections per session removes it); a later call replaces
// an f that has not run.
func (c *Conn) OnClose(f func()) { c.untrack.Store(&f) }

// Close closes the connection and, for a handoff, shuts the socket down
// first: the relay still holds a descriptor of it, so closing ours alone
// would leave the sandbox waiting. Then the lease is closed.
func (c *Conn) Close() error {
	if f := c.untrack.Swap(nil); f != nil {
		(*f)()
	}
	if c.release != nil {
		c.relOnce.Do(c.release)
	}
	if c.expiry != nil {
		c.expiry.Stop()
	}
	if c.lease == nil {
		return c.Conn.Close()
	}
	var err error
	c.once.Do(func() {
		c.closed.Store(true)
		if sc, ok := c.Conn.(syscall.Conn); ok {
			if raw, rerr := sc.SyscallConn(); rerr == nil {
				_ = raw.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
			}
		}
		err = c.Conn.Close()
		_ = c.lease.Close()
		if t := c.idle.Load(); t != nil {
			t.Stop()
		}
	})
	return err
}

// watch closes a handed-off connection when the relay closes the lease
// (its Close, or its process ending), when the relay sends anything on it
// (it never does), or when no Read or Write has happened for a whole
// period of idle.
func (c *Conn) watch(idle time.Duration) {
	c.arm(idle, c.moved.Load())
	go func() {
		var b [1]byte
		_, _ = c.lease.Read(b[:])
		_ = c.Close()
	}()
}

// arm starts the idle check: after idle, the connection is closed unless
// a Read or Write happened since moved was seen, in which case it re-arms.
func (c *Conn) arm(idle time.Duration, seen uint64) {
	c.idle.Store(time.AfterFunc(idle, func() {
		if c.closed.Load() {
			return
		}
		if n := c.moved.Load(); n != seen || c.tunnel.Load() {
			// A detached tunnel moves its bytes below Read and Write;
			// its own watchdog (splice's egress.idle_timeout) closes it,
			// and Close stops this one.
			c.arm(idle, n)
			return
		}
		_ = c.Close()
	}))
}

// Listener accepts on the gateway's Unix socket and yields only
// connections from a trusted relay (SO_PEERCRED uid in the trusted set)
// that began with a valid identity preamble. Everything else is answered
// with a clear error and closed. Identity comes from nowhere else.
type Listener struct {
	ln      *net.UnixListener
	trusted map[uint32]bool
	log     *slog.Logger
	conns   chan *Conn
	done    chan struct{}
	once    sync.Once
	refused func(code refusal.Code) // metrics hook
	idle    time.Duration           // handed-off connections: DefaultHandoffIdle
	lim     listenLimits

	open      atomic.Int64   // connections accepted and not yet closed
	mu        sync.Mutex     // guards bySandbox
	bySandbox map[string]int // open identified connections per sandbox
	warned    atomic.Int64   // unix seconds of the last over-cap log line
	quiet     atomic.Int64   // over-cap refusals not logged since

	hosted HostedOptions  // gateway.hosted's hooks, set by ListenHosted (hosted.go)
	budget *refusalBudget // of refusals naming no token, set by ListenHosted (hosted_budget.go)
}

// listenLimits are the sandbox socket's bounds on open connections and
// on how long a request body may take (THREATS B10). Zero values: no cap.
type listenLimits struct {
	maxConns      int // open connections in total: more are 503 gateway_busy
	maxPerSandbox int // open connections of one sandbox: more are 429 too_many_connections
	body          h1.BodyLimit
}

// Options configure Listen.
type Options struct {
	Socket      string             // the Unix socket path (gateway.sandbox_socket)
	TrustedUIDs []uint32           // relay uids trusted by SO_PEERCRED (gateway.trusted_relay_uids)
	Log         *slog.Logger       // nil: discarded
	Refused     func(refusal.Code) // counts each refused connection (metrics); nil: none
	// HandoffIdle is the idle period of handed-off connections; zero:
	// DefaultHandoffIdle (tests shorten it).
	HandoffIdle time.Duration
	// MaxConns and MaxPerSandbox cap the open connections in total
	// (503 gateway_busy) and per sandbox (429 too_many_connections);
	// zero: no cap.
	MaxConns, MaxPerSandbox int
	Body                    h1.BodyLimit // the request body bound; zero: none
}

// Listen opens the sandbox socket at o.Socket, readable and writable by
// its owner and group only, and starts accepting on it. A stale socket of
// an earlier run is removed; anything else at the path, or a socket
// another process still serves, is an error.
func Listen(o Options) (*Listener, error) {
	path, trusted, log, refused, idle := o.Socket, o.TrustedUIDs, o.Log, o.Refused, o.HandoffIdle
	lim := listenLimits{maxConns: o.MaxConns, maxPerSandbox: o.MaxPerSandbox, body: o.Body}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if refused == nil {
		refused = func(refusal.Code) {}
	}
	if idle <= 0 {
		idle = DefaultHandoffIdle
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("gateway: sandbox socket dir: %w", err)
	}
	// Remove a stale socket from an earlier run, but never anything else.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("gateway: sandbox socket %s exists and is not a socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("gateway: sandbox socket %s is in use by another process", path)
		}
		_ = os.Remove(path)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("gateway: listen %s: %w", path, err)
	}
	// Only the relay's group and owner may connect; SO_PEERCRED decides trust.
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("gateway: chmod %s: %w", path, err)
	}
	set := map[uint32]bool{}
	for _, u := range trusted {
		set[u] = true
	}
	l := &Listener{ln: ln, trusted: set, log: log, conns: make(chan *Conn), done: make(chan struct{}), refused: refused, idle: idle,
		lim: lim, bySandbox: map[string]int{}}
	go l.acceptLoop()
	return l, nil
}

func (l *Listener) acceptLoop() {
	if err := l.accepting(func() (net.Conn, error) { return l.ln.AcceptUnix() }, func(c net.Conn) { l.admit(c.(*net.UnixConn)) }); err != nil {
		l.Close()
	}
}

// accepting calls admit on its own goroutine for every connection accept
// yields, until l is closed (nil) or accept fails for good (the error).
// Running out of descriptors or a timeout is waited out (B6).
func (l *Listener) accepting(accept func() (net.Conn, error), admit func(net.Conn)) error {
	starved := false // out of descriptors since the last accept
	for {
		c, err := accept()
		if err != nil {
			select {
			case <-l.done:
				return nil
			default:
			}
			var ne net.Error
			fds := errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)
			if fds && !starved {
				starved = true
				l.log.Warn("sandbox connections: out of file descriptors; new connections wait in the listen backlog until some are freed (raise LimitNOFILE)", "err", err)
			}
			if fds || errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(50 * time.Millisecond) // back off, then recover (B6)
				continue
			}
			return err
		}
		if starved {
			starved = false
			l.log.Info("sandbox connections: accepting again: file descriptors were freed")
		}
		go admit(c)
	}
}

// admit counts the connection against the caps, checks the peer and reads
// the preamble off the accept loop so a slow relay cannot stall other
// connections. It is the one place every sandbox connection (tool calls,
// the forward proxy and its tunnels, handed-off sockets) is admitted, so
// the caps hold for all of them: past the total, 503 gateway_busy; past
// the sandbox's share, 429 too_many_connections; each answered at once
// and closed, never left waiting in the accept loop (THREATS B10).
func (l *Listener) admit(c *net.UnixConn) { l.admitCapped(l.identify(c)) }

// admitCapped takes ic's places under the caps and passes it to Accept,
// or answers and closes it (a nil ic was refused already). The preamble
// came first, within preambleTimeout, from a trusted relay.
func (l *Listener) admitCapped(ic *Conn) {
	if ic == nil {
		return
	}
	if n := l.open.Add(1); l.lim.maxConns > 0 && n > int64(l.lim.maxConns) {
		l.open.Add(-1)
		l.overCap(ic.id, refusal.GatewayBusy)
		rejectConn(ic, http.StatusServiceUnavailable, refusal.GatewayBusy,
			fmt.Sprintf("the gateway has its %d connections open (gateway.max_connections); close some or retry shortly", l.lim.maxConns))
		return
	}
	sb := ic.id.Host + "\x00" + ic.id.Sandbox // sandbox names are a relay's (host's) own
	if !l.takeSandbox(sb) {
		l.open.Add(-1)
		l.overCap(ic.id, refusal.TooManyConnections)
		rejectConn(ic, http.StatusTooManyRequests, refusal.TooManyConnections,
			fmt.Sprintf("this sandbox has its %d connections open (gateway.max_connections_per_sandbox); close some or retry shortly", l.lim.maxPerSandbox))
		return
	}
	ic.release = func() {
		l.putSandbox(sb)
		l.open.Add(-1)
	}
	select {
	case l.conns <- ic:
	case <-l.done:
		ic.Close()
	}
}

// takeSandbox counts one more open connection of sandbox sb, unless it
// has its share already.
func (l *Listener) takeSandbox(sb string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim.maxPerSandbox > 0 && l.bySandbox[sb] >= l.lim.maxPerSandbox {
		return false
	}
	l.bySandbox[sb]++
	return true
}

func (l *Listener) putSandbox(sb string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySandbox[sb]--; l.bySandbox[sb] <= 0 {
		delete(l.bySandbox, sb)
	}
}

// overCap counts a connection refused at a cap and logs it: the first
// refusal, then at most one line a second with how many were not logged,
// so a flood cannot flood the log too.
func (l *Listener) overCap(id wire.Identity, code refusal.Code) {
	l.refused(code)
	now := time.Now().Unix()
	last := l.warned.Load()
	if now == last || !l.warned.CompareAndSwap(last, now) {
		l.quiet.Add(1)
		return
	}
	l.log.Warn("sandbox socket: refused a connection over the connection cap", "decision", "block", "code", string(code),
		"sandbox", id.Sandbox, "agent", id.Agent, "session", id.Session, "open", l.open.Load(),
		"max_connections", l.lim.maxConns, "max_connections_per_sandbox", l.lim.maxPerSandbox, "not_logged_since", l.quiet.Swap(0))
}

// identify checks the peer and reads the preamble; it answers and closes
// a connection it refuses, and returns nil for it.
func (l *Listener) identify(c *net.UnixConn) *Conn {
	uid, pid, err := peerCred(c)
	if err != nil || !l.trusted[uid] {
		l.log.Warn("sandbox socket: refused connection from untrusted peer", "peer_uid", uid, "peer_pid", pid, "err", err)
		l.refused(refusal.UntrustedPeer)
		rejectConn(c, 403, refusal.UntrustedPeer, "this socket accepts connections only from a trusted sluice relay (sandboxd)")
		return nil
	}
	// Receive uses recvmsg: a handed-off descriptor arrives with the line
	// and is validated (one connected stream socket) or closed.
	_ = c.SetReadDeadline(time.Now().Add(preambleTimeout))
	p, err := wire.Receive(c)
	if errors.Is(err, wire.ErrHandoff) {
		l.log.Warn("sandbox socket: refused handoff: the passed descriptors are not one connected stream socket", "peer_uid", uid, "err", err)
		l.refused(refusal.IdentityRequired)
		rejectConn(c, 400, refusal.IdentityRequired, "a SLUICE-HANDOFF line must pass exactly one connected stream socket, and a SLUICE-IDENTITY line none")
		return nil
	}
	if err != nil {
		l.log.Warn("sandbox socket: refused connection without a valid identity preamble", "peer_uid", uid, "err", err)
		l.refused(refusal.IdentityRequired)
		rejectConn(c, 400, refusal.IdentityRequired, "a relayed connection must start with a valid SLUICE-IDENTITY line")
		return nil
	}
	_ = c.SetReadDeadline(time.Time{})
	if p.Identity, err = canonicalIdentity(p.Identity); err != nil {
		l.log.Warn("sandbox socket: refused connection with an ambiguous identity", "peer_uid", uid, "err", err)
		l.refused(refusal.IdentityRequired)
		if p.Conn != nil {
			p.Conn.Close()
		}
		rejectConn(c, 400, refusal.IdentityRequired, err.Error())
		return nil
	}
	ic := &Conn{Conn: c, r: p.Reader, base: p.Reader, id: p.Identity}
	if p.Conn != nil {
		br := bufio.NewReaderSize(p.Conn, wire.MaxLine)
		ic = &Conn{Conn: p.Conn, r: br, base: br, id: p.Identity, lease: c}
		ic.watch(l.idle)
	}
	return ic
}

func peerCred(c *net.UnixConn) (uid uint32, pid int32, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, err
	}
	if cerr != nil {
		return 0, 0, cerr
	}
	return cred.Uid, cred.Pid, nil
}

// rejectConn answers with an HTTP error (what a confused client most likely
// speaks) and closes.
func rejectConn(c net.Conn, status int, code refusal.Code, msg string) {
	body := fmt.Sprintf(`{"error":{"code":%q,"message":%q}}`+"\n", code, msg)
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, statusText(status), len(body), body)
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	// Lingering close: a Unix socket closed with unread input resets the
	// peer, which would lose the answer. Drain a little, briefly, first.
	_ = c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	c.Close()
}

func statusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return t
	}
	return "Error"
}

// Accept implements net.Listener for http.Server.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes the socket; connections already admitted
// stay open until their own Close.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.ln.Close()
	})
	return err
}

// Addr is the socket's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

type identityKey struct{}

// ConnContext attaches an admitted connection's identity to the context
// of its requests (http.Server.ConnContext); IdentityFrom reads it.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if ic, ok := c.(*Conn); ok {
		if ic.hosted != nil {
			ctx = context.WithValue(ctx, hostedKey{}, ic.hosted)
		}
		return context.WithValue(ctx, identityKey{}, ic.id)
	}
	return ctx
}

// IdentityFrom returns the relayed identity; ok is false only for a bug
// (a connection that skipped admit), and callers then refuse.
func IdentityFrom(ctx context.Context) (wire.Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(wire.Identity)
	return id, ok
}

// canonicalIdentity puts the user and session of a relayed identity in
// canonical form (package ident: case folded, NFKC), the form every later
// comparison sees: hold ownership and self-approval, grants, ended
// sessions. An identity whose user or session cannot be canonicalised
// (invisible characters, letters of two scripts) is refused.
func canonicalIdentity(id wire.Identity) (wire.Identity, error) {
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
			return id, fmt.Errorf("the identity's %s is ambiguous: %w", f.name, err)
		}
		*f.v = c
	}
	return id, nil
}
