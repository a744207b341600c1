package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
)

// TestConnectorsCmd: sluice connectors lists each connector with its
// credential and tools, and a remote MCP server whose MCP authorization
// is refused shows the step and the reason; nothing is registered.
func TestConnectorsCmd(t *testing.T) {
	dir := t.TempDir()
	const public = "https://review.example"
	good := oauthtest.StartMCP(t, public+"/connections/callback")
	bad := oauthtest.StartMCP(t, public+"/connections/callback")
	bad.SetResource("https://elsewhere.example/mcp")
	cfg := fmt.Sprintf(`
store: sqlite:%[1]s/sluice.db
audit: { path: %[1]s/audit.log }
secrets: { backend: local, local: { path: %[1]s/secrets.json, key_file: %[1]s/secrets.key } }
approvals: { public_url: %[2]s }
connectors:
  - { slug: notes, provider: mcp, url: "%[3]s", allow_private: [127.0.0.0/8], credential: { oauth2: { flow: authorization_code } } }
  - { slug: wrongres, provider: mcp, url: "%[4]s", allow_private: [127.0.0.0/8], credential: { oauth2: { flow: authorization_code } } }
agents: [{ name: bot, connectors: [notes, wrongres] }]
policies: [{ match: "*", action: block }]
`, dir, public, good.MCPURL, bad.MCPURL)
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"connectors", "--config", path}, strings.NewReader(""), &out, &errb); err != nil {
		t.Fatalf("connectors: %v\n%s%s", err, out.String(), errb.String())
	}
	got := out.String()
	for _, want := range []string{
		"SLUG", "notes", "oauth2 (MCP authorization, per person)",
		"notes: connectors[0]: the remote MCP server speaks MCP authorization (authorization server " + good.AS.URL + ")",
		"wrongres: connectors[1].credential.oauth2: the remote MCP server's authorization cannot be discovered: oauth: wrongres: MCP authorization: protected-resource metadata:",
		`names the resource "https://elsewhere.example/mcp"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if n := good.Registrations.Load() + bad.Registrations.Load(); n != 0 {
		t.Fatalf("listing the connectors registered %d clients", n)
	}
}
