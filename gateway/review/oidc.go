package review

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/store"
)

// oidcFlow is the authorization-code flow with state, nonce and PKCE.
// Discovery is lazy (and retried until it works), so a provider outage
// does not stop the gateway from starting; it only blocks OIDC sign-in.
// A started sign-in is kept in the SessionStore (the gateway's store), so
// the provider's redirect may reach any replica.
type oidcFlow struct {
	cfg OIDC
	st  SessionStore

	mu       sync.Mutex
	provider *oidc.Provider
	verifier *oidc.IDTokenVerifier
	oauth    *oauth2.Config
}

// oidcPending is one sign-in in progress. It is stored sealed under a key
// derived from the random id in the browser's sluice_oidc cookie, keyed
// by that id's hash: the store never holds the id, so a reader of it can
// neither match a row to a browser nor read the state, nonce or verifier.
type oidcPending struct {
	State    string `json:"state"`
	Nonce    string `json:"nonce"`
	Verifier string `json:"verifier"`
}

const (
	oidcPendingTTL = 10 * time.Minute
	oidcPendingMax = 10000 // unfinished sign-ins kept at most
)

func newOIDCFlow(c OIDC, st SessionStore) (*oidcFlow, error) {
	if c.Issuer == "" || c.ClientID == "" || c.RedirectURL == "" {
		return nil, errors.New("review: oidc: issuer, client_id and redirect URL are required")
	}
	if c.UsernameClaim == "" {
		c.UsernameClaim = "preferred_username"
	}
	if c.GroupsClaim == "" {
		c.GroupsClaim = "groups"
	}
	if c.HTTPClient == nil {
		c.HTTPClient = http.DefaultClient
	}
	return &oidcFlow{cfg: c, st: st}, nil
}

// oidcSeal is the store's key of the sign-in whose cookie holds id, and
// the AEAD its row is sealed with (bound to that key).
func oidcSeal(id string) (string, cipher.AEAD) {
	h := sha256.Sum256([]byte("sluice oidc pending\x00" + id))
	k := sha256.Sum256([]byte("sluice oidc pending key\x00" + id))
	b, _ := aes.NewCipher(k[:]) // 32 bytes: AES-256, never an error
	g, _ := cipher.NewGCM(b)
	return hex.EncodeToString(h[:]), g
}

func (f *oidcFlow) ctx(ctx context.Context) context.Context {
	return oidc.ClientContext(ctx, f.cfg.HTTPClient)
}

// setup discovers the provider once.
func (f *oidcFlow) setup(ctx context.Context) (*oauth2.Config, *oidc.IDTokenVerifier, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.provider == nil {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		p, err := oidc.NewProvider(f.ctx(ctx), f.cfg.Issuer)
		if err != nil {
			return nil, nil, fmt.Errorf("review: oidc: discovery: %w", err)
		}
		f.provider = p
		f.verifier = p.Verifier(&oidc.Config{ClientID: f.cfg.ClientID})
		f.oauth = &oauth2.Config{
			ClientID: f.cfg.ClientID, ClientSecret: f.cfg.ClientSecret, RedirectURL: f.cfg.RedirectURL,
			Endpoint: p.Endpoint(), Scopes: []string{oidc.ScopeOpenID, "profile", "email", "groups"},
		}
	}
	return f.oauth, f.verifier, nil
}

// begin starts a sign-in: its id (for the cookie) and its secrets, kept
// sealed in the store.
func (f *oidcFlow) begin(ctx context.Context, now time.Time) (id string, p oidcPending, err error) {
	p = oidcPending{State: randomToken(), Nonce: randomToken(), Verifier: oauth2.GenerateVerifier()}
	id = randomToken()
	key, g := oidcSeal(id)
	plain, err := json.Marshal(p)
	if err != nil {
		return "", p, fmt.Errorf("bug(): review: oidc pending: %w", err)
	}
	nonce := make([]byte, g.NonceSize())
	_, _ = rand.Read(nonce)
	sealed := base64.RawURLEncoding.EncodeToString(g.Seal(nonce, nonce, plain, []byte(key)))
	err = f.st.PutUIOIDCPending(ctx, store.UIOIDCPending{IDHash: key, Sealed: sealed, Created: now, Expires: now.Add(oidcPendingTTL)}, oidcPendingMax)
	return id, p, err
}

// take returns and forgets the sign-in whose cookie holds id: each is
// usable once, on any replica, until it expires. ok is false for one
// unknown, used, expired or not sealed under id; err is a store failure.
func (f *oidcFlow) take(ctx context.Context, id string, now time.Time) (p oidcPending, ok bool, err error) {
	key, g := oidcSeal(id)
	row, err := f.st.TakeUIOIDCPending(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	b, err := base64.RawURLEncoding.DecodeString(row.Sealed)
	if err != nil || len(b) < g.NonceSize() || !now.Before(row.Expires) {
		return p, false, nil
	}
	plain, err := g.Open(nil, b[:g.NonceSize()], b[g.NonceSize():], []byte(key))
	if err != nil || json.Unmarshal(plain, &p) != nil {
		return oidcPending{}, false, nil
	}
	return p, true, nil
}

func (u *UI) handleOIDCLogin(w http.ResponseWriter, r *http.Request) {
	if u.oidc == nil {
		u.fail(w, r, nil, http.StatusNotFound, "OIDC sign-in is not configured.")
		return
	}
	oc, _, err := u.oidc.setup(r.Context())
	if err != nil {
		u.log.Error("review: oidc", "err", err.Error())
		u.fail(w, r, nil, http.StatusBadGateway, "The identity provider cannot be reached.")
		return
	}
	id, p, err := u.oidc.begin(r.Context(), u.opt.Now())
	if err != nil {
		u.log.Error("review: oidc: keep the started sign-in", "err", err.Error())
		u.fail(w, r, nil, http.StatusServiceUnavailable, "Sign-in cannot be started now. Try again.")
		return
	}
	// Lax, not Strict: the provider's redirect back is a cross-site navigation.
	http.SetCookie(w, u.cookie(r, "sluice_oidc", id, http.SameSiteLaxMode, int(oidcPendingTTL/time.Second)))
	http.Redirect(w, r, oc.AuthCodeURL(p.State, oidc.Nonce(p.Nonce), oauth2.S256ChallengeOption(p.Verifier)), http.StatusFound)
}

func (u *UI) handleOIDCCallback(w http.ResponseWriter, r *http.Request) {
	if u.oidc == nil {
		u.fail(w, r, nil, http.StatusNotFound, "OIDC sign-in is not configured.")
		return
	}
	refuse := func(why string, err error) {
		f := map[string]any{"method": "oidc", "reason": why}
		if err != nil {
			u.log.Warn("review: oidc sign-in refused", "reason", why, "err", err.Error())
		}
		u.audit(r.Context(), "ui.login_failed", f)
		u.fail(w, r, nil, http.StatusForbidden, "Sign-in through the identity provider failed ("+why+"). Start again.")
	}
	http.SetCookie(w, u.cookie(r, "sluice_oidc", "", http.SameSiteLaxMode, -1))
	c, err := r.Cookie("sluice_oidc")
	if err != nil {
		refuse("no_flow", nil)
		return
	}
	p, ok, err := u.oidc.take(r.Context(), c.Value, u.opt.Now())
	if err != nil {
		refuse("store", err) // closed: a sign-in that cannot be checked is refused
		return
	}
	if !ok {
		refuse("no_flow", nil)
		return
	}
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		refuse("provider_error", errors.New(e))
		return
	}
	if !tokenEqual(q.Get("state"), p.State) {
		refuse("state_mismatch", nil)
		return
	}
	oc, verifier, err := u.oidc.setup(r.Context())
	if err != nil {
		refuse("discovery", err)
		return
	}
	ctx := u.oidc.ctx(r.Context())
	tok, err := oc.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(p.Verifier))
	if err != nil {
		refuse("code_exchange", err)
		return
	}
	raw, ok := tok.Extra("id_token").(string)
	if !ok {
		refuse("no_id_token", nil)
		return
	}
	idt, err := verifier.Verify(ctx, raw)
	if err != nil {
		refuse("id_token_invalid", err)
		return
	}
	if !tokenEqual(idt.Nonce, p.Nonce) {
		refuse("nonce_mismatch", nil)
		return
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		refuse("claims", err)
		return
	}
	name, _ := claims[u.oidc.cfg.UsernameClaim].(string)
	if name == "" || len(name) > 256 {
		refuse("no_username_claim", nil)
		return
	}
	if _, err := ident.Person(name); err != nil {
		// "connection:SLUG" would match the approver of calls held until
		// SLUG is connected; "group:G" a group approver's form.
		refuse("not_a_person_name", err)
		return
	}
	var groups []string
	if gs, ok := claims[u.oidc.cfg.GroupsClaim].([]any); ok {
		for _, g := range gs {
			if s, ok := g.(string); ok && s != "" {
				groups = append(groups, s)
			}
		}
	}
	if !u.startSession(w, r, holds.Person{Name: name, Groups: groups}, "oidc") {
		return
	}
	// A page, not a redirect: the Strict session cookie is not sent on a
	// redirect chain that a cross-site navigation started, but it is on a
	// navigation this page starts.
	u.render(w, http.StatusOK, "redirect", page{Title: "Signed in"})
}
