// Package receipts signs and verifies approval receipts: when a held call
// that a person approved is executed, the gateway signs (Ed25519) a
// receipt binding who approved it and when, the request's canonical hash,
// the policy revision that decided it again at execution, the upstream's
// status and where the credential went. Anyone with the public key can
// check a receipt offline.
//
// A receipt file is canonical: Verify re-encodes what it parsed and
// requires the very same bytes, so a receipt with any byte changed —
// inside the signed fields, in the signature or in the framing — does not
// verify.
//
// The package imports only the standard library.
package receipts

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/internal/keyfile"
)

// Version is the receipt format's version.
const Version = 1

// domain separates receipt signatures from any other use of the key.
const domain = "sluice-receipt-v1\n"

// Receipt is what a signature binds. Field order is the encoding's order.
type Receipt struct {
	Version   int    `json:"version"`
	HoldID    string `json:"hold_id"`
	RequestID string `json:"request_id"` // the agent's call that created the hold
	Tool      string `json:"tool"`
	Caller    Caller `json:"caller"`
	// Approver is the person who approved, as authenticated by the review
	// UI or the admin API; ApprovedAt is when.
	Approver   string    `json:"approver"`
	ApprovedAt time.Time `json:"approved_at"`
	ExecutedAt time.Time `json:"executed_at"`
	// RequestSHA256 is the hex SHA-256 of the canonical request encoding
	// that was approved and sent (the hold's sha256).
	RequestSHA256  string `json:"request_sha256"`
	PolicyRevision string `json:"policy_revision"`
	Decision       string `json:"decision"` // the policy's decision at execution (allow or ask)
	UpstreamStatus int    `json:"upstream_status"`
	// Credential says where the credential went ("header:Authorization"),
	// never its value; LeaseID is its Vault lease, when it has one.
	Credential string `json:"credential,omitempty"`
	LeaseID    string `json:"lease_id,omitempty"`
	KeyID      string `json:"key_id"`
	// Key names the key version that signed, for a key held in Vault
	// ("vault transit key transit/keys/receipts version 2"); the local
	// key leaves it out. KeyID alone picks the verification key.
	Key string `json:"key,omitempty"`
}

// Caller is the identity the held call was made under.
type Caller struct {
	Sandbox string `json:"sandbox"`
	Agent   string `json:"agent"`
	Session string `json:"session"`
	User    string `json:"user"`
}

// Signed is a receipt and its signature: the file format.
type Signed struct {
	Receipt   Receipt `json:"receipt"`
	Algorithm string  `json:"alg"`       // "Ed25519"
	Signature string  `json:"signature"` // base64url, unpadded, of Ed25519(domain + receipt JSON)
}

// KeyID is a public key's id: the first 16 hex digits of its SHA-256.
func KeyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:8])
}

// Key is a signing key held outside the gateway (Vault transit's ed25519
// key, vault.TransitEd25519): versions, each with its public key, and
// signing with one version. The private key never reaches the gateway.
type Key interface {
	// Name says which key it is (for errors and logs).
	Name() string
	// Versions returns the latest version and every version's public key.
	Versions(ctx context.Context) (latest int, pubs map[int]ed25519.PublicKey, err error)
	// Sign returns the raw Ed25519 signature of msg by the version.
	Sign(ctx context.Context, version int, msg []byte) ([]byte, error)
}

// Public is a verification key: its id (KeyID) and, for a key with
// versions, its version's name.
type Public struct {
	KeyID string
	Name  string // "" for the local key; "vault transit key transit/keys/NAME version N"
	Key   ed25519.PublicKey
}

// Signer signs receipts with one Ed25519 key: a local one (NewSigner) or
// a Key held in Vault (NewKeySigner), whose latest version signs.
type Signer struct {
	local ed25519.PrivateKey
	id    string
	key   Key
}

// NewSigner wraps the local key.
func NewSigner(key ed25519.PrivateKey) *Signer {
	return &Signer{local: key, id: KeyID(key.Public().(ed25519.PublicKey))}
}

// NewKeySigner signs with k's latest version.
func NewKeySigner(k Key) *Signer { return &Signer{key: k} }

// Keys returns the verification keys, the one that signs now first; for
// a Key, then every older version still held (receipts signed before a
// rotation verify with them), newest first.
func (s *Signer) Keys(ctx context.Context) ([]Public, error) {
	if s.key == nil {
		return []Public{{KeyID: s.id, Key: s.local.Public().(ed25519.PublicKey)}}, nil
	}
	latest, pubs, err := s.key.Versions(ctx)
	if err != nil {
		return nil, fmt.Errorf("receipts: %w", err)
	}
	if pubs[latest] == nil {
		return nil, fmt.Errorf("receipts: %s: no public key for version %d", s.key.Name(), latest)
	}
	vers := make([]int, 0, len(pubs))
	for n := range pubs {
		vers = append(vers, n)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(vers)))
	out := make([]Public, 0, len(vers))
	for _, n := range vers {
		if n > latest {
			continue
		}
		out = append(out, Public{KeyID: KeyID(pubs[n]), Name: s.key.Name() + " version " + strconv.Itoa(n), Key: pubs[n]})
	}
	return out, nil
}

// Sign stamps r with the key's id and version and returns the receipt
// file: canonical JSON and a newline. With a Key, the latest version
// signs (r.Key names it) and the signature is checked against its public
// key before it is returned: a receipt that would not verify is an error.
func (s *Signer) Sign(ctx context.Context, r Receipt) ([]byte, error) {
	r.Version = Version
	r.ApprovedAt, r.ExecutedAt = r.ApprovedAt.UTC(), r.ExecutedAt.UTC()
	var pub ed25519.PublicKey
	var version int
	if s.key == nil {
		r.KeyID, r.Key = s.id, ""
	} else {
		latest, pubs, err := s.key.Versions(ctx)
		if err != nil {
			return nil, fmt.Errorf("receipts: %w", err)
		}
		if pub = pubs[latest]; pub == nil {
			return nil, fmt.Errorf("receipts: %s: no public key for version %d", s.key.Name(), latest)
		}
		version, r.KeyID, r.Key = latest, KeyID(pub), s.key.Name()+" version "+strconv.Itoa(latest)
	}
	msg, err := signedBytes(r)
	if err != nil {
		return nil, err
	}
	var sig []byte
	if s.key == nil {
		sig = ed25519.Sign(s.local, msg)
	} else if sig, err = s.key.Sign(ctx, version, msg); err != nil {
		return nil, fmt.Errorf("receipts: %w", err)
	} else if !ed25519.Verify(pub, msg, sig) {
		return nil, fmt.Errorf("receipts: %s version %d: the signature does not verify with its public key", s.key.Name(), version)
	}
	return encode(Signed{Receipt: r, Algorithm: "Ed25519", Signature: base64.RawURLEncoding.EncodeToString(sig)})
}

// probeDomain prefixes what Probe signs: never a receipt's domain, so a
// probe's signature cannot pass for a receipt's.
const probeDomain = "sluice-receipt-probe-v1\n"

// Probe signs a probe message (not a receipt) with the key's latest
// version and checks the signature: a Key the gateway may read but not
// sign with (the Vault policy, a derived key) fails here, at start, not at
// the first executed hold.
func (s *Signer) Probe(ctx context.Context) error {
	if s.key == nil {
		return nil
	}
	latest, pubs, err := s.key.Versions(ctx)
	if err != nil {
		return fmt.Errorf("receipts: %w", err)
	}
	msg := []byte(probeDomain + time.Now().UTC().Format(time.RFC3339Nano))
	sig, err := s.key.Sign(ctx, latest, msg)
	if err != nil {
		return fmt.Errorf("receipts: %w", err)
	}
	if pubs[latest] == nil || !ed25519.Verify(pubs[latest], msg, sig) {
		return fmt.Errorf("receipts: %s version %d: the signature does not verify with its public key", s.key.Name(), latest)
	}
	return nil
}

func signedBytes(r Receipt) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("receipts: encode: %w", err)
	}
	return append([]byte(domain), b...), nil
}

func encode(s Signed) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("receipts: encode: %w", err)
	}
	return append(b, '\n'), nil
}

// Verify checks a receipt file against pub and returns the receipt. It
// fails unless the file is exactly the canonical encoding of what it
// holds and the signature verifies: no byte of it can change.
func Verify(file []byte, pub ed25519.PublicKey) (Receipt, error) {
	dec := json.NewDecoder(bytes.NewReader(file))
	dec.DisallowUnknownFields()
	var s Signed
	if err := dec.Decode(&s); err != nil {
		return Receipt{}, fmt.Errorf("receipts: not a receipt: %w", err)
	}
	canon, err := encode(s)
	if err != nil {
		return Receipt{}, err
	}
	if !bytes.Equal(canon, file) {
		return Receipt{}, errors.New("receipts: not in canonical form: the file was changed after signing")
	}
	if s.Algorithm != "Ed25519" {
		return Receipt{}, fmt.Errorf("receipts: algorithm %q: want Ed25519", s.Algorithm)
	}
	if s.Receipt.Version != Version {
		return Receipt{}, fmt.Errorf("receipts: version %d: want %d", s.Receipt.Version, Version)
	}
	if want := KeyID(pub); s.Receipt.KeyID != want {
		return Receipt{}, fmt.Errorf("receipts: signed by key %s, not by %s", s.Receipt.KeyID, want)
	}
	sig, err := base64.RawURLEncoding.Strict().DecodeString(s.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return Receipt{}, errors.New("receipts: malformed signature")
	}
	msg, err := signedBytes(s.Receipt)
	if err != nil {
		return Receipt{}, err
	}
	if !ed25519.Verify(pub, msg, sig) {
		return Receipt{}, errors.New("receipts: bad signature")
	}
	return s.Receipt, nil
}

// LoadKey reads the signing key's seed (hex) from path; with create, a
// missing file is made with a fresh key (0600, never overwritten).
func LoadKey(path string, create bool) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && create {
		return createKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("receipts: key: %w", err)
	}
	seed, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("receipts: key %s: want %d bytes of hex", path, ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

func createKey(path string) (ed25519.PrivateKey, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, fmt.Errorf("receipts: key: %w", err)
	}
	created, err := keyfile.Create(path, []byte(hex.EncodeToString(seed)+"\n"))
	if err != nil {
		return nil, fmt.Errorf("receipts: key: %w", err)
	}
	if !created {
		return LoadKey(path, false) // another process made it first
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// PublicPEM encodes pub as a PEM "PUBLIC KEY" (PKIX), what `openssl pkey
// -pubin` and `sluice receipts verify --key` read.
func PublicPEM(pub ed25519.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic("bug(): receipts: marshal ed25519 public key: " + err.Error())
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// ParsePublicKey reads a public key as PEM (PKIX), or as 64 hex digits or
// base64 of the 32 raw bytes.
func ParsePublicKey(b []byte) (ed25519.PublicKey, error) {
	if blk, _ := pem.Decode(b); blk != nil {
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("receipts: public key: %w", err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("receipts: public key is %T, want Ed25519", k)
		}
		return pub, nil
	}
	s := strings.TrimSpace(string(b))
	if raw, err := hex.DecodeString(s); err == nil && len(raw) == ed25519.PublicKeySize {
		return ed25519.PublicKey(raw), nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if raw, err := enc.DecodeString(s); err == nil && len(raw) == ed25519.PublicKeySize {
			return ed25519.PublicKey(raw), nil
		}
	}
	return nil, errors.New("receipts: public key: want PEM, 64 hex digits or base64 of 32 bytes")
}
