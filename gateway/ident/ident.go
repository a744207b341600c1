// Package ident canonicalises the names of people and sessions before
// they are compared (THREATS E8): the user an identity preamble names, the
// approver who signs in to the review UI or holds an admin token, the
// approvers a policy decision lists, and session ids. Two spellings of
// one name ("Alice" and "alice", "ａｌｉｃｅ" and "alice", a precomposed
// "é" and "e" with a combining accent) have one canonical form, so the
// self-approval check, grants and hold ownership cannot be passed by
// spelling a name differently; and names that cannot be compared safely
// (control or invisible characters, letters from more than one script)
// are refused, not guessed at.
//
// Canonical is the only comparison rule: compare canonical forms exactly.
package ident

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// MaxLen bounds a name, in bytes of its canonical form.
const MaxLen = 256

// ValidID accepts what an identity preamble could carry and a person
// could type as an id (a session, sandbox, agent or user): 1..MaxLen
// bytes, printable, no spaces. It says nothing of the canonical form
// (Canonical).
func ValidID(id string) bool {
	if id == "" || len(id) > MaxLen {
		return false
	}
	for _, r := range id {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// fold is Unicode default case folding (full folding, so "ß" and "ss"
// are one name); a cases.Caser is not safe for concurrent use, so each
// call makes its own (cheap).
func fold(s string) string { return cases.Fold().String(s) }

// Canonical returns the canonical form of name: NFKC (compatibility
// forms such as full-width letters become the plain ones), then case
// folded, then NFKC again (folding can denormalise). It refuses, naming
// the reason:
//
//   - an empty name or one longer than MaxLen;
//   - invalid UTF-8;
//   - a control, format or otherwise invisible character (C0, C1, DEL,
//     zero-width joiners and spaces, bidi controls, the BOM, soft hyphen),
//     any whitespace, or an unassigned code point;
//   - letters from more than one script (Latin "a" next to Cyrillic "а"):
//     the usual way to make one name look like another. A whole name in
//     another script is accepted and is a different name.
//
// Canonical of a canonical name is that name.
func Canonical(name string) (string, error) {
	if name == "" {
		return "", errors.New("ident: empty name")
	}
	if !utf8.ValidString(name) {
		return "", errors.New("ident: name is not valid UTF-8")
	}
	for _, r := range name {
		switch {
		case unicode.IsControl(r), unicode.Is(unicode.Cf, r):
			return "", fmt.Errorf("ident: name contains control or invisible character %U", r)
		case unicode.IsSpace(r):
			return "", fmt.Errorf("ident: name contains whitespace %U", r)
		case !unicode.IsPrint(r) && !unicode.Is(unicode.Mn, r):
			return "", fmt.Errorf("ident: name contains non-printable character %U", r)
		}
	}
	c := norm.NFKC.String(fold(norm.NFKC.String(name)))
	if len(c) > MaxLen {
		return "", fmt.Errorf("ident: name longer than %d bytes", MaxLen)
	}
	script := ""
	for _, r := range c {
		if !unicode.IsLetter(r) {
			continue
		}
		s := scriptOf(r)
		if s == "" {
			return "", fmt.Errorf("ident: name contains unassigned character %U", r)
		}
		if s == "Common" || s == "Inherited" {
			continue
		}
		if script == "" {
			script = s
		} else if s != script {
			return "", fmt.Errorf("ident: name mixes %s and %s letters", script, s)
		}
	}
	for _, r := range c { // NFKC can produce what the checks above refuse
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.IsSpace(r) {
			return "", fmt.Errorf("ident: name's normal form contains %U", r)
		}
	}
	return c, nil
}

// Same reports whether a and b are one name: both canonicalise and the
// forms are equal. A name that does not canonicalise is the same as
// nothing, not even itself; callers that must fail closed when in doubt
// (the self-approval check) use Conflict.
func Same(a, b string) bool {
	ca, err := Canonical(a)
	if err != nil {
		return false
	}
	cb, err := Canonical(b)
	return err == nil && ca == cb
}

// Conflict reports whether a and b may be one person: they are the same
// name, or either cannot be canonicalised (so that a name spelled to
// dodge the comparison counts as a match, never as a stranger). Empty
// names conflict with nothing.
func Conflict(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	ca, errA := Canonical(a)
	cb, errB := Canonical(b)
	return errA != nil || errB != nil || ca == cb
}

// scriptOf is the name of r's script in unicode.Scripts, "" when r is in
// none.
func scriptOf(r rune) string {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' {
			return "Latin"
		}
		return "Common"
	}
	for name, t := range unicode.Scripts {
		if unicode.Is(t, r) {
			return name
		}
	}
	return ""
}
