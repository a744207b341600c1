package review

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/gateway/holds"
)

// session is one signed-in person. The cookie carries only the random ID;
// everything else stays on the server, so a logout or expiry is final.
type session struct {
	id       string
	person   holds.Person
	csrf     string // per-session token every POST must carry
	method   string // "password" or "oidc"
	created  time.Time
	lastSeen time.Time
}

// sessions is the in-memory session table. Sessions do not survive a
// restart: people sign in again, which is the safe direction.
type sessions struct {
	mu   sync.Mutex
	m    map[string]*session
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

func (ss *sessions) create(p holds.Person, method string, now time.Time) *session {
	s := &session{id: randomToken(), person: p, csrf: randomToken(), method: method, created: now, lastSeen: now}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for id, o := range ss.m { // sweep expired ones while here
		if ss.expired(o, now) {
			delete(ss.m, id)
		}
	}
	ss.m[s.id] = s
	return s
}

func (ss *sessions) expired(s *session, now time.Time) bool {
	return now.Sub(s.created) >= ss.ttl || now.Sub(s.lastSeen) >= ss.idle
}

// get returns the live session with this ID and marks it used, or nil.
func (ss *sessions) get(id string, now time.Time) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[id]
	if s == nil {
		return nil
	}
	if ss.expired(s, now) {
		delete(ss.m, id)
		return nil
	}
	s.lastSeen = now
	c := *s
	return &c
}

// alive reports whether the session still exists and has not expired,
// without counting as activity (the live event stream checks this).
func (ss *sessions) alive(id string, now time.Time) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[id]
	return s != nil && !ss.expired(s, now)
}

func (ss *sessions) remove(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, id)
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
