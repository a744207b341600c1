package guard

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"sync"
	"syscall"
	"time"
)

// Direct is the round tripper of a connector's tool calls. A plain-http
// request is sent and its answer read on the caller's goroutine, over a
// kept-alive connection the guard dialled: no goroutine of a transport's
// own writes the request or reads the answer, so a call wakes no other
// thread to hand its bytes across (on a sequential call those hand-offs
// and the scheduler's wake-ups were a measurable part of its latency). Any
// other request (https, where HTTP/2 is negotiated) goes to the guarded
// *http.Transport it wraps.
//
// The request is written by net/http (Request.Write) and the answer read
// by net/http (ReadResponse): no parsing of its own. The answer's head
// is bounded as the transport bounds it; a 1xx answer is skipped, a 101
// refused. The request's context bounds the exchange: its deadline is the
// connection's, and its end closes the exchange at once. A connection is
// kept for the next call only when the answer was read to its end and
// neither side asked to close; before it is used again a non-blocking
// peek makes sure the server has not closed it (or sent anything) while
// it was idle.
type Direct struct {
	*http.Transport // https, and CloseIdleConnections' other half

	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle int
	idleFor time.Duration // how long a kept connection may wait for its next call
	maxHead int64

	mu      sync.Mutex
	idle    map[string][]*directConn // by host:port, most recent last
	janitor *time.Timer              // closes connections idle past idleFor; nil while none is kept
}

// directConn is one kept-alive connection.
type directConn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	lim  *headLimit
	used time.Time // when it went idle
}

// headLimit bounds the bytes read from the connection while the budget is
// set: the answer's head, as MaxResponseHeaderBytes does.
type headLimit struct {
	r      io.Reader
	remain int64 // < 0: no bound
}

var errHeadTooLarge = errors.New("guard: the upstream's response head is too large")

func (h *headLimit) Read(p []byte) (int, error) {
	if h.remain == 0 {
		return 0, errHeadTooLarge
	}
	if h.remain > 0 && int64(len(p)) > h.remain {
		p = p[:h.remain]
	}
	n, err := h.r.Read(p)
	if h.remain > 0 {
		h.remain -= int64(n)
	}
	return n, err
}

// NewDirect wraps t (Transport's) for a connector's tool calls.
func NewDirect(d *Dialer, allow []netip.Prefix, t *http.Transport) *Direct {
	idleFor := t.IdleConnTimeout
	if idleFor <= 0 {
		idleFor = 90 * time.Second // http.DefaultTransport's
	}
	return &Direct{Transport: t, maxIdle: t.MaxIdleConnsPerHost, maxHead: t.MaxResponseHeaderBytes, idleFor: idleFor,
		dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr, allow)
		},
		idle: map[string][]*directConn{}}
}

// RoundTrip implements http.RoundTripper.
func (d *Direct) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		return d.Transport.RoundTrip(req)
	}
	ctx := req.Context()
	addr := hostPort(req.URL)
	trace := httptrace.ContextClientTrace(ctx)
	pc, reused := d.get(addr)
	if pc == nil {
		if trace != nil && trace.ConnectStart != nil {
			trace.ConnectStart("tcp", addr)
		}
		c, err := d.dial(ctx, "tcp", addr)
		if trace != nil && trace.ConnectDone != nil {
			trace.ConnectDone("tcp", addr, err)
		}
		if err != nil {
			closeBody(req)
			return nil, err
		}
		lim := &headLimit{r: c, remain: -1}
		pc = &directConn{c: c, br: bufio.NewReaderSize(lim, 4096), bw: bufio.NewWriterSize(c, 4096), lim: lim}
	}
	if trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: pc.c, Reused: reused})
	}
	resp, err := d.exchange(ctx, pc, req, addr)
	if err != nil {
		pc.c.Close()
		return nil, err
	}
	return resp, nil
}

// exchange writes req on pc (a connection to addr) and reads its
// answer's head.
func (d *Direct) exchange(ctx context.Context, pc *directConn, req *http.Request, addr string) (*http.Response, error) {
	dl, bounded := ctx.Deadline()
	if !bounded && d.Transport.ResponseHeaderTimeout > 0 {
		// As the transport bounds a context without a deadline: the
		// answer's head must come within ResponseHeaderTimeout.
		dl = time.Now().Add(d.Transport.ResponseHeaderTimeout)
	}
	_ = pc.c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = pc.c.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, error) {
		stop()
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() && bounded {
			return nil, fmt.Errorf("%w: %w", context.DeadlineExceeded, err) // the connection's deadline is the context's
		}
		return nil, err
	}
	if err := req.Write(pc.bw); err != nil {
		return fail(err)
	}
	if err := pc.bw.Flush(); err != nil {
		return fail(err)
	}
	for range 16 { // 1xx answers before the final one
		pc.lim.remain = max(d.maxHead, 1)
		resp, err := http.ReadResponse(pc.br, req)
		pc.lim.remain = -1
		if err != nil {
			return fail(err)
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return fail(errors.New("guard: the upstream switched protocols"))
		case resp.StatusCode >= 100 && resp.StatusCode < 200:
			continue
		}
		if !bounded {
			_ = pc.c.SetDeadline(time.Time{}) // the body is the caller's to bound
		}
		keep := !resp.Close && !req.Close && resp.ProtoAtLeast(1, 1)
		resp.Body = &directBody{rc: resp.Body, d: d, pc: pc, addr: addr, keep: keep, stop: stop, eof: resp.Body == http.NoBody}
		return resp, nil
	}
	return fail(errors.New("guard: the upstream sent too many informational answers"))
}

// directBody gives its connection back once read to its end.
type directBody struct {
	rc   io.ReadCloser
	d    *Direct
	pc   *directConn
	addr string
	keep bool
	stop func() bool
	eof  bool
	done bool
}

func (b *directBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, errors.New("guard: read on a closed body")
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *directBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	err := b.rc.Close()
	live := b.stop() // false: the context ended, and the connection's deadline is in the past
	if b.keep && b.eof && live && b.pc.br.Buffered() == 0 {
		_ = b.pc.c.SetDeadline(time.Time{})
		b.d.put(b.addr, b.pc)
		return err
	}
	b.pc.c.Close()
	return err
}

// get returns a kept connection to addr that is still open, or nil.
func (d *Direct) get(addr string) (*directConn, bool) {
	now := time.Now()
	for {
		d.mu.Lock()
		l := d.idle[addr]
		if len(l) == 0 {
			d.mu.Unlock()
			return nil, false
		}
		pc := l[len(l)-1]
		l[len(l)-1] = nil
		d.idle[addr] = l[:len(l)-1]
		d.mu.Unlock()
		if idle, _ := Idle(pc.c); idle && now.Sub(pc.used) < d.idleFor {
			return pc, true
		}
		pc.c.Close()
	}
}

// put keeps pc for the next call to addr, if there is room.
func (d *Direct) put(addr string, pc *directConn) {
	pc.used = time.Now()
	d.mu.Lock()
	if len(d.idle[addr]) < d.maxIdle {
		d.idle[addr] = append(d.idle[addr], pc)
		if d.janitor == nil {
			// Armed while connections are kept, not per call: it stops
			// only when a sweep finds none.
			d.janitor = time.AfterFunc(d.idleFor/2, d.sweep)
		}
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	pc.c.Close()
}

// sweep closes the connections kept longer than idleFor, as the
// transport does, so that an upstream's closed connections are not held
// open after the calls stopped.
func (d *Direct) sweep() {
	now := time.Now()
	var old []*directConn
	d.mu.Lock()
	for addr, l := range d.idle {
		keep := l[:0]
		for _, pc := range l {
			if now.Sub(pc.used) >= d.idleFor {
				old = append(old, pc)
			} else {
				keep = append(keep, pc)
			}
		}
		clear(l[len(keep):])
		if len(keep) == 0 {
			delete(d.idle, addr)
		} else {
			d.idle[addr] = keep
		}
	}
	if len(d.idle) > 0 {
		d.janitor.Reset(d.idleFor / 2)
	} else {
		d.janitor = nil
	}
	d.mu.Unlock()
	for _, pc := range old {
		pc.c.Close()
	}
}

// CloseIdleConnections closes the kept connections, both halves'.
func (d *Direct) CloseIdleConnections() {
	d.mu.Lock()
	idle := d.idle
	d.idle = map[string][]*directConn{}
	if d.janitor != nil {
		d.janitor.Stop()
		d.janitor = nil
	}
	d.mu.Unlock()
	for _, l := range idle {
		for _, pc := range l {
			pc.c.Close()
		}
	}
	d.Transport.CloseIdleConnections()
}

// Idle peeks at a kept connection without waiting: idle is true when
// nothing is there to read (EAGAIN). A closed connection (EOF), an error,
// or bytes nobody asked for (a late or stray answer) make it false. ok is
// false when c is not a socket that can be peeked at.
func Idle(c net.Conn) (idle, ok bool) {
	sc, is := c.(syscall.Conn)
	if !is {
		return false, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, true
	}
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		idle = errors.Is(rerr, syscall.EAGAIN)
		return true // never wait
	})
	return idle && err == nil, true
}

// hostPort is u's host and port, http's default port when it names none.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
