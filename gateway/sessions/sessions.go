// Package sessions is what ending a session does at once: the refusal
// of its later calls (Refusal, Check), the closing of every connection
// opened under it (Conns), and the credential source's hook that revokes
// what it was given (Ender).
package sessions

import (
	"context"
	"io"
	"net/http"
	"sync"

	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/storecheck"
)

// Conns are the open connections of every session: each admitted
// sandbox connection (relayed, handed off, or from a remote relay) and the
// upstream of each pass-through tunnel, by the session of the identity
// that opened it. Ending a session closes them all at once (THREATS C12):
// a tunnel or a keep-alive connection opened before the end carries
// nothing after it, and whatever the sandbox opens afterwards is refused
// where every egress is decided (egress.Proxy.sessionGate).
//
// Registration comes before any request is read from the connection and
// the end is recorded in the store before CloseSession runs, so a
// connection is either closed by the end or refused after it: never both
// open and allowed.
type Conns struct {
	mu sync.Mutex
	m  map[string]map[io.Closer]struct{}
}

// Add registers c under session and returns the function that removes it
// (idempotent). A connection without a session is not registered.
func (sc *Conns) Add(session string, c io.Closer) (remove func()) {
	if session == "" {
		return func() {}
	}
	sc.mu.Lock()
	if sc.m == nil {
		sc.m = map[string]map[io.Closer]struct{}{}
	}
	set := sc.m[session]
	if set == nil {
		set = map[io.Closer]struct{}{}
		sc.m[session] = set
	}
	set[c] = struct{}{}
	sc.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			sc.mu.Lock()
			defer sc.mu.Unlock()
			if set := sc.m[session]; set != nil {
				delete(set, c)
				if len(set) == 0 {
					delete(sc.m, session)
				}
			}
		})
	}
}

// CloseSession closes every connection registered under session and
// returns how many it closed. Closing runs outside the lock: an
// ingress.Conn's Close removes itself.
func (sc *Conns) CloseSession(session string) int {
	sc.mu.Lock()
	set := sc.m[session]
	delete(sc.m, session)
	sc.mu.Unlock()
	for c := range set {
		_ = c.Close()
	}
	return len(set)
}

// Count is the number of connections open under session (tests).
func (sc *Conns) Count(session string) int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.m[session])
}

// Ender revokes what a session was given when the session ends.
// When the credential source (Options.Credentials, or the configured
// secrets backend) implements it, POST /api/v1/sessions/{session}/end calls
// EndSession after the session is recorded as ended and its pending holds
// are expired. This is where the Vault backend plugs lease revocation in
// (issue 5); no backend implements it yet, so today ending a session refuses
// its later calls and expires its holds, and revokes nothing.
//
// EndSession runs on every end request, a repeat included, so it must be
// idempotent. An error answers the request 502 revocation_failed (the
// session stays ended); the caller retries.
type Ender interface {
	EndSession(ctx context.Context, session string) error
}

// Refusal refuses a call whose identity carries an ended session;
// a store failure refuses too (fail closed). A call without a session is
// never refused here.
func Refusal(ctx context.Context, st *store.Store, session string) *refusal.Error {
	if session == "" {
		return nil
	}
	ended, err := st.SessionEnded(ctx, session)
	if e := storecheck.Refusal(err); e != nil {
		return e
	}
	if err != nil {
		return refusal.New(http.StatusServiceUnavailable, refusal.SessionUnavailable, "whether this session has ended cannot be read; the call was not sent").Wrap(err)
	}
	if ended {
		return refusal.New(http.StatusForbidden, refusal.SessionEnded, "this session has ended; nothing more is sent for it")
	}
	return nil
}

// Check is Refusal over st, as the doors' hooks take it.
func Check(st *store.Store) func(ctx context.Context, session string) *refusal.Error {
	return func(ctx context.Context, session string) *refusal.Error { return Refusal(ctx, st, session) }
}
