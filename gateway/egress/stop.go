package egress

import (
	"slices"
	"sync"
)

// StopHooks is what a gateway's shutdown must reach that http.Server.Shutdown does
// not: requests that would otherwise run on (DNS streams wait for
// questions for minutes), and the upstream transports of raw egress,
// which keep idle connections open.
type StopHooks struct {
	mu       sync.Mutex
	stopping bool
	next     uint64
	running  map[uint64]func() // told when the shutdown begins
	closers  []func()          // run when the servers have stopped, and by Close
}

// OnStop arranges for f to run once when the shutdown begins, or at once if
// it has begun. The returned func unregisters f; once it returns, f is not
// running and will not run. f runs with the hooks locked: it must be quick
// and must not call back.
func (h *StopHooks) OnStop(f func()) (unregister func()) {
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

// Begin tells every registered request that the shutdown began.
func (h *StopHooks) Begin() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopping = true
	for k, f := range h.running {
		f()
		delete(h.running, k)
	}
}

// AtClose adds f to what runs when the servers have stopped.
func (h *StopHooks) AtClose(f func()) {
	h.mu.Lock()
	h.closers = append(h.closers, f)
	h.mu.Unlock()
}

// CloseAll runs the closers; it may run more than once.
func (h *StopHooks) CloseAll() {
	h.mu.Lock()
	fs := slices.Clone(h.closers)
	h.mu.Unlock()
	for _, f := range fs {
		f()
	}
}
