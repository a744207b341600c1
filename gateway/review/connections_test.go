package review

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// conns records what the Connections page asked of the OAuth client.
type conns struct {
	mu                                  sync.Mutex
	begun, completed, disconnected, ran []string
	bind                                string // Begin's
}

func (c *conns) note(l *[]string, s string) { c.mu.Lock(); *l = append(*l, s); c.mu.Unlock() }
func (c *conns) List(context.Context, string) ([]Connection, error) {
	return []Connection{{Connector: "docs", Status: "not_connected"}}, nil
}
func (c *conns) Begin(_ context.Context, connector, user, bind string) (string, error) {
	c.note(&c.begun, connector+"/"+user)
	c.mu.Lock()
	c.bind = bind
	c.mu.Unlock()
	return "https://idp.example/auth?state=s", nil
}
func (c *conns) Complete(_ context.Context, bind, state, _ string) (Connection, error) {
	c.mu.Lock()
	ok := bind != "" && bind == c.bind
	c.mu.Unlock()
	if state != "good" || !ok {
		return Connection{Connector: "docs"}, ErrConnectState
	}
	c.note(&c.completed, "docs/alice")
	return Connection{Connector: "docs", User: "alice", Status: "connected", Scopes: []string{"read"}}, nil
}
func (c *conns) Disconnect(_ context.Context, connector, user string) (bool, error) {
	c.note(&c.disconnected, connector+"/"+user)
	return true, nil
}
func (c *conns) Connected(connector, user string) { c.note(&c.ran, connector+"/"+user) }

// TestConnectionsAuditFailsClosed: a connect the audit log cannot record
// is not started, and a connection it cannot record is undone (revoked
// and deleted) before anything may use it.
func TestConnectionsAuditFailsClosed(t *testing.T) {
	for _, failing := range []string{"connection_started", "connection_connected"} {
		t.Run(failing, func(t *testing.T) {
			c := &conns{}
			e := newEnv(t, func(o *Options) {
				o.Connections = c
				o.Audit = func(_ context.Context, event string, _ map[string]any) error {
					if event == failing {
						return errors.New("disk full")
					}
					return nil
				}
			})
			b := e.browser()
			csrf := b.login("alice", "alice-pw")
			path := "/connections/docs/connect?csrf=" + csrf
			if failing == "connection_connected" {
				b.get(path)
				path = "/connections/callback?state=good&code=x"
			}
			r, body := b.get(path)
			if r.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "audit log cannot be written") {
				t.Fatalf("%d %s", r.StatusCode, body)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			switch failing {
			case "connection_started":
				if len(c.begun) != 0 {
					t.Fatal("an unaudited connect was started")
				}
			case "connection_connected":
				if len(c.completed) != 1 || len(c.disconnected) != 1 || len(c.ran) != 0 {
					t.Fatalf("completed %v, undone %v, held calls released %v", c.completed, c.disconnected, c.ran)
				}
			}
		})
	}
}

// TestConnectNeedsCSRFAndStateRefusal: Connect is a GET that carries the
// session's token; a callback with a state the client refuses is 400.
func TestConnectNeedsCSRFAndStateRefusal(t *testing.T) {
	c := &conns{}
	e := newEnv(t, func(o *Options) { o.Connections = c })
	b := e.browser()
	csrf := b.login("alice", "alice-pw")
	if r, _ := b.get("/connections/docs/connect"); r.StatusCode != http.StatusForbidden {
		t.Fatalf("connect without the token: %d", r.StatusCode)
	}
	if r, _ := b.get("/connections/docs/connect?csrf=" + csrf); r.StatusCode != http.StatusSeeOther || !strings.HasPrefix(r.Header.Get("Location"), "https://idp.example/auth") {
		t.Fatalf("connect: %d %s", r.StatusCode, r.Header.Get("Location"))
	}
	if r, body := b.get("/connections/callback?state=forged&code=x"); r.StatusCode != http.StatusBadRequest || !strings.Contains(body, "not valid for your session") {
		t.Fatalf("forged state: %d", r.StatusCode)
	}
	if len(c.begun) != 1 || len(c.completed) != 0 {
		t.Fatalf("begun %v completed %v", c.begun, c.completed)
	}
}

// TestConnectCallbackNeedsTheBrowserNotTheSession: the provider's redirect
// may reach a replica the person is not signed in to, and a cross-site
// navigation does not carry the Strict session cookie; so the callback
// needs no session, only the connect cookie set by Connect in that
// browser (SameSite=Lax, HttpOnly, the callback's path). Another browser
// with the same state and code (a leaked callback URL) is refused.
func TestConnectCallbackNeedsTheBrowserNotTheSession(t *testing.T) {
	c := &conns{}
	e := newEnv(t, func(o *Options) { o.Connections = c })
	b := e.browser()
	csrf := b.login("alice", "alice-pw")
	r, _ := b.get("/connections/docs/connect?csrf=" + csrf)
	var ck *http.Cookie
	for _, k := range r.Cookies() {
		if k.Name == "sluice_connect" {
			ck = k
		}
	}
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteLaxMode || ck.Path != "/connections/callback" || ck.MaxAge != 600 || ck.Value == "" {
		t.Fatalf("connect cookie = %+v", ck)
	}
	other := e.browser()
	other.login("bob", "bob-pw")
	if r, body := other.get("/connections/callback?state=good&code=x"); r.StatusCode != http.StatusBadRequest || !strings.Contains(body, "not valid for your session") {
		t.Fatalf("another browser's callback: %d", r.StatusCode)
	}
	// The starting browser, signed out (another replica): connected.
	b.c.Jar.SetCookies(mustURL(t, e.srv.URL), []*http.Cookie{{Name: "sluice_session", Value: "", MaxAge: -1, Path: "/"}})
	r, _ = b.get("/connections/callback?state=good&code=x")
	if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/connections?connected=docs" {
		t.Fatalf("callback without a session: %d %s", r.StatusCode, r.Header.Get("Location"))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.completed) != 1 || len(c.ran) != 1 || c.ran[0] != "docs/alice" {
		t.Fatalf("completed %v, held calls released for %v", c.completed, c.ran)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
