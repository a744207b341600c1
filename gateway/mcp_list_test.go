package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

const listUserYAML = `
gateway:
  sandbox_socket: %[1]s/relay.sock
  trusted_relay_uids: [%[2]d]
  admin_listen: 127.0.0.1:0
store: sqlite:%[1]s/sluice.db
audit: { path: %[1]s/audit.log }
secrets:
  backend: vault
  vault:
    address: %[3]s
    auth: { method: approle, role_id_file: %[4]s, secret_id_file: %[5]s }
    timeout: 2s
connectors:
  - slug: listed
    provider: mcp
    url: %[6]s
    allow_private: [127.0.0.0/8]
    list_user: svc-lister
    credential: { vault: { kv: "secret/data/users/{user}/remote", field: api_key } }
  - slug: unlisted
    provider: mcp
    url: %[6]s
    allow_private: [127.0.0.0/8]
    credential: { vault: { kv: "secret/data/users/{user}/remote", field: api_key } }
agents:
  - { name: agent-a, connectors: [listed, unlisted] }
policies:
  - { match: "*", action: allow }
`

// TestMCPRemoteListUser: a remote MCP server whose credential is per user
// ({user} in its Vault path; a real Vault) is listed with the connector's
// list_user, a service identity, since a listing has no caller; a call of
// its tool still carries the caller's own credential. The same server
// without list_user shows unavailable with that reason, and its tools are
// not listed.
func TestMCPRemoteListUser(t *testing.T) {
	srv := vaulttest.Start(t)
	keys := map[string]string{"svc-lister": "svc-lister-key-00001", "alice": "alice-remote-key-0002"}
	for u, k := range keys {
		srv.Write(t, "secret/data/users/"+u+"/remote", map[string]any{"data": map[string]any{"api_key": k}})
	}

	// The remote: a real go-sdk server that accepts either bearer key and
	// records which one each JSON-RPC method came with.
	var mu sync.Mutex
	seen := map[string][]string{} // method → bearer keys
	rs := sdk.NewServer(&sdk.Implementation{Name: "remote", Version: "1"}, nil)
	sdk.AddTool(rs, &sdk.Tool{Name: "whoami", Description: "Says who you are."}, func(_ context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "ok"}}}, nil, nil
	})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return rs }, nil)
	remote := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if auth != keys["svc-lister"] && auth != keys["alice"] {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var m struct {
			Method string `json:"method"`
		}
		_ = json.Unmarshal(body, &m)
		mu.Lock()
		seen[m.Method] = append(seen[m.Method], auth)
		mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(remote.Close)

	dir, err := os.MkdirTemp("", "sluice-lu-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rid, sid := srv.AppRole(t, dir, "gateway", `path "secret/data/*" { capabilities = ["read"] }`, "1h")
	cfg, err := config.Parse([]byte(fmt.Sprintf(listUserYAML, dir, os.Getuid(), srv.Addr, rid, sid, remote.URL+"/mcp")), dir)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done; gw.Close() })
	select {
	case <-gw.Ready():
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("gateway not ready")
	}
	g := &testGateway{Server: gw, cfg: cfg}
	alice := g.client(wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-alice", User: "alice", Host: "h1"})

	resp, err := alice.Get("http://sluice/v1/tools")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Tools       []struct{ Name string } `json:"tools"`
		Unavailable []map[string]string     `json:"unavailable"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tl := range list.Tools {
		names[tl.Name] = true
	}
	reasons := map[string]string{}
	for _, u := range list.Unavailable {
		reasons[u["connector"]] = u["reason"]
	}
	t.Logf("tools %v, unavailable %v", names, reasons)
	if !names["listed.whoami"] || reasons["listed"] != "" {
		t.Errorf("the remote with list_user is not listed: tools %v, reason %q", names, reasons["listed"])
	}
	if names["unlisted.whoami"] || !strings.HasPrefix(reasons["unlisted"], "credential: ") || !strings.Contains(reasons["unlisted"], "per user") || !strings.Contains(reasons["unlisted"], "list_user") {
		t.Errorf("the remote without list_user: listed %v, reason %q; want unavailable naming list_user", names["unlisted.whoami"], reasons["unlisted"])
	}
	mu.Lock()
	for _, k := range seen["tools/list"] {
		if k != keys["svc-lister"] {
			t.Errorf("a listing carried another user's key")
		}
	}
	if len(seen["tools/list"]) == 0 {
		t.Errorf("the remote was never listed")
	}
	mu.Unlock()

	// A call acts for its caller: alice's own key, not the service's.
	r := doCall(t, alice, "listed.whoami", `{"body":{}}`)
	mu.Lock()
	calls := append([]string(nil), seen["tools/call"]...)
	mu.Unlock()
	if r.status != 200 || len(calls) != 1 || calls[0] != keys["alice"] {
		t.Errorf("alice's call: %d %s; the remote's tools/call keys were alice's: %v", r.status, r.raw, len(calls) == 1 && calls[0] == keys["alice"])
	}
}
