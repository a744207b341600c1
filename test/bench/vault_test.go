//go:build linux

package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/vault"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

// benchVault is section 6: the Vault backend against a real Vault dev
// server on loopback (./test.sh builds it; without it the rows say so).
//   - cache hit: a KV credential with a warm cache; its note counts the
//     requests sent to Vault per 1,000 calls (the goal is 0);
//   - cache miss: the same read with a cache that has always expired, so
//     every call asks Vault;
//   - one KV read: Vault's own Go client reading the same secret, the cost
//     a miss is compared with.
func benchVault(t *testing.T, w *world) []*section {
	s := &section{Title: "Vault credentials", Baseline: "one KV read (Vault's client)",
		Intro: "The gateway's Vault backend (vault/) in the test process against a real `vault server -dev` on loopback, AppRole login, a KV v2 secret."}
	if vaulttest.Available() != nil {
		s.skip("one KV read (Vault's client)", vaulttest.Available().Error())
		s.skip("cache hit", "no Vault server binary")
		s.skip("cache miss", "no Vault server binary")
		return []*section{s}
	}
	srv := vaulttest.Start(t)
	srv.Write(t, "secret/data/bench", map[string]any{"data": map[string]any{"api_key": w.secret}})
	rid, sid := srv.AppRole(t, t.TempDir(), "gateway", `path "secret/data/*" { capabilities = ["read"] }`, "1h")
	open := func(ttl time.Duration) (*vault.Vault, error) {
		return vault.OpenVault(context.Background(), vault.VaultConfig{Address: srv.Addr, CacheTTL: ttl,
			Auth: vault.VaultAuth{Method: "approle", RoleIDFile: rid, SecretIDFile: sid}})
	}
	warm, err := open(time.Hour)
	if err != nil {
		t.Fatalf("vault: %v", err)
	}
	defer warm.Close(context.Background())
	cold, err := open(time.Nanosecond)
	if err != nil {
		t.Fatalf("vault: %v", err)
	}
	defer cold.Close(context.Background())
	client := srv.Client(t)
	ctx := context.Background()
	kv := func(v *vault.Vault) func() error {
		return func() error { _, err := v.KV(ctx, "secret/data/bench", "api_key"); return err }
	}
	n := iterations(2000)
	var hitCalls int64
	warmKV := kv(warm)
	hit := &probe{name: "cache hit", fn: func() error { hitCalls++; return warmKV() }}
	miss := &probe{name: "cache miss", fn: kv(cold)}
	direct := &probe{name: "one KV read (Vault's client)", fn: func() error { _, err := client.Logical().Read("secret/data/bench"); return err }}
	if err := warmKV(); err != nil { // fill the cache: the count starts warm
		t.Fatalf("vault: %v", err)
	}
	before := warm.Requests()
	interleave([]*probe{direct, hit, miss}, n, 3)
	calls := hitCalls // timed and untimed
	reqs := warm.Requests() - before
	hit.note = fmt.Sprintf("%d requests to Vault over %d calls: %.1f per 1,000 (goal 0)", reqs, calls, float64(reqs)*1000/float64(max(calls, 1)))
	miss.note = "every call reads Vault (cache_ttl 1 ns)"
	s.addProbes([]*probe{direct, hit, miss})
	verdict := "not met"
	if reqs == 0 {
		verdict = "met"
	}
	s.Verdicts = append(s.Verdicts, fmt.Sprintf("Issue 3: requests to Vault per 1,000 calls with a warm cache = %.1f (goal 0): %s.", float64(reqs)*1000/float64(max(calls, 1)), verdict))
	if m, d := s.find("cache miss"), s.find("one KV read (Vault's client)"); m.measured() && d.measured() {
		s.Verdicts = append(s.Verdicts, fmt.Sprintf("Issue 3: a cache miss costs %s one KV read with Vault's own client (median).", ratio(float64(pct(m.Lat, 50)), float64(pct(d.Lat, 50)))))
	}
	return []*section{s}
}
