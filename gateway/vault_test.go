package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/receipts"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

// vaultedUpstream is the API behind the vault connectors. It checks each
// credential the way a real upstream would: /kv reports which key arrived,
// /db logs in to PostgreSQL with the basic-auth credentials, /signed
// verifies the JWT against the gateway's published JWKS and recomputes the
// request hash.
type vaultedUpstream struct {
	*httptest.Server
	requests atomic.Int64
	pg       *vaulttest.Postgres
	jwksURL  atomic.Pointer[string]
	mu       sync.Mutex
	seen     []string // every credential value received (to check none leaks)
}

func newVaultedUpstream(t *testing.T, pg *vaulttest.Postgres) *vaultedUpstream {
	u := &vaultedUpstream{pg: pg}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/kv":
			k := r.Header.Get("X-Api-Key")
			u.note(k)
			fmt.Fprintf(w, `{"key_sha256":%q}`, sha(k))
		case r.URL.Path == "/db":
			user, pass, ok := r.BasicAuth()
			u.note(pass)
			if !ok || u.pg == nil {
				http.Error(w, `{"error":"no basic auth"}`, http.StatusUnauthorized)
				return
			}
			who, err := u.pg.Query(r.Context(), user, pass, "select current_user")
			if err != nil {
				w.WriteHeader(http.StatusForbidden)
				fmt.Fprintf(w, `{"error":"postgres refused the login"}`)
				return
			}
			fmt.Fprintf(w, `{"pg_user":%q}`, who)
		case strings.HasPrefix(r.URL.Path, "/signed/"):
			tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			u.note(tok)
			body, _ := io.ReadAll(r.Body)
			claims, err := u.verify(r, tok, body)
			if err != nil {
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprintf(w, `{"error":%q}`, err.Error())
				return
			}
			json.NewEncoder(w).Encode(map[string]any{"claims": claims})
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *vaultedUpstream) note(v string) {
	if v != "" {
		u.mu.Lock()
		u.seen = append(u.seen, v)
		u.mu.Unlock()
	}
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// verify checks a per-call JWT as an upstream must: the signature against
// the JWKS fetched from the gateway's admin listener, aud, exp, and that
// req_sha256 is the hash of the request this upstream received.
func (u *vaultedUpstream) verify(r *http.Request, tok string, body []byte) (map[string]any, error) {
	p := u.jwksURL.Load()
	if p == nil {
		return nil, fmt.Errorf("no jwks url")
	}
	resp, err := http.Get(*p)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(resp.Body).Decode(&set); err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	jws, err := jose.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256, jose.RS256, jose.EdDSA})
	if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	keys := set.Key(jws.Signatures[0].Header.KeyID)
	if len(keys) != 1 {
		return nil, fmt.Errorf("kid %q not published", jws.Signatures[0].Header.KeyID)
	}
	payload, err := jws.Verify(keys[0])
	if err != nil {
		return nil, fmt.Errorf("signature: %w", err)
	}
	var cl map[string]any
	if err := json.Unmarshal(payload, &cl); err != nil {
		return nil, err
	}
	if cl["aud"] != "vaulted-api" {
		return nil, fmt.Errorf("aud %v", cl["aud"])
	}
	if exp, _ := cl["exp"].(float64); int64(exp) < time.Now().Unix() {
		return nil, fmt.Errorf("expired")
	}
	h := sha256.New()
	io.WriteString(h, r.Method+"\n"+r.URL.RequestURI()+"\n")
	h.Write(body)
	if got := hex.EncodeToString(h.Sum(nil)); cl["req_sha256"] != got {
		return nil, fmt.Errorf("req_sha256 %v is not this request's %s", cl["req_sha256"], got)
	}
	return cl, nil
}

const vaultGatewayYAML = `
gateway:
  sandbox_socket: %[1]s/relay.sock
  trusted_relay_uids: [%[4]d]
  admin_listen: 127.0.0.1:0
  session_tokens_sha256: [%[7]s]
store: sqlite:%[1]s/sluice.db
audit: { path: %[1]s/audit.log }
secrets:
  backend: vault
  vault:
    address: %[3]s
    auth: { method: approle, role_id_file: %[5]s, secret_id_file: %[6]s }
    cache_ttl: 2s
    timeout: 2s
connectors:
  - slug: kv
    spec: %[8]s
    base_url: %[2]s
    allow_private: [127.0.0.0/8]
    credential: { vault: { kv: secret/data/vaulted, field: api_key } }
  - slug: peruser
    spec: %[8]s
    base_url: %[2]s
    allow_private: [127.0.0.0/8]
    credential: { vault: { kv: "secret/data/users/{user}/vaulted", field: api_key } }
  - slug: named
    spec: %[8]s
    base_url: %[2]s
    allow_private: [127.0.0.0/8]
    credential: { secret: vaulted-key }
  - slug: db
    spec: %[8]s
    base_url: %[2]s
    allow_private: [127.0.0.0/8]
    credential: { vault: { dynamic: database/creds/ro } }
  - slug: helddb
    spec: %[8]s
    base_url: %[2]s
    allow_private: [127.0.0.0/8]
    credential: { vault: { dynamic: database/creds/ro } }
  - slug: signed
    spec: %[8]s
    base_url: %[2]s
    allow_private: [127.0.0.0/8]
    credential: { vault: { transit_key: sluice-calls, audience: vaulted-api, ttl: 2m } }
agents:
  - { name: agent-a, connectors: [kv, peruser, named, db, helddb, signed] }
policies:
  - { match: "helddb.*", action: ask, approvers: [bob] }
  - { match: "*", action: allow }
`

const gwPolicy = `
path "secret/data/*" { capabilities = ["read"] }
path "database/creds/*" { capabilities = ["read"] }
path "sys/leases/renew" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
path "transit/sign/*" { capabilities = ["update"] }
path "transit/keys/*" { capabilities = ["read"] }
`

// TestVaultCredentials runs every Vault credential kind through the real
// gateway against a real Vault, PostgreSQL and an upstream that verifies
// what it is given (issue 3's "Done when").
func TestVaultCredentials(t *testing.T) {
	pg := vaulttest.StartPostgres(t)
	srv := vaulttest.Start(t)
	srv.Write(t, "secret/data/vaulted", map[string]any{"data": map[string]any{"api_key": "kv-key-for-vaulted-0001"}})
	srv.Write(t, "secret/data/users/alice/vaulted", map[string]any{"data": map[string]any{"api_key": "alice-key-for-vaulted-02"}})
	srv.Write(t, "secret/data/users/bob/vaulted", map[string]any{"data": map[string]any{"api_key": "bob-key-for-vaulted-0003"}})
	srv.Write(t, "secret/data/sluice/project/vaulted-key", map[string]any{"data": map[string]any{"value": "named-key-in-vault-0004"}})
	srv.Mount(t, "database", "database")
	srv.Write(t, "database/config/pg", map[string]any{
		"plugin_name": "postgresql-database-plugin", "allowed_roles": "ro",
		"connection_url": pg.ConnectionURL(), "username": "postgres", "password": pg.Password,
	})
	srv.Write(t, "database/roles/ro", map[string]any{
		"db_name":             "pg",
		"creation_statements": `CREATE ROLE "{{name}}" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}';`,
		"default_ttl":         "1m", "max_ttl": "10m",
	})
	srv.Mount(t, "transit", "transit")
	srv.Write(t, "transit/keys/sluice-calls", map[string]any{"type": "ecdsa-p256"})

	up := newVaultedUpstream(t, pg)
	dir, err := os.MkdirTemp("", "sluice-vgw-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rid, sid := srv.AppRole(t, dir, "gateway", gwPolicy, "1h")
	spec, _ := filepath.Abs("testdata/vaulted.yaml")
	data := fmt.Sprintf(vaultGatewayYAML, dir, up.URL, srv.Addr, os.Getuid(), rid, sid, tokenHash("tok-sandboxd"), spec) + approversYAML
	cfg, err := config.Parse([]byte(data), dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gateway.HoldWait = config.Duration(50 * time.Millisecond)
	logBuf := &syncBuffer{}
	gw, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.NewJSONHandler(logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatalf("New: %v\n%s", err, srv.Log())
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &testGateway{Server: gw, cfg: cfg, dir: dir, logBuf: logBuf, cancel: cancel, done: make(chan error, 1)}
	go func() { g.done <- gw.Serve(ctx) }()
	select {
	case <-gw.Ready():
	case err := <-g.done:
		t.Fatalf("serve: %v", err)
	}
	closed := false
	stop := func() {
		if !closed {
			closed = true
			cancel()
			<-g.done
			gw.Close()
		}
	}
	t.Cleanup(stop)
	jwks := "http://" + gw.AdminAddr() + "/.well-known/jwks.json"
	up.jwksURL.Store(&jwks)
	src := gw.creds.(*creds.Vault)

	alice := g.client(wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-alice", User: "alice", Host: "h1"})
	bob := g.client(wire.Identity{Sandbox: "sb-2", Agent: "agent-a", Session: "s-bob", User: "bob", Host: "h1"})
	nobody := g.client(wire.Identity{Sandbox: "sb-3", Agent: "agent-a", Session: "s-none", Host: "h1"})
	var replies []string

	t.Run("kv", func(t *testing.T) {
		r := doCall(t, alice, "kv.kv", `{}`)
		replies = append(replies, r.raw)
		if r.status != 200 || !strings.Contains(r.raw, sha("kv-key-for-vaulted-0001")) {
			t.Fatalf("%d %s: the upstream did not receive the KV value", r.status, r.raw)
		}
		before := src.Client().Requests()
		for i := 0; i < 20; i++ {
			if r := doCall(t, alice, "kv.kv", `{}`); r.status != 200 {
				t.Fatalf("%d %s", r.status, r.raw)
			}
		}
		if n := src.Client().Requests() - before; n != 0 {
			t.Errorf("20 calls with a warm cache sent %d requests to Vault, want 0", n)
		}
	})
	t.Run("named secret in Vault KV", func(t *testing.T) {
		r := doCall(t, alice, "named.kv", `{}`)
		replies = append(replies, r.raw)
		if r.status != 200 || !strings.Contains(r.raw, sha("named-key-in-vault-0004")) {
			t.Fatalf("%d %s", r.status, r.raw)
		}
	})
	t.Run("per-user scope never crosses users", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			c    *http.Client
			want string
		}{{"alice", alice, "alice-key-for-vaulted-02"}, {"bob", bob, "bob-key-for-vaulted-0003"}} {
			r := doCall(t, tc.c, "peruser.kv", `{}`)
			replies = append(replies, r.raw)
			if r.status != 200 || !strings.Contains(r.raw, sha(tc.want)) {
				t.Fatalf("%s: %d %s: want %s's own key", tc.name, r.status, r.raw, tc.name)
			}
		}
		before := up.requests.Load()
		r := doCall(t, nobody, "peruser.kv", `{}`)
		if r.status != 503 || r.code() != "credential_unavailable" {
			t.Fatalf("a session acting for no user: %d %s, want 503 credential_unavailable", r.status, r.raw)
		}
		if up.requests.Load() != before {
			t.Error("the upstream was dialled without a credential")
		}
	})
	t.Run("per-call JWT verified by the upstream", func(t *testing.T) {
		r := doCall(t, alice, "signed.signed", `{"path":{"id":"T-9"},"body":{"note":"héllo"}}`)
		replies = append(replies, r.raw)
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.raw)
		}
		for _, want := range []string{`"agent":"agent-a"`, `"session":"s-alice"`, `"user":"alice"`, `"tool":"signed.signed"`, `"aud":"vaulted-api"`, `"iss":"sluice"`} {
			if !strings.Contains(r.raw, want) {
				t.Errorf("claims lack %s: %s", want, r.raw)
			}
		}
		r2 := doCall(t, alice, "signed.signed", `{"path":{"id":"T-9"},"body":{"note":"other"}}`)
		if r2.status != 200 || r2.raw == r.raw {
			t.Errorf("second call: %d; a token must be minted per call", r2.status)
		}
	})
	var pgUser string
	t.Run("dynamic database credentials per session", func(t *testing.T) {
		r := doCall(t, alice, "db.db", `{}`)
		replies = append(replies, r.raw)
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.raw)
		}
		var body struct {
			Body struct {
				PGUser string `json:"pg_user"`
			} `json:"body"`
		}
		_ = json.Unmarshal([]byte(r.raw), &body)
		pgUser = body.Body.PGUser
		if !strings.HasPrefix(pgUser, "v-") {
			t.Fatalf("upstream logged in as %q (%s), want a Vault-made role", pgUser, r.raw)
		}
		if pg.Super(t, "select count(*) from pg_roles where rolname = '"+pgUser+"'") != "1" {
			t.Fatal("the dynamic user does not exist during the session")
		}
		rb := doCall(t, bob, "db.db", `{}`)
		if rb.status != 200 || strings.Contains(rb.raw, pgUser) {
			t.Fatalf("bob's session: %d %s: want its own database user", rb.status, rb.raw)
		}
		if r := g.admin(t, "tok-sandboxd", "POST", "/api/v1/sessions/s-alice/end", ""); r.status != 200 {
			t.Fatalf("session end: %d %s", r.status, r.raw)
		}
		if pg.Super(t, "select count(*) from pg_roles where rolname = '"+pgUser+"'") != "0" {
			t.Error("the dynamic user still exists after sessions end")
		}
		if len(src.Client().Leases("s-bob")) != 1 {
			t.Error("ending alice's session touched bob's lease")
		}
		if r := doCall(t, alice, "db.db", `{}`); r.status != 403 || r.code() != "session_ended" {
			t.Errorf("a call of the ended session: %d %s, want 403 session_ended", r.status, r.raw)
		}
	})
	t.Run("a held call's receipt names the credential's lease", func(t *testing.T) {
		held := g.client(wire.Identity{Sandbox: "sb-4", Agent: "agent-a", Session: "s-held", User: "alice", Host: "h1"})
		id, _ := holdOf(t, doCall(t, held, "helddb.db", `{}`))
		if ar := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", `{"reason":"ok"}`); ar.status != 200 {
			t.Fatalf("approve: %d %s", ar.status, ar.raw)
		}
		rr := g.admin(t, "tok-bob", "GET", "/api/v1/holds/"+id+"/receipt", "")
		kr := g.admin(t, "", "GET", "/api/v1/receipts/key", "")
		pub, err := receipts.ParsePublicKey([]byte(kr.body["public_key_pem"].(string)))
		if err != nil || rr.status != 200 {
			t.Fatalf("receipt %d %s; key %v", rr.status, rr.raw, err)
		}
		rc, err := receipts.Verify([]byte(rr.raw), pub)
		if err != nil {
			t.Fatalf("Verify: %v\n%s", err, rr.raw)
		}
		leases := src.Client().Leases("s-held")
		if len(leases) != 1 || rc.LeaseID != leases[0] || !strings.HasPrefix(rc.LeaseID, "database/creds/ro/") || rc.UpstreamStatus != 200 || rc.Credential == "" {
			t.Fatalf("receipt %+v; the session's leases %v", rc, leases)
		}
		// Vault itself knows the lease the receipt names.
		if _, err := srv.Client(t).Sys().Lookup(rc.LeaseID); err != nil {
			t.Fatalf("Vault does not know lease %s: %v", rc.LeaseID, err)
		}
	})
	t.Run("JWKS is served on the admin listener", func(t *testing.T) {
		resp, err := http.Get(jwks)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var set jose.JSONWebKeySet
		if err := json.NewDecoder(resp.Body).Decode(&set); err != nil || len(set.Key("sluice-calls-v1")) != 1 {
			t.Fatalf("jwks: %v %+v", err, set)
		}
		for _, k := range set.Keys {
			if !k.IsPublic() {
				t.Error("the JWKS publishes a private key")
			}
		}
	})
	t.Run("Vault stopped: cached values until expiry, then 503 and nothing dialled", func(t *testing.T) {
		if r := doCall(t, bob, "kv.kv", `{}`); r.status != 200 {
			t.Fatalf("warm-up: %d %s", r.status, r.raw)
		}
		stopped := time.Now()
		srv.Stop()
		if r := doCall(t, bob, "kv.kv", `{}`); time.Since(stopped) < 2*time.Second && r.status != 200 {
			t.Fatalf("within cache_ttl: %d %s, want the cached value to work", r.status, r.raw)
		}
		time.Sleep(time.Until(stopped.Add(2200 * time.Millisecond)))
		before := up.requests.Load()
		for _, tool := range []string{"kv.kv", "signed.signed"} {
			args := `{}`
			if tool == "signed.signed" {
				args = `{"path":{"id":"x"},"body":{}}`
			}
			r := doCall(t, bob, tool, args)
			if r.status != 503 || r.code() != "credential_unavailable" {
				t.Fatalf("%s after expiry: %d %s, want 503 credential_unavailable", tool, r.status, r.raw)
			}
			if strings.Contains(strings.ToLower(r.raw), "vault:") || strings.Contains(r.raw, "127.0.0.1") {
				t.Errorf("the refusal carries Vault's error: %s", r.raw)
			}
		}
		if up.requests.Load() != before {
			t.Error("the upstream was dialled without a credential")
		}
		recs := auditEvents(t, g)
		found := false
		for _, rec := range recs {
			b, _ := json.Marshal(rec)
			if strings.Contains(string(b), "credential_unavailable") {
				found = true
			}
		}
		if !found {
			t.Error("no audit record carries credential_unavailable")
		}
	})

	stop()
	audit, _ := os.ReadFile(cfg.Audit.Path)
	up.mu.Lock()
	secrets := append([]string{"kv-key-for-vaulted-0001", "alice-key-for-vaulted-02", "bob-key-for-vaulted-0003", "named-key-in-vault-0004", srv.RootToken}, up.seen...)
	up.mu.Unlock()
	sidRaw, _ := os.ReadFile(sid)
	secrets = append(secrets, string(sidRaw))
	for _, s := range secrets {
		for where, text := range map[string]string{"the gateway log": logBuf.String(), "the audit log": string(audit), "the replies": strings.Join(replies, "\n")} {
			if s != "" && strings.Contains(text, s) {
				t.Errorf("%s contains a secret (%d bytes)", where, len(s))
			}
		}
	}
}
