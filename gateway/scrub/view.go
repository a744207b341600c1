package scrub

import (
	"bytes"
	"math"
	"sort"
	"unicode/utf8"
)

// view is a decoding of a body: text, and for each byte of text the offset
// in the body of the escape it was decoded from. Every decoder here turns
// each piece of input (an escape, or one plain byte) into at least one
// byte of output, in order, so the pieces are contiguous: a piece ends
// where the next one starts.
type view struct {
	text []byte
	src  []int32
	n    int  // length of the body
	json bool // the JSON-escape decoding of the body itself
}

// origin maps the match [from, to) of v.text to the bytes of the body it
// was decoded from, widened to whole escapes.
func (v *view) origin(from, to int) (int, int) {
	start := int(v.src[from])
	last := v.src[to-1]
	m := to
	for m < len(v.src) && v.src[m] == last {
		m++ // more bytes of the same escape (a multi-byte rune)
	}
	if m == len(v.src) {
		return start, v.n
	}
	return start, int(v.src[m])
}

// decoder decodes the escape at b[i:], if one starts there, appending its
// bytes to dst and returning how many input bytes it took (0: none).
type decoder func(dst, b []byte, i int) ([]byte, int)

// decode builds the view of b under dec.
func decode(b []byte, dec decoder) *view {
	v := &view{text: make([]byte, 0, len(b)), src: make([]int32, 0, len(b)), n: len(b)}
	for i := 0; i < len(b); {
		before := len(v.text)
		var took int
		v.text, took = dec(v.text, b, i)
		if took == 0 {
			v.text, took = append(v.text, b[i]), 1
		}
		for range len(v.text) - before {
			v.src = append(v.src, int32(i))
		}
		i += took
	}
	return v
}

// compose maps a view of outer.text back to outer's body.
func compose(inner, outer *view) *view {
	for k, s := range inner.src {
		inner.src[k] = outer.src[s]
	}
	inner.n = outer.n
	return inner
}

// views returns the decoded views of b worth searching: only the decoders
// whose escape character occurs in b.
func views(b []byte) []*view {
	if len(b) > math.MaxInt32 {
		return nil
	}
	var out []*view
	if bytes.IndexByte(b, '\\') >= 0 {
		j := decode(b, jsonEscape)
		j.json = true
		out = append(out, j)
		if bytes.IndexByte(j.text, '%') >= 0 {
			out = append(out, compose(decode(j.text, percentEscape), j))
		}
	}
	if bytes.IndexByte(b, '%') >= 0 {
		out = append(out, decode(b, percentEscape))
	}
	if bytes.IndexByte(b, '&') >= 0 {
		out = append(out, decode(b, htmlReference))
	}
	return out
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// hex4 parses the four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		d, ok := unhex(c)
		if !ok {
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

// jsonEscape decodes a JSON string escape (RFC 8259 section 7), a UTF-16
// surrogate pair as one rune; a lone surrogate becomes U+FFFD, as
// encoding/json decodes it.
func jsonEscape(dst, b []byte, i int) ([]byte, int) {
	if b[i] != '\\' || i+1 >= len(b) {
		return dst, 0
	}
	switch c := b[i+1]; c {
	case '"', '\\', '/':
		return append(dst, c), 2
	case 'b':
		return append(dst, '\b'), 2
	case 'f':
		return append(dst, '\f'), 2
	case 'n':
		return append(dst, '\n'), 2
	case 'r':
		return append(dst, '\r'), 2
	case 't':
		return append(dst, '\t'), 2
	case 'u':
		r, ok := hex4(b, i+2)
		if !ok {
			return dst, 0
		}
		if 0xD800 <= r && r < 0xDC00 && i+11 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
			if lo, ok := hex4(b, i+8); ok && 0xDC00 <= lo && lo < 0xE000 {
				return utf8.AppendRune(dst, 0x10000+(r-0xD800)<<10+(lo-0xDC00)), 12
			}
		}
		if 0xD800 <= r && r < 0xE000 {
			r = utf8.RuneError
		}
		return utf8.AppendRune(dst, r), 6
	}
	return dst, 0
}

// percentEscape decodes %XX in either case (RFC 3986 section 2.1).
func percentEscape(dst, b []byte, i int) ([]byte, int) {
	if b[i] != '%' || i+2 >= len(b) {
		return dst, 0
	}
	hi, ok1 := unhex(b[i+1])
	lo, ok2 := unhex(b[i+2])
	if !ok1 || !ok2 {
		return dst, 0
	}
	return append(dst, hi<<4|lo), 3
}

// htmlNamed are the character references an HTML escaper writes.
var htmlNamed = []struct {
	name string
	c    byte
}{{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}}

// htmlReference decodes an HTML character reference: the named ones
// escapers write, and numeric ones, decimal or hex, with or without the
// closing ';' (browsers accept both; WHATWG HTML 13.2.5.72).
func htmlReference(dst, b []byte, i int) ([]byte, int) {
	if b[i] != '&' {
		return dst, 0
	}
	for _, n := range htmlNamed {
		if bytes.HasPrefix(b[i:], []byte(n.name)) {
			return append(dst, n.c), len(n.name)
		}
	}
	j := i + 1
	if j >= len(b) || b[j] != '#' {
		return dst, 0
	}
	j++
	base := rune(10)
	if j < len(b) && (b[j] == 'x' || b[j] == 'X') {
		base, j = 16, j+1
	}
	var r rune
	digits := 0
	for ; j < len(b) && digits < 8; j++ {
		d, ok := unhex(b[j])
		if !ok || rune(d) >= base {
			break
		}
		r = r*base + rune(d)
		digits++
	}
	if digits == 0 || r > utf8.MaxRune {
		return dst, 0
	}
	if j < len(b) && b[j] == ';' {
		j++
	}
	if !utf8.ValidRune(r) {
		r = utf8.RuneError
	}
	return utf8.AppendRune(dst, r), j - i
}

// widen grows each span to whole pieces of v (escapes stay whole): a
// match found in another view that starts or ends inside a JSON escape
// (a hex-looking secret right after \u) would otherwise leave half an escape
// behind and break the document.
func (v *view) widen(spans []span) {
	starts := make([]int32, 0, len(v.src))
	for k, s := range v.src {
		if k == 0 || s != v.src[k-1] {
			starts = append(starts, s)
		}
	}
	for i := range spans {
		k := sort.Search(len(starts), func(x int) bool { return int(starts[x]) > spans[i].from }) - 1
		if k >= 0 {
			spans[i].from = int(starts[k])
		}
		k = sort.Search(len(starts), func(x int) bool { return int(starts[x]) >= spans[i].to })
		if k < len(starts) {
			spans[i].to = int(starts[k])
		} else {
			spans[i].to = v.n
		}
	}
}
