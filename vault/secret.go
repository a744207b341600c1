package vault

import (
	"fmt"
	"io"
	"log/slog"
)

const redacted = "[redacted]"

// Secret holds a credential value. Its zero value is empty.
//
// Every way of printing a Secret (fmt with any verb, encoding/json, log/slog)
// yields "[redacted]"; only Reveal returns the bytes.
type Secret struct {
	b     []byte
	lease string // the Vault lease the value came from ("" for none)
}

// NewSecret wraps b (which it copies).
func NewSecret(b []byte) Secret {
	if len(b) == 0 {
		return Secret{}
	}
	return Secret{b: append([]byte(nil), b...)}
}

// Reveal returns the value. Call it only where the credential is attached.
// The returned slice is shared with s: do not modify it.
func (s Secret) Reveal() []byte { return s.b }

// LeaseID is the Vault lease the value came from (a dynamic secret's),
// or "". It is not a secret: Vault and sluice log it, and an approval
// receipt names it.
func (s Secret) LeaseID() string { return s.lease }

// WithLease is s naming the lease id it came from.
func (s Secret) WithLease(id string) Secret {
	s.lease = id
	return s
}

// Len returns the value's length in bytes.
func (s Secret) Len() int { return len(s.b) }

// IsZero reports whether s is empty.
func (s Secret) IsZero() bool { return len(s.b) == 0 }

// String, GoString, MarshalJSON and LogValue all return "[redacted]".
func (s Secret) String() string { return redacted }

// GoString makes %#v print "[redacted]".
func (s Secret) GoString() string { return redacted }

// MarshalJSON encodes the string "[redacted]".
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// MarshalText makes encoders that prefer TextMarshaler (YAML, map keys) redact too.
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// LogValue makes log/slog print "[redacted]".
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// Format writes "[redacted]" for every verb, so %x, %q and %d cannot leak
// the bytes the way they would through the default struct formatting.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redacted) }

var (
	_ fmt.Stringer   = Secret{}
	_ fmt.GoStringer = Secret{}
	_ fmt.Formatter  = Secret{}
	_ slog.LogValuer = Secret{}
)
