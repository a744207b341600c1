package review

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/sluice-gw/sluice/gateway/holds"
)

// provider is a tiny real OpenID provider: discovery, JWKS, an authorize
// endpoint that signs the user straight in, and a token endpoint that
// checks the code, the client secret and the PKCE verifier and signs an ID
// token with RSA.
type provider struct {
	t   *testing.T
	srv *httptest.Server
	key *rsa.PrivateKey

	mu    sync.Mutex
	codes map[string]grant
	// knobs the cases turn
	user      string
	groups    []string
	audience  string // default: the client ID
	badNonce  bool
	challenge string // the last code_challenge seen
}

type grant struct{ nonce, challenge, redirect string }

func newProvider(t *testing.T) *provider {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{t: t, key: key, codes: map[string]grant{}, user: "alice", groups: []string{"finance"}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{
			"issuer": p.srv.URL, "authorization_endpoint": p.srv.URL + "/authorize", "token_endpoint": p.srv.URL + "/token",
			"jwks_uri": p.srv.URL + "/jwks", "id_token_signing_alg_values_supported": []string{"RS256"},
			"response_types_supported": []string{"code"}, "subject_types_supported": []string{"public"},
			"code_challenge_methods_supported": []string{"S256"},
		})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &p.key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	})
	mux.HandleFunc("GET /authorize", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("client_id") != "sluice" || q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" ||
			q.Get("code_challenge") == "" || q.Get("nonce") == "" || q.Get("state") == "" {
			http.Error(w, "bad authorize request: "+r.URL.RawQuery, 400)
			return
		}
		code := randomToken()
		p.mu.Lock()
		p.codes[code] = grant{nonce: q.Get("nonce"), challenge: q.Get("code_challenge"), redirect: q.Get("redirect_uri")}
		p.challenge = q.Get("code_challenge")
		p.mu.Unlock()
		http.Redirect(w, r, q.Get("redirect_uri")+"?code="+url.QueryEscape(code)+"&state="+url.QueryEscape(q.Get("state")), http.StatusFound)
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		id, secret, ok := r.BasicAuth()
		if !ok {
			id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
		}
		p.mu.Lock()
		g, found := p.codes[r.PostForm.Get("code")]
		delete(p.codes, r.PostForm.Get("code"))
		p.mu.Unlock()
		sum := sha256.Sum256([]byte(r.PostForm.Get("code_verifier")))
		switch {
		case id != "sluice" || secret != "s3cret":
			http.Error(w, `{"error":"invalid_client"}`, 401)
			return
		case !found || g.redirect != r.PostForm.Get("redirect_uri"):
			http.Error(w, `{"error":"invalid_grant"}`, 400)
			return
		case base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge:
			http.Error(w, `{"error":"invalid_grant","error_description":"pkce"}`, 400)
			return
		}
		nonce := g.nonce
		if p.badNonce {
			nonce = "not-the-nonce"
		}
		aud := p.audience
		if aud == "" {
			aud = "sluice"
		}
		now := time.Now()
		claims, _ := json.Marshal(map[string]any{"iss": p.srv.URL, "sub": "u-1", "aud": aud, "nonce": nonce,
			"iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix(), "preferred_username": p.user, "groups": p.groups})
		sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: p.key}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
		if err != nil {
			t.Error(err)
			return
		}
		jws, err := sig.Sign(claims)
		if err != nil {
			t.Error(err)
			return
		}
		raw, _ := jws.CompactSerialize()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "token_type": "Bearer", "expires_in": 300, "id_token": raw})
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

func TestOIDCFlow(t *testing.T) {
	cases := []struct {
		name     string
		setup    func(p *provider)
		tamper   func(cb *url.URL) // the browser alters the callback
		replay   bool
		want     int
		wantUser string
		wantWhy  string
	}{
		{name: "signs in with groups", want: 200, wantUser: "alice"},
		{name: "state mismatch (login CSRF)", tamper: func(u *url.URL) {
			q := u.Query()
			q.Set("state", "forged")
			u.RawQuery = q.Encode()
		}, want: 403, wantWhy: "state_mismatch"},
		{name: "nonce mismatch (token replay)", setup: func(p *provider) { p.badNonce = true }, want: 403, wantWhy: "nonce_mismatch"},
		{name: "ID token for another client", setup: func(p *provider) { p.audience = "other-app" }, want: 403, wantWhy: "id_token_invalid"},
		{name: "forged code", tamper: func(u *url.URL) {
			q := u.Query()
			q.Set("code", "guessed")
			u.RawQuery = q.Encode()
		}, want: 403, wantWhy: "code_exchange"},
		{name: "callback replayed", replay: true, want: 403, wantWhy: "no_flow"},
		{name: "no username claim", setup: func(p *provider) { p.user = "" }, want: 403, wantWhy: "no_username_claim"},
		// A person named as the approver of calls held until docs is
		// connected would approve them: not a person's name, however
		// spelled.
		{name: "username of a connection marker", setup: func(p *provider) { p.user = "connection:docs" }, want: 403, wantWhy: "not_a_person_name"},
		{name: "username of a connection marker, other case", setup: func(p *provider) { p.user = "Connection:Docs" }, want: 403, wantWhy: "not_a_person_name"},
		{name: "username of a group marker", setup: func(p *provider) { p.user = "group:finance" }, want: 403, wantWhy: "not_a_person_name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t)
			if c.setup != nil {
				c.setup(p)
			}
			var e *env
			e = newEnv(t, func(o *Options) {
				o.OIDC = &OIDC{Issuer: p.srv.URL, ClientID: "sluice", ClientSecret: "s3cret", RedirectURL: "http://placeholder/oidc/callback"}
			})
			// The redirect URL names the UI's own server, known only now.
			e.ui.oidc.cfg.RedirectURL = e.srv.URL + "/oidc/callback"
			b := e.browser()
			_, loginPage := b.get("/login")
			if !strings.Contains(loginPage, `href="/oidc/login"`) {
				t.Fatal("login page lacks the SSO link")
			}
			r, _ := b.get("/oidc/login")
			if r.StatusCode != http.StatusFound {
				t.Fatalf("oidc/login: %d", r.StatusCode)
			}
			// The browser visits the provider, which redirects back.
			ar, err := b.c.Get(r.Header.Get("Location"))
			if err != nil {
				t.Fatal(err)
			}
			ar.Body.Close()
			if ar.StatusCode != http.StatusFound {
				t.Fatalf("authorize: %d", ar.StatusCode)
			}
			cb, _ := url.Parse(ar.Header.Get("Location"))
			if c.tamper != nil {
				c.tamper(cb)
			}
			if c.replay {
				if r, _ := b.get(cb.RequestURI()); r.StatusCode != 200 {
					t.Fatalf("first callback: %d", r.StatusCode)
				}
			}
			r, body := b.get(cb.RequestURI())
			if r.StatusCode != c.want {
				t.Fatalf("callback: %d, want %d: %.300s", r.StatusCode, c.want, body)
			}
			if c.wantWhy != "" && !strings.Contains(body, "("+c.wantWhy+")") {
				t.Fatalf("refusal lacks reason %q: %.400s", c.wantWhy, body)
			}
			if c.wantWhy != "" {
				e.mu.Lock()
				audited := strings.Contains(strings.Join(e.audits, "\n"), "ui.login_failed")
				e.mu.Unlock()
				if !audited {
					t.Fatalf("refusal %s not audited: %v", c.wantWhy, e.audits)
				}
			}
			if c.wantUser == "" {
				if r, _ := b.get("/"); r.StatusCode != http.StatusSeeOther && !c.replay {
					t.Fatalf("signed in after a refused callback: %d", r.StatusCode)
				}
				return
			}
			if !strings.Contains(body, `http-equiv="refresh"`) {
				t.Fatal("no same-site continuation page")
			}
			r, q := b.get("/")
			if r.StatusCode != 200 || !strings.Contains(q, `<span class="me">Signed in as <b>`+c.wantUser+`</b></span>`) {
				t.Fatalf("queue after sign-in: %d", r.StatusCode)
			}
			// The session carries the provider's groups: a group:finance hold is alice's to decide.
			h := e.hold(`{"id":1}`)
			h.Approvers = []string{"group:finance"}
			if err := e.mgr.CanApprove(h, e.ui.sessionPerson(t, b)); err != nil {
				t.Fatalf("groups not taken from the ID token: %v", err)
			}
		})
	}
}

// sessionPerson returns the person of the browser's session (test helper).
func (u *UI) sessionPerson(t *testing.T, b *browser) holds.Person {
	t.Helper()
	su, _ := url.Parse(b.e.srv.URL)
	for _, c := range b.c.Jar.Cookies(su) {
		if c.Name == sessionCookie {
			if s, _ := u.sess.get(context.Background(), c.Value, u.opt.Now()); s != nil {
				return s.person
			}
		}
	}
	t.Fatal("no session")
	return holds.Person{}
}
