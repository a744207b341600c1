package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/sluice-gw/sluice/gateway/guard"
)

// readClientHello reads one TLS ClientHello (possibly over several
// records) and returns the bytes read, to be replayed upstream, and its
// one server name. A missing, empty, repeated or unparsable SNI is an error.
func readClientHello(r *bufio.Reader) ([]byte, string, error) {
	var raw, hs []byte
	for {
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(r, hdr); err != nil {
			return nil, "", fmt.Errorf("client hello: read record: %w", err)
		}
		if hdr[0] != 0x16 || hdr[1] != 3 {
			return nil, "", errors.New("client hello: not a TLS handshake record")
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > 1<<14 {
			return nil, "", errors.New("client hello: bad record length")
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, "", fmt.Errorf("client hello: read record: %w", err)
		}
		raw = append(append(raw, hdr...), body...)
		hs = append(hs, body...)
		if len(hs) >= 4 {
			want := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
			if want > 64<<10 {
				return nil, "", errors.New("client hello: too long")
			}
			if len(hs) >= want {
				sni, err := parseClientHelloSNI(hs[:want])
				return raw, sni, err
			}
		}
		if len(raw) > 64<<10 {
			return nil, "", errors.New("client hello: too long")
		}
	}
}

// parseClientHelloSNI parses a ClientHello handshake message (RFC 8446
// 4.1.2) and returns its server_name (RFC 6066 3), canonicalised like a
// CONNECT host.
func parseClientHelloSNI(m []byte) (string, error) {
	bad := func(what string) (string, error) { return "", errors.New("client hello: " + what) }
	p := cursor(m)
	typ, ok := p.u8()
	if !ok || typ != 1 {
		return bad("not a ClientHello")
	}
	body, ok := p.u24Bytes()
	if !ok || len(p) != 0 {
		return bad("bad handshake length")
	}
	if _, ok := body.bytes(2 + 32); !ok { // legacy_version, random
		return bad("truncated")
	}
	if _, ok := body.u8Bytes(); !ok { // legacy_session_id
		return bad("truncated session id")
	}
	if _, ok := body.u16Bytes(); !ok { // cipher_suites
		return bad("truncated cipher suites")
	}
	if _, ok := body.u8Bytes(); !ok { // legacy_compression_methods
		return bad("truncated compression methods")
	}
	exts, ok := body.u16Bytes()
	if !ok {
		return bad("no extensions")
	}
	var name string
	found := false
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.u16Bytes()
		if !ok1 || !ok2 {
			return bad("truncated extension")
		}
		if typ != 0 {
			continue
		}
		if found {
			return bad("two server_name extensions")
		}
		found = true
		list, ok := data.u16Bytes()
		if !ok || len(data) != 0 {
			return bad("malformed server_name")
		}
		for len(list) > 0 {
			nt, ok1 := list.u8()
			hn, ok2 := list.u16Bytes()
			if !ok1 || !ok2 {
				return bad("malformed server_name list")
			}
			if nt != 0 {
				continue
			}
			if name != "" {
				return bad("more than one host name in server_name")
			}
			if len(hn) == 0 {
				return bad("empty server name")
			}
			name = string(hn)
		}
	}
	if name == "" {
		return bad("no server name")
	}
	if strings.HasSuffix(name, ".") {
		return bad("server name ends in a dot (RFC 6066 3)")
	}
	host, _, err := guard.ParseAuthority(name, "443")
	if err != nil || strings.Contains(name, ":") {
		return bad("server name is not a host name")
	}
	return host, nil
}

// cursor reads big-endian fields off a byte slice.
type cursor []byte

func (c *cursor) bytes(n int) ([]byte, bool) {
	if n < 0 || len(*c) < n {
		return nil, false
	}
	b := (*c)[:n]
	*c = (*c)[n:]
	return b, true
}

func (c *cursor) u8() (int, bool) {
	b, ok := c.bytes(1)
	if !ok {
		return 0, false
	}
	return int(b[0]), true
}

func (c *cursor) u16() (int, bool) {
	b, ok := c.bytes(2)
	if !ok {
		return 0, false
	}
	return int(b[0])<<8 | int(b[1]), true
}

func (c *cursor) u8Bytes() (cursor, bool) {
	n, ok := c.u8()
	if !ok {
		return nil, false
	}
	b, ok := c.bytes(n)
	return b, ok
}

func (c *cursor) u16Bytes() (cursor, bool) {
	n, ok := c.u16()
	if !ok {
		return nil, false
	}
	b, ok := c.bytes(n)
	return b, ok
}

func (c *cursor) u24Bytes() (cursor, bool) {
	b, ok := c.bytes(3)
	if !ok {
		return nil, false
	}
	return c.bytes(int(b[0])<<16 | int(b[1])<<8 | int(b[2]))
}
