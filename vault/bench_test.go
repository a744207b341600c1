package vault_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/vault"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

// BenchmarkKV measures the Vault backend against a real dev server:
//
//	warm:       a cached KV value; reports vault-req/1000 (goal 0)
//	miss:       every read misses the cache (CacheTTL 1 ns) and asks Vault
//	direct-read: one KV read with Vault's own client, the baseline a miss
//	            is compared with (miss / direct-read is the cost of a miss
//	            relative to one KV read)
func BenchmarkKV(b *testing.B) {
	srv := vaulttest.Start(b)
	srv.Write(b, "secret/data/bench", map[string]any{"data": map[string]any{"api_key": "bench-api-key-0123456789"}})
	rid, sid := srv.AppRole(b, b.TempDir(), "gateway", gatewayPolicy, "1h")
	open := func(ttl time.Duration) *vault.Vault {
		v, err := vault.OpenVault(context.Background(), vault.VaultConfig{
			Address: srv.Addr, Auth: vault.VaultAuth{Method: "approle", RoleIDFile: rid, SecretIDFile: sid}, CacheTTL: ttl,
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { v.Close(context.Background()) })
		return v
	}
	ctx := context.Background()
	b.Run("warm", func(b *testing.B) {
		v := open(time.Hour)
		if _, err := v.KV(ctx, "secret/data/bench", "api_key"); err != nil {
			b.Fatal(err)
		}
		before := v.Requests()
		b.ResetTimer()
		for b.Loop() {
			if _, err := v.KV(ctx, "secret/data/bench", "api_key"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(v.Requests()-before)*1000/float64(b.N), "vault-req/1000")
	})
	b.Run("miss", func(b *testing.B) {
		v := open(time.Nanosecond)
		before := v.Requests()
		b.ResetTimer()
		for b.Loop() {
			if _, err := v.KV(ctx, "secret/data/bench", "api_key"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(v.Requests()-before)*1000/float64(b.N), "vault-req/1000")
	})
	b.Run("direct-read", func(b *testing.B) {
		c := srv.Client(b)
		for b.Loop() {
			if _, err := c.Logical().Read("secret/data/bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
