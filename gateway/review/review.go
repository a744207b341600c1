// Package review is the web UI where people decide held calls: sign-in
// (local users with bcrypt hashes, or OIDC), a live queue of pending holds,
// a hold's page showing exactly what would be sent, approve and deny forms,
// history, the audit log as a filtered table with a badge saying whether
// its hash chain verifies, and a session's timeline.
//
// Everything a hold carries came from the agent and is hostile: pages are
// html/template (contextual escaping), invisible and bidi characters are
// shown as markers, huge values are cut with an expand control. The server
// decides who may approve (Holds.CanApprove before showing controls, and
// Holds.Approve refuses anyway); every POST carries a per-session CSRF
// token; pages are served with a strict CSP and no inline script.
package review

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/store"
)

// Holds is what the UI needs of the holds manager (*holds.Manager).
type Holds interface {
	List(ctx context.Context, f holds.Filter) ([]holds.Hold, error)
	Get(ctx context.Context, id string) (holds.Hold, error)
	Approve(ctx context.Context, id string, by holds.Person, reason string) (holds.Hold, error)
	// ApproveGrant approves and grants "always allow this exact call" on
	// the terms given (how long, how many calls).
	ApproveGrant(ctx context.Context, id string, by holds.Person, reason string, t holds.GrantTerms) (holds.Hold, holds.Grant, error)
	Deny(ctx context.Context, id string, by holds.Person, reason string) (holds.Hold, error)
	Subscribe(ctx context.Context) <-chan holds.Event
	CanApprove(h holds.Hold, p holds.Person) error
}

// OIDC configures sign-in through an OpenID provider (authorization-code
// flow with state, nonce and PKCE).
type OIDC struct {
	Issuer       string
	ClientID     string
	ClientSecret string
	// RedirectURL is this UI's callback as the provider knows it:
	// "https://sluice.example/oidc/callback".
	RedirectURL string
	// UsernameClaim names the person (default "preferred_username"); it is
	// what approver lists in policy name.
	UsernameClaim string
	// GroupsClaim lists the person's groups (default "groups").
	GroupsClaim string
	// HTTPClient talks to the provider (default http.DefaultClient).
	HTTPClient *http.Client
}

// Options configures New.
type Options struct {
	Holds Holds         // required
	Users []config.User // local approver accounts (bcrypt password hashes)
	OIDC  *OIDC         // optional
	Log   *slog.Logger  // default: discard
	Audit func(ctx context.Context, event string, fields map[string]any) error
	// AuditFile is the audit log (audit.path) the audit table and the
	// session timelines read, and verify, on each view (optional).
	AuditFile string
	Now       func() time.Time // default time.Now
	// SessionTTL and SessionIdle bound a session (defaults 8h and 30m).
	SessionTTL, SessionIdle time.Duration
	// SecureCookies forces the Secure attribute (for TLS terminated in front
	// of the gateway); cookies are always Secure on a TLS request.
	SecureCookies bool
	// LoginFailures failures per LoginWindow lock a user name for the
	// address they came from, and ten times as many from all addresses lock
	// it for everyone (defaults 5, 15m).
	LoginFailures int
	LoginWindow   time.Duration
	// Connections, when set, serves the Connections page (connections.go):
	// a person connects the connectors that act with their own account.
	Connections Connections
	// Grants, when set, serves the Grants page (grants.go).
	Grants Grants
	// Sessions keeps the sign-in sessions (the gateway's store, so that
	// every replica sharing it shares them). Default: this process's
	// memory.
	Sessions SessionStore
}

// UI is the review web UI; mount it at "/" on the admin listener.
type UI struct {
	opt      Options
	log      *slog.Logger
	users    map[string]config.User
	sess     *sessions
	limit    *limiter
	oidc     *oidcFlow
	pages    map[string]*template.Template
	mux      *http.ServeMux
	static   http.Handler
	dummyPWH []byte
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// csp allows only this origin's files: no inline script or style, no
// framing, forms only to this origin.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

const sessionCookie = "sluice_session"

// New builds the UI.
func New(opt Options) (*UI, error) {
	if opt.Holds == nil {
		return nil, errors.New("review: options: Holds is required")
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Audit == nil {
		opt.Audit = func(context.Context, string, map[string]any) error { return nil }
	}
	if opt.SessionTTL <= 0 {
		opt.SessionTTL = 8 * time.Hour
	}
	if opt.SessionIdle <= 0 {
		opt.SessionIdle = 30 * time.Minute
	}
	if opt.LoginFailures <= 0 {
		opt.LoginFailures = 5
	}
	if opt.LoginWindow <= 0 {
		opt.LoginWindow = 15 * time.Minute
	}
	if opt.Sessions == nil {
		opt.Sessions = &memSessions{m: map[string]store.UISession{}}
	}
	u := &UI{
		opt:   opt,
		log:   opt.Log,
		users: map[string]config.User{},
		sess:  &sessions{st: opt.Sessions, ttl: opt.SessionTTL, idle: opt.SessionIdle},
		limit: &limiter{fails: map[string][]time.Time{}, max: opt.LoginFailures, window: opt.LoginWindow},
		pages: map[string]*template.Template{},
	}
	for i, us := range opt.Users {
		if us.Name == "" {
			return nil, fmt.Errorf("review: users[%d]: empty name", i)
		}
		if _, err := bcrypt.Cost([]byte(us.PasswordHash)); err != nil {
			return nil, fmt.Errorf("review: users[%d] (%s): password_hash is not bcrypt: %w", i, us.Name, err)
		}
		u.users[us.Name] = us
	}
	// Unknown names are checked against this hash, so a failed login takes
	// as long whether or not the account exists.
	cost := bcrypt.DefaultCost
	for _, us := range u.users {
		cost, _ = bcrypt.Cost([]byte(us.PasswordHash))
		break
	}
	h, err := bcrypt.GenerateFromPassword([]byte(randomToken()), cost)
	if err != nil {
		return nil, fmt.Errorf("review: dummy hash: %w", err)
	}
	u.dummyPWH = h
	if opt.OIDC != nil {
		if u.oidc, err = newOIDCFlow(*opt.OIDC, opt.Sessions); err != nil {
			return nil, err
		}
	}
	funcs := template.FuncMap{
		"visible": visible,
		"long":    long,
		"pretty":  prettyJSON,
		"age":     func(t time.Time) string { return ago(opt.Now().Sub(t)) },
		"until": func(t time.Time) string {
			d := t.Sub(opt.Now())
			if d <= 0 {
				return "expired " + ago(-d) + " ago"
			}
			return "in " + ago(d)
		},
		"stamp":         stampHTML,
		"sortedHeaders": sortedHeaders,
		"argsum":        func(doc []byte) string { return argSummary(doc) },
		"pathesc":       url.PathEscape,
	}
	for _, name := range []string{"login", "queue", "hold", "history", "audit", "timeline", "error", "redirect", "queuefrag", "connections", "grants"} {
		t, err := template.New("base.html").Funcs(funcs).ParseFS(templateFS, "templates/base.html", "templates/queuelist.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("review: template %s: %w", name, err)
		}
		u.pages[name] = t
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("bug(): review: static: %w", err)
	}
	u.static = http.StripPrefix("/ui/static/", http.FileServerFS(sub))

	m := http.NewServeMux()
	m.HandleFunc("GET /ui/static/", u.handleStatic)
	m.HandleFunc("GET /login", u.handleLoginPage)
	m.HandleFunc("POST /login", u.handleLogin)
	m.HandleFunc("GET /oidc/login", u.handleOIDCLogin)
	m.HandleFunc("GET /oidc/callback", u.handleOIDCCallback)
	m.HandleFunc("POST /logout", u.authed(u.handleLogout))
	m.HandleFunc("GET /{$}", u.authed(u.handleQueue))
	m.HandleFunc("GET /ui/queue", u.authed(u.handleQueueFragment))
	m.HandleFunc("GET /ui/events", u.authed(u.handleEvents))
	m.HandleFunc("GET /holds/{id}", u.authed(u.handleHold))
	m.HandleFunc("POST /holds/{id}/approve", u.authed(u.handleDecide(true)))
	m.HandleFunc("POST /holds/{id}/deny", u.authed(u.handleDecide(false)))
	m.HandleFunc("GET /history", u.authed(u.handleHistory))
	m.HandleFunc("GET /audit", u.authed(u.handleAudit))
	m.HandleFunc("GET /sessions/{session}", u.authed(u.handleTimeline))
	if opt.Grants != nil {
		m.HandleFunc("GET /grants", u.authed(u.handleGrants))
		m.HandleFunc("POST /grants/{id}/revoke", u.authed(u.handleRevokeGrant))
	}
	if opt.Connections != nil {
		m.HandleFunc("GET /connections", u.authed(u.handleConnections))
		m.HandleFunc("GET /connections/callback", u.handleConnectCallback) // no session needed (connections.go)
		m.HandleFunc("GET /connections/{connector}/connect", u.authed(u.handleConnect))
		m.HandleFunc("POST /connections/{connector}/disconnect", u.authed(u.handleDisconnect))
	}
	u.mux = m
	return u, nil
}

// ServeHTTP sets the security headers every answer carries, refuses
// cross-origin POSTs, and routes.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin") // not no-referrer: that makes browsers send "Origin: null" on our own POSTs
	h.Set("Cache-Control", "no-store")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if r.Method == http.MethodPost && !sameOrigin(r) {
		u.fail(w, r, nil, http.StatusForbidden, "Cross-origin request refused.")
		return
	}
	u.mux.ServeHTTP(w, r)
}

// sameOrigin is a second line behind CSRF tokens: a browser's POST names its
// origin, and it must be this host.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || o == "null" {
		return o == "" // a browser that sends no Origin still needs the token
	}
	ou, err := url.Parse(o)
	return err == nil && ou.Host == r.Host
}

func (u *UI) handleStatic(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-cache")
	u.static.ServeHTTP(w, r)
}

// authed runs h with the request's session, or sends the browser to login.
func (u *UI) authed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var s *session
		if c, err := r.Cookie(sessionCookie); err == nil {
			if s, err = u.sess.get(r.Context(), c.Value, u.opt.Now()); err != nil {
				u.sessionFail(w, r, nil, err)
				return
			}
		}
		if s == nil {
			if r.Method == http.MethodGet && r.URL.Path != "/ui/events" && r.URL.Path != "/ui/queue" {
				http.Redirect(w, r, "/login", http.StatusSeeOther)
				return
			}
			u.fail(w, r, nil, http.StatusUnauthorized, "Not signed in, or the session expired.")
			return
		}
		if r.Method == http.MethodPost {
			if err := r.ParseForm(); err != nil {
				u.fail(w, r, s, http.StatusBadRequest, "Malformed form.")
				return
			}
			if !tokenEqual(r.PostForm.Get("csrf"), s.csrf) {
				u.log.Warn("review: csrf token missing or wrong", "user", s.person.Name, "path", r.URL.Path)
				u.fail(w, r, s, http.StatusForbidden, "Missing or wrong form token (CSRF). Reload the page and try again.")
				return
			}
		}
		h(w, r, s)
	}
}

// page is what every template gets.
type page struct {
	Title   string
	Me      *holds.Person
	CSRF    string
	Nav     string
	Conns   bool // the Connections page exists
	Grants  bool // the Grants page exists
	OIDC    bool
	Message string
	Data    any
}

func (u *UI) render(w http.ResponseWriter, status int, name string, p page) {
	t := u.pages[name]
	var b strings.Builder
	if err := t.ExecuteTemplate(&b, "page", p); err != nil {
		u.log.Error("review: render", "page", name, "err", err.Error())
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

func (u *UI) fail(w http.ResponseWriter, r *http.Request, s *session, status int, msg string) {
	p := page{Title: http.StatusText(status), Message: msg, Data: status}
	if s != nil {
		p.Me, p.CSRF = &s.person, s.csrf
	}
	u.render(w, status, "error", p)
}

func (u *UI) page(s *session, title, nav string, data any) page {
	return page{Title: title, Me: &s.person, CSRF: s.csrf, Nav: nav, Data: data, Conns: u.opt.Connections != nil, Grants: u.opt.Grants != nil}
}

// --- sign-in ---

func (u *UI) audit(ctx context.Context, event string, f map[string]any) {
	if err := u.opt.Audit(ctx, event, f); err != nil {
		u.log.Error("review: audit", "event", event, "err", err.Error())
	}
}

// --- holds ---

// view is one hold as the pages show it, with what this person may do.
type view struct {
	holds.Hold
	Mine       bool   // the person is the requester (caller.user)
	CanApprove bool   // the server's answer, not the page's guess
	Why        string // why not, when CanApprove is false
	Outcome    Outcome
	Marked     bool // the page shows markers for invisible characters: explain them
}

// visibleTo decides whether a person may see a hold at all: its approvers
// and its requester may; others get 404, as if it did not exist.
func (u *UI) visibleTo(h holds.Hold, p holds.Person) (view, bool) {
	v := view{Hold: h, Mine: ident.Conflict(h.Caller.User, p.Name), Outcome: outcome(h)} // Mine as CanApprove compares
	err := u.opt.Holds.CanApprove(h, p)
	switch {
	case err == nil && !v.Mine:
		v.CanApprove = true
	case v.Mine || errors.Is(err, holds.ErrSelfApproval):
		v.Mine = true
		v.Why = "You are the person this call is made for, so someone else must approve it."
	default:
		return v, false
	}
	return v, true
}

func (u *UI) listFor(ctx context.Context, p holds.Person, f holds.Filter) ([]view, error) {
	hs, err := u.opt.Holds.List(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]view, 0, len(hs))
	for _, h := range hs {
		if v, ok := u.visibleTo(h, p); ok {
			out = append(out, v)
		}
	}
	return out, nil
}

func (u *UI) pending(ctx context.Context, p holds.Person) ([]view, error) {
	return u.listFor(ctx, p, holds.Filter{Status: []holds.Status{holds.Pending}, Limit: 500})
}

func (u *UI) handleQueue(w http.ResponseWriter, r *http.Request, s *session) {
	vs, err := u.pending(r.Context(), s.person)
	if err != nil {
		u.storeFail(w, r, s, err)
		return
	}
	u.render(w, http.StatusOK, "queue", u.page(s, "Pending", "queue", vs))
}

// handleQueueFragment is the queue's list alone, fetched by the page's
// script when the event stream says something changed.
func (u *UI) handleQueueFragment(w http.ResponseWriter, r *http.Request, s *session) {
	vs, err := u.pending(r.Context(), s.person)
	if err != nil {
		u.storeFail(w, r, s, err)
		return
	}
	u.render(w, http.StatusOK, "queuefrag", u.page(s, "", "", vs))
}

func (u *UI) storeFail(w http.ResponseWriter, r *http.Request, s *session, err error) {
	u.log.Error("review: holds", "err", err.Error())
	u.fail(w, r, s, http.StatusServiceUnavailable, "The holds store is unavailable; try again shortly.")
}

func (u *UI) handleHold(w http.ResponseWriter, r *http.Request, s *session) {
	h, err := u.opt.Holds.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		u.decisionFail(w, r, s, err)
		return
	}
	v, ok := u.visibleTo(h, s.person)
	if !ok {
		u.fail(w, r, s, http.StatusNotFound, "No such hold.")
		return
	}
	v.Marked = holdMarked(h)
	u.render(w, http.StatusOK, "hold", u.page(s, "Hold "+h.ID, "", v))
}

// grantTTLs are the lifetimes the approve form offers for "always allow"
// ("" when the select is missing: the default).
var grantTTLs = map[string]time.Duration{"": holds.DefaultGrantTTL, "1h": time.Hour, "8h": 8 * time.Hour, "24h": holds.MaxGrantTTL}

// grantUses are the use limits the approve form offers ("" and "any": no
// limit but the lifetime).
var grantUses = map[string]int{"": 0, "any": 0, "1": 1, "2": 2, "5": 5, "10": 10}

func (u *UI) handleDecide(approve bool) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		id := r.PathValue("id")
		reason := strings.TrimSpace(r.PostForm.Get("reason"))
		if len(reason) > 2000 {
			u.fail(w, r, s, http.StatusBadRequest, "The reason is too long (at most 2000 bytes).")
			return
		}
		always := r.PostForm.Get("always")
		if always != "" && (!approve || always != "on") {
			u.fail(w, r, s, http.StatusBadRequest, "“Always allow” goes only with Approve.")
			return
		}
		var err error
		switch {
		case always == "on":
			ttl, ok := grantTTLs[r.PostForm.Get("ttl")]
			if !ok {
				u.fail(w, r, s, http.StatusBadRequest, "Choose how long “always allow” lasts: 1h, 8h or 24h.")
				return
			}
			uses, ok := grantUses[r.PostForm.Get("uses")]
			if !ok {
				u.fail(w, r, s, http.StatusBadRequest, "Choose how many calls “always allow” lets through: any, 1, 2, 5 or 10.")
				return
			}
			_, _, err = u.opt.Holds.ApproveGrant(r.Context(), id, s.person, reason, holds.GrantTerms{TTL: ttl, MaxUses: uses})
		case approve:
			_, err = u.opt.Holds.Approve(r.Context(), id, s.person, reason)
		default:
			_, err = u.opt.Holds.Deny(r.Context(), id, s.person, reason)
		}
		if err != nil {
			u.log.Info("review: decision refused", "user", s.person.Name, "hold", id, "approve", approve, "err", err.Error())
			u.decisionFail(w, r, s, err)
			return
		}
		http.Redirect(w, r, "/holds/"+url.PathEscape(id), http.StatusSeeOther)
	}
}

// decisionFail maps the holds errors to pages with the designed status.
func (u *UI) decisionFail(w http.ResponseWriter, r *http.Request, s *session, err error) {
	switch {
	case errors.Is(err, holds.ErrSelfApproval):
		u.fail(w, r, s, http.StatusForbidden, "You cannot approve or deny a call made for you (self_approval_forbidden).")
	case errors.Is(err, holds.ErrNotApprover):
		u.fail(w, r, s, http.StatusForbidden, "You are not an approver of this hold (not_an_approver).")
	case errors.Is(err, holds.ErrNotFound):
		u.fail(w, r, s, http.StatusNotFound, "No such hold.")
	case errors.Is(err, holds.ErrConflict):
		u.fail(w, r, s, http.StatusConflict, "This hold was already decided.")
	case errors.Is(err, holds.ErrExpired):
		u.fail(w, r, s, http.StatusGone, "This hold expired before it was decided.")
	default:
		u.storeFail(w, r, s, err)
	}
}

func (u *UI) handleHistory(w http.ResponseWriter, r *http.Request, s *session) {
	f := holds.Filter{Status: []holds.Status{holds.Approved, holds.Running, holds.Done, holds.Denied, holds.Expired, holds.Unknown, holds.Failed}, Limit: 200}
	vs, err := u.listFor(r.Context(), s.person, f)
	if err != nil {
		u.storeFail(w, r, s, err)
		return
	}
	u.render(w, http.StatusOK, "history", u.page(s, "History", "history", vs))
}

// handleEvents streams "changed" events for holds this person may see, so
// the queue updates without reloading. It ends with the session.
func (u *UI) handleEvents(w http.ResponseWriter, r *http.Request, s *session) {
	fl, ok := w.(http.Flusher)
	if !ok {
		u.fail(w, r, s, http.StatusInternalServerError, "Streaming unsupported.")
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch := u.opt.Holds.Subscribe(ctx)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 3000\n\n")
	fl.Flush()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if ok, err := u.sess.alive(ctx, s.id, u.opt.Now()); !ok || err != nil {
				return // signed out or expired on any replica, or unknown: the stream ends
			}
			// Also a resync: the manager drops events for a subscriber that
			// falls behind, so the page re-lists at least this often.
			fmt.Fprint(w, "event: changed\ndata: {}\n\n")
			fl.Flush()
		case ev, ok := <-ch:
			if !ok {
				return
			}
			if _, vis := u.visibleTo(ev.Hold, s.person); !vis {
				continue
			}
			b, _ := json.Marshal(map[string]string{"id": ev.Hold.ID, "kind": ev.Kind})
			fmt.Fprintf(w, "event: changed\ndata: %s\n\n", b)
			fl.Flush()
		}
	}
}

// --- helpers for templates ---

type header struct {
	Name   string
	Values []string
}

func sortedHeaders(h map[string][]string) []header {
	out := make([]header, 0, len(h))
	for k, v := range h {
		out = append(out, header{k, v})
	}
	slices.SortFunc(out, func(a, b header) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	default:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
}
