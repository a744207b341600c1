package config

// mcpOAuth2Problems checks credential.oauth2 on a provider: mcp connector:
// the remote server's MCP authorization is discovered (RFC 9728, RFC
// 8414), so its endpoints are not configured, and each person connects
// (authorization_code). client_id may be left out: the gateway then
// registers one (RFC 7591).
func mcpOAuth2Problems(k string, o *OAuth2, bad func(key, format string, args ...any)) {
	if o.Flow == "client_credentials" {
		bad(k+".flow", "with provider: mcp only authorization_code (MCP authorization: each person connects the server)")
	}
	for _, f := range [...]struct{ key, v string }{{"authorization_url", o.AuthorizationURL}, {"token_url", o.TokenURL}, {"scheme", o.Scheme}} {
		if f.v != "" {
			bad(k+"."+f.key, "not with provider: mcp: discovered from the server's protected-resource and authorization-server metadata")
		}
	}
}
