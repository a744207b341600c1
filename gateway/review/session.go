package review

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/store"
)

// session is one signed-in person as a request sees it. The cookie
// carries only the random ID; the rest is in the session table (the
// gateway's store), keyed by the ID's SHA-256, so a logout or expiry on
// any replica is final on all.
type session struct {
	id     string // the cookie's value; never stored
	person holds.Person
	csrf   string // per-session token every POST must carry (sessionCSRF(id))
	method string // "password" or "oidc"
}

// SessionStore keeps the UI's sessions where every gateway replica
// sharing the store sees them (*store.Store). Sessions are keyed by
// sessionHash(id); a row's own expiry and idle timeout decide whether it
// is live (see store.UISession).
type SessionStore interface {
	PutUISession(ctx context.Context, s store.UISession) error
	// TouchUISession returns the live session and records its use, or
	// store.ErrNotFound.
	TouchUISession(ctx context.Context, idHash string, now time.Time) (store.UISession, error)
	UISessionAlive(ctx context.Context, idHash string, now time.Time) (bool, error)
	DeleteUISession(ctx context.Context, idHash string) error
	// OIDC sign-ins started and not yet finished (oidc.go), so that the
	// provider's redirect may reach any replica: Put drops the expired
	// and the oldest beyond max-1; Take deletes and returns one, once
	// however many callbacks race for it, or store.ErrNotFound.
	PutUIOIDCPending(ctx context.Context, p store.UIOIDCPending, max int) error
	TakeUIOIDCPending(ctx context.Context, idHash string) (store.UIOIDCPending, error)
}

// sessions is the session table as the UI uses it. There is no cache in
// front of the store: every request reads its row, so a session ended on
// another replica is refused here at once.
type sessions struct {
	st   SessionStore
	ttl  time.Duration // absolute lifetime
	idle time.Duration // lifetime without requests
}

func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("bug(): crypto/rand: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// sessionHash is what the store keys a session by: a reader of the table
// learns no ID it could present.
func sessionHash(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])
}

// sessionCSRF is the session's CSRF token, derived from its ID (so every
// replica computes the same token and none is stored): unpredictable
// without the ID, and it reveals neither the ID nor the stored hash
// (another prefix).
func sessionCSRF(id string) string {
	h := sha256.Sum256([]byte("sluice review csrf\x00" + id))
	return base64.RawURLEncoding.EncodeToString(h[:])
}

func (ss *sessions) create(ctx context.Context, p holds.Person, method string, now time.Time) (*session, error) {
	s := &session{id: randomToken(), person: p, method: method}
	s.csrf = sessionCSRF(s.id)
	err := ss.st.PutUISession(ctx, store.UISession{IDHash: sessionHash(s.id), Person: p.Name, Groups: p.Groups, Method: method,
		Created: now, Expires: now.Add(ss.ttl), Idle: ss.idle})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// get returns the live session with this ID and marks it used, or nil
// when there is none (an error only when the store did not answer).
func (ss *sessions) get(ctx context.Context, id string, now time.Time) (*session, error) {
	if id == "" {
		return nil, nil
	}
	u, err := ss.st.TouchUISession(ctx, sessionHash(id), now)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &session{id: id, person: holds.Person{Name: u.Person, Groups: u.Groups}, csrf: sessionCSRF(id), method: u.Method}, nil
}

// alive reports whether the session still exists and has not expired,
// without counting as activity (the live event stream checks this).
func (ss *sessions) alive(ctx context.Context, id string, now time.Time) (bool, error) {
	return ss.st.UISessionAlive(ctx, sessionHash(id), now)
}

func (ss *sessions) remove(ctx context.Context, id string) error {
	return ss.st.DeleteUISession(ctx, sessionHash(id))
}

// memSessions is the SessionStore of a UI given none: this process's
// memory, with the store's rules. Its sessions do not survive a restart
// and are not seen by other processes.
type memSessions struct {
	mu   sync.Mutex
	m    map[string]store.UISession
	oidc map[string]store.UIOIDCPending
}

func (ms *memSessions) PutUISession(_ context.Context, u store.UISession) error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for h, o := range ms.m { // sweep ended ones while here
		if !o.Live(u.Created) {
			delete(ms.m, h)
		}
	}
	u.LastSeen = u.Created
	u.Groups = slices.Clone(u.Groups)
	ms.m[u.IDHash] = u
	return nil
}

func (ms *memSessions) TouchUISession(_ context.Context, idHash string, now time.Time) (store.UISession, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	u, ok := ms.m[idHash]
	if !ok {
		return store.UISession{}, store.ErrNotFound
	}
	if !u.Live(now) {
		delete(ms.m, idHash)
		return store.UISession{}, store.ErrNotFound
	}
	if u.LastSeen.Before(now) {
		u.LastSeen = now
		ms.m[idHash] = u
	}
	u.Groups = slices.Clone(u.Groups)
	return u, nil
}

func (ms *memSessions) UISessionAlive(_ context.Context, idHash string, now time.Time) (bool, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	u, ok := ms.m[idHash]
	return ok && u.Live(now), nil
}

func (ms *memSessions) DeleteUISession(_ context.Context, idHash string) error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.m, idHash)
	return nil
}

func (ms *memSessions) PutUIOIDCPending(_ context.Context, p store.UIOIDCPending, max int) error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for h, o := range ms.oidc {
		if !p.Created.Before(o.Expires) {
			delete(ms.oidc, h)
		}
	}
	if ms.oidc == nil || (max > 0 && len(ms.oidc) >= max) {
		ms.oidc = map[string]store.UIOIDCPending{} // a flood of unfinished sign-ins: start over
	}
	ms.oidc[p.IDHash] = p
	return nil
}

func (ms *memSessions) TakeUIOIDCPending(_ context.Context, idHash string) (store.UIOIDCPending, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	p, ok := ms.oidc[idHash]
	if !ok {
		return store.UIOIDCPending{}, store.ErrNotFound
	}
	delete(ms.oidc, idHash)
	return p, nil
}

// tokenEqual compares CSRF tokens in constant time.
func tokenEqual(a, b string) bool {
	return len(a) > 0 && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// limiter refuses logins after too many failures in a window. It counts
// per (name, client address): guessing one account's password from one
// address is slow, and someone else failing on purpose from their own
// address cannot lock the account's owner out. A second, per-name count
// (globalFactor times larger) slows a guess spread over many addresses.
// It is keyed by the submitted name, existing or not, so it does not
// reveal whether an account exists. The address is the TCP peer: behind a
// reverse proxy every client shares the proxy's address.
type limiter struct {
	mu     sync.Mutex
	fails  map[string][]time.Time
	max    int
	window time.Duration
}

// globalFactor: failures for one name from all addresses together that
// lock it, as a multiple of the per-address limit.
const globalFactor = 10

func pairKey(name, addr string) string { return name + "\x00" + addr }

func (l *limiter) allowed(name, addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.recent(pairKey(name, addr), now)) < l.max && len(l.recent(name, now)) < l.max*globalFactor
}

func (l *limiter) recent(key string, now time.Time) []time.Time {
	ts := l.fails[key]
	k := 0
	for _, t := range ts {
		if now.Sub(t) < l.window {
			ts[k] = t
			k++
		}
	}
	ts = ts[:k]
	if len(ts) == 0 {
		delete(l.fails, key)
	} else {
		l.fails[key] = ts
	}
	return ts
}

func (l *limiter) fail(name, addr string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.fails) > 100000 { // bound memory against floods of invented names
		l.fails = map[string][]time.Time{}
	}
	for _, key := range []string{pairKey(name, addr), name} {
		l.fails[key] = append(l.recent(key, now), now)
	}
}

// reset forgets the failures from addr after a successful sign-in there.
func (l *limiter) reset(name, addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.fails, pairKey(name, addr))
}

// clientAddr is the request's TCP peer address without the port.
func clientAddr(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// cookie builds a cookie with the UI's fixed attributes: HttpOnly, Path=/,
// Secure when the request came over TLS.
func cookie(r *http.Request, name, value string, sameSite http.SameSite, maxAge int) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: "/", HttpOnly: true, Secure: r.TLS != nil, SameSite: sameSite, MaxAge: maxAge}
}
