package receipts

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func sample() Receipt {
	return Receipt{
		HoldID: "h_01", RequestID: "req-1", Tool: "billing-api.create_refund",
		Caller:   Caller{Sandbox: "sb-1", Agent: "support-bot", Session: "s-1", User: "bob"},
		Approver: "alice", ApprovedAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), ExecutedAt: time.Date(2026, 12, 1, 10, 0, 1, 5, time.UTC),
		RequestSHA256: strings.Repeat("ab", 32), PolicyRevision: "r7", Decision: "ask", UpstreamStatus: 201,
		Credential: "header:Authorization", LeaseID: "database/creds/readonly/abc",
	}
}

func TestSignVerify(t *testing.T) {
	key := filepath.Join(t.TempDir(), "sub", "receipts.key")
	priv, err := LoadKey(key, true)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadKey(key, true)
	if err != nil || !again.Equal(priv) {
		t.Fatalf("second LoadKey made a new key (%v)", err)
	}
	if fi, _ := os.Stat(key); fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode = %v, want 0600", fi.Mode().Perm())
	}
	s := NewSigner(priv)
	file, err := s.Sign(context.Background(), sample())
	if err != nil {
		t.Fatal(err)
	}
	keys, err := s.Keys(context.Background())
	if err != nil || len(keys) != 1 {
		t.Fatalf("Keys = %v, %v: want the local key", keys, err)
	}
	pub, err := ParsePublicKey(PublicPEM(keys[0].Key))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Verify(file, pub)
	if err != nil {
		t.Fatalf("Verify: %v\n%s", err, file)
	}
	if r.Approver != "alice" || r.UpstreamStatus != 201 || r.PolicyRevision != "r7" || r.KeyID != keys[0].KeyID || r.Key != "" {
		t.Fatalf("receipt = %+v", r)
	}

	// Any byte changed, anywhere, to anything else: never verifies.
	for i := range file {
		for _, delta := range []byte{1, 0x20, 0x80} {
			bad := append([]byte(nil), file...)
			bad[i] ^= delta
			if _, err := Verify(bad, pub); err == nil {
				t.Fatalf("byte %d (%q) ^ %#x still verifies:\n%s", i, file[i], delta, bad)
			}
		}
	}
	// Nor with bytes added or cut.
	for _, bad := range [][]byte{append(append([]byte(nil), file...), '\n'), file[:len(file)-1], append([]byte(" "), file...)} {
		if _, err := Verify(bad, pub); err == nil {
			t.Fatalf("a resized receipt verifies: %q", bad)
		}
	}
	// Nor under another key.
	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := Verify(file, otherPub); err == nil || !strings.Contains(err.Error(), "signed by key") {
		t.Fatalf("Verify with another key = %v", err)
	}
}

func TestParsePublicKey(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	for _, in := range []string{string(PublicPEM(pub)), "  " + string(hexOf(pub)) + "\n"} {
		got, err := ParsePublicKey([]byte(in))
		if err != nil || !got.Equal(pub) {
			t.Fatalf("ParsePublicKey(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParsePublicKey([]byte("nope")); err == nil {
		t.Fatal("garbage parsed as a key")
	}
}

func hexOf(b []byte) []byte {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return out
}

// versionedKey is a Key with versions held in memory; wrong signs with
// another key than the latest version's.
type versionedKey struct {
	privs map[int]ed25519.PrivateKey
	wrong bool
}

func (k versionedKey) Name() string { return "test key" }

func (k versionedKey) Versions(context.Context) (int, map[int]ed25519.PublicKey, error) {
	pubs := map[int]ed25519.PublicKey{}
	for n, p := range k.privs {
		pubs[n] = p.Public().(ed25519.PublicKey)
	}
	return len(k.privs), pubs, nil
}

func (k versionedKey) Sign(_ context.Context, version int, msg []byte) ([]byte, error) {
	if k.wrong {
		version--
	}
	return ed25519.Sign(k.privs[version], msg), nil
}

// TestKeySigner: a key with versions signs with its latest, names it, and
// a signature that does not verify with that version's public key is an
// error, at Probe and at Sign, never a receipt.
func TestKeySigner(t *testing.T) {
	privs := map[int]ed25519.PrivateKey{}
	for n := 1; n <= 2; n++ {
		_, privs[n], _ = ed25519.GenerateKey(rand.Reader)
	}
	s := NewKeySigner(versionedKey{privs: privs})
	ctx := context.Background()
	keys, err := s.Keys(ctx)
	if err != nil || len(keys) != 2 || keys[0].Name != "test key version 2" || keys[1].KeyID != KeyID(privs[1].Public().(ed25519.PublicKey)) {
		t.Fatalf("Keys = %+v, %v", keys, err)
	}
	file, err := s.Sign(ctx, sample())
	if err != nil || s.Probe(ctx) != nil {
		t.Fatalf("Sign: %v", err)
	}
	if r, err := Verify(file, keys[0].Key); err != nil || r.Key != "test key version 2" || r.KeyID != keys[0].KeyID {
		t.Fatalf("Verify = %+v, %v", r, err)
	}
	if _, err := Verify(file, keys[1].Key); err == nil || !strings.Contains(err.Error(), "signed by key "+keys[0].KeyID) {
		t.Fatalf("Verify with version 1's key: %v", err)
	}
	bad := NewKeySigner(versionedKey{privs: privs, wrong: true})
	if b, err := bad.Sign(ctx, sample()); err == nil || b != nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("Sign by the wrong version: %v %s", err, b)
	}
	if err := bad.Probe(ctx); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("Probe by the wrong version: %v", err)
	}
}
