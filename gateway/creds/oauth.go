package creds

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/vault"
)

// OAuthClient resolves connector cc's credential.oauth2 against its spec:
// the URLs the config leaves empty come from the spec's oauth2
// securityScheme (credential.oauth2.scheme, or the one scheme with this
// flow), and a URL with a plain-http scheme is accepted only for an
// address inside allow_private (allow: it would carry the client secret and the
// tokens). The client's Secret and HTTP are set by the gateway.
func OAuthClient(key string, cc config.Connector, conn *connectors.Connector, allow []netip.Prefix) (*oauth.Client, []error) {
	o := cc.Credential.OAuth2
	key += ".credential.oauth2"
	c := &oauth.Client{Connector: cc.Slug, ClientID: o.ClientID, Scopes: slices.Clone(o.Scopes),
		AuthURL: o.AuthorizationURL, TokenURL: o.TokenURL, RevocationURL: o.RevocationURL}
	flow := "clientCredentials"
	c.Flow = oauth.ClientCredentials
	if o.Flow == "authorization_code" {
		flow, c.Flow = "authorizationCode", oauth.AuthorizationCode
	}
	var errs []error
	var from *connectors.OAuthFlow
	if o.Scheme != "" {
		sc := conn.Schemes[o.Scheme]
		switch {
		case sc == nil || sc.Type != "oauth2":
			errs = append(errs, fmt.Errorf("%s.scheme: the spec has no oauth2 securityScheme %q", key, o.Scheme))
		default:
			if f, ok := sc.Flows[flow]; ok {
				from = &f
			} else {
				errs = append(errs, fmt.Errorf("%s.scheme: securityScheme %q has no %s flow", key, o.Scheme, flow))
			}
		}
	} else {
		var names []string
		for n, sc := range conn.Schemes {
			if f, ok := sc.Flows[flow]; ok && sc.Type == "oauth2" {
				names = append(names, n)
				from = &f
			}
		}
		if len(names) > 1 && (o.TokenURL == "" || (c.Flow == oauth.AuthorizationCode && o.AuthorizationURL == "")) {
			slices.Sort(names)
			errs = append(errs, fmt.Errorf("%s.scheme: the spec has several oauth2 schemes with a %s flow (%s); name one, or set the URLs", key, flow, strings.Join(names, ", ")))
		}
	}
	if from != nil {
		if c.TokenURL == "" {
			c.TokenURL = from.TokenURL
		}
		if c.AuthURL == "" && c.Flow == oauth.AuthorizationCode {
			c.AuthURL = from.AuthorizationURL
		}
		if len(c.Scopes) == 0 {
			c.Scopes = slices.Clone(from.Scopes)
		}
	}
	check := func(k, v string) {
		if v == "" {
			return
		}
		pu, err := url.Parse(v)
		switch {
		case err != nil || pu.Host == "" || (pu.Scheme != "https" && pu.Scheme != "http"):
			errs = append(errs, fmt.Errorf("%s.%s: want an absolute http(s) URL, got %q", key, k, config.RedactURL(v)))
		case pu.Scheme == "http" && !PlaintextOK(pu.Hostname(), allow):
			errs = append(errs, fmt.Errorf("%s.%s: tokens and the client secret cross plain http only to an address inside allow_private; use https", key, k))
		}
	}
	if c.TokenURL == "" {
		errs = append(errs, fmt.Errorf("%s.token_url: must be set: the spec has no oauth2 %s flow to take it from", key, flow))
	}
	if c.Flow == oauth.AuthorizationCode && c.AuthURL == "" {
		errs = append(errs, fmt.Errorf("%s.authorization_url: must be set: the spec has no oauth2 %s flow to take it from", key, flow))
	}
	check("token_url", c.TokenURL)
	check("revocation_url", c.RevocationURL)
	if c.Flow == oauth.AuthorizationCode && c.AuthURL != "" {
		// The person's browser goes here, not the gateway: any http(s) URL.
		if pu, err := url.Parse(c.AuthURL); err != nil || pu.Host == "" || (pu.Scheme != "https" && pu.Scheme != "http") {
			errs = append(errs, fmt.Errorf("%s.authorization_url: want an absolute http(s) URL, got %q", key, config.RedactURL(c.AuthURL)))
		}
	}
	return c, errs
}

// PlaintextOK says whether a credential may cross plain HTTP to host: only
// when host is an address literal inside the connector's allow_private.
func PlaintextOK(host string, allow []netip.Prefix) bool {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	for _, p := range allow {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// oauthToken is the credential for a connector with
// credential.oauth2: the access token for the call's person (or the
// connector), or 403 connection_required naming where to connect. A
// connection the provider stopped honouring is never used.
func (s *Creds) oauthToken(ctx context.Context, tool *connectors.Tool, user string) (vault.Secret, string, *refusal.Error) {
	if s.d.OAuth == nil {
		return vault.Secret{}, "", refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "bug: this connector's OAuth client is not set up")
	}
	tok, err := s.d.OAuth.Token(ctx, tool.Connector, user)
	var re *oauth.RequiredError
	switch {
	case errors.As(err, &re):
		msg := fmt.Sprintf("connector %q acts with the account of the person this session runs for, who has not connected it", tool.Connector)
		switch {
		case user == "":
			msg = fmt.Sprintf("connector %q acts with a person's own account, and this session runs for no person", tool.Connector)
		case re.Status == oauth.NeedsReconnect:
			msg = fmt.Sprintf("the provider no longer accepts %s's connection of connector %q (consent revoked or expired); they must reconnect", user, tool.Connector)
		}
		if user != "" {
			msg += "; connect at " + s.d.ConnectionsURL(tool.Connector) + " and retry"
		}
		return vault.Secret{}, "", refusal.New(http.StatusForbidden, refusal.ConnectionRequired, msg).Wrap(err)
	case errors.As(err, new(*oauth.DiscoveryError)):
		// MCP authorization: the step and the reason name no token.
		return vault.Secret{}, "", refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, err.Error()).Wrap(err)
	case err != nil:
		return vault.Secret{}, "", refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the OAuth token for this connector is unavailable").Wrap(err)
	}
	// The audit record names the connection and its scopes, never the token.
	return vault.NewSecret(tok.Value), fmt.Sprintf("oauth2 %s scopes=%s", tok.Connection, strings.Join(tok.Scopes, " ")), nil
}
