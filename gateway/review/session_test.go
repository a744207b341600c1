package review

import (
	"context"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/store"
)

// sessionStore opens a SQLite store of its own for a UI's sessions.
func sessionStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "sessions.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestSessionStoreDown: when the session store does not answer, nobody is
// signed in — a page is 503 (not a sign-in form that could not work
// either), the admin API's Person refuses, a sign-in is 503 without a
// cookie, and a sign-out is 503, not a pretended success.
func TestSessionStoreDown(t *testing.T) {
	st := sessionStore(t)
	e := newEnv(t, func(o *Options) { o.Sessions = st })
	b := e.browser()
	csrf := b.login("alice", "alice-pw")
	if r, _ := b.get("/"); r.StatusCode != http.StatusOK {
		t.Fatalf("signed in: GET / %d", r.StatusCode)
	}
	st.Close()
	r, body := b.get("/")
	if r.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "session store is unavailable") {
		t.Fatalf("GET / with the store down: %d; want 503", r.StatusCode)
	}
	su, _ := url.Parse(e.srv.URL)
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/api/v1/holds", nil)
	for _, c := range b.c.Jar.Cookies(su) {
		req.AddCookie(c)
	}
	if _, ok := e.ui.Person(req); ok {
		t.Fatal("Person authenticated a request with the store down")
	}
	if r, _ := b.post("/logout", url.Values{"csrf": {csrf}}, nil); r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("logout with the store down: %d; want 503", r.StatusCode)
	}
	b2 := e.browser()
	_, page := b2.get("/login")
	r, _ = b2.post("/login", url.Values{"csrf": {csrfOf(t, page)}, "username": {"alice"}, "password": {"alice-pw"}}, nil)
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("sign-in with the store down: %d; want 503", r.StatusCode)
	}
	for _, c := range b2.c.Jar.Cookies(su) {
		if c.Name == sessionCookie {
			t.Fatal("a session cookie was set though the store did not take the session")
		}
	}
}
