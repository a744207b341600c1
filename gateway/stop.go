package gateway

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"time"
)

// shutdownGrace bounds a graceful shutdown: requests still running after
// it have their connections closed.
const shutdownGrace = 10 * time.Second

// shutdown stops servers gracefully. Long-lived requests are told first
// (stopHooks.begin: a DNS stream stops reading questions, answers those in
// flight and ends its body), so that Shutdown waits for them only as long
// as their answers take; whatever still runs after shutdownGrace has its
// connection closed rather than outliving Serve. Then the idle upstream
// connections of raw egress are closed.
func (s *Server) shutdown(servers []*http.Server) {
	s.stop.begin()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(ctx); err != nil {
			s.log.Warn("gateway: shutdown: grace period over; closing the connections still busy", "grace", shutdownGrace.String(), "err", err)
			_ = srv.Close()
		}
	}
	s.stop.closeAll()
}

// stopHooks is what a shutdown must reach that http.Server.Shutdown does
// not: requests that would otherwise run on (DNS streams wait for
// questions for minutes), and the upstream transports of raw egress,
// which keep idle connections open.
type stopHooks struct {
	mu       sync.Mutex
	stopping bool
	next     uint64
	running  map[uint64]func() // told when the shutdown begins
	closers  []func()          // run when the servers have stopped, and by Close
}

// onStop arranges for f to run once when the shutdown begins, or at once if
// it has begun. The returned func unregisters f; once it returns, f is not
// running and will not run. f runs with the hooks locked: it must be quick
// and must not call back.
func (h *stopHooks) onStop(f func()) (unregister func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopping {
		f()
		return func() {}
	}
	if h.running == nil {
		h.running = map[uint64]func(){}
	}
	h.next++
	k := h.next
	h.running[k] = f
	return func() {
		h.mu.Lock()
		delete(h.running, k)
		h.mu.Unlock()
	}
}

// begin tells every registered request that the shutdown began.
func (h *stopHooks) begin() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopping = true
	for k, f := range h.running {
		f()
		delete(h.running, k)
	}
}

// atClose adds f to what runs when the servers have stopped.
func (h *stopHooks) atClose(f func()) {
	h.mu.Lock()
	h.closers = append(h.closers, f)
	h.mu.Unlock()
}

// closeAll runs the closers; it may run more than once.
func (h *stopHooks) closeAll() {
	h.mu.Lock()
	fs := slices.Clone(h.closers)
	h.mu.Unlock()
	for _, f := range fs {
		f()
	}
}
