package review

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/gateway/ident"
)

// Connections is what the Connections page needs: the gateway's OAuth
// client (package gateway/oauth), adapted. Begin binds a connect to the
// person and to the browser it started in (bind: the value of a cookie
// only that browser holds); Complete finishes it for that person, given
// the same bind, and returns the connection with its User.
type Connections interface {
	List(ctx context.Context, user string) ([]Connection, error)
	Begin(ctx context.Context, connector, user, bind string) (authURL string, err error)
	Complete(ctx context.Context, bind, state, code string) (Connection, error)
	Disconnect(ctx context.Context, connector, user string) (revoked bool, err error)
	// Connected runs once a connect is stored and audited (the gateway
	// releases the calls held for it).
	Connected(connector, user string)
}

// Connection is one connector as a person sees it on the page.
type Connection struct {
	Connector   string
	User        string // set by Complete
	Status      string // not_connected, connected, needs_reconnect
	Scopes      []string
	ConnectedAt time.Time
	// Problem is why it cannot be connected now (a remote MCP server's
	// authorization could not be discovered), shown beside it; "".
	Problem string
}

// ErrConnectState is what Complete wraps for a callback whose state is
// not this session's (forged, replayed, expired).
var ErrConnectState = errors.New("review: connect state refused")

// ErrConnectUnavailable is what Begin wraps when the connector cannot be
// connected now; the rest of the error's text says why and is shown.
var ErrConnectUnavailable = errors.New("cannot be connected now")

type connectionsPage struct {
	List []Connection
}

// me is the person's name as sandbox identities carry it (ident's
// canonical form): the user a connection is stored for.
func me(s *session) (string, bool) {
	n, err := ident.Person(s.person.Name)
	return n, err == nil && n != ""
}

func (u *UI) handleConnections(w http.ResponseWriter, r *http.Request, s *session) {
	msg := ""
	if c := r.URL.Query().Get("connected"); c != "" {
		msg = "Connected " + clip(c, 64) + "."
	}
	u.renderConnections(w, r, s, http.StatusOK, msg)
}

func (u *UI) renderConnections(w http.ResponseWriter, r *http.Request, s *session, status int, msg string) {
	user, ok := me(s)
	if !ok {
		u.fail(w, r, s, http.StatusForbidden, "Your account name cannot own connections.")
		return
	}
	list, err := u.opt.Connections.List(r.Context(), user)
	if err != nil {
		u.log.Error("review: list connections", "user", user, "err", err.Error())
		u.fail(w, r, s, http.StatusServiceUnavailable, "Connections cannot be read right now.")
		return
	}
	p := u.page(s, "Connections", "connections", connectionsPage{List: list})
	p.Message = msg
	u.render(w, status, "connections", p)
}

// handleConnect starts a connect: a GET (a link, so that the redirect to
// the provider is a navigation the CSP's form-action does not govern)
// that carries the session's CSRF token.
func (u *UI) handleConnect(w http.ResponseWriter, r *http.Request, s *session) {
	user, ok := me(s)
	if !ok || !tokenEqual(r.URL.Query().Get("csrf"), s.csrf) {
		u.fail(w, r, s, http.StatusForbidden, "Missing or wrong form token (CSRF). Reload the page and try again.")
		return
	}
	connector := r.PathValue("connector")
	// Audited before the state exists: a connect the log cannot record
	// is not started.
	if err := u.opt.Audit(r.Context(), "connection_started", map[string]any{"user": user, "connector": connector}); err != nil {
		u.log.Error("review: connect not audited; not started", "user", user, "connector", connector, "err", err.Error())
		u.fail(w, r, s, http.StatusServiceUnavailable, "The audit log cannot be written; the connect was not started.")
		return
	}
	// The browser's proof at the callback: a fresh value in a cookie of
	// its own, SameSite=Lax because the callback is a cross-site
	// navigation from the provider (the Strict session cookie is not sent
	// on it), and scoped to the callback's path.
	bind := randomToken()
	to, err := u.opt.Connections.Begin(r.Context(), connector, user, bind)
	if errors.Is(err, ErrConnectUnavailable) {
		u.fail(w, r, s, http.StatusServiceUnavailable, clip(err.Error(), 600))
		return
	}
	if err != nil {
		u.fail(w, r, s, http.StatusNotFound, "No connector by that name acts with a person's own account.")
		return
	}
	ck := u.cookie(r, connectCookie, bind, http.SameSiteLaxMode, int(connectCookieTTL/time.Second))
	ck.Path = "/connections/callback"
	http.SetCookie(w, ck)
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// connectCookie carries a started connect's bind to the callback.
const (
	connectCookie    = "sluice_connect"
	connectCookieTTL = 10 * time.Minute
)

// handleConnectCallback is where the provider sends the person back. It
// needs no review UI session (the provider's redirect may reach a replica
// the person is not signed in to, and a cross-site navigation does not
// carry the Strict session cookie): the state names the started connect
// and its person, and the connect cookie proves the browser is the one
// that started it.
func (u *UI) handleConnectCallback(w http.ResponseWriter, r *http.Request) {
	var s *session
	if c, err := r.Cookie(sessionCookie); err == nil {
		s, _ = u.sess.get(r.Context(), c.Value, u.opt.Now()) // optional here: the connect cookie and state decide
	}
	user := ""
	if s != nil {
		user, _ = me(s)
	}
	bind := ""
	if c, err := r.Cookie(connectCookie); err == nil {
		bind = c.Value
	}
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		u.auditOrLog(r.Context(), "connection_refused", map[string]any{"user": user, "reason": "provider: " + clip(e, 64)})
		u.fail(w, r, s, http.StatusOK, "The provider did not grant access ("+clip(e, 64)+").")
		return
	}
	c, err := u.opt.Connections.Complete(r.Context(), bind, q.Get("state"), q.Get("code"))
	if c.User != "" {
		user = c.User
	}
	if err != nil {
		reason := "exchange"
		if errors.Is(err, ErrConnectState) {
			reason = "state"
		}
		u.log.Warn("review: connect refused", "user", user, "reason", reason, "err", err.Error())
		u.auditOrLog(r.Context(), "connection_refused", map[string]any{"user": user, "connector": c.Connector, "reason": reason})
		msg := "This connect link is not valid for your session (already used, expired or not started here). Start again."
		if reason != "state" {
			msg = "The provider did not accept the authorization. Start again."
		}
		u.fail(w, r, s, http.StatusBadRequest, msg)
		return
	}
	clearCk := u.cookie(r, connectCookie, "", http.SameSiteLaxMode, -1)
	clearCk.Path = "/connections/callback"
	http.SetCookie(w, clearCk)
	if err := u.opt.Audit(r.Context(), "connection_connected", map[string]any{"user": user, "connector": c.Connector, "scopes": c.Scopes}); err != nil {
		// A connection the audit log does not show must not stand (as an
		// unaudited grant does not): revoke and delete it.
		u.log.Error("review: connect not audited; undone", "user", user, "connector", c.Connector, "err", err.Error())
		if _, derr := u.opt.Connections.Disconnect(context.WithoutCancel(r.Context()), c.Connector, user); derr != nil {
			u.log.Error("review: unaudited connection not fully undone", "user", user, "connector", c.Connector, "err", derr.Error())
		}
		u.fail(w, r, s, http.StatusServiceUnavailable, "The audit log cannot be written; the connection was not kept.")
		return
	}
	u.opt.Connections.Connected(c.Connector, user)
	http.Redirect(w, r, "/connections?connected="+c.Connector, http.StatusSeeOther)
}

func (u *UI) handleDisconnect(w http.ResponseWriter, r *http.Request, s *session) {
	user, ok := me(s)
	if !ok {
		u.fail(w, r, s, http.StatusForbidden, "Your account name cannot own connections.")
		return
	}
	connector := r.PathValue("connector")
	revoked, err := u.opt.Connections.Disconnect(r.Context(), connector, user)
	f := map[string]any{"user": user, "connector": connector, "revoked": revoked}
	if err != nil {
		u.log.Warn("review: disconnect", "user", user, "connector", connector, "err", err.Error())
		f["error"] = "revocation at the provider failed"
	}
	u.auditOrLog(r.Context(), "connection_disconnected", f) // the tokens are gone either way: the safe direction
	msg := "Disconnected " + connector + "."
	if err != nil {
		msg += " The provider could not confirm the revocation; the tokens are deleted here."
	}
	u.renderConnections(w, r, s, http.StatusOK, msg)
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// auditOrLog appends an audit record whose failure undoes nothing (a
// refusal, a deletion): the failure is logged for the operator.
func (u *UI) auditOrLog(ctx context.Context, event string, f map[string]any) {
	if err := u.opt.Audit(ctx, event, f); err != nil {
		u.log.Error("review: audit record not written", "event", event, "err", err.Error())
	}
}
