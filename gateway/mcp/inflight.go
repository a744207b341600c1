package mcp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
)

// inflight is one session's calls in flight, whichever path serves them:
// the SDK's (the gate claims the id before the SDK sees the message) and
// the fast path's. The SDK keeps its own set of the ids it serves, which
// the fast path never enters; this set is the one both pass, so one id is
// in flight at most once on the session, as JSON-RPC requires and as the
// SDK enforces among its own calls.
//
// It also holds what a DELETE of the session waits for: the SDK's Close
// lets the calls it runs finish (their contexts are not cancelled) and
// answers 204 only then, and their results are not delivered (the stream
// is closing); the fast path's calls are waited for and answered the same.
type inflight struct {
	mu     sync.Mutex
	ids    map[any]struct{} // int64 or string, as the SDK's jsonrpc reads an id
	ended  bool             // the session is ending: the fast path takes no more
	fast   sync.WaitGroup   // fast calls running
	closed chan struct{}    // closed when ended is set
}

func newInflight() *inflight {
	return &inflight{ids: map[any]struct{}{}, closed: make(chan struct{})}
}

// idKey is a request id as the SDK's jsonrpc reads it (MakeID): a number
// as the int64 of its float64, a string as its decoded value; ok is false
// for anything else (the gate refuses such ids before this).
func idKey(raw json.RawMessage) (any, bool) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return nil, false
	}
	switch x := v.(type) {
	case float64:
		return int64(x), true
	case string:
		return x, true
	}
	return nil, false
}

// duplicateID is the SDK's message for a call whose id is in flight.
func duplicateID(key any) string {
	return fmt.Sprintf("duplicate in-flight request ID %v", key)
}

// claim records an SDK call's id; false: a call with that id is in flight.
func (f *inflight) claim(key any) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, dup := f.ids[key]; dup {
		return false
	}
	f.ids[key] = struct{}{}
	return true
}

func (f *inflight) release(key any) {
	f.mu.Lock()
	delete(f.ids, key)
	f.mu.Unlock()
}

// beginFast claims key for a fast call. dup: a call with that id is in
// flight; ended: the session is ending, and the call is the SDK's to
// answer (it refuses it), not the fast path's to run.
func (f *inflight) beginFast(key any) (dup, ended bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return false, true
	}
	if _, dup := f.ids[key]; dup {
		return true, false
	}
	f.ids[key] = struct{}{}
	f.fast.Add(1)
	return false, false
}

func (f *inflight) endFast(key any) {
	f.release(key)
	f.fast.Done()
}

// end stops the fast path taking calls; wait then waits for those it runs.
func (f *inflight) end() {
	f.mu.Lock()
	if !f.ended {
		f.ended = true
		close(f.closed)
	}
	f.mu.Unlock()
}

func (f *inflight) wait() { f.fast.Wait() }

// waitingWriter holds a DELETE's answer until the fast path's calls on the
// session ended: the SDK answers once its Close waited for its own.
type waitingWriter struct {
	http.ResponseWriter
	calls *inflight
	once  sync.Once
}

func (w *waitingWriter) WriteHeader(code int) {
	w.once.Do(w.calls.wait)
	w.ResponseWriter.WriteHeader(code)
}

func (w *waitingWriter) Write(b []byte) (int, error) {
	w.once.Do(w.calls.wait)
	return w.ResponseWriter.Write(b)
}

// isEnded reports whether end has begun.
func (f *inflight) isEnded() bool {
	select {
	case <-f.closed:
		return true
	default:
		return false
	}
}
