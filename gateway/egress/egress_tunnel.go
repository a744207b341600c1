package egress

import (
	"io"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// sandboxConn is a connection of the sandbox socket (ingress.Conn) that a
// tunnel may take over: Detach returns the bytes its readers took and
// nobody read, Socket the socket beneath them.
type sandboxConn interface {
	net.Conn
	Detach() []byte
	Socket() net.Conn
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

// relayTCP is splice between two TCP sockets read and written directly.
// Small exchanges, a request and its answer, are copied through a buffer:
// for them the kernel's splice(2) costs more than read and write. A
// direction whose read fills the whole buffer is a bulk transfer: the
// rest of it is left to io.Copy, which moves the bytes with splice(2) and
// never through this process (bulk counts such directions). Such a copy
// reports its count only when it ends, so for it the idle watchdog asks
// the kernel whether data still arrives (TCP_INFO's last_data_recv on its
// source socket). When nothing has moved either way for idle, closer (for
// a handed-off socket the ingress.Conn, which also ends the lease) and up
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
	if ic, ok := c.(sandboxConn); ok {
		closeWrite(ic.Socket())
		return
	}
	_ = c.Close()
}

// The pieces every byte relay of raw egress shares: a CONNECT tunnel
// (splice, relayTCP) and a switched WebSocket (relayWebSocket) each copy
// both ways, note when a byte last moved, and are cut by one watchdog when
// nothing has moved for the idle timeout (one timer per relay rather than
// a deadline update per read).

// activity is when a relay last moved a byte, either way.
type activity struct{ last atomic.Int64 }

func newActivity() *activity {
	a := &activity{}
	a.touch()
	return a
}

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// idleFor reports whether nothing has moved for d.
func (a *activity) idleFor(d time.Duration) bool {
	return time.Since(time.Unix(0, a.last.Load())) >= d
}

// awaitRelay returns once both directions of a relay have sent on done.
// Every quarter of idle it asks stalled, and calls cut when that says
// nothing has moved for idle; cut must make both directions end. With
// cutOnEnd, the first direction to end cuts the other too.
func awaitRelay(done <-chan struct{}, idle time.Duration, stalled func() bool, cut func(), cutOnEnd bool) {
	tick := time.NewTicker(max(idle/4, time.Millisecond))
	defer tick.Stop()
	for finished := 0; finished < 2; {
		select {
		case <-done:
			finished++
			if cutOnEnd {
				cut()
			}
		case <-tick.C:
			if stalled() {
				cut()
			}
		}
	}
}

// copyCounted copies src to dst, adding what it wrote to n and calling
// touch on every read that moved bytes. It returns at src's end (nil) or
// the first read or write error.
func copyCounted(dst io.Writer, src io.Reader, n *atomic.Int64, touch func()) (int64, error) {
	buf := make([]byte, 32<<10)
	var total int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			touch()
			m, werr := dst.Write(buf[:k])
			total += int64(m)
			n.Add(int64(m))
			if werr != nil {
				return total, werr
			}
		}
		if err != nil {
			if err == io.EOF {
				return total, nil
			}
			return total, err
		}
	}
}
