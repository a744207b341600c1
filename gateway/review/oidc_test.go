package review

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/jackc/pgx/v5"

	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
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

// TestOIDCCallbackOnAnotherReplica: two UIs, each with its own store on
// one PostgreSQL database (replicas behind one public URL). The sign-in
// starts on r0; the provider's redirect reaches r1, which never saw it:
// signed in (and so on r0). The same callback again, on either, is
// refused no_flow. While it was pending, the table held neither the
// cookie's id nor the state, nonce or verifier.
func TestOIDCCallbackOnAnotherReplica(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	dsn := pg.SuperURL(pg.NewDatabaseT(t))
	p := newProvider(t)
	var rs [2]*env
	for i := range rs {
		st, err := store.Open(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		rs[i] = newEnv(t, func(o *Options) {
			o.Sessions = st
			o.OIDC = &OIDC{Issuer: p.srv.URL, ClientID: "sluice", ClientSecret: "s3cret", RedirectURL: "http://placeholder/oidc/callback"}
		})
	}
	for _, e := range rs { // one public URL, which the provider sends r1
		e.ui.oidc.cfg.RedirectURL = rs[1].srv.URL + "/oidc/callback"
	}
	b0 := rs[0].browser()
	b1 := &browser{t: t, e: rs[1], c: b0.c} // the same browser (cookies are per host, not port)
	r, _ := b0.get("/oidc/login")
	if r.StatusCode != http.StatusFound {
		t.Fatalf("oidc/login on r0: %d", r.StatusCode)
	}
	var cookie string
	for _, c := range r.Cookies() {
		if c.Name == "sluice_oidc" {
			cookie = c.Value
		}
	}
	ar, err := b0.c.Get(r.Header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	ar.Body.Close()
	cb, err := url.Parse(ar.Header.Get("Location"))
	if err != nil || cookie == "" || !strings.HasPrefix(cb.String(), rs[1].srv.URL) {
		t.Fatalf("the provider's redirect %q (cookie set %v): %v", cb, cookie != "", err)
	}

	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	rs1, err := conn.Query(context.Background(), `SELECT row_to_json(x)::text FROM ui_oidc_pending x`)
	if err != nil {
		t.Fatal(err)
	}
	for rs1.Next() {
		var s string
		if err := rs1.Scan(&s); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, s)
	}
	rs1.Close()
	conn.Close(context.Background())
	all := strings.Join(rows, "\n")
	if len(rows) != 1 || strings.Contains(all, cookie) || strings.Contains(all, cb.Query().Get("state")) || strings.Contains(all, p.challenge) {
		t.Fatalf("pending sign-ins in the database: %d rows; the cookie's id, the state or the challenge in them: %v %v %v",
			len(rows), strings.Contains(all, cookie), strings.Contains(all, cb.Query().Get("state")), strings.Contains(all, p.challenge))
	}

	r, body := b1.get(cb.RequestURI())
	if r.StatusCode != http.StatusOK || !strings.Contains(body, `http-equiv="refresh"`) {
		t.Fatalf("callback on r1: %d %s", r.StatusCode, body[strings.Index(body, "<main"):])
	}
	for i, b := range []*browser{b1, b0} {
		if r, q := b.get("/"); r.StatusCode != 200 || !strings.Contains(q, `Signed in as <b>alice</b>`) {
			t.Fatalf("queue on r%d after the sign-in on r1: %d", 1-i, r.StatusCode)
		}
	}
	// The callback again (the cookie replayed with it), on each replica.
	for i, e := range rs {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+cb.RequestURI(), nil)
		req.AddCookie(&http.Cookie{Name: "sluice_oidc", Value: cookie})
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "(no_flow)") {
			t.Fatalf("the callback replayed on r%d: %d %.300s", i, r.StatusCode, body)
		}
	}
}

// brokenOIDCStore is a SessionStore whose pending sign-ins cannot be
// written (put) or read (take).
type brokenOIDCStore struct {
	SessionStore
	put, take bool
}

func (b brokenOIDCStore) PutUIOIDCPending(ctx context.Context, p store.UIOIDCPending, max int) error {
	if b.put {
		return errors.New("database down")
	}
	return b.SessionStore.PutUIOIDCPending(ctx, p, max)
}

func (b brokenOIDCStore) TakeUIOIDCPending(ctx context.Context, idHash string) (store.UIOIDCPending, error) {
	if b.take {
		return store.UIOIDCPending{}, errors.New("database down")
	}
	return b.SessionStore.TakeUIOIDCPending(ctx, idHash)
}

// TestOIDCStoreDown: a sign-in that cannot be kept is not started (503,
// no redirect to the provider); one that cannot be read back is refused
// (reason store, audited), with no session.
func TestOIDCStoreDown(t *testing.T) {
	for _, c := range []struct {
		name      string
		put, take bool
	}{{"put", true, false}, {"take", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t)
			e := newEnv(t, func(o *Options) {
				o.Sessions = brokenOIDCStore{SessionStore: &memSessions{m: map[string]store.UISession{}}, put: c.put, take: c.take}
				o.OIDC = &OIDC{Issuer: p.srv.URL, ClientID: "sluice", ClientSecret: "s3cret", RedirectURL: "http://placeholder/oidc/callback"}
			})
			e.ui.oidc.cfg.RedirectURL = e.srv.URL + "/oidc/callback"
			b := e.browser()
			r, _ := b.get("/oidc/login")
			if c.put {
				if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Location") != "" {
					t.Fatalf("oidc/login with the store down: %d %q", r.StatusCode, r.Header.Get("Location"))
				}
				return
			}
			ar, err := b.c.Get(r.Header.Get("Location"))
			if err != nil {
				t.Fatal(err)
			}
			ar.Body.Close()
			cb, _ := url.Parse(ar.Header.Get("Location"))
			r, body := b.get(cb.RequestURI())
			e.mu.Lock()
			audited := strings.Contains(strings.Join(e.audits, "\n"), "ui.login_failed")
			e.mu.Unlock()
			if r.StatusCode != http.StatusForbidden || !strings.Contains(body, "(store)") || !audited {
				t.Fatalf("callback with the store down: %d, audited %v", r.StatusCode, audited)
			}
			if r, _ := b.get("/"); r.StatusCode != http.StatusSeeOther {
				t.Fatalf("signed in after a refused callback: %d", r.StatusCode)
			}
		})
	}
}
