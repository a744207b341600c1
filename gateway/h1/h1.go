// Package h1 is the HTTP/1.1 field-line syntax (RFC 9110 5, RFC 9112 5)
// that sluice checks byte for byte on both sides of the gateway: the
// inbound request-head checker of the sandbox socket and the parser of
// upstream response heads in raw egress. Both must agree on what a field
// line is, so they share this one definition; it is strict where Go's own
// server repairs (obs-fold, a space before the colon, control bytes).
// It also holds the request body bound (BodyLimit, THREATS B10) that the
// socket's checker and the intercepted tunnels' inner requests both keep.
//
// The package imports only the standard library.
package h1

import (
	"bytes"
	"errors"
	"strings"
)

// CheckFieldLine refuses obs-fold, a name that is not a token (bytes
// 0x80-0xff, a space before the colon) and control bytes in a value. l is
// one field line without its line end.
func CheckFieldLine(l []byte) error {
	if len(l) > 0 && (l[0] == ' ' || l[0] == '\t') {
		return errors.New("obs-fold continuation line (RFC 9112 5.2)")
	}
	i := bytes.IndexByte(l, ':')
	if i <= 0 {
		return errors.New("header line without a name")
	}
	for _, c := range l[:i] {
		if !IsTokenChar(c) {
			return errors.New("invalid byte in a header name (RFC 9110 5.1)")
		}
	}
	for _, c := range l[i+1:] {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return errors.New("control byte in a header value (RFC 9110 5.5)")
		}
	}
	return nil
}

// SplitField splits a field line that CheckFieldLine accepted into its
// name and its value without surrounding spaces and tabs. Both alias l.
func SplitField(l []byte) (name, value []byte) {
	i := bytes.IndexByte(l, ':') // CheckFieldLine found one after a name
	return l[:i], bytes.Trim(l[i+1:], " \t")
}

// Field is a field name the framing of a message depends on.
type Field uint8

// The fields whose names Name recognises; any other is Other.
const (
	Other Field = iota
	ContentLength
	TransferEncoding
	Host
	Expect
	Connection
)

var names = [...][]byte{
	ContentLength:    []byte("Content-Length"),
	TransferEncoding: []byte("Transfer-Encoding"),
	Host:             []byte("Host"),
	Expect:           []byte("Expect"),
	Connection:       []byte("Connection"),
}

// String returns the field's canonical name, or "other".
func (f Field) String() string {
	if f == Other || int(f) >= len(names) {
		return "other"
	}
	return string(names[f])
}

// Name returns which framing field name is, compared case-insensitively as
// RFC 9110 5.1 says; Other when it is none of them.
func Name(name []byte) Field {
	for f := ContentLength; int(f) < len(names); f++ {
		if bytes.EqualFold(name, names[f]) {
			return f
		}
	}
	return Other
}

// HasToken reports whether token is in the comma- or space-separated list
// v, case-insensitively, as Go's server reads Expect.
func HasToken(v, token string) bool {
	for sp := 0; sp+len(token) <= len(v); sp++ {
		if sp > 0 && !isTokenBoundary(v[sp-1]) {
			continue
		}
		if end := sp + len(token); end != len(v) && !isTokenBoundary(v[end]) {
			continue
		}
		if strings.EqualFold(v[sp:sp+len(token)], token) {
			return true
		}
	}
	return false
}

func isTokenBoundary(b byte) bool { return b == ' ' || b == ',' || b == '\t' }

// IsTokenChar reports whether c may appear in a token (RFC 9110 5.6.2):
// a field name or a method.
func IsTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// ValidHost reports whether a Host value has only bytes a uri-host and
// port may have, as Go's server checks it (httpguts.ValidHostHeader).
func ValidHost(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!$%&'()*+,-.:;=[]_~", c) >= 0) {
			return false
		}
	}
	return true
}
