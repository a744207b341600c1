// Package scrub removes credentials an upstream reflects back before a
// response reaches the caller. A secret is matched raw, base64 (standard and
// URL alphabets, padded or not), URL-encoded (query and path escaping) and,
// for HTTP basic auth, as the base64 of "user:pass".
//
// The forms of each secret are prepared once by New:
//   - raw bytes;
//   - base64, standard and URL alphabets, padded and unpadded;
//   - for secrets of at least MinLenEmbedded bytes, the part of the base64
//     text that the secret alone determines at each of the three byte
//     alignments, so the secret is found inside a longer base64 blob (a JWT
//     segment, "user:pass" when only the password was given);
//   - url.QueryEscape and url.PathEscape, with upper- and lower-case %XX;
//   - hex, lower and upper case;
//   - the JSON string encoding (escaped '/', '<', '>', '&', quotes, controls).
//
// For basic auth the gateway passes both "user:pass" and the password alone.
//
// Secrets shorter than MinLen bytes are not scrubbed: replacing every "abc"
// in a body mangles it and still hides nothing, since three bytes are
// guessable. The gateway must refuse to attach such a credential; Ignored
// reports how many were left out so it can.
//
// Matching works on complete byte slices; buffering a whole body before
// scrubbing is the caller's job.
package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Replacement is what a reflected secret is replaced by.
const Replacement = "[redacted-by-sluice]"

// MinLen is the shortest secret that is scrubbed.
const MinLen = 4

// MinLenEmbedded is the shortest secret whose base64 is also searched for
// inside longer base64 text. Below it the determined part of the encoding
// is so short that unrelated base64 would match by chance.
const MinLenEmbedded = 8

// Scrubber knows the secret forms to look for. A nil or empty Scrubber
// finds nothing. It is safe for concurrent use.
type Scrubber struct {
	forms   [][]byte // longest first, no duplicates
	ignored int
}

// New prepares the forms of every secret (empty ones are ignored, and so
// are ones shorter than MinLen; see Ignored).
func New(secrets ...[]byte) *Scrubber {
	s := &Scrubber{}
	seen := map[string]bool{}
	add := func(f string) {
		if len(f) >= MinLen && !seen[f] {
			seen[f] = true
			s.forms = append(s.forms, []byte(f))
		}
	}
	for _, sec := range secrets {
		if len(sec) == 0 {
			continue
		}
		if len(sec) < MinLen {
			s.ignored++
			continue
		}
		for _, f := range forms(sec) {
			add(f)
		}
	}
	// Longest first, so that a padded base64 form wins over its unpadded
	// prefix and the replacement covers the whole reflected text.
	slices.SortStableFunc(s.forms, func(a, b []byte) int { return len(b) - len(a) })
	return s
}

func forms(sec []byte) []string {
	raw := string(sec)
	out := []string{raw}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		out = append(out, enc.EncodeToString(sec))
	}
	if len(sec) >= MinLenEmbedded {
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			for shift := range 3 {
				out = append(out, base64Core(enc, sec, shift))
			}
		}
	}
	for _, esc := range []string{url.QueryEscape(raw), url.PathEscape(raw)} {
		out = append(out, esc, lowerPercent(esc))
	}
	h := hex.EncodeToString(sec)
	out = append(out, h, strings.ToUpper(h))
	if j, err := json.Marshal(raw); err == nil && len(j) >= 2 {
		js := string(j[1 : len(j)-1])
		out = append(out, js, strings.ReplaceAll(js, "/", `\/`)) // encoders that escape '/'
	}
	return out
}

// base64Core returns the characters of the base64 encoding of sec, placed
// shift bytes into a longer input, that depend on sec's bits only.
func base64Core(enc *base64.Encoding, sec []byte, shift int) string {
	in := make([]byte, shift+len(sec))
	copy(in[shift:], sec)
	e := enc.EncodeToString(in)
	first := (8*shift + 5) / 6         // first sextet wholly inside sec
	last := 8 * (shift + len(sec)) / 6 // one past the last one
	return e[first:last]
}

// lowerPercent returns s with the hex digits of each %XX in lower case.
func lowerPercent(s string) string {
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			b[i+1] = lowerHex(b[i+1])
			b[i+2] = lowerHex(b[i+2])
			i += 2
		}
	}
	return string(b)
}

func lowerHex(c byte) byte {
	if 'A' <= c && c <= 'F' {
		return c + 'a' - 'A'
	}
	return c
}

// Ignored returns how many non-empty secrets were too short to scrub.
func (s *Scrubber) Ignored() int {
	if s == nil {
		return 0
	}
	return s.ignored
}

// Bytes returns b with every form replaced, and whether any was found.
// Matches are leftmost, and at one position the longest form wins. If
// nothing is found b itself is returned; otherwise b is left untouched and
// a new slice is returned.
func (s *Scrubber) Bytes(b []byte) ([]byte, bool) {
	if s == nil || len(s.forms) == 0 {
		return b, false
	}
	// next[i] is the index in b of the next match of form i at or after
	// pos, or -1. bytes.Index is fast on the common no-match path.
	var small [32]int
	next := small[:0]
	hit := false
	for _, f := range s.forms {
		i := bytes.Index(b, f)
		next = append(next, i)
		hit = hit || i >= 0
	}
	if !hit {
		return b, false
	}
	out := make([]byte, 0, len(b))
	pos := 0
	for {
		best := -1
		for i, n := range next {
			if n >= 0 && (best < 0 || n < next[best]) {
				best = i // forms are longest first: ties keep the longest
			}
		}
		if best < 0 {
			break
		}
		at := next[best]
		out = append(out, b[pos:at]...)
		out = append(out, Replacement...)
		pos = at + len(s.forms[best])
		for i, n := range next {
			if n >= 0 && n < pos {
				if j := bytes.Index(b[pos:], s.forms[i]); j >= 0 {
					next[i] = pos + j
				} else {
					next[i] = -1
				}
			}
		}
	}
	out = append(out, b[pos:]...)
	return out, true
}

// String is Bytes for strings.
func (s *Scrubber) String(v string) (string, bool) {
	if s == nil || len(s.forms) == 0 {
		return v, false
	}
	out, found := s.Bytes([]byte(v))
	if !found {
		return v, false
	}
	return string(out), true
}

// Header scrubs every value of h in place (names are left alone) and
// reports whether anything was found.
func (s *Scrubber) Header(h http.Header) bool {
	found := false
	for _, vs := range h {
		for i, v := range vs {
			if nv, ok := s.String(v); ok {
				vs[i] = nv
				found = true
			}
		}
	}
	return found
}
