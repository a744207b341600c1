package config

import (
	"strings"
	"testing"
)

// TestListUser: connectors[].list_user is a provider: mcp connector's
// service identity for a per-user credential; anywhere else, or a name
// that would not stay one Vault path segment, is an error naming the key.
func TestListUser(t *testing.T) {
	const vault = "secrets: { backend: vault, vault: { address: 'https://v:8200', auth: { method: token, token_file: t } } }\n"
	perUser := "credential: { vault: { kv: 'secret/data/users/{user}/tools', field: k } }"
	for _, tc := range []struct{ name, yaml, key string }{
		{"on an openapi connector", "connectors: [{ slug: a, spec: a.yaml, list_user: svc }]\n", "connectors[0].list_user: only with provider: mcp"},
		{"without a per-user credential", vault + "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', list_user: svc, credential: { vault: { kv: secret/data/tools, field: k } } }]\n", "connectors[0].list_user: only with a per-user credential"},
		{"without a credential", "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', list_user: svc }]\n", "connectors[0].list_user: only with a per-user credential"},
		{"a path segment", vault + "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', list_user: '../root', " + perUser + " }]\n", "connectors[0].list_user: want a user name"},
		{"a leading dot", vault + "connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', list_user: .svc, " + perUser + " }]\n", "connectors[0].list_user: want a user name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "/x")
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("err = %v, want it to name %s", err, tc.key)
			}
		})
	}
	c, err := Parse([]byte(vault+"connectors: [{ slug: a, provider: mcp, url: 'https://x/mcp', list_user: svc-lister, "+perUser+" }]\nagents: [{ name: bot, connectors: [a] }]\n"), "/x")
	if err != nil {
		t.Fatal(err)
	}
	if cn := c.Connectors[0]; cn.ListUser != "svc-lister" || !cn.Credential.PerUser() {
		t.Fatalf("connector %+v", cn)
	}
}
