package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

const oauthDocsSpec = `openapi: 3.0.3
info: { title: docs, version: "1" }
components:
  securitySchemes:
    docsAuth:
      type: oauth2
      flows:
        authorizationCode:
          authorizationUrl: %[1]s/auth
          tokenUrl: %[1]s/oauth/token
          scopes: { openid: sign in, offline_access: stay connected }
security: [ { docsAuth: [openid] } ]
paths:
  /docs/{id}:
    get:
      operationId: getDoc
      parameters: [ { name: id, in: path, required: true, schema: { type: string, maxLength: 20 } } ]
      responses: { "200": { description: ok } }
`

const oauthReplicaYAML = `
gateway:
  sandbox_socket: %[1]s/relay.sock
  trusted_relay_uids: [%[2]d]
  admin_listen: 127.0.0.1:0
  replica_id: %[3]s
store: %[4]s
audit: { path: %[1]s/audit.log }
secrets: { backend: vault, vault: { address: %[5]s, auth: { method: token, token_file: %[6]s } } }
approvals: { public_url: "http://sluice.test" }
connectors:
  - slug: docs
    spec: %[7]s
    base_url: %[8]s
    allow_private: [127.0.0.0/8]
    credential:
      oauth2: { flow: authorization_code, client_id: sluice-docs, client_secret: docs-client-secret, scopes: [openid, offline_access] }
agents:
  - { name: agent-a, connectors: [docs] }
policies:
  - { match: "*", action: allow }
`

// TestOAuthReplicasVaultPostgres: two gateways (each its own store pool,
// Vault client and OAuth manager) on one real PostgreSQL and one real
// Vault, with zitadel's authorization server:
//   - a connect started on A is completed by the callback on B (the
//     started connect is in the store), once: the same state again, on
//     A, is refused;
//   - the tokens are in Vault KV v2 (user scope), nowhere in PostgreSQL;
//   - with the access token expired, 40 concurrent calls through both
//     make exactly one refresh at the provider (the store's refresh
//     lease), every call carrying the new token; the rotated refresh
//     token is what Vault holds.
func TestOAuthReplicasVaultPostgres(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	db := pg.NewDatabaseT(t)
	dsn := pg.SuperURL(db)
	vs := vaulttest.Start(t)
	ctx := context.Background()
	const redirect = "http://sluice.test/connections/callback"
	as := oauthtest.Start(t, redirect, "sluice-docs")
	vs.Write(t, "secret/data/sluice/project/docs-client-secret", map[string]any{"data": map[string]any{"value": oauthtest.WebSecret}})

	var authMu sync.Mutex
	var auths []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authMu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		authMu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)

	top := t.TempDir()
	spec := filepath.Join(top, "docs.yaml")
	tokenFile := filepath.Join(top, "vault-token")
	must(t, os.WriteFile(spec, fmt.Appendf(nil, oauthDocsSpec, as.URL), 0o644))
	must(t, os.WriteFile(tokenFile, []byte(vs.RootToken), 0o600))
	var logs [2]*syncBuffer
	var gs [2]*testGateway
	for i := range gs {
		dir, err := os.MkdirTemp("", "sluice-oa-")
		must(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		cfg, err := config.Parse(fmt.Appendf(nil, oauthReplicaYAML, dir, os.Getuid(), fmt.Sprintf("r%d", i), dsn, vs.Addr, tokenFile, spec, up.URL), dir)
		must(t, err)
		logs[i] = &syncBuffer{}
		srv, err := New(ctx, cfg, Options{Logger: slog.New(slog.NewJSONHandler(logs[i], &slog.HandlerOptions{Level: slog.LevelDebug})), Tracing: testTracing})
		must(t, err)
		sctx, cancel := context.WithCancel(ctx)
		g := &testGateway{Server: srv, cfg: cfg, dir: dir, logBuf: logs[i], cancel: cancel, done: make(chan error, 1)}
		go func() { g.done <- srv.Serve(sctx) }()
		select {
		case <-srv.Ready():
		case err := <-g.done:
			t.Fatalf("serve: %v", err)
		case <-time.After(15 * time.Second):
			t.Fatal("gateway not ready after 15s")
		}
		t.Cleanup(func() { cancel(); <-g.done; srv.Close() })
		gs[i] = g
	}
	a, b := gs[0], gs[1]

	// Start on A, call back on B.
	u, err := a.OAuth().Begin(ctx, "docs", "alice", "browser-1")
	must(t, err)
	back, err := as.Consent(u)
	must(t, err)
	state, code := back.Query().Get("state"), back.Query().Get("code")
	c, err := b.OAuth().Complete(ctx, "browser-1", state, code)
	if err != nil || c.User != "alice" || c.Status != oauth.Connected {
		t.Fatalf("callback on B: %+v, %v", c, err)
	}
	if _, err := a.OAuth().Complete(ctx, "browser-1", state, code); !errors.Is(err, oauth.ErrBadState) {
		t.Fatalf("the same state again on A: %v, want ErrBadState", err)
	}
	if n := as.Grants("authorization_code"); n != 1 {
		t.Fatalf("%d code exchanges, want 1", n)
	}

	// The tokens: in Vault, at the person's scope; not in PostgreSQL.
	vc := vs.Client(t)
	readTokens := func() map[string]any {
		t.Helper()
		sec, err := vc.Logical().Read("secret/data/sluice/user/alice/oauth2.docs")
		if err != nil || sec == nil {
			t.Fatalf("Vault KV has no tokens for alice: %v", err)
		}
		var rec map[string]any
		must(t, json.Unmarshal([]byte(sec.Data["data"].(map[string]any)["value"].(string)), &rec))
		return rec
	}
	first := readTokens()
	access, refresh := first["access"].(string), first["refresh"].(string)
	if access == "" || refresh == "" {
		t.Fatalf("stored tokens incomplete: %v", slices.Collect(maps.Keys(first)))
	}
	conn, err := pgx.Connect(ctx, pg.SuperURL(db))
	must(t, err)
	defer conn.Close(ctx)
	dump := func() string {
		t.Helper()
		var sb strings.Builder
		for _, tbl := range []string{"oauth_connections", "oauth_pending"} {
			rows, err := conn.Query(ctx, `SELECT row_to_json(x)::text FROM `+tbl+` x`)
			must(t, err)
			for rows.Next() {
				var s string
				must(t, rows.Scan(&s))
				sb.WriteString(s + "\n")
			}
			rows.Close()
		}
		return sb.String()
	}
	if d := dump(); !strings.Contains(d, `"status":"connected"`) || strings.Contains(d, access) || strings.Contains(d, refresh) {
		t.Fatalf("PostgreSQL rows (connected row expected, no token): %s", d)
	}

	call := func(g *testGateway) reply {
		req, _ := http.NewRequest(http.MethodPost, "http://sluice/v1/tools/docs.get_doc", strings.NewReader(`{"path":{"id":"7"}}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := g.client(agentA).Do(req)
		if err != nil {
			return reply{status: -1, raw: err.Error()}
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		return reply{status: resp.StatusCode, raw: buf.String()}
	}
	for _, g := range gs {
		if r := call(g); r.status != http.StatusOK {
			t.Fatalf("call: %d %s", r.status, r.raw)
		}
	}

	// The access token expires (as stored, and in both caches).
	first["expiry"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	b2, _ := json.Marshal(first)
	vs.Write(t, "secret/data/sluice/user/alice/oauth2.docs", map[string]any{"data": map[string]any{"value": string(b2)}})
	a.OAuth().Expire()
	b.OAuth().Expire()
	authMu.Lock()
	auths = nil
	authMu.Unlock()
	const n = 40
	var wg sync.WaitGroup
	var bad atomic.Int64
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			if r := call(gs[i%2]); r.status != http.StatusOK {
				bad.Add(1)
				t.Errorf("call %d on r%d: %d %s", i, i%2, r.status, r.raw)
			}
		})
	}
	close(start)
	wg.Wait()
	if bad.Load() > 0 {
		t.FailNow()
	}
	if got := as.Grants("refresh_token"); got != 1 {
		t.Fatalf("%d calls through 2 replicas made %d refreshes at the provider, want 1", n, got)
	}
	now := readTokens()
	if now["refresh"] == refresh || now["access"] == access {
		t.Fatal("the stored tokens were not rotated")
	}
	authMu.Lock()
	defer authMu.Unlock()
	if len(auths) != n {
		t.Fatalf("upstream got %d requests, want %d", len(auths), n)
	}
	for _, h := range auths {
		if h != "Bearer "+now["access"].(string) {
			t.Fatalf("a call carried a token other than the refreshed one")
		}
	}
	for i, l := range logs {
		if s := l.String(); strings.Contains(s, access) || strings.Contains(s, refresh) || strings.Contains(s, now["refresh"].(string)) {
			t.Fatalf("r%d's log holds a token", i)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
