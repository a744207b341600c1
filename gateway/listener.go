package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// preambleTimeout bounds how long a relay may take to send its identity line.
const preambleTimeout = 5 * time.Second

// identConn is an accepted sandbox connection whose relay was trusted and
// whose identity preamble was read. Reads continue from the buffer that
// held the preamble so no request bytes are lost.
type identConn struct {
	net.Conn
	r  *bufio.Reader
	id wire.Identity
}

func (c *identConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// sandboxListener accepts on the gateway's Unix socket and yields only
// connections from a trusted relay (SO_PEERCRED uid in the trusted set)
// that began with a valid identity preamble. Everything else is answered
// with a clear error and closed. Identity comes from nowhere else.
type sandboxListener struct {
	ln      *net.UnixListener
	trusted map[uint32]bool
	log     *slog.Logger
	conns   chan *identConn
	done    chan struct{}
	once    sync.Once
	refused func(code Code) // metrics hook
}

func listenSandbox(path string, trusted []uint32, log *slog.Logger, refused func(Code)) (*sandboxListener, error) {
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
	l := &sandboxListener{ln: ln, trusted: set, log: log, conns: make(chan *identConn), done: make(chan struct{}), refused: refused}
	go l.acceptLoop()
	return l, nil
}

func (l *sandboxListener) acceptLoop() {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				time.Sleep(50 * time.Millisecond) // back off, then recover (B6)
				continue
			}
			l.Close()
			return
		}
		go l.admit(c)
	}
}

// admit checks the peer and reads the preamble off the accept loop so a slow
// relay cannot stall other connections.
func (l *sandboxListener) admit(c *net.UnixConn) {
	uid, pid, err := peerCred(c)
	if err != nil || !l.trusted[uid] {
		l.log.Warn("sandbox socket: refused connection from untrusted peer", "peer_uid", uid, "peer_pid", pid, "err", err)
		l.refused(CodeUntrustedPeer)
		rejectConn(c, 403, CodeUntrustedPeer, "this socket accepts connections only from a trusted sluice relay (sandboxd)")
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(preambleTimeout))
	r := bufio.NewReaderSize(c, wire.MaxLine)
	id, err := wire.Read(r)
	if err != nil {
		l.log.Warn("sandbox socket: refused connection without a valid identity preamble", "peer_uid", uid, "err", err)
		l.refused(CodeIdentityRequired)
		rejectConn(c, 400, CodeIdentityRequired, "a relayed connection must start with a valid SLUICE-IDENTITY line")
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	select {
	case l.conns <- &identConn{Conn: c, r: r, id: id}:
	case <-l.done:
		c.Close()
	}
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
func rejectConn(c net.Conn, status int, code Code, msg string) {
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
	switch code {
	case 400:
		return "Bad Request"
	case 403:
		return "Forbidden"
	}
	return "Error"
}

// Accept implements net.Listener for http.Server.
func (l *sandboxListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *sandboxListener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.ln.Close()
	})
	return err
}

func (l *sandboxListener) Addr() net.Addr { return l.ln.Addr() }

type identityKey struct{}

func connContext(ctx context.Context, c net.Conn) context.Context {
	if ic, ok := c.(*identConn); ok {
		return context.WithValue(ctx, identityKey{}, ic.id)
	}
	return ctx
}

// identityFrom returns the relayed identity; ok is false only for a bug
// (a connection that skipped admit), and callers then refuse.
func identityFrom(ctx context.Context) (wire.Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(wire.Identity)
	return id, ok
}
