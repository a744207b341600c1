package review

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/ident"
)

// oidcFlow is the authorization-code flow with state, nonce and PKCE.
// Discovery is lazy (and retried until it works), so a provider outage
// does not stop the gateway from starting; it only blocks OIDC sign-in.
type oidcFlow struct {
	cfg OIDC

	mu       sync.Mutex
	provider *oidc.Provider
	verifier *oidc.IDTokenVerifier
	oauth    *oauth2.Config
	pending  map[string]oidcPending // by the random ID in the sluice_oidc cookie
}

// oidcPending is one sign-in in progress.
type oidcPending struct {
	state, nonce, verifier string
	started                time.Time
}

const oidcPendingTTL = 10 * time.Minute

func newOIDCFlow(c OIDC) (*oidcFlow, error) {
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
	return &oidcFlow{cfg: c, pending: map[string]oidcPending{}}, nil
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

func (f *oidcFlow) begin(now time.Time) (id string, p oidcPending) {
	p = oidcPending{state: randomToken(), nonce: randomToken(), verifier: oauth2.GenerateVerifier(), started: now}
	id = randomToken()
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, v := range f.pending {
		if now.Sub(v.started) > oidcPendingTTL {
			delete(f.pending, k)
		}
	}
	if len(f.pending) > 10000 {
		f.pending = map[string]oidcPending{}
	}
	f.pending[id] = p
	return id, p
}

// take returns and forgets a pending sign-in: each is usable once.
func (f *oidcFlow) take(id string, now time.Time) (oidcPending, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pending[id]
	delete(f.pending, id)
	return p, ok && now.Sub(p.started) <= oidcPendingTTL
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
	id, p := u.oidc.begin(u.opt.Now())
	// Lax, not Strict: the provider's redirect back is a cross-site navigation.
	http.SetCookie(w, u.cookie(r, "sluice_oidc", id, http.SameSiteLaxMode, int(oidcPendingTTL/time.Second)))
	http.Redirect(w, r, oc.AuthCodeURL(p.state, oidc.Nonce(p.nonce), oauth2.S256ChallengeOption(p.verifier)), http.StatusFound)
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
	p, ok := u.oidc.take(c.Value, u.opt.Now())
	if !ok {
		refuse("no_flow", nil)
		return
	}
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		refuse("provider_error", errors.New(e))
		return
	}
	if !tokenEqual(q.Get("state"), p.state) {
		refuse("state_mismatch", nil)
		return
	}
	oc, verifier, err := u.oidc.setup(r.Context())
	if err != nil {
		refuse("discovery", err)
		return
	}
	ctx := u.oidc.ctx(r.Context())
	tok, err := oc.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(p.verifier))
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
	if !tokenEqual(idt.Nonce, p.nonce) {
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
