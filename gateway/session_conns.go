package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"

	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/storecheck"
)

// sessionConns are the open connections of every session: each admitted
// sandbox connection (relayed, handed off, or from a remote relay) and the
// upstream of each pass-through tunnel, by the session of the identity
// that opened it. Ending a session closes them all at once (THREATS C12):
// a tunnel or a keep-alive connection opened before the end carries
// nothing after it, and whatever the sandbox opens afterwards is refused
// where every egress is decided (egress.Proxy.sessionGate).
//
// Registration comes before any request is read from the connection and
// the end is recorded in the store before closeSession runs, so a
// connection is either closed by the end or refused after it: never both
// open and allowed.
type sessionConns struct {
	mu sync.Mutex
	m  map[string]map[io.Closer]struct{}
}

// add registers c under session and returns the function that removes it
// (idempotent). A connection without a session is not registered.
func (sc *sessionConns) add(session string, c io.Closer) (remove func()) {
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

// closeSession closes every connection registered under session and
// returns how many it closed. Closing runs outside the lock: an
// ingress.Conn's Close removes itself.
func (sc *sessionConns) closeSession(session string) int {
	sc.mu.Lock()
	set := sc.m[session]
	delete(sc.m, session)
	sc.mu.Unlock()
	for c := range set {
		_ = c.Close()
	}
	return len(set)
}

// count is the number of connections open under session (tests).
func (sc *sessionConns) count(session string) int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.m[session])
}

// ingress.ConnContext attaches the admitted connection's identity to its requests
// and registers the connection under its session, so that ending the
// session closes it (sessionConns).
func (sc *sessionConns) connContext(ctx context.Context, c net.Conn) context.Context {
	if ic, ok := c.(*ingress.Conn); ok {
		ic.OnClose(sc.add(ic.Identity().Session, ic))
	}
	return ingress.ConnContext(ctx, c)
}

// SessionEnder revokes what a session was given when the session ends.
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
type SessionEnder interface {
	EndSession(ctx context.Context, session string) error
}

// sessionRefusal refuses a call whose identity carries an ended session;
// a store failure refuses too (fail closed). A call without a session is
// never refused here.
func sessionRefusal(ctx context.Context, st *store.Store, session string) *refusal.Error {
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

// sessionCheck is sessionRefusal over st, as the doors' hooks take it.
func sessionCheck(st *store.Store) func(ctx context.Context, session string) *refusal.Error {
	return func(ctx context.Context, session string) *refusal.Error { return sessionRefusal(ctx, st, session) }
}
