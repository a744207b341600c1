package egress

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/sluice-gw/sluice/gateway/refusal"
)

// egressPath is a raw-egress request path in the one form policy decides
// on and the upstream receives (THREATS C11): sent is the escaped path put
// on the wire, decoded the same path with its escapes decoded, which is
// what policy sees as input.request.path (as before, a decoded path).
type egressPath struct {
	sent, decoded string
}

// normalizePath turns the escaped path of a request target into its
// RFC 3986 normal form, or refuses it. It is the only place a raw-egress
// path is interpreted: the forward proxy and intercepted tunnels
// (HTTP/1.1 and HTTP/2) both call it, decide on decoded and send exactly
// sent, so an upstream that normalises the path itself finds what policy
// already decided on.
//
//   - Percent-encodings of unreserved characters (ALPHA, DIGIT, "-", ".",
//     "_", "~") are decoded (RFC 3986 6.2.2.2); every other encoding is
//     kept, with upper-case hex (6.2.2.1).
//   - Dot segments are removed (5.2.4), after that decoding, so "%2e" and
//     "%2E%2e" are dot segments too; ".." above the root stays at the
//     root.
//   - Empty segments ("//") are merged: no upstream routes them apart
//     from one "/" the same way, and most merge them.
//   - Refused: an encoded slash ("%2F") or backslash ("%5C"), a literal
//     backslash, a dot segment with parameters (".;x", "..;x": servlet
//     containers treat them as dot segments), an encoded or literal
//     control character (including NUL), and a malformed "%" escape.
//     Upstreams disagree on whether an encoded slash separates segments,
//     so no one form could be both checked and sent.
//   - A byte outside RFC 3986's pchar and "/" (a space, a non-ASCII byte,
//     "{"...) is percent-encoded.
func normalizePath(escaped string) (egressPath, error) {
	if plainPath(escaped) {
		// Already in normal form with nothing to decode: what the
		// general path below returns, without building it again.
		return egressPath{sent: escaped, decoded: escaped}, nil
	}
	return normalizePathSlow(escaped)
}

// plainPath reports whether escaped is a path normalizePath returns as it
// is, in both forms: it starts with "/", holds only "/" and pchar bytes
// (no escape to decode or keep, nothing to encode or refuse), has no empty
// segment but a trailing one, and no segment whose name (before any ";")
// is "." or "..". Most request paths are; FuzzNormalizePath holds the two
// paths equal.
func plainPath(escaped string) bool {
	if escaped == "" || escaped[0] != '/' {
		return false
	}
	start := 1 // of the current segment
	for i := 1; i <= len(escaped); i++ {
		if i < len(escaped) && escaped[i] != '/' {
			if !isPchar(escaped[i]) {
				return false
			}
			continue
		}
		seg := escaped[start:i]
		if seg == "" && i < len(escaped) {
			return false // "//": merged
		}
		if name, _, _ := strings.Cut(seg, ";"); name == "." || name == ".." {
			return false // removed, or refused with parameters
		}
		start = i + 1
	}
	return true
}

// normalizePathSlow is normalizePath for any path.
func normalizePathSlow(escaped string) (egressPath, error) {
	if escaped == "" {
		escaped = "/"
	}
	if escaped[0] != '/' {
		return egressPath{}, errors.New("the path does not start with /")
	}
	var b strings.Builder
	b.Grow(len(escaped))
	for i := 0; i < len(escaped); i++ {
		c := escaped[i]
		switch {
		case c == '%':
			if i+2 >= len(escaped) || !isHex(escaped[i+1]) || !isHex(escaped[i+2]) {
				return egressPath{}, errors.New("malformed percent-encoding in the path")
			}
			d := unhex(escaped[i+1])<<4 | unhex(escaped[i+2])
			i += 2
			switch {
			case d == '/':
				return egressPath{}, errors.New("an encoded slash (%2F) in the path is refused: upstreams disagree on what it means")
			case d == '\\':
				return egressPath{}, errors.New("an encoded backslash (%5C) in the path is refused: upstreams disagree on what it means")
			case d < 0x20 || d == 0x7f:
				return egressPath{}, fmt.Errorf("an encoded control character (%%%02X) in the path is refused", d)
			case isUnreserved(d):
				b.WriteByte(d)
			default:
				fmt.Fprintf(&b, "%%%02X", d)
			}
		case c == '\\':
			return egressPath{}, errors.New("a backslash in the path is refused: some upstreams read it as /")
		case c < 0x20 || c == 0x7f:
			return egressPath{}, fmt.Errorf("a control character (0x%02x) in the path is refused", c)
		case c == '/' || isPchar(c):
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	segs := strings.Split(b.String()[1:], "/")
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		last := i == len(segs)-1
		name, _, params := strings.Cut(s, ";")
		switch {
		case (name == "." || name == "..") && params:
			return egressPath{}, fmt.Errorf("a dot segment with parameters (%q) in the path is refused", s)
		case name == ".":
			if last {
				out = append(out, "")
			}
		case name == "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		case s == "":
			if last {
				out = append(out, "") // a trailing slash stays
			}
		default:
			out = append(out, s)
		}
	}
	sent := "/" + strings.Join(out, "/")
	decoded, err := url.PathUnescape(sent)
	if err != nil {
		return egressPath{}, fmt.Errorf("bug(): normalised path %q does not decode: %w", sent, err)
	}
	return egressPath{sent: sent, decoded: decoded}, nil
}

// setOn makes u's path exactly p. Go sends RawPath when it is a valid
// encoding of Path, which sent always is (pchar, "/" and escapes only);
// an error is a broken invariant, and nothing is sent.
func (p egressPath) setOn(u *url.URL) error {
	u.Path, u.RawPath = p.decoded, p.sent
	if got := u.EscapedPath(); got != p.sent {
		return fmt.Errorf("bug(): path %q would be sent as %q", p.sent, got)
	}
	return nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// isUnreserved is RFC 3986's unreserved set.
func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// isPchar is RFC 3986's pchar without pct-encoded: unreserved, sub-delims,
// ":" and "@".
func isPchar(c byte) bool {
	return isUnreserved(c) || strings.IndexByte("!$&'()*+,;=:@", c) >= 0
}

// path normalises r's path for c (normalizePath); a refused path is 400
// schema_violation naming what was wrong, audited with reason
// path_refused.
func (c *egressCall) path(r *http.Request) (egressPath, *egressError) {
	p, err := normalizePath(r.URL.EscapedPath())
	if err != nil {
		c.Event = "path_refused"
		return egressPath{}, egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "request path: "+err.Error())
	}
	return p, nil
}
