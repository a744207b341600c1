package vault_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluice-gw/sluice/vault"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

// TestNamedKV: the gateway's own writes to Vault KV v2 (a person's OAuth
// tokens) land where Named reads, are read back uncached (a rotation by
// another replica is seen at once, though cache_ttl is an hour), and a
// Delete removes every version; bad names and scopes are refused before
// anything is sent.
func TestNamedKV(t *testing.T) {
	srv := vaulttest.Start(t)
	// The policy the README gives for people's tokens.
	rid, sid := srv.AppRole(t, t.TempDir(), "oauth-tokens", `
path "secret/data/sluice/user/*" { capabilities = ["create", "update", "read"] }
path "secret/metadata/sluice/user/*" { capabilities = ["delete"] }
`, "1h")
	v, _ := open(t, srv, "1h", func(c *vault.VaultConfig) { c.Auth.RoleIDFile, c.Auth.SecretIDFile = rid, sid })
	kv := vault.NamedKV{V: v}
	ctx := context.Background()
	alice := vault.UserScope("alice")
	if _, err := kv.Get(ctx, "oauth2.docs", alice); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("empty: %v", err)
	}
	for _, val := range []string{"first-token-record-0123", "rotated-token-record-4567"} {
		if err := kv.Set(ctx, "oauth2.docs", alice, vault.NewSecret([]byte(val))); err != nil {
			t.Fatal(err)
		}
		got, err := kv.Get(ctx, "oauth2.docs", alice)
		if err != nil || string(got.Reveal()) != val {
			t.Fatalf("Get after Set(%s): %v", val, err)
		}
	}
	sec, err := srv.Client(t).Logical().Read("secret/data/sluice/user/alice/oauth2.docs")
	if err != nil || sec == nil || sec.Data["data"].(map[string]any)["value"] != "rotated-token-record-4567" {
		t.Fatalf("not at Named's path: %v", err)
	}
	if err := kv.Delete(ctx, "oauth2.docs", alice); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "oauth2.docs", alice); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("after Delete: %v", err)
	}
	if meta, err := srv.Client(t).Logical().Read("secret/metadata/sluice/user/alice/oauth2.docs"); err != nil || meta != nil {
		t.Fatalf("versions kept after Delete: %v %v", meta, err)
	}
	if err := kv.Delete(ctx, "oauth2.docs", alice); err != nil {
		t.Fatalf("deleting nothing: %v", err)
	}
	for _, bad := range []struct {
		name  string
		scope vault.Scope
	}{{"../x", alice}, {"oauth2.docs", vault.Scope("user:../bob")}, {"oauth2.docs", vault.Scope("root")}} {
		if err := kv.Set(ctx, bad.name, bad.scope, vault.NewSecret([]byte("v"))); err == nil {
			t.Errorf("Set(%q, %q) accepted", bad.name, bad.scope)
		}
	}
}
