// Package oauthtest runs a real OAuth 2.0 / OpenID authorization server
// for tests: zitadel/oidc's op package with its example storage (in-memory
// users, clients, codes and rotating refresh tokens) and example login
// page, on a loopback port. It counts what reaches the token endpoint, and
// can sign a person in and consent without a browser.
package oauthtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
)

// Users of the example storage.
const (
	Password = "verysecure"
	// The service account of the client-credentials flow.
	ServiceID     = "sid1"
	ServiceSecret = "verysecret"
	// WebSecret is the secret of every web client Start registers.
	WebSecret = "sluice-web-secret-0123456789"
)

// Server is a running authorization server.
type Server struct {
	URL     string // the issuer, http://127.0.0.1:PORT
	Storage *storage.Storage
	srv     *httptest.Server

	// Counts at the token endpoint by grant_type.
	mu     sync.Mutex
	grants map[string]int
	// Revocations counts requests to the revocation endpoint.
	Revocations atomic.Int64
	// Transport, when set, is how Consent's browser reaches the server
	// (a server inside a network namespace).
	Transport http.RoundTripper
	redirects []string     // Location headers sent back to a client's callback
	auths     []url.Values // the query of each authorization request
}

// AuthRequests returns the query of every authorization request, oldest
// first (to check a client's PKCE challenge and state).
func (s *Server) AuthRequests() []url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]url.Values(nil), s.auths...)
}

// Redirects returns every redirect the server sent a browser back to a
// client with (code and state in the query), oldest first.
func (s *Server) Redirects() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.redirects...)
}

type recorder struct {
	http.ResponseWriter
	s        *Server
	redirect string
}

func (r *recorder) WriteHeader(code int) {
	if loc := r.Header().Get("Location"); code >= 300 && code < 400 && strings.HasPrefix(loc, r.redirect) {
		r.s.mu.Lock()
		r.s.redirects = append(r.s.redirects, loc)
		r.s.mu.Unlock()
	}
	r.ResponseWriter.WriteHeader(code)
}

// Endpoints are the server's URLs.
func (s *Server) AuthURL() string       { return s.URL + "/auth" }
func (s *Server) TokenURL() string      { return s.URL + "/oauth/token" }
func (s *Server) RevocationURL() string { return s.URL + "/revoke" }

// Username is the example's first user's login name on this issuer.
func (s *Server) Username() string { return "test-user@127.0.0.1" }

// UserID is that user's subject.
const UserID = "id1"

// Grants returns how many token requests of grant type g arrived.
func (s *Server) Grants(g string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grants[g]
}

// Start runs a server with one web client per clientID (secret WebSecret,
// code + refresh grants, PKCE accepted) that may redirect to redirect.
func Start(t testing.TB, redirect string, clientIDs ...string) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return StartOn(t, ln, redirect, clientIDs...)
}

// StartOn is Start on ln (a listener inside a network namespace, say);
// the issuer is http://ln's address.
func StartOn(t testing.TB, ln net.Listener, redirect string, clientIDs ...string) *Server {
	t.Helper()
	issuer := "http://" + ln.Addr().String()
	clients := map[string]*storage.Client{}
	for _, id := range clientIDs {
		clients[id] = storage.WebClient(id, WebSecret, redirect)
	}
	st := storage.NewStorageWithClients(storage.NewUserStore(issuer), clients)
	router := exampleop.SetupServer(issuer, st, nil, false)
	s := &Server{URL: issuer, Storage: st, grants: map[string]int{}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/oauth/token":
			if err := r.ParseForm(); err == nil {
				s.mu.Lock()
				s.grants[r.PostForm.Get("grant_type")]++
				s.mu.Unlock()
			}
		case "/revoke":
			s.Revocations.Add(1)
		case "/auth":
			s.mu.Lock()
			s.auths = append(s.auths, r.URL.Query())
			s.mu.Unlock()
		}
		router.ServeHTTP(&recorder{ResponseWriter: w, s: s, redirect: redirect}, r)
	})
	s.srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

// RevokeConsent ends every token the person holds for clientID, as a
// person revoking the app's access at the provider would.
func (s *Server) RevokeConsent(t testing.TB, clientID string) {
	t.Helper()
	if err := s.Storage.TerminateSession(context.Background(), UserID, clientID); err != nil {
		t.Fatal(err)
	}
}

// Consent follows authURL as the example user's browser would: the login
// form, then the provider's redirect back. It returns the redirect to the
// client's callback (with code and state) without following it.
func (s *Server) Consent(authURL string) (*url.URL, error) {
	return s.ConsentAs(authURL, s.Username())
}

// ConsentAs is Consent signed in as username ("test-user2" is the
// example's second user, subject id2).
func (s *Server) ConsentAs(authURL, username string) (*url.URL, error) {
	jar, _ := cookiejar.New(nil)
	var back *url.URL
	c := &http.Client{Jar: jar, Transport: s.Transport, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if !strings.HasPrefix(req.URL.String(), s.URL) {
			back = req.URL
			return http.ErrUseLastResponse
		}
		return nil
	}}
	resp, err := c.Get(authURL)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if back != nil {
		return back, nil // an error redirect, before any login
	}
	id := resp.Request.URL.Query().Get("authRequestID")
	if id == "" {
		return nil, fmt.Errorf("oauthtest: no login page: %s %s", resp.Status, resp.Request.URL)
	}
	resp, err = c.PostForm(s.URL+"/login/username", url.Values{"id": {id}, "username": {username}, "password": {Password}})
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if back == nil {
		return nil, errors.New("oauthtest: the provider did not redirect back: " + resp.Status)
	}
	return back, nil
}
