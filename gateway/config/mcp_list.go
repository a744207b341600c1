package config

import "strings"

// PerUser reports whether the credential is fetched per user: a Vault
// path with {user}. Such a credential needs a caller, and a remote MCP
// server's listing has none (Connector.ListUser).
func (c *Credential) PerUser() bool {
	if c == nil || c.Vault == nil {
		return false
	}
	return strings.Contains(c.Vault.KV, "{user}") || strings.Contains(c.Vault.Dynamic, "{user}")
}

// listUserProblems checks a provider: mcp connector's list_user: a name
// that stays one Vault path segment (as the secret stores name users:
// a letter or digit, then letters, digits, '_', '.', '-', at most 128), and
// only beside a per-user credential, which is the only kind it changes.
func listUserProblems(k string, cn Connector, bad func(key, format string, args ...any)) {
	u := cn.ListUser
	if u == "" {
		return
	}
	if !userName(u) {
		bad(k+".list_user", "want a user name: a letter or digit, then letters, digits, '_', '.' and '-' (at most 128), got %q", u)
		return
	}
	if !cn.Credential.PerUser() {
		bad(k+".list_user", "only with a per-user credential ({user} in credential.vault.kv or .dynamic): another credential lists as it calls")
	}
}

func userName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i, c := range s {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return true
}
