package guard

import (
	"net/netip"
	"strings"
)

// AuthorityError is a refused "host:port". Reason says what was wrong; it
// never repeats the input, which may carry userinfo (a password).
type AuthorityError struct {
	Reason string
}

func (e *AuthorityError) Error() string { return "guard: parse authority: " + e.Reason }

func badAuthority(reason string) (string, string, error) {
	return "", "", &AuthorityError{Reason: reason}
}

// maxAuthority bounds the input; a DNS name is at most 253 bytes.
const maxAuthority = 512

// ParseAuthority parses a "host:port" authority the way an HTTP proxy must:
// it rejects userinfo, empty or non-numeric or out-of-range ports, brackets
// around non-IPv6, and returns the canonical lower-case host without a
// trailing dot. Numeric IPv4 spellings that inet_aton would accept
// ("2130706433", "0x7f000001", "0177.0.0.1", "127.1") are returned as the
// dotted-quad they mean so that Classify sees the real address.
//
// The rules, so that one authority has exactly one meaning:
//   - IPv6 literals must be in brackets and are returned without them in
//     netip's canonical form ("[::]" gives "::"); zones ("%eth0") are refused.
//   - A name whose last label is a number (decimal, or 0x hex) must be a
//     whole inet_aton IPv4 spelling (WHATWG URL "ends in a number"), so
//     "1.2.3.4.5" and "example.0x1" are refused rather than sent to DNS.
//   - Names are ASCII letters, digits, '-' and '_' in labels of 1..63 bytes,
//     at most 253 bytes; non-ASCII (IDN) hosts are refused: send punycode.
//   - The port is 1..65535 in decimal without sign or leading zeros. With no
//     ":port", defaultPort is used (it must obey the same rule); "" means a
//     port is required.
//
// Failures are *AuthorityError.
func ParseAuthority(authority string, defaultPort string) (host, port string, err error) {
	if authority == "" {
		return badAuthority("empty authority")
	}
	if len(authority) > maxAuthority {
		return badAuthority("authority too long")
	}
	for i := 0; i < len(authority); i++ {
		switch b := authority[i]; {
		case b >= 0x80:
			return badAuthority("non-ASCII host: send the IDNA punycode (xn--) form")
		case b <= 0x20 || b == 0x7f:
			return badAuthority("space or control character")
		case b == '@':
			return badAuthority("userinfo not allowed")
		case b == '%':
			return badAuthority("percent-encoding or IPv6 zone not allowed")
		}
	}

	var portPart string
	hasPort := false
	if authority[0] == '[' {
		end := strings.IndexByte(authority, ']')
		if end < 0 {
			return badAuthority("missing ']'")
		}
		inner, rest := authority[1:end], authority[end+1:]
		if strings.ContainsAny(inner, "[]") || strings.ContainsAny(rest, "[]") {
			return badAuthority("nested or stray brackets")
		}
		switch {
		case rest == "":
		case rest[0] == ':':
			portPart, hasPort = rest[1:], true
		default:
			return badAuthority("junk after ']'")
		}
		a, perr := netip.ParseAddr(inner)
		if perr != nil || !a.Is6() {
			return badAuthority("brackets around a host that is not an IPv6 address")
		}
		host = a.String()
	} else {
		if strings.ContainsAny(authority, "[]") {
			return badAuthority("stray bracket")
		}
		hostPart := authority
		switch strings.Count(authority, ":") {
		case 0:
		case 1:
			i := strings.IndexByte(authority, ':')
			hostPart, portPart, hasPort = authority[:i], authority[i+1:], true
		default:
			return badAuthority("IPv6 address must be in brackets")
		}
		var reason string
		host, reason = canonicalHost(hostPart)
		if reason != "" {
			return badAuthority(reason)
		}
	}

	switch {
	case hasPort && portPart == "":
		return badAuthority("empty port")
	case hasPort:
		port = portPart
	case defaultPort == "":
		return badAuthority("missing port")
	default:
		port = defaultPort
	}
	if !validPort(port) {
		return badAuthority("port must be 1-65535 in decimal without sign or leading zeros")
	}
	return host, port, nil
}

func validPort(p string) bool {
	if len(p) == 0 || len(p) > 5 || p[0] == '0' {
		return false
	}
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
		n = n*10 + int(p[i]-'0')
	}
	return n <= 65535
}

// canonicalHost lower-cases h, drops one trailing dot, checks the name
// syntax and turns numeric IPv4 spellings into a dotted quad. It returns a
// non-empty reason on failure.
func canonicalHost(h string) (string, string) {
	h = strings.TrimSuffix(h, ".")
	if h == "" {
		return "", "empty host"
	}
	if len(h) > 253 {
		return "", "host name longer than 253 bytes"
	}
	h = strings.ToLower(h)
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" {
			return "", "empty label in host name"
		}
		if len(l) > 63 {
			return "", "label longer than 63 bytes in host name"
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return "", "invalid character in host name"
			}
		}
	}
	if !isNumberLabel(labels[len(labels)-1]) {
		return h, ""
	}
	a, ok := inetAton(labels)
	if !ok {
		return "", "malformed numeric IPv4 host"
	}
	return a.String(), ""
}

// isNumberLabel reports whether l is a decimal or 0x-hex number: a label the
// WHATWG URL parser treats as making the whole host an IPv4 address.
func isNumberLabel(l string) bool {
	if len(l) >= 2 && l[0] == '0' && l[1] == 'x' {
		for i := 2; i < len(l); i++ {
			if !isHex(l[i]) {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return l != ""
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

// inetAton parses lower-cased labels as glibc inet_aton(3) does: one to four
// parts, each decimal, 0x hex or 0-prefixed octal; the last part fills the
// remaining bytes ("127.1" is 127.0.0.1, "2130706433" is 127.0.0.1).
func inetAton(labels []string) (netip.Addr, bool) {
	n := len(labels)
	if n == 0 || n > 4 {
		return netip.Addr{}, false
	}
	var v uint32
	for i, l := range labels {
		x, ok := atonPart(l)
		if !ok {
			return netip.Addr{}, false
		}
		if i < n-1 {
			if x > 0xff {
				return netip.Addr{}, false
			}
			v |= uint32(x) << (24 - 8*i)
			continue
		}
		if x >= uint64(1)<<(8*(5-n)) {
			return netip.Addr{}, false
		}
		v |= uint32(x)
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

func atonPart(s string) (uint64, bool) {
	base := uint64(10)
	switch {
	case len(s) >= 2 && s[0] == '0' && s[1] == 'x':
		base, s = 16, s[2:] // "0x" alone is 0, as in glibc and WHATWG
	case len(s) >= 2 && s[0] == '0':
		base, s = 8, s[1:]
	case s == "":
		return 0, false
	}
	var x uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		var d uint64
		switch {
		case '0' <= c && c <= '9':
			d = uint64(c - '0')
		case 'a' <= c && c <= 'f':
			d = uint64(c-'a') + 10
		default:
			return 0, false
		}
		if d >= base {
			return 0, false
		}
		x = x*base + d
		if x > 0xffffffff {
			return 0, false
		}
	}
	return x, true
}
