// Package vault provides credential sources for the gateway: the embedded
// local store (encrypted at rest) now, and HashiCorp Vault (KV v2, leased
// dynamic secrets, identity tokens) through its own backend.
//
// A credential never leaves the gateway process: Secret redacts itself in
// logs, fmt and JSON, and only Reveal returns its bytes.
//
// This package imports no other package of sluice.
package vault

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Scope narrows a secret: "project" (the default), "user:NAME" or "connector:SLUG".
type Scope string

// ScopeProject is the default scope.
const ScopeProject Scope = "project"

// UserScope returns the scope "user:NAME".
func UserScope(name string) Scope { return Scope("user:" + name) }

// ConnectorScope returns the scope "connector:SLUG".
func ConnectorScope(slug string) Scope { return Scope("connector:" + slug) }

// ErrNotFound is returned (wrapped) when a secret does not exist.
var ErrNotFound = errors.New("vault: secret not found")

// Entry is a secret's listing: never its value.
type Entry struct {
	Name    string
	Scope   Scope
	Updated string // RFC 3339
}

// MaxValue bounds a secret value, in bytes.
const MaxValue = 64 << 10

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// validName is nameRE.MatchString without the regexp machine: every
// credential lookup checks its name and scope, so it is on the tool-call
// path (TestValidNameMatchesRE holds the two equal).
func validName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// ValidateName checks a secret name (also used for the NAME and SLUG of a
// scope): a letter or digit, then up to 127 letters, digits, '_', '.' or '-'.
func ValidateName(name string) error {
	if err := validateName(name); err != nil {
		return fmt.Errorf("vault: %w", err)
	}
	return nil
}

func validateName(name string) error {
	if !validName(name) {
		return fmt.Errorf("invalid secret name %q: want %s", clip(name), nameRE)
	}
	return nil
}

// Validate checks that s is "project", "user:NAME" or "connector:SLUG".
func (s Scope) Validate() error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("vault: %w", err)
	}
	return nil
}

func (s Scope) validate() error {
	str := string(s)
	if str == string(ScopeProject) {
		return nil
	}
	for _, kind := range []string{"user:", "connector:"} {
		if rest, ok := strings.CutPrefix(str, kind); ok {
			if !validName(rest) {
				return fmt.Errorf("invalid scope %q: bad %s", clip(str), strings.TrimSuffix(kind, ":"))
			}
			return nil
		}
	}
	return fmt.Errorf("invalid scope %q: want project, user:NAME or connector:SLUG", clip(str))
}

// ValidateValue checks a secret value: non-empty, at most MaxValue bytes, and
// free of CR, LF and NUL, which could smuggle headers when the value is
// attached (THREATS D6). The error never contains the value.
func ValidateValue(v []byte) error {
	if err := validateValue(v); err != nil {
		return fmt.Errorf("vault: %w", err)
	}
	return nil
}

func validateValue(v []byte) error {
	switch {
	case len(v) == 0:
		return errors.New("invalid secret value: empty")
	case len(v) > MaxValue:
		return fmt.Errorf("invalid secret value: %d bytes, limit %d", len(v), MaxValue)
	}
	for i, c := range v {
		switch c {
		case '\r', '\n', 0:
			return fmt.Errorf("invalid secret value: forbidden byte %#02x at offset %d (CR, LF and NUL are refused)", c, i)
		}
	}
	return nil
}

// clip bounds caller-chosen text quoted in an error. Names and scopes are not
// secret, but they can be long.
func clip(s string) string {
	if len(s) > 140 {
		return s[:140] + "…"
	}
	return s
}
