package egress

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
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
	relayBoth(
		func() { _, _ = copyCounted(up, clientR, upN, act.touch); closeWrite(up) },
		func() { _, _ = copyCounted(client, up, dnN, act.touch); closeWrite(client) },
		idle, func() bool { return act.idleFor(idle) }, func() { client.Close(); up.Close() })
}

// relayTCP is splice between two TCP sockets read and written directly,
// each direction read inside the poller's callback into a pooled buffer
// that is put back before each wait (readPooled): an idle direction holds
// none. A direction whose read fills relayBufSize is a bulk transfer
// (bulk counts such directions): from then on it reads into the larger
// bulkBufSize buffers, one read(2) and one write(2) per up to 1 MiB.
// splice(2) was used for bulk directions before: it spends a little less
// of this process's CPU per byte, but behind it the client and the
// upstream spend more (test/bench: about 40 ms more per 100 MB on
// loopback, perf-egress.md), so the download is slower overall. When
// nothing has moved either way for idle, closer (for a handed-off socket
// the ingress.Conn, which also ends the lease) and up are closed.
func relayTCP(closer net.Conn, client, up *net.TCPConn, idle time.Duration, upN, dnN, bulk *atomic.Int64) {
	act := newActivity()
	cp := func(dst, src *net.TCPConn, n *atomic.Int64) {
		defer func() { _ = dst.CloseWrite() }()
		rc, err := src.SyscallConn()
		if err != nil {
			return
		}
		pool := &relayBufs
		for {
			bp, k, err := readPooled(rc, pool)
			full := bp != nil && k == len(*bp)
			if k > 0 {
				act.touch()
				if _, werr := dst.Write((*bp)[:k]); werr != nil {
					pool.Put(bp)
					return
				}
				n.Add(int64(k))
			}
			if bp != nil {
				pool.Put(bp)
			}
			if err != nil {
				return
			}
			if full && pool == &relayBufs {
				pool = &bulkBufs
				bulk.Add(1)
			}
		}
	}
	relayBoth(func() { cp(up, client, upN) }, func() { cp(client, up, dnN) },
		idle, func() bool { return act.idleFor(idle) }, func() { closer.Close(); up.Close() })
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

// relayBoth runs a relay's two directions, down on the calling goroutine
// and up on one of its own, and returns when both have ended. Its
// watchdog is a timer, not a goroutine: every quarter of idle it asks
// stalled, and calls cut (which must end both directions) when that says
// nothing has moved for idle. A held tunnel so costs two goroutines.
func relayBoth(up, down func(), idle time.Duration, stalled func() bool, cut func()) {
	period := max(idle/4, time.Millisecond)
	var mu sync.Mutex
	ended := false
	var t *time.Timer
	// t is set under mu: the callback reads it under mu, and may run
	// before AfterFunc's return is assigned.
	mu.Lock()
	t = time.AfterFunc(period, func() {
		if stalled() {
			cut()
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !ended {
			t.Reset(period)
		}
	})
	mu.Unlock()
	defer func() {
		mu.Lock()
		ended = true
		mu.Unlock()
		t.Stop()
	}()
	done := make(chan struct{})
	go func() { up(); close(done) }()
	down()
	<-done
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
//
// An idle direction holds no 32 KiB buffer: a socket read directly is
// waited on with no buffer at all (readPooled) and read into a pooled
// one; any other reader blocks in a read of a small buffer, and only a
// read that fills it (a bulk transfer) takes a pooled one for the next.
func copyCounted(dst io.Writer, src io.Reader, n *atomic.Int64, touch func()) (int64, error) {
	var total int64
	var small []byte
	var rc syscall.RawConn
	if sc, ok := src.(syscall.Conn); ok && canWait(src) {
		rc, _ = sc.SyscallConn() // nil on error: read through src, which reports it
	}
	if rc == nil {
		small = make([]byte, smallBufSize)
	}
	bulk := false
	for {
		var (
			buf []byte
			bp  *[]byte
			k   int
			err error
		)
		if rc != nil {
			bp, k, err = readPooled(rc, &relayBufs)
			if bp != nil {
				buf = *bp
			}
		} else {
			buf = small
			if bulk {
				bp = relayBufs.Get().(*[]byte)
				buf = *bp
			}
			k, err = src.Read(buf)
		}
		if k > 0 {
			touch()
			m, werr := dst.Write(buf[:k])
			total += int64(m)
			n.Add(int64(m))
			if werr != nil {
				err = werr
			}
		}
		bulk = k == len(buf)
		if bp != nil {
			relayBufs.Put(bp)
		}
		if err != nil {
			if err == io.EOF {
				return total, nil
			}
			return total, err
		}
	}
}

// relayBufSize is the buffer a relay reads into; a read that fills it
// marks a bulk transfer (relayTCP).
const relayBufSize = 32 << 10

// bulkBufSize is what a bulk direction of relayTCP reads into.
const bulkBufSize = 1 << 20

// smallBufSize is what a relay direction that cannot wait without a buffer
// (canWait) holds while idle.
const smallBufSize = 1 << 10

// relayBufs are the relays' read buffers, taken only while bytes move.
var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

// bulkBufs are bulk directions' read buffers, taken only while bytes move.
var bulkBufs = sync.Pool{New: func() any { b := make([]byte, bulkBufSize); return &b }}

// readPooled reads once from a stream socket read directly (canWait),
// waiting for data without holding a buffer: the read is made inside Go's
// poller callback into a buffer taken from pool, which is put
// back before each wait. A wake-up so costs one read(2), where a peek for
// readiness followed by a read costs two. It returns the buffer holding the
// k bytes read (nil only with an error; the caller puts it back), io.EOF at
// the stream's end, or the read's error; deadlines and Close end the wait
// as they end a Read.
func readPooled(rc syscall.RawConn, pool *sync.Pool) (bp *[]byte, k int, err error) {
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		if bp == nil {
			bp = pool.Get().(*[]byte)
		}
		for {
			k, rerr = unix.Read(int(fd), *bp)
			if rerr != unix.EINTR {
				break
			}
		}
		if rerr == unix.EAGAIN {
			pool.Put(bp) // not yet: the poller waits, holding no buffer
			bp = nil
			return false
		}
		return true
	}); err != nil {
		return bp, 0, err
	}
	switch {
	case rerr != nil:
		return bp, 0, os.NewSyscallError("read", rerr)
	case k == 0:
		return bp, 0, io.EOF
	}
	return bp, k, nil
}

// canWait says whether readPooled can read src: a TCP or Unix stream
// socket read directly, not through a wrapper that may hold bytes of its own.
func canWait(src io.Reader) bool {
	switch src.(type) {
	case *net.TCPConn, *net.UnixConn:
		return true
	}
	return false
}
