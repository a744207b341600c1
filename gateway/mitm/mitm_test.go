package mitm

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLeaf(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := now
	a, err := LoadOrCreate(dir, Options{CacheSize: 2, Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(a.Cert())

	t.Run("SAN is the host and the chain verifies", func(t *testing.T) {
		c, err := a.Leaf("api.example.com")
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Leaf.DNSNames; len(got) != 1 || got[0] != "api.example.com" {
			t.Fatalf("DNSNames = %v", got)
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: roots, CurrentTime: now}); err != nil {
			t.Fatalf("verify: %v", err)
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{DNSName: "other.example.com", Roots: roots, CurrentTime: now}); err == nil {
			t.Fatal("a leaf verified for another host")
		}
	})
	t.Run("validity is short", func(t *testing.T) {
		c, _ := a.Leaf("api.example.com")
		if d := c.Leaf.NotAfter.Sub(now); d > LeafValidity || d < LeafValidity-time.Minute {
			t.Fatalf("NotAfter is %v after now, want %v", d, LeafValidity)
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: roots, CurrentTime: now.Add(LeafValidity + time.Minute)}); err == nil {
			t.Fatal("leaf still valid after LeafValidity")
		}
	})
	t.Run("cached until half its validity", func(t *testing.T) {
		c1, _ := a.Leaf("api.example.com")
		c2, _ := a.Leaf("api.example.com")
		if c1 != c2 {
			t.Fatal("second Leaf minted again")
		}
		clock = now.Add(LeafValidity/2 + time.Minute)
		defer func() { clock = now }()
		c3, _ := a.Leaf("api.example.com")
		if c3 == c1 {
			t.Fatal("a leaf past half its validity was reused")
		}
	})
	t.Run("cache is bounded", func(t *testing.T) {
		for i := range 10 {
			if _, err := a.Leaf(fmt.Sprintf("h%d.example.com", i)); err != nil {
				t.Fatal(err)
			}
		}
		if n := a.Cached(); n != 2 {
			t.Fatalf("cache holds %d leaves, want 2", n)
		}
	})
	t.Run("IP addresses and empty names are refused", func(t *testing.T) {
		for _, h := range []string{"", "127.0.0.1", "::1"} {
			if _, err := a.Leaf(h); err == nil {
				t.Errorf("Leaf(%q) minted", h)
			}
		}
	})
}

func TestLoadOrCreate(t *testing.T) {
	t.Run("key is 0600 and reloads to the same CA", func(t *testing.T) {
		dir := t.TempDir()
		a, err := LoadOrCreate(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(filepath.Join(dir, KeyFile))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("key mode %04o", st.Mode().Perm())
		}
		b, err := LoadOrCreate(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !a.Cert().Equal(b.Cert()) {
			t.Fatal("reload made a new CA")
		}
		if !a.Cert().IsCA || a.Cert().PublicKeyAlgorithm != x509.ECDSA {
			t.Fatal("not an ECDSA CA")
		}
		if len(a.Cert().ExcludedIPRanges) != 2 || !a.Cert().PermittedDNSDomainsCritical {
			t.Fatalf("name constraints: excluded IP ranges %v", a.Cert().ExcludedIPRanges)
		}
	})
	t.Run("a key readable by others is refused", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := LoadOrCreate(dir, Options{}); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, KeyFile), 0o640); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOrCreate(dir, Options{})
		var pe *PermissionError
		if !errors.As(err, &pe) {
			t.Fatalf("got %v, want *PermissionError", err)
		}
	})
	t.Run("placeholder key is stable and 0600", func(t *testing.T) {
		dir := t.TempDir()
		k1, err := LoadOrCreateHMACKey(dir)
		if err != nil {
			t.Fatal(err)
		}
		k2, err := LoadOrCreateHMACKey(dir)
		if err != nil {
			t.Fatal(err)
		}
		if string(k1) != string(k2) || len(k1) != 32 {
			t.Fatal("placeholder key changed or has the wrong size")
		}
		_ = os.Chmod(filepath.Join(dir, HMACKeyFile), 0o644)
		var pe *PermissionError
		if _, err := LoadOrCreateHMACKey(dir); !errors.As(err, &pe) {
			t.Fatalf("got %v, want *PermissionError", err)
		}
	})
}

func BenchmarkLeaf(b *testing.B) {
	a, err := LoadOrCreate(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cached", func(b *testing.B) {
		_, _ = a.Leaf("api.example.com")
		for b.Loop() {
			if _, err := a.Leaf("api.example.com"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("mint", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			if _, err := a.Leaf(fmt.Sprintf("h%d.example.com", i)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
