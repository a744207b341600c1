// Package scrub removes credentials an upstream reflects back before a
// response reaches the caller. A secret is matched raw, base64 (standard and
// URL alphabets, padded or not), hex, and, for HTTP basic auth, as the
// base64 of "user:pass"; every form in any ASCII case.
//
// The forms of each secret are prepared once by New:
//   - raw bytes;
//   - base64, standard and URL alphabets, padded and unpadded;
//   - for secrets of at least MinLenEmbedded bytes, the part of the base64
//     text that the secret alone determines at each of the three byte
//     alignments, so the secret is found inside a longer base64 blob (a JWT
//     segment, "user:pass" when only the password was given);
//   - url.QueryEscape (a space as '+');
//   - hex.
//
// Escapes are not matched as one encoder writes them: the text is decoded
// first and the forms are looked for in what it decodes to (see view.go).
// Each body is searched as it is, with its JSON string escapes decoded
// (\u0073, \/, \n, surrogate pairs), with its percent-escapes decoded (%73
// or %2F, either case, some bytes escaped or all), with its HTML character
// references decoded (&#115;, &#x73;, &amp;), and with JSON escapes then
// percent-escapes decoded. A match replaces the escaped text it came from,
// whole escapes only, so a JSON document stays valid JSON.
//
// For basic auth the gateway passes both "user:pass" and the password alone.
//
// Secrets shorter than MinLen bytes are not scrubbed: replacing every "abc"
// in a body mangles it and still hides nothing, since three bytes are
// guessable. The gateway must refuse to attach such a credential; Ignored
// reports how many were left out so it can.
//
// Matching works on complete byte slices; buffering a whole body before
// scrubbing is the caller's job. Reply does that for an HTTP reply: it
// undoes content codings, refuses what it cannot see through and fixes the
// framing headers.
package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"slices"
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
	forms   [][]byte // in ASCII lower case, longest first, no duplicates
	ignored int
}

// New prepares the forms of every secret (empty ones are ignored, and so
// are ones shorter than MinLen; see Ignored).
func New(secrets ...[]byte) *Scrubber {
	s := &Scrubber{}
	seen := map[string]bool{}
	add := func(f string) {
		f = string(lower(nil, []byte(f)))
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
	// Percent-escapes are decoded before matching; only the '+' that
	// query escaping writes for a space is not an escape.
	out = append(out, url.QueryEscape(raw))
	return append(out, hex.EncodeToString(sec))
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

// lower appends b in ASCII lower case to dst. It keeps every byte where it
// was, so an index into the result is one into b.
func lower(dst, b []byte) []byte {
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// Ignored returns how many non-empty secrets were too short to scrub.
func (s *Scrubber) Ignored() int {
	if s == nil {
		return 0
	}
	return s.ignored
}

// span is a half-open byte range of the scrubbed input.
type span struct{ from, to int }

// Bytes returns b with every form replaced, and whether any was found. A
// form is found in b in any ASCII case, and in each decoded view of b; a
// match replaces the bytes of b it was decoded from, and overlapping
// matches are replaced once. If nothing is found b itself is returned;
// otherwise b is left untouched and a new slice is returned.
func (s *Scrubber) Bytes(b []byte) ([]byte, bool) {
	if s == nil || len(s.forms) == 0 || len(b) == 0 {
		return b, false
	}
	var spans []span
	s.find(b, nil, &spans)
	vs := views(b)
	for _, v := range vs {
		s.find(v.text, v, &spans)
	}
	if len(spans) == 0 {
		return b, false
	}
	for _, v := range vs {
		if v.json {
			v.widen(spans)
		}
	}
	slices.SortFunc(spans, func(x, y span) int {
		if x.from != y.from {
			return x.from - y.from
		}
		return y.to - x.to
	})
	out := make([]byte, 0, len(b))
	pos := 0
	for i := 0; i < len(spans); {
		sp := spans[i]
		// Merge every span that overlaps this one (adjacent ones stay
		// separate: two secrets side by side are two replacements).
		for i++; i < len(spans) && spans[i].from < sp.to; i++ {
			sp.to = max(sp.to, spans[i].to)
		}
		out = append(out, b[pos:sp.from]...)
		out = append(out, Replacement...)
		pos = sp.to
	}
	return append(out, b[pos:]...), true
}

// find appends the spans of b (the original input) where a form occurs in
// text, which is b itself when v is nil and v's decoded text otherwise.
func (s *Scrubber) find(text []byte, v *view, spans *[]span) {
	low := text
	for _, c := range text {
		if 'A' <= c && c <= 'Z' {
			low = lower(make([]byte, 0, len(text)), text)
			break
		}
	}
	for _, f := range s.forms {
		for off := 0; off+len(f) <= len(low); {
			i := bytes.Index(low[off:], f)
			if i < 0 {
				break
			}
			from, to := off+i, off+i+len(f)
			if v != nil {
				from, to = v.origin(from, to)
			}
			*spans = append(*spans, span{from, to})
			off += i + len(f)
		}
	}
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

// Header scrubs every value of h in place, drops every field whose name
// holds a secret (a name cannot carry the replacement text, and Go's
// canonical form changed its case already), and reports whether anything
// was found.
func (s *Scrubber) Header(h http.Header) bool {
	if s == nil || len(s.forms) == 0 {
		return false
	}
	found := false
	for k, vs := range h {
		if _, ok := s.String(k); ok {
			delete(h, k)
			found = true
			continue
		}
		for i, v := range vs {
			if nv, ok := s.String(v); ok {
				vs[i] = nv
				found = true
			}
		}
	}
	return found
}
