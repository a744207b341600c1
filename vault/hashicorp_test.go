package vault_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/hashicorp/vault/api"

	"github.com/sluice-gw/sluice/vault"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

// gatewayPolicy is what a deployment grants the gateway's AppRole.
const gatewayPolicy = `
path "secret/data/*" { capabilities = ["read"] }
path "database/creds/*" { capabilities = ["read"] }
path "sys/leases/renew" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
path "transit/sign/*" { capabilities = ["update"] }
path "transit/keys/*" { capabilities = ["read"] }
path "identity/oidc/token/*" { capabilities = ["read"] }
`

// syncBuf is a log sink the test reads after the backend wrote to it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// open logs in with a fresh AppRole (token TTL ttl) and returns the backend
// and its log.
func open(t *testing.T, srv *vaulttest.Server, ttl string, mut func(*vault.VaultConfig)) (*vault.Vault, *syncBuf) {
	t.Helper()
	rid, sid := srv.AppRole(t, t.TempDir(), "gateway", gatewayPolicy, ttl)
	logs := &syncBuf{}
	cfg := vault.VaultConfig{
		Address: srv.Addr,
		Auth:    vault.VaultAuth{Method: "approle", RoleIDFile: rid, SecretIDFile: sid},
		Timeout: 2 * time.Second,
		Logger:  slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mut != nil {
		mut(&cfg)
	}
	v, err := vault.OpenVault(context.Background(), cfg)
	if err != nil {
		t.Fatalf("OpenVault: %v\n%s", err, srv.Log())
	}
	t.Cleanup(func() { _ = v.Close(context.Background()) })
	return v, logs
}

// noLeak fails when any of the values appears in the text.
func noLeak(t *testing.T, where, text string, values ...string) {
	t.Helper()
	for _, v := range values {
		if v != "" && strings.Contains(text, v) {
			t.Errorf("%s contains a secret value (%d bytes)", where, len(v))
		}
	}
}

func TestKVAndNamedScopes(t *testing.T) {
	srv := vaulttest.Start(t)
	srv.Write(t, "secret/data/billing", map[string]any{"data": map[string]any{"api_key": "kv-billing-key-0123456789"}})
	srv.Write(t, "secret/data/sluice/project/github", map[string]any{"data": map[string]any{"value": "project-wide-github-token"}})
	srv.Write(t, "secret/data/sluice/user/alice/github", map[string]any{"data": map[string]any{"value": "alice-own-github-token-x"}})
	srv.Write(t, "secret/data/sluice/connector/gh/deploy", map[string]any{"data": map[string]any{"value": "connector-deploy-key-xyz"}})
	v, logs := open(t, srv, "1h", nil)
	ctx := context.Background()

	got, err := v.KV(ctx, "secret/data/billing", "api_key")
	if err != nil || string(got.Reveal()) != "kv-billing-key-0123456789" {
		t.Fatalf("KV = %q, %v", got.Reveal(), err)
	}
	before := v.Requests()
	for i := 0; i < 1000; i++ {
		if _, err := v.KV(ctx, "secret/data/billing", "api_key"); err != nil {
			t.Fatal(err)
		}
	}
	if n := v.Requests() - before; n != 0 {
		t.Errorf("1000 warm KV reads sent %d requests to Vault, want 0", n)
	}
	if _, err := v.KV(ctx, "secret/data/billing", "nope"); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("missing field: err = %v, want ErrNotFound", err)
	}

	tests := []struct {
		name, secret string
		scopes       []vault.Scope
		want         string
		wantScope    vault.Scope
	}{
		{"user scope wins over project", "github", []vault.Scope{vault.ConnectorScope("gh"), vault.UserScope("alice"), vault.ScopeProject}, "alice-own-github-token-x", vault.UserScope("alice")},
		{"another user falls to project, never to alice's", "github", []vault.Scope{vault.ConnectorScope("gh"), vault.UserScope("bob"), vault.ScopeProject}, "project-wide-github-token", vault.ScopeProject},
		{"connector scope", "deploy", []vault.Scope{vault.ConnectorScope("gh"), vault.ScopeProject}, "connector-deploy-key-xyz", vault.ConnectorScope("gh")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, sc, err := v.Named(ctx, tc.secret, tc.scopes...)
			if err != nil || string(got.Reveal()) != tc.want || sc != tc.wantScope {
				t.Fatalf("Named = %q at %s, %v; want %q at %s", got.Reveal(), sc, err, tc.want, tc.wantScope)
			}
		})
	}
	if _, _, err := v.Named(ctx, "deploy", vault.ConnectorScope("other"), vault.UserScope("alice")); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("deploy for another connector: err = %v, want ErrNotFound", err)
	}
	if _, _, err := v.Named(ctx, "../x", vault.ScopeProject); err == nil {
		t.Error("a name with a path separator was accepted")
	}
	noLeak(t, "the backend's log", logs.String(), "kv-billing-key-0123456789", "alice-own-github-token-x", "project-wide-github-token", srv.RootToken)
}

// TestOutage: a cached value keeps working while Vault is down, until it
// expires; after that the read fails (ErrUnavailable) and returns nothing
// stale.
func TestOutage(t *testing.T) {
	for _, how := range []string{"stopped", "sealed"} {
		t.Run(how, func(t *testing.T) {
			srv := vaulttest.Start(t)
			srv.Write(t, "secret/data/billing", map[string]any{"data": map[string]any{"api_key": "outage-billing-key-12345"}})
			v, _ := open(t, srv, "1h", func(c *vault.VaultConfig) { c.CacheTTL = 2 * time.Second })
			ctx := context.Background()
			if _, err := v.KV(ctx, "secret/data/billing", "api_key"); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if how == "stopped" {
				srv.Stop()
			} else {
				srv.Seal(t)
			}
			got, err := v.KV(ctx, "secret/data/billing", "api_key")
			if time.Since(start) < 2*time.Second && (err != nil || string(got.Reveal()) != "outage-billing-key-12345") {
				t.Fatalf("within the cache TTL: %q, %v; want the cached value", got.Reveal(), err)
			}
			time.Sleep(time.Until(start.Add(2100 * time.Millisecond)))
			got, err = v.KV(ctx, "secret/data/billing", "api_key")
			if !errors.Is(err, vault.ErrUnavailable) || !got.IsZero() {
				t.Fatalf("after expiry with Vault %s: %d bytes, err %v; want nothing and ErrUnavailable", how, got.Len(), err)
			}
			if strings.Contains(err.Error(), "outage-billing-key") {
				t.Error("the error carries the secret")
			}
		})
	}
}

// TestDynamicPostgres: leased database credentials per session, usable in
// PostgreSQL while the session lasts, renewed past their first TTL, and
// gone from PostgreSQL once the session ends.
func TestDynamicPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts PostgreSQL")
	}
	pg := vaulttest.StartPostgres(t)
	srv := vaulttest.Start(t)
	srv.Mount(t, "database", "database")
	srv.Write(t, "database/config/pg", map[string]any{
		"plugin_name": "postgresql-database-plugin", "allowed_roles": "ro",
		"connection_url": pg.ConnectionURL(), "username": "postgres", "password": pg.Password,
	})
	srv.Write(t, "database/roles/ro", map[string]any{
		"db_name":             "pg",
		"creation_statements": `CREATE ROLE "{{name}}" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}'; GRANT pg_read_all_data TO "{{name}}";`,
		"default_ttl":         "4s", "max_ttl": "10m",
	})
	v, logs := open(t, srv, "1h", nil)
	ctx := context.Background()

	a, err := v.Dynamic(ctx, "sess-a", "database/creds/ro")
	if err != nil {
		t.Fatalf("Dynamic: %v\n%s", err, srv.Log())
	}
	user, pass := string(a["username"].Reveal()), string(a["password"].Reveal())
	if user == "" || pass == "" {
		t.Fatalf("no username/password in %v", a)
	}
	if out, err := pg.Query(ctx, user, pass, "select current_user"); err != nil || out != user {
		t.Fatalf("connecting as the dynamic user: %q, %v", out, err)
	}
	again, err := v.Dynamic(ctx, "sess-a", "database/creds/ro")
	if err != nil || string(again["username"].Reveal()) != user {
		t.Fatalf("same session, same path: got another credential (%v)", err)
	}
	b, err := v.Dynamic(ctx, "sess-b", "database/creds/ro")
	if err != nil {
		t.Fatal(err)
	}
	userB := string(b["username"].Reveal())
	if userB == user {
		t.Fatal("two sessions share one dynamic credential")
	}
	leaseA := v.Leases("sess-a")
	if len(leaseA) != 1 {
		t.Fatalf("sess-a leases = %v", leaseA)
	}

	// Past the 4 s default TTL: renewed (the same lease, still usable).
	time.Sleep(6 * time.Second)
	if _, err := v.Dynamic(ctx, "sess-a", "database/creds/ro"); err != nil {
		t.Fatal(err)
	}
	if got := v.Leases("sess-a"); len(got) != 1 || got[0] != leaseA[0] {
		t.Fatalf("after the first TTL the lease changed: %v -> %v (not renewed)", leaseA, got)
	}
	if _, err := pg.Query(ctx, user, pass, "select 1"); err != nil {
		t.Fatalf("the renewed credential stopped working: %v", err)
	}

	roleExists := func(name string) bool {
		return pg.Super(t, "select count(*) from pg_roles where rolname = '"+strings.ReplaceAll(name, "'", "''")+"'") == "1"
	}
	if !roleExists(user) || !roleExists(userB) {
		t.Fatal("the dynamic roles do not exist in PostgreSQL during their sessions")
	}
	if err := v.EndSession(ctx, "sess-a"); err != nil {
		t.Fatalf("EndSession: %v", err)
	}
	if roleExists(user) {
		t.Error("sess-a's PostgreSQL role still exists after the session ended")
	}
	if _, err := pg.Query(ctx, user, pass, "select 1"); err == nil {
		t.Error("sess-a's credential still connects after the session ended")
	}
	if !roleExists(userB) {
		t.Error("ending sess-a revoked sess-b's credential")
	}
	if err := v.EndSession(ctx, "sess-a"); err != nil {
		t.Errorf("ending a session twice: %v", err)
	}
	if len(v.Leases("sess-a")) != 0 {
		t.Error("sess-a still holds leases")
	}
	if err := v.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if roleExists(userB) {
		t.Error("Close did not revoke the leases still held")
	}
	noLeak(t, "the backend's log", logs.String(), pass, string(b["password"].Reveal()))
}

// TestSignJWT: per-call JWTs signed inside Vault verify against the JWKS
// for every supported key type, carry the claims and expire.
func TestSignJWT(t *testing.T) {
	srv := vaulttest.Start(t)
	srv.Mount(t, "transit", "transit")
	v, _ := open(t, srv, "1h", nil)
	ctx := context.Background()
	for _, typ := range []string{"ecdsa-p256", "ed25519", "rsa-2048"} {
		t.Run(typ, func(t *testing.T) {
			key := "k-" + typ
			srv.Write(t, "transit/keys/"+key, map[string]any{"type": typ})
			tok, err := v.SignJWT(ctx, key, map[string]any{"aud": "billing", "tool": "billing_get_invoice", "req_sha256": "ab12"}, time.Minute)
			if err != nil {
				t.Fatalf("SignJWT: %v", err)
			}
			set, err := v.JWKS(ctx, []string{key}, false)
			if err != nil {
				t.Fatal(err)
			}
			var jwks jose.JSONWebKeySet
			if err := json.Unmarshal(set, &jwks); err != nil {
				t.Fatal(err)
			}
			algs := []jose.SignatureAlgorithm{jose.ES256, jose.EdDSA, jose.RS256}
			jws, err := jose.ParseSigned(string(tok.Reveal()), algs)
			if err != nil {
				t.Fatal(err)
			}
			kid := jws.Signatures[0].Header.KeyID
			keys := jwks.Key(kid)
			if len(keys) != 1 {
				t.Fatalf("kid %q not in the JWKS %s", kid, set)
			}
			payload, err := jws.Verify(keys[0])
			if err != nil {
				t.Fatalf("signature does not verify against the published key: %v", err)
			}
			var cl map[string]any
			_ = json.Unmarshal(payload, &cl)
			if cl["aud"] != "billing" || cl["tool"] != "billing_get_invoice" || cl["req_sha256"] != "ab12" {
				t.Errorf("claims = %v", cl)
			}
			if exp, _ := cl["exp"].(float64); exp <= float64(time.Now().Unix()) || exp > float64(time.Now().Add(61*time.Second).Unix()) {
				t.Errorf("exp = %v, want about a minute from now", cl["exp"])
			}
			// A tampered payload does not verify.
			parts := strings.Split(string(tok.Reveal()), ".")
			forged := parts[0] + "." + strings.TrimRight(parts[1], "=") + "x." + parts[2]
			if fj, err := jose.ParseSigned(forged, algs); err == nil {
				if _, err := fj.Verify(keys[0]); err == nil {
					t.Error("a tampered token verified")
				}
			}
		})
	}
	if _, err := v.SignJWT(ctx, "missing", nil, time.Minute); err == nil {
		t.Error("signing with a missing key succeeded")
	}
}

// TestIdentityToken: identity tokens for the gateway's entity, checked
// against the configured audience.
func TestIdentityToken(t *testing.T) {
	srv := vaulttest.Start(t)
	srv.Write(t, "identity/oidc/key/sluice", map[string]any{"allowed_client_ids": "*", "algorithm": "RS256"})
	srv.Write(t, "identity/oidc/role/billing", map[string]any{"key": "sluice", "ttl": "5m"})
	role, err := srv.Client(t).Logical().Read("identity/oidc/role/billing")
	if err != nil {
		t.Fatal(err)
	}
	clientID, _ := role.Data["client_id"].(string)
	v, _ := open(t, srv, "1h", nil)
	ctx := context.Background()
	tok, err := v.IdentityToken(ctx, "billing", clientID)
	if err != nil {
		t.Fatalf("IdentityToken: %v\n%s", err, srv.Log())
	}
	set, err := v.JWKS(ctx, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	var jwks jose.JSONWebKeySet
	_ = json.Unmarshal(set, &jwks)
	jws, err := jose.ParseSigned(string(tok.Reveal()), []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		t.Fatal(err)
	}
	keys := jwks.Key(jws.Signatures[0].Header.KeyID)
	if len(keys) == 0 {
		t.Fatalf("identity key not published: %s", set)
	}
	if _, err := jws.Verify(keys[0]); err != nil {
		t.Fatalf("identity token does not verify: %v", err)
	}
	before := v.Requests()
	if _, err := v.IdentityToken(ctx, "billing", clientID); err != nil || v.Requests() != before {
		t.Errorf("a second token within its lifetime asked Vault again (%d requests, %v)", v.Requests()-before, err)
	}
	if _, err := v.IdentityToken(ctx, "billing", "someone-else"); err == nil {
		t.Error("a token for another audience was accepted")
	}
}

// TestTokenLifecycle: the gateway's own token is renewed before its TTL
// and replaced by a new login when it reaches its max TTL.
func TestTokenLifecycle(t *testing.T) {
	srv := vaulttest.Start(t)
	c := srv.Client(t)
	if err := c.Sys().EnableAuthWithOptions("approle", &api.EnableAuthOptions{Type: "approle"}); err != nil {
		t.Fatal(err)
	}
	srv.Write(t, "secret/data/billing", map[string]any{"data": map[string]any{"api_key": "lifecycle-billing-key-9"}})
	dir := t.TempDir()
	if err := c.Sys().PutPolicy("gw", gatewayPolicy); err != nil {
		t.Fatal(err)
	}
	srv.Write(t, "auth/approle/role/gw", map[string]any{"token_policies": "gw", "token_ttl": "4s", "token_max_ttl": "9s", "secret_id_num_uses": 0})
	rid, _ := c.Logical().Read("auth/approle/role/gw/role-id")
	sid := srv.Write(t, "auth/approle/role/gw/secret-id", nil)
	ridF, sidF := filepath.Join(dir, "rid"), filepath.Join(dir, "sid")
	os.WriteFile(ridF, []byte(rid.Data["role_id"].(string)), 0o600)
	os.WriteFile(sidF, []byte(sid.Data["secret_id"].(string)), 0o600)
	logs := &syncBuf{}
	v, err := vault.OpenVault(context.Background(), vault.VaultConfig{
		Address: srv.Addr, Auth: vault.VaultAuth{Method: "approle", RoleIDFile: ridF, SecretIDFile: sidF},
		CacheTTL: 500 * time.Millisecond, Timeout: 2 * time.Second,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close(context.Background())
	// 14 s spans three 4 s TTLs and a 9 s max TTL: every read must work.
	for end := time.Now().Add(14 * time.Second); time.Now().Before(end); time.Sleep(700 * time.Millisecond) {
		if _, err := v.KV(context.Background(), "secret/data/billing", "api_key"); err != nil {
			t.Fatalf("after %s: %v\n%s", time.Until(end), err, logs.String())
		}
	}
	if n := strings.Count(logs.String(), "vault: token renewed"); n < 1 {
		t.Errorf("the token was never renewed")
	}
	if n := strings.Count(logs.String(), "vault: logged in"); n < 2 {
		t.Errorf("logged in %d times in 14 s with a 9 s max TTL, want a fresh login", n)
	}
	noLeak(t, "the backend's log", logs.String(), sid.Data["secret_id"].(string), "lifecycle-billing-key-9")
}

// TestLoginFailure: a wrong secret_id fails OpenVault with Vault's reason
// and nothing of the credential.
func TestLoginFailure(t *testing.T) {
	srv := vaulttest.Start(t)
	rid, sid := srv.AppRole(t, t.TempDir(), "gateway", gatewayPolicy, "1h")
	if err := os.WriteFile(sid, []byte("00000000-0000-0000-0000-00000000dead"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := vault.OpenVault(context.Background(), vault.VaultConfig{Address: srv.Addr, Auth: vault.VaultAuth{Method: "approle", RoleIDFile: rid, SecretIDFile: sid}})
	if err == nil || !errors.Is(err, vault.ErrUnavailable) || !strings.Contains(err.Error(), "status 400") {
		t.Fatalf("err = %v, want a login failure with Vault's status", err)
	}
	if strings.Contains(err.Error(), "dead") {
		t.Error("the error echoes the secret_id")
	}
	_, err = vault.OpenVault(context.Background(), vault.VaultConfig{Address: srv.Addr, Auth: vault.VaultAuth{Method: "token", TokenFile: filepath.Join(t.TempDir(), "none")}})
	if err == nil || !strings.Contains(err.Error(), "auth.token_file") {
		t.Fatalf("missing token file: err = %v", err)
	}
}

// TestWrappedSecretID: a wrapped secret_id is unwrapped once; when someone
// else unwrapped it first, the gateway refuses to start and says why (D8).
func TestWrappedSecretID(t *testing.T) {
	srv := vaulttest.Start(t)
	rid, _ := srv.AppRole(t, t.TempDir(), "gateway", gatewayPolicy, "1h")
	wrap := func() string {
		c := srv.Client(t)
		c.SetWrappingLookupFunc(func(string, string) string { return "60s" })
		sec, err := c.Logical().Write("auth/approle/role/gateway/secret-id", nil)
		if err != nil || sec.WrapInfo == nil {
			t.Fatalf("wrapped secret-id: %v", err)
		}
		return sec.WrapInfo.Token
	}
	dir := t.TempDir()
	open := func(tok string) (*vault.Vault, string, error) {
		f := filepath.Join(dir, "wrapped")
		if err := os.WriteFile(f, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		logs := &syncBuf{}
		v, err := vault.OpenVault(context.Background(), vault.VaultConfig{Address: srv.Addr,
			Auth:   vault.VaultAuth{Method: "approle", RoleIDFile: rid, SecretIDFile: f, SecretIDWrapped: true},
			Logger: slog.New(slog.NewJSONHandler(logs, nil))})
		return v, logs.String(), err
	}
	t.Run("fresh wrapping token logs in", func(t *testing.T) {
		v, _, err := open(wrap())
		if err != nil {
			t.Fatalf("OpenVault: %v", err)
		}
		v.Close(context.Background())
	})
	t.Run("a token someone already unwrapped is an alarm", func(t *testing.T) {
		tok := wrap()
		if _, err := srv.Client(t).Logical().Unwrap(tok); err != nil { // the attacker's unwrap
			t.Fatal(err)
		}
		_, logs, err := open(tok)
		if !errors.Is(err, vault.ErrWrapReused) {
			t.Fatalf("err = %v, want ErrWrapReused", err)
		}
		if !strings.Contains(logs, "ALERT") {
			t.Errorf("no alert logged: %s", logs)
		}
		noLeak(t, "the log", logs, tok)
	})
}

// TestJWTAuth: the gateway logs in with a JWT from a file (the jwt auth
// method, as a workload identity would); a token for another audience is
// refused by Vault and the start fails with Vault's reason.
func TestJWTAuth(t *testing.T) {
	srv := vaulttest.Start(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pubPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	c := srv.Client(t)
	if err := c.Sys().EnableAuthWithOptions("jwt", &api.EnableAuthOptions{Type: "jwt"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Sys().PutPolicy("gw", gatewayPolicy); err != nil {
		t.Fatal(err)
	}
	srv.Write(t, "auth/jwt/config", map[string]any{"jwt_validation_pubkeys": []string{pubPEM}})
	srv.Write(t, "auth/jwt/role/gateway", map[string]any{"role_type": "jwt", "bound_audiences": "vault", "user_claim": "sub", "token_policies": "gw", "token_ttl": "1h"})
	srv.Write(t, "secret/data/billing", map[string]any{"data": map[string]any{"api_key": "jwt-auth-billing-key-77"}})
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mint := func(aud string) string {
		claims, _ := json.Marshal(map[string]any{"sub": "sluice-gateway", "aud": aud, "iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()})
		jws, err := signer.Sign(claims)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := jws.CompactSerialize()
		return s
	}
	for _, tc := range []struct {
		name, aud string
		ok        bool
	}{{"workload token for vault", "vault", true}, {"token for another audience", "billing", false}} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "jwt")
			jwt := mint(tc.aud)
			os.WriteFile(f, []byte(jwt), 0o600)
			logs := &syncBuf{}
			v, err := vault.OpenVault(context.Background(), vault.VaultConfig{Address: srv.Addr,
				Auth: vault.VaultAuth{Method: "jwt", Role: "gateway", JWTFile: f}, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
			if !tc.ok {
				if err == nil || !errors.Is(err, vault.ErrUnavailable) || !strings.Contains(err.Error(), "auth/jwt/login") {
					t.Fatalf("err = %v, want the login refused", err)
				}
				noLeak(t, "the error", err.Error(), jwt)
				return
			}
			if err != nil {
				t.Fatalf("OpenVault: %v", err)
			}
			defer v.Close(context.Background())
			if got, err := v.KV(context.Background(), "secret/data/billing", "api_key"); err != nil || string(got.Reveal()) != "jwt-auth-billing-key-77" {
				t.Fatalf("KV after jwt login: %v", err)
			}
			noLeak(t, "the log", logs.String(), jwt)
		})
	}
}

// tokenReviewer is the one piece of a Kubernetes API server that Vault's
// kubernetes auth method talks to: POST
// /apis/authentication.k8s.io/v1/tokenreviews. It speaks that protocol
// (a real API server cannot run here) and authenticates exactly the
// service-account tokens it issued.
type tokenReviewer struct {
	*httptest.Server
	mu      sync.Mutex
	issued  map[string]string // token -> "namespace/name/uid"
	reviews int
}

func newTokenReviewer(t *testing.T) *tokenReviewer {
	tr := &tokenReviewer{issued: map[string]string{}}
	tr.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.NotFound(w, r)
			return
		}
		var review struct {
			Spec struct {
				Token string `json:"token"`
			} `json:"spec"`
		}
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		tr.mu.Lock()
		who, ok := tr.issued[review.Spec.Token]
		tr.reviews++
		tr.mu.Unlock()
		status := map[string]any{"authenticated": false, "error": "invalid bearer token"}
		if ok {
			p := strings.SplitN(who, "/", 3)
			status = map[string]any{"authenticated": true, "user": map[string]any{
				"username": "system:serviceaccount:" + p[0] + ":" + p[1], "uid": p[2],
				"groups": []string{"system:serviceaccounts", "system:serviceaccounts:" + p[0]},
			}}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "status": status})
	}))
	t.Cleanup(tr.Close)
	return tr
}

// issue mints a legacy service-account token (the claims Vault reads) and
// records it as valid when valid is set.
func (tr *tokenReviewer) issue(t *testing.T, key *ecdsa.PrivateKey, ns, name, uid string, valid bool) string {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	claims, _ := json.Marshal(map[string]any{
		"iss": "kubernetes/serviceaccount", "sub": "system:serviceaccount:" + ns + ":" + name,
		"kubernetes.io/serviceaccount/namespace":            ns,
		"kubernetes.io/serviceaccount/service-account.name": name,
		"kubernetes.io/serviceaccount/service-account.uid":  uid,
		"kubernetes.io/serviceaccount/secret.name":          name + "-token",
	})
	jws, err := signer.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := jws.CompactSerialize()
	if valid {
		tr.mu.Lock()
		tr.issued[tok] = ns + "/" + name + "/" + uid
		tr.mu.Unlock()
	}
	return tok
}

// TestKubernetesAuth: the gateway logs in with its pod's service-account
// token; Vault asks the API server's TokenReview; a token the API server
// does not vouch for, or one for another service account, is refused.
func TestKubernetesAuth(t *testing.T) {
	srv := vaulttest.Start(t)
	tr := newTokenReviewer(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tr.Certificate().Raw}))
	c := srv.Client(t)
	if err := c.Sys().EnableAuthWithOptions("kubernetes", &api.EnableAuthOptions{Type: "kubernetes"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Sys().PutPolicy("gw", gatewayPolicy); err != nil {
		t.Fatal(err)
	}
	srv.Write(t, "auth/kubernetes/config", map[string]any{"kubernetes_host": tr.URL, "kubernetes_ca_cert": ca, "disable_local_ca_jwt": true})
	srv.Write(t, "auth/kubernetes/role/gateway", map[string]any{"bound_service_account_names": "sluice", "bound_service_account_namespaces": "sluice-system", "token_policies": "gw", "token_ttl": "1h"})
	srv.Write(t, "secret/data/billing", map[string]any{"data": map[string]any{"api_key": "k8s-auth-billing-key-55"}})
	for _, tc := range []struct {
		name         string
		ns, sa       string
		vouched, ok  bool
		wantInReason string
	}{
		{"the gateway's own service account", "sluice-system", "sluice", true, true, ""},
		{"a token the API server does not vouch for", "sluice-system", "sluice", false, false, "status 403"},
		{"another service account", "default", "agent", true, false, "status 403"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jwt := tr.issue(t, key, tc.ns, tc.sa, "uid-"+tc.sa, tc.vouched)
			f := filepath.Join(t.TempDir(), "token")
			os.WriteFile(f, []byte(jwt), 0o600)
			tr.mu.Lock()
			reviews := tr.reviews
			tr.mu.Unlock()
			v, err := vault.OpenVault(context.Background(), vault.VaultConfig{Address: srv.Addr,
				Auth: vault.VaultAuth{Method: "kubernetes", Role: "gateway", JWTFile: f}})
			tr.mu.Lock()
			reviewed := tr.reviews > reviews
			tr.mu.Unlock()
			if !tc.ok {
				if err == nil || !strings.Contains(err.Error(), tc.wantInReason) {
					t.Fatalf("err = %v, want a refused login (%s)", err, tc.wantInReason)
				}
				// The designed reason for an unvouched token: the API
				// server said no, so a review must have happened.
				if !tc.vouched && !reviewed {
					t.Error("an unvouched token was refused without asking the TokenReview API")
				}
				noLeak(t, "the error", err.Error(), jwt)
				return
			}
			if err != nil {
				t.Fatalf("OpenVault: %v\n%s", err, srv.Log())
			}
			defer v.Close(context.Background())
			if !reviewed {
				t.Error("the login succeeded without a TokenReview")
			}
			if got, err := v.KV(context.Background(), "secret/data/billing", "api_key"); err != nil || string(got.Reveal()) != "k8s-auth-billing-key-55" {
				t.Fatalf("KV after kubernetes login: %v", err)
			}
		})
	}
}
