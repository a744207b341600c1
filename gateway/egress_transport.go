package gateway

import (
	"net/http"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/policy"
)

// maxPooledCallers bounds the callers with a transport of their own; past
// it, transports idle the longest are let go first.
const maxPooledCallers = 1024

// upstreamPool keeps one http.Transport per caller for absolute-form
// requests. A Transport pools connections per host, so an upstream
// connection is reused for the same (caller, host) only: it never carries
// two sandboxes' (or sessions') requests, and a caller that desynchronises
// one (THREATS F1-F4) can only confuse its own responses.
type upstreamPool struct {
	newTransport func() *http.Transport
	idle         time.Duration // a caller's transport unused this long is closed

	mu    sync.Mutex
	m     map[policy.Caller]*callerTransport
	swept time.Time
}

type callerTransport struct {
	t    *http.Transport
	used time.Time // under upstreamPool.mu
}

func newUpstreamPool(idle time.Duration, newTransport func() *http.Transport) *upstreamPool {
	return &upstreamPool{newTransport: newTransport, idle: idle, m: map[policy.Caller]*callerTransport{}}
}

// get returns c's transport, creating it on first use.
func (p *upstreamPool) get(c policy.Caller) *http.Transport {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.swept) >= p.idle/2 || len(p.m) >= maxPooledCallers {
		p.sweepLocked(now)
	}
	ct := p.m[c]
	if ct == nil {
		ct = &callerTransport{t: p.newTransport()}
		p.m[c] = ct
	}
	ct.used = now
	return ct.t
}

// sweepLocked closes the transports unused for idle, and the least recently
// used ones while the pool is full. Requests still running on a closed
// transport finish; its connections are closed as they come back idle.
func (p *upstreamPool) sweepLocked(now time.Time) {
	p.swept = now
	for c, ct := range p.m {
		if now.Sub(ct.used) >= p.idle {
			ct.t.CloseIdleConnections()
			delete(p.m, c)
		}
	}
	for len(p.m) >= maxPooledCallers {
		var oldest policy.Caller
		var at time.Time
		for c, ct := range p.m {
			if at.IsZero() || ct.used.Before(at) {
				oldest, at = c, ct.used
			}
		}
		p.m[oldest].t.CloseIdleConnections()
		delete(p.m, oldest)
	}
}

// closeIdle closes every idle upstream connection and lets the transports
// go. It is what a stopping server runs for the pool (stopHooks.atClose):
// by then Shutdown has waited for the requests, so every connection is
// idle and none is left open.
func (p *upstreamPool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, ct := range p.m {
		ct.t.CloseIdleConnections()
		delete(p.m, c)
	}
}
