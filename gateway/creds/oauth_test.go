package creds

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/oauth"
)

// TestOAuthClientFromSpec: a credential.oauth2's URLs come from the spec's
// oauth2 flow unless the config sets them, and what cannot be decided is
// an error naming the key.
func TestOAuthClientFromSpec(t *testing.T) {
	flows := func(auth, token string) map[string]connectors.OAuthFlow {
		return map[string]connectors.OAuthFlow{"authorizationCode": {AuthorizationURL: auth, TokenURL: token, Scopes: []string{"read", "write"}}}
	}
	spec := &connectors.Connector{Schemes: map[string]*connectors.SecurityScheme{
		"oa":  {Name: "oa", Type: "oauth2", Flows: flows("https://idp.example/auth", "https://idp.example/token")},
		"key": {Name: "key", Type: "apiKey", In: "header", Param: "X-Key"},
	}}
	two := &connectors.Connector{Schemes: map[string]*connectors.SecurityScheme{
		"a": {Name: "a", Type: "oauth2", Flows: flows("https://a/auth", "https://a/token")},
		"b": {Name: "b", Type: "oauth2", Flows: flows("https://b/auth", "https://b/token")},
	}}
	none := &connectors.Connector{Schemes: map[string]*connectors.SecurityScheme{}}
	loop := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	cases := []struct {
		name  string
		o     config.OAuth2
		conn  *connectors.Connector
		want  string // an error naming this, or "" for none
		check func(*oauth.Client) bool
		allow []netip.Prefix // the connector's allow_private
	}{
		{name: "urls and scopes from the spec", o: config.OAuth2{Flow: "authorization_code", ClientID: "c"}, conn: spec,
			check: func(c *oauth.Client) bool {
				return c.AuthURL == "https://idp.example/auth" && c.TokenURL == "https://idp.example/token" && strings.Join(c.Scopes, " ") == "read write"
			}},
		{name: "config overrides the spec", o: config.OAuth2{Flow: "authorization_code", ClientID: "c", TokenURL: "https://other/token", Scopes: []string{"x"}}, conn: spec,
			check: func(c *oauth.Client) bool {
				return c.TokenURL == "https://other/token" && c.AuthURL == "https://idp.example/auth" && c.Scopes[0] == "x"
			}},
		{name: "no flow in the spec", o: config.OAuth2{Flow: "client_credentials", ClientID: "c", ClientSecret: "s"}, conn: spec, want: "connectors[0].credential.oauth2.token_url: must be set"},
		{name: "no authorization url", o: config.OAuth2{Flow: "authorization_code", ClientID: "c", TokenURL: "https://t/token"}, conn: none, want: "connectors[0].credential.oauth2.authorization_url: must be set"},
		{name: "two oauth2 schemes", o: config.OAuth2{Flow: "authorization_code", ClientID: "c"}, conn: two, want: "connectors[0].credential.oauth2.scheme: the spec has several oauth2 schemes"},
		{name: "scheme picks one", o: config.OAuth2{Flow: "authorization_code", ClientID: "c", Scheme: "b"}, conn: two,
			check: func(c *oauth.Client) bool { return c.TokenURL == "https://b/token" }},
		{name: "scheme not oauth2", o: config.OAuth2{Flow: "authorization_code", ClientID: "c", Scheme: "key"}, conn: spec, want: "connectors[0].credential.oauth2.scheme: the spec has no oauth2 securityScheme"},
		{name: "plain http token url outside allow_private", o: config.OAuth2{Flow: "client_credentials", ClientID: "c", ClientSecret: "s", TokenURL: "http://idp.example/token"}, conn: none,
			want: "connectors[0].credential.oauth2.token_url: tokens and the client secret cross plain http only"},
		{name: "plain http token url inside allow_private", o: config.OAuth2{Flow: "client_credentials", ClientID: "c", ClientSecret: "s", TokenURL: "http://127.0.0.1:9/token"}, conn: none, allow: loop,
			check: func(c *oauth.Client) bool { return c.Flow == oauth.ClientCredentials }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			cc := config.Connector{Slug: "docs", Credential: &config.Credential{OAuth2: &o}}
			c, errs := OAuthClient("connectors[0]", cc, tc.conn, tc.allow)
			if tc.want != "" {
				if len(errs) == 0 || !strings.Contains(errs[0].Error(), tc.want) {
					t.Fatalf("errs = %v, want one naming %q", errs, tc.want)
				}
				return
			}
			if len(errs) > 0 || !tc.check(c) {
				t.Fatalf("client %+v, errs %v", c, errs)
			}
		})
	}
}
