package egress

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/policy"
)

// maxPooledCallers bounds the callers with idle upstream connections of
// their own; past it, the callers idle the longest are let go first.
const maxPooledCallers = 1024

// upstreamPool keeps the idle upstream connections of absolute-form
// requests, per caller and per destination. An upstream connection is
// reused for the same (caller, destination) only: it never carries two
// sandboxes' (or sessions') requests, and a caller that desynchronises
// one (THREATS F1-F4) can only confuse its own responses. A connection
// is pooled only after an exchange that ended exactly at the end of its
// response (egress_upstream.go); anything else closes it.
//
// It replaces one http.Transport per caller: a Transport keeps two
// goroutines per connection and hands every response across them, which
// cost a quarter of the proxy's CPU per kept-alive request.
type upstreamPool struct {
	opts upstreamOptions

	mu      sync.Mutex
	m       map[policy.Caller]*callerConns
	idleN   int         // idle connections in m
	swept   time.Time   // last sweep of callers
	janitor *time.Timer // closes connections idle past opts.idle; nil while none is idle
	closed  bool        // after closeIdle: returned connections are closed
}

// upstreamOptions are the pool's and its exchanges' settings.
type upstreamOptions struct {
	// dial connects to a destination (host:port) through the guard.
	dial func(ctx context.Context, addr string) (net.Conn, error)
	// idle is how long an idle connection is kept, and how long a
	// caller with none is remembered.
	idle time.Duration
	// maxIdlePerHost and maxIdlePerCaller bound the idle connections.
	maxIdlePerHost, maxIdlePerCaller int
	// headerTimeout bounds the wait for a response head once the request
	// is written (and each write of a request body).
	headerTimeout time.Duration
}

// callerConns are one caller's idle connections by destination.
type callerConns struct {
	used  time.Time            // under upstreamPool.mu
	hosts map[string][]*upConn // most recently idle last
	n     int                  // idle connections in hosts
}

// upConn is one upstream connection and its buffers.
type upConn struct {
	conn   net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	addr   string // destination (host:port) it was dialled for
	remote string // the address it is connected to, for the audit record
	idleAt time.Time
	reused bool // it served an exchange before this one
}

func newUpstreamPool(opts upstreamOptions) *upstreamPool {
	return &upstreamPool{opts: opts, m: map[policy.Caller]*callerConns{}}
}

// errPoolClosed is returned for a dial after the pool was closed.
var errPoolClosed = errors.New("upstream pool: the gateway is stopping")

// get returns an idle connection of caller to addr, or dials one.
func (p *upstreamPool) get(ctx context.Context, caller policy.Caller, addr string) (*upConn, error) {
	now := time.Now()
	for {
		pc := p.takeIdle(caller, addr, now)
		if pc == nil {
			break
		}
		if now.Sub(pc.idleAt) < p.opts.idle && stillIdle(pc.conn) {
			pc.reused = true
			return pc, nil
		}
		_ = pc.conn.Close() // expired, closed by the upstream, or it sent bytes nobody asked for
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, errPoolClosed
	}
	conn, err := p.opts.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	pc := &upConn{conn: conn, br: bufio.NewReaderSize(conn, 4096), bw: bufio.NewWriterSize(conn, 4096), addr: addr}
	if a, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		pc.remote = a.AddrPort().Addr().Unmap().String()
	} else if host, _, err := net.SplitHostPort(conn.RemoteAddr().String()); err == nil {
		pc.remote = host
	}
	return pc, nil
}

// takeIdle removes and returns caller's most recently idle connection to
// addr, if any, and marks the caller used.
func (p *upstreamPool) takeIdle(caller policy.Caller, addr string, now time.Time) *upConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.swept) >= p.opts.idle/2 || len(p.m) > maxPooledCallers {
		p.sweepLocked(now)
	}
	cc := p.m[caller]
	if cc == nil {
		return nil
	}
	cc.used = now
	list := cc.hosts[addr]
	if len(list) == 0 {
		return nil
	}
	pc := list[len(list)-1]
	list[len(list)-1] = nil
	if list = list[:len(list)-1]; len(list) == 0 {
		delete(cc.hosts, addr)
	} else {
		cc.hosts[addr] = list
	}
	cc.n--
	p.idleN--
	return pc
}

// put pools pc, idle, for caller; past the bounds, or once the pool is
// closed, it is closed instead.
func (p *upstreamPool) put(caller policy.Caller, pc *upConn) {
	now := time.Now()
	pc.idleAt = now
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = pc.conn.Close()
		return
	}
	cc := p.m[caller]
	if cc == nil {
		cc = &callerConns{hosts: map[string][]*upConn{}, used: now}
		p.m[caller] = cc
		if len(p.m) > maxPooledCallers {
			p.sweepLocked(now) // never drops cc, the most recently used
		}
	}
	cc.used = now
	list := cc.hosts[pc.addr]
	if len(list) >= p.opts.maxIdlePerHost || cc.n >= p.opts.maxIdlePerCaller {
		_ = pc.conn.Close()
		return
	}
	cc.hosts[pc.addr] = append(list, pc)
	cc.n++
	p.idleN++
	if p.janitor == nil {
		p.janitor = time.AfterFunc(p.janitorPeriod(), p.sweep)
	}
}

func (p *upstreamPool) janitorPeriod() time.Duration { return max(p.opts.idle/4, 10*time.Millisecond) }

// sweep is the janitor: it closes the connections idle for opts.idle and
// runs again while any is left.
func (p *upstreamPool) sweep() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweepLocked(time.Now())
	p.janitor = nil
	if p.idleN > 0 && !p.closed {
		p.janitor = time.AfterFunc(p.janitorPeriod(), p.sweep)
	}
}

// sweepLocked closes the connections idle for opts.idle, forgets the
// callers unused that long, and drops the least recently used callers
// while there are more than maxPooledCallers.
func (p *upstreamPool) sweepLocked(now time.Time) {
	p.swept = now
	for c, cc := range p.m {
		for addr, list := range cc.hosts {
			kept := list[:0]
			for _, pc := range list {
				if now.Sub(pc.idleAt) >= p.opts.idle {
					_ = pc.conn.Close()
					cc.n--
					p.idleN--
					continue
				}
				kept = append(kept, pc)
			}
			clear(list[len(kept):])
			if len(kept) == 0 {
				delete(cc.hosts, addr)
			} else {
				cc.hosts[addr] = kept
			}
		}
		if cc.n == 0 && now.Sub(cc.used) >= p.opts.idle {
			delete(p.m, c)
		}
	}
	for len(p.m) > maxPooledCallers {
		var oldest policy.Caller
		var at time.Time
		for c, cc := range p.m {
			if at.IsZero() || cc.used.Before(at) {
				oldest, at = c, cc.used
			}
		}
		p.dropLocked(oldest)
	}
}

// dropLocked closes caller's idle connections and forgets it.
func (p *upstreamPool) dropLocked(caller policy.Caller) {
	cc := p.m[caller]
	for _, list := range cc.hosts {
		for _, pc := range list {
			_ = pc.conn.Close()
		}
	}
	p.idleN -= cc.n
	delete(p.m, caller)
}

// closeIdle closes every idle upstream connection, and every one returned
// later. It is what a stopping server runs for the pool
// (stopHooks.atClose): by then Shutdown has waited for the requests, so
// every connection is idle and none is left open.
func (p *upstreamPool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for c := range p.m {
		p.dropLocked(c)
	}
	if p.janitor != nil {
		p.janitor.Stop()
		p.janitor = nil
	}
}

// stillIdle reports whether an idle connection can carry a request: the
// upstream has neither closed it nor sent anything since its last
// response (a peek that never blocks). A connection whose socket cannot
// be peeked at counts as usable; the exchange retries a replayable
// request on a fresh connection if it was closed after all.
func stillIdle(c net.Conn) bool {
	idle, ok := guard.Idle(c)
	return idle || !ok
}
