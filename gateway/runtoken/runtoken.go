// Package runtoken mints and checks per-run credentials for hosted
// sandboxes (E2B, Daytona, Modal: sandboxes on hosts without sandboxd).
// A token names exactly one identity (sandbox, agent, session, user) and
// an expiry, and carries an HMAC-SHA256 over both with a key every
// replica shares (gateway.hosted.token_key_file), so any replica accepts
// any replica's tokens without a table. Revocation is not here: a token
// is bound to its session, and the gateway refuses a token whose session
// the store records as ended.
//
// The token is a secret: Token implements slog.LogValuer and fmt.Formatter
// so that it never prints, and no error of this package quotes it.
package runtoken

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/internal/keyfile"
)

// KeySize is the MAC key's size in bytes.
const KeySize = 32

// MaxLen bounds a token's length; a longer one is refused unread.
const MaxLen = 2048

// prefix starts every token: its format version. A token of another
// version is refused as malformed.
const prefix = "srt1."

// b64 decodes strictly: one encoding per byte string, so a token has
// one spelling.
var b64 = base64.RawURLEncoding.Strict()

// domain separates this MAC from any other use of the key.
const domain = "sluice run token v1\x00"

// Claims is what a token stands for.
type Claims struct {
	Sandbox string `json:"sb"`
	Agent   string `json:"a"`
	Session string `json:"s"`
	User    string `json:"u,omitempty"`
	// Egress narrows the agent's raw egress allowlist for this run, in
	// the identity preamble's canonical form (wire.FormatEgress); "" is
	// no narrowing.
	Egress string `json:"eg,omitempty"`
	// Issued and Expires are Unix seconds.
	Issued  int64 `json:"iat"`
	Expires int64 `json:"exp"`
	// Nonce makes two tokens minted in one second for one identity
	// different (hex, 16 bytes).
	Nonce string `json:"n"`
}

// ExpiresAt is the expiry as a time.
func (c Claims) ExpiresAt() time.Time { return time.Unix(c.Expires, 0) }

// Token is a minted token: keep it out of logs (it prints as [redacted]).
type Token string

// LogValue keeps a token out of structured logs.
func (Token) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// Format keeps a token out of formatted text (%v, %s, %q).
func (Token) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte("[redacted]")) }

// Reason is why a token was refused: a stable word for audit records and
// the 407 answer, never the token.
type Reason string

// Refusal reasons.
const (
	Malformed Reason = "malformed" // not a token of this format
	BadMAC    Reason = "bad_mac"   // not minted with this key, or altered
	Expired   Reason = "expired"   // past its expiry
)

// Error is a refused token.
type Error struct{ Reason Reason }

func (e *Error) Error() string { return "runtoken: token " + string(e.Reason) }

// Key is a MAC key.
type Key struct{ k []byte }

// NewKey wraps raw (KeySize bytes).
func NewKey(raw []byte) (*Key, error) {
	if len(raw) != KeySize {
		return nil, fmt.Errorf("runtoken: key: want %d bytes, got %d", KeySize, len(raw))
	}
	return &Key{k: bytes.Clone(raw)}, nil
}

// Mint makes the token for c, with a fresh nonce.
func (k *Key) Mint(c Claims) (Token, error) {
	if c.Nonce == "" {
		n := make([]byte, 16)
		if _, err := rand.Read(n); err != nil {
			return "", fmt.Errorf("runtoken: nonce: %w", err)
		}
		c.Nonce = hex.EncodeToString(n)
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("runtoken: encode: %w", err)
	}
	p := base64.RawURLEncoding.EncodeToString(payload)
	return Token(prefix + p + "." + base64.RawURLEncoding.EncodeToString(k.mac(p))), nil
}

func (k *Key) mac(payload string) []byte {
	m := hmac.New(sha256.New, k.k)
	m.Write([]byte(domain))
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// Check verifies tok's MAC (in constant time) and its expiry at now, and
// returns its claims. The payload is decoded only after its MAC verified:
// nothing an attacker wrote is parsed. An expired token's claims are
// returned with the Expired error (they are authentic), for the record of
// the refusal; every other error returns no claims.
func (k *Key) Check(tok string, now time.Time) (Claims, error) {
	if len(tok) > MaxLen {
		return Claims{}, &Error{Malformed}
	}
	rest, ok := strings.CutPrefix(tok, prefix)
	if !ok {
		return Claims{}, &Error{Malformed}
	}
	p, sig, ok := strings.Cut(rest, ".")
	if !ok || p == "" || strings.Contains(sig, ".") {
		return Claims{}, &Error{Malformed}
	}
	got, err := b64.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return Claims{}, &Error{Malformed}
	}
	if !hmac.Equal(got, k.mac(p)) {
		return Claims{}, &Error{BadMAC}
	}
	raw, err := b64.DecodeString(p)
	if err != nil {
		return Claims{}, &Error{Malformed}
	}
	var c Claims
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || c.Agent == "" || c.Session == "" || c.Expires == 0 {
		return Claims{}, &Error{Malformed} // a bug of the minter: it was signed
	}
	if !now.Before(c.ExpiresAt()) {
		return c, &Error{Expired} // its MAC verified: the claims say whose it was
	}
	return c, nil
}

// LoadKey reads the key (hex) from path; with create, a missing file is
// made with a fresh key (0600, never overwritten). A key file readable
// by group or others is refused: anyone who reads it can mint tokens.
func LoadKey(path string, create bool) (*Key, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) && create {
		return createKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("runtoken: key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("runtoken: key %s: mode %v is readable by group or others; chmod 600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("runtoken: key: %w", err)
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(raw) != KeySize {
		return nil, fmt.Errorf("runtoken: key %s: want %d bytes of hex", path, KeySize)
	}
	return NewKey(raw)
}

func createKey(path string) (*Key, error) {
	raw := make([]byte, KeySize)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("runtoken: key: %w", err)
	}
	created, err := keyfile.Create(path, []byte(hex.EncodeToString(raw)+"\n"))
	if err != nil {
		return nil, fmt.Errorf("runtoken: key: %w", err)
	}
	if !created {
		return LoadKey(path, false) // another replica or process made it first
	}
	return NewKey(raw)
}
