package review

import (
	"net/http"
	"slices"
	"time"

	"github.com/sluice-gw/sluice/gateway/holds"
	"golang.org/x/crypto/bcrypt"
)

// Sign-in and sign-out: the login form, a session started for a person
// (password, token or OIDC), and the session cookie as the admin API's
// authentication.

func (u *UI) handleLoginPage(w http.ResponseWriter, r *http.Request) {
	u.loginForm(w, r, http.StatusOK, "")
}

// loginForm renders the form with a fresh pre-session CSRF token in a
// cookie and the form (double submit): a login POST from another site
// cannot carry it.
func (u *UI) loginForm(w http.ResponseWriter, r *http.Request, status int, msg string) {
	tok := randomToken()
	http.SetCookie(w, u.cookie(r, "sluice_login", tok, http.SameSiteStrictMode, 600))
	u.render(w, status, "login", page{Title: "Sign in", CSRF: tok, OIDC: u.oidc != nil, Message: msg})
}

func (u *UI) cookie(r *http.Request, name, value string, ss http.SameSite, maxAge int) *http.Cookie {
	c := cookie(r, name, value, ss, maxAge)
	c.Secure = c.Secure || u.opt.SecureCookies
	return c
}

func (u *UI) handleLogin(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		u.fail(w, r, nil, http.StatusBadRequest, "Malformed form.")
		return
	}
	c, err := r.Cookie("sluice_login")
	if err != nil || !tokenEqual(r.PostForm.Get("csrf"), c.Value) {
		u.fail(w, r, nil, http.StatusForbidden, "Missing or wrong form token (CSRF). Reload the sign-in page.")
		return
	}
	name, pw := r.PostForm.Get("username"), r.PostForm.Get("password")
	now := u.opt.Now()
	if len(name) > 256 || len(pw) > 1024 {
		u.loginForm(w, r, http.StatusBadRequest, "Name or password too long.")
		return
	}
	addr := clientAddr(r)
	if !u.limit.allowed(name, addr, now) {
		u.audit(r.Context(), "ui.login_refused", map[string]any{"user": name, "reason": "rate_limited", "addr": addr})
		u.loginForm(w, r, http.StatusTooManyRequests, "Too many failed attempts for this name; wait and try again.")
		return
	}
	us, ok := u.users[name]
	hash := u.dummyPWH
	if ok {
		hash = []byte(us.PasswordHash)
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(pw)) != nil || !ok {
		u.limit.fail(name, addr, now)
		u.audit(r.Context(), "ui.login_failed", map[string]any{"user": name, "method": "password"})
		u.loginForm(w, r, http.StatusUnauthorized, "Wrong name or password.")
		return
	}
	u.limit.reset(name, addr)
	if !u.startSession(w, r, holds.Person{Name: us.Name, Groups: slices.Clone(us.Groups)}, "password") {
		return
	}
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// startSession stores a new session and sets its cookie; false (the page
// sent) when the session store did not take it.
func (u *UI) startSession(w http.ResponseWriter, r *http.Request, p holds.Person, method string) bool {
	if c, err := r.Cookie(sessionCookie); err == nil { // no fixation: a new ID every sign-in
		if err := u.sess.remove(r.Context(), c.Value); err != nil {
			u.sessionFail(w, r, nil, err)
			return false
		}
	}
	s, err := u.sess.create(r.Context(), p, method, u.opt.Now())
	if err != nil {
		u.sessionFail(w, r, nil, err)
		return false
	}
	http.SetCookie(w, u.cookie(r, sessionCookie, s.id, http.SameSiteStrictMode, int(u.opt.SessionTTL/time.Second)))
	http.SetCookie(w, u.cookie(r, "sluice_login", "", http.SameSiteStrictMode, -1))
	u.audit(r.Context(), "ui.login", map[string]any{"user": p.Name, "groups": p.Groups, "method": method})
	return true
}

// sessionFail answers a request whose session the store could not read or
// write: 503, and the person is not treated as signed in (or out).
func (u *UI) sessionFail(w http.ResponseWriter, r *http.Request, s *session, err error) {
	u.log.Error("review: sessions", "err", err.Error())
	u.fail(w, r, s, http.StatusServiceUnavailable, "The session store is unavailable; try again shortly.")
}

func (u *UI) handleLogout(w http.ResponseWriter, r *http.Request, s *session) {
	if err := u.sess.remove(r.Context(), s.id); err != nil { // not signed out: say so
		u.sessionFail(w, r, s, err)
		return
	}
	http.SetCookie(w, u.cookie(r, sessionCookie, "", http.SameSiteStrictMode, -1))
	u.audit(r.Context(), "ui.logout", map[string]any{"user": s.person.Name})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// Person authenticates a request by its UI session cookie, for the admin
// JSON API (gateway.Server.SetAdminAuth). A state-changing request must also
// carry the session's CSRF token in the X-CSRF-Token header and come from
// this origin; otherwise it is not authenticated.
func (u *UI) Person(r *http.Request) (holds.Person, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return holds.Person{}, false
	}
	s, err := u.sess.get(r.Context(), c.Value, u.opt.Now())
	if err != nil || s == nil {
		return holds.Person{}, false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	default:
		if !sameOrigin(r) || !tokenEqual(r.Header.Get("X-CSRF-Token"), s.csrf) {
			return holds.Person{}, false
		}
	}
	p := s.person
	p.Groups = slices.Clone(p.Groups)
	return p, true
}
