package config

import "strings"

// OAuthTokenPrefix starts the name under which a person's OAuth tokens
// for connector SLUG are kept in the secret store ("oauth2.SLUG", scope
// user:NAME). No secret reference may name it: a connector's
// credential.secret or an egress placeholder's secret resolved there
// would send the whole token record (refresh token included).
const OAuthTokenPrefix = "oauth2."

// OAuthTokenName is the secret-store name of connector's OAuth tokens,
// and the name an egress placeholder bound to that connection carries.
func OAuthTokenName(connector string) string { return OAuthTokenPrefix + connector }

// OAuthClientPrefix starts the name under which a dynamically registered
// OAuth client of a remote MCP server is kept ("oauth2-client.SLUG",
// scope connector:SLUG): its client secret is no connector's credential.
const OAuthClientPrefix = "oauth2-client."

// reservedSecret refuses a secret reference in the names the gateway
// keeps OAuth tokens and registered clients under.
func reservedSecret(key, name string, bad func(key, format string, args ...any)) {
	for _, p := range []string{OAuthTokenPrefix, OAuthClientPrefix} {
		if strings.HasPrefix(strings.ToLower(name), p) {
			bad(key, "%q: names beginning %q are the gateway's own OAuth records; bind a connection with egress.placeholders[].connection instead", name, p)
			return
		}
	}
}

// validatePlaceholderBinding checks what an egress.placeholders entry
// stands for: a secret, or (connection) the access token of the calling
// person's OAuth connection to a credential.oauth2 connector with flow
// authorization_code, or of a client_credentials connector.
func validatePlaceholderBinding(k string, p Placeholder, c *Config, bad func(key, format string, args ...any)) (name string, ok bool) {
	switch {
	case p.Connection != "" && p.Secret != "":
		bad(k+".connection", "secret and connection are exclusive")
		return "", false
	case p.Connection == "":
		reservedSecret(k+".secret", p.Secret, bad)
		return p.Secret, true
	}
	for _, cc := range c.Connectors {
		if cc.Slug == p.Connection && cc.Credential != nil && cc.Credential.OAuth2 != nil {
			return OAuthTokenName(p.Connection), true
		}
	}
	bad(k+".connection", "%q is not a connector with credential.oauth2", p.Connection)
	return "", false
}

// Name is the name an egress.placeholders entry's placeholder
// carries (sluice:secret:NAME:…): the secret, or the connection's
// OAuthTokenName.
func (p Placeholder) Name() string {
	if p.Connection != "" {
		return OAuthTokenName(p.Connection)
	}
	return p.Secret
}
