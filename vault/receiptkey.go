package vault

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

// TransitEd25519 is an ed25519 key of the transit engine that signs
// messages as they are (no prehash, no JWS framing): what approval
// receipts are signed with when receipts.signer is vault-transit. Its
// signatures verify with crypto/ed25519 against the public key Vault
// publishes for the version that made them; the private key never leaves
// Vault.
type TransitEd25519 struct {
	v   *Vault
	key string
}

// NewTransitEd25519 is the transit key named key, at the client's transit
// mount. Versions checks that it exists and is ed25519.
func NewTransitEd25519(v *Vault, key string) *TransitEd25519 {
	return &TransitEd25519{v: v, key: key}
}

// Name says which key it is, for people and errors.
func (t *TransitEd25519) Name() string {
	return "vault transit key " + t.v.cfg.TransitMount + "/keys/" + t.key
}

// Versions returns the key's latest version and the public key of every
// version Vault still holds (cached for the client's cache_ttl, so a
// rotation is seen within it).
func (t *TransitEd25519) Versions(ctx context.Context) (int, map[int]ed25519.PublicKey, error) {
	ke, err := t.v.transitKey(ctx, t.key)
	if err != nil {
		return 0, nil, err
	}
	if ke.typ != "ed25519" {
		return 0, nil, fmt.Errorf("vault: %s has type %q: receipts want ed25519", t.Name(), ke.typ)
	}
	pubs := make(map[int]ed25519.PublicKey, len(ke.pubs))
	for n, p := range ke.pubs {
		pubs[n] = p.(ed25519.PublicKey) // parsePublic made it for type ed25519
	}
	return ke.latest, pubs, nil
}

// Sign signs msg with the key's version (transit/sign/KEY with
// key_version) and returns the raw 64-byte signature: Vault's
// "vault:vN:" prefix, which must name that version, is stripped.
func (t *TransitEd25519) Sign(ctx context.Context, version int, msg []byte) ([]byte, error) {
	path := t.v.cfg.TransitMount + "/sign/" + t.key
	sec, err := t.v.write(ctx, path, map[string]any{"input": base64.StdEncoding.EncodeToString(msg), "key_version": version})
	if err != nil {
		return nil, err
	}
	if sec == nil {
		return nil, fmt.Errorf("vault: %s: empty reply", path)
	}
	s, _ := sec.Data["signature"].(string)
	raw, ok := strings.CutPrefix(s, "vault:v"+strconv.Itoa(version)+":")
	if !ok {
		return nil, fmt.Errorf("vault: %s: the signature is not of version %d", path, version)
	}
	sig, err := base64.StdEncoding.DecodeString(raw)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("vault: %s: the signature is not %d bytes of base64", path, ed25519.SignatureSize)
	}
	return sig, nil
}
