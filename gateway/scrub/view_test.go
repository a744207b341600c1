package scrub

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// jsonU spells every byte of s as a \u escape, with hex digits in the
// given case.
func jsonU(s string, upper bool) string {
	var b strings.Builder
	for _, r := range s {
		if r > 0xffff {
			r1, r2 := 0xD800+(r-0x10000)>>10, 0xDC00+(r-0x10000)&0x3ff
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			continue
		}
		f := `\u%04x`
		if upper {
			f = `\u%04X`
		}
		fmt.Fprintf(&b, f, r)
	}
	return b.String()
}

// pctAll percent-encodes every byte of s.
func pctAll(s string, upper bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if upper {
			fmt.Fprintf(&b, "%%%02X", s[i])
		} else {
			fmt.Fprintf(&b, "%%%02x", s[i])
		}
	}
	return b.String()
}

// pctAlternate percent-encodes every other byte of s, in alternating
// case: an encoder nobody wrote, which no fixed list of forms has.
func pctAlternate(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch i % 4 {
		case 0:
			fmt.Fprintf(&b, "%%%02X", s[i])
		case 2:
			fmt.Fprintf(&b, "%%%02x", s[i])
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// htmlDec spells every rune of s as a decimal reference, with or without
// the closing ';'.
func htmlDec(s string, semi bool) string {
	var b strings.Builder
	for _, r := range s {
		fmt.Fprintf(&b, "&#%d", r)
		if semi {
			b.WriteByte(';')
		}
	}
	return b.String()
}

// TestEncodedForms is THREATS D11: the reflected secret spelled the ways
// an error page, a logging endpoint or a JSON encoder writes it by
// accident. Each must be found, and what is left must not hold the secret
// in any form a decoder recovers.
func TestEncodedForms(t *testing.T) {
	const key = "sk_live_51H+x/y=z&q?k" // every encoding changes some of it
	const uni = "päss-wörd-✓-🔑-secret"  // 2-, 3- and 4-byte UTF-8
	r := Replacement
	tests := []struct {
		name, secret, in, want string
	}{
		{"upper case", key, "ERROR: BAD KEY " + strings.ToUpper(key), "ERROR: BAD KEY " + r},
		{"lower case", key, "key " + strings.ToLower(key) + ".", "key " + r + "."},
		{"json \\u every byte, lower hex (RFC 8259 7)", key, `{"k":"` + jsonU(key, false) + `"}`, `{"k":"` + r + `"}`},
		{"json \\u every byte, upper hex", key, `{"k":"` + jsonU(key, true) + `"}`, `{"k":"` + r + `"}`},
		{"json \\u mixed with plain bytes", key, `{"k":"sk\u005flive_51H+x\/y=z\u0026q?k"}`, `{"k":"` + r + `"}`},
		{"json \\u of non-ASCII and a surrogate pair", uni, `["` + jsonU(uni, false) + `"]`, `["` + r + `"]`},
		{"json \\u as an object key", key, `{"` + jsonU(key, true) + `":1}`, `{"` + r + `":1}`},
		{"json \\u inside a longer string", key, `{"m":"bad key: ` + jsonU(key, false) + ` (401)"}`, `{"m":"bad key: ` + r + ` (401)"}`},
		{"json \\u of the base64", key, `{"b":"` + jsonU(base64.StdEncoding.EncodeToString([]byte(key)), false) + `"}`, `{"b":"` + r + `"}`},
		{"json escaped '/' in std base64", key, `"` + strings.ReplaceAll(base64.StdEncoding.EncodeToString([]byte(key)), "/", `\/`) + `"`, `"` + r + `"`},
		{"full percent-encoding, upper hex (RFC 3986 2.1)", key, "/log?k=" + pctAll(key, true), "/log?k=" + r},
		{"full percent-encoding, lower hex", key, "/log?k=" + pctAll(key, false), "/log?k=" + r},
		{"percent-encoding of alternate bytes, alternate case", key, "k=" + pctAlternate(key) + "&x", "k=" + r + "&x"},
		{"url.PathEscape", key, "/keys/" + url.PathEscape(key) + "/x", "/keys/" + r + "/x"},
		{"url.QueryEscape of a secret with a space", "two words secret", "q=" + url.QueryEscape("two words secret"), "q=" + r},
		{"percent-encoding inside a JSON \\u escape", key, `"` + strings.ReplaceAll(pctAll(key, true), "%", `\u0025`) + `"`, `"` + r + `"`},
		{"html decimal references", key, "<p>" + htmlDec(key, true) + "</p>", "<p>" + r + "</p>"},
		{"html decimal references without ';'", key, "<p>" + htmlDec(key, false) + "</p>", "<p>" + r + "</p>"},
		{"html escaped (&amp;)", key, "<b>sk_live_51H+x/y=z&amp;q?k</b>", "<b>" + r + "</b>"},
		{"html hex references of non-ASCII", uni, "<p>p&#xe4;ss-w&#XF6;rd-&#x2713;-&#x1F511;-secret</p>", "<p>" + r + "</p>"},
		{"base64 std, upper-cased by an error page", key, "TOKEN " + strings.ToUpper(base64.StdEncoding.EncodeToString([]byte(key))), "TOKEN " + r},
		{"base64 url unpadded", key, "t=" + base64.RawURLEncoding.EncodeToString([]byte(key)), "t=" + r},
		{"hex, mixed case", key, "h=" + mixCase(fmt.Sprintf("%x", key)), "h=" + r},
		{"percent-encoded base64", key, "t=" + url.QueryEscape(base64.StdEncoding.EncodeToString([]byte(key))), "t=" + r},
		{"a lone \\ud800 does not stop the search", key, `"\ud800` + key + `"`, `"\ud800` + r + `"`},
		{"a hex-looking secret that starts inside a \\u escape", "abcd1234ef", `{"a":"\uabcd1234ef"}`, `{"a":"` + r + `"}`},
		{"control: a broken escape is left alone", key, `"\u00zz %g1 &#xZZ;"`, `"\u00zz %g1 &#xZZ;"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New([]byte(tt.secret))
			got, found := s.String(tt.in)
			if got != tt.want {
				t.Errorf("String(%q)\n = %q\nwant %q", tt.in, got, tt.want)
			}
			if want := tt.in != tt.want; found != want {
				t.Errorf("found = %v, want %v", found, want)
			}
			if json.Valid([]byte(tt.in)) && !json.Valid([]byte(got)) {
				t.Errorf("valid JSON became invalid: %q", got)
			}
			// Nothing a decoder recovers from the rest holds the secret.
			if again, f := s.String(got); f {
				t.Errorf("a second pass still finds the secret in %q (-> %q)", got, again)
			}
		})
	}
}

func mixCase(s string) string {
	b := []byte(s)
	for i := range b {
		if i%2 == 0 && 'a' <= b[i] && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	return string(b)
}

// TestJSONDecodedNotMatched checks the claim of TestEncodedForms from the
// other side: any JSON string that decodes to text holding the secret is
// scrubbed, whichever bytes the encoder chose to escape.
func TestJSONDecodedNotMatched(t *testing.T) {
	const key = "tok-A1b2C3d4E5f6"
	s := New([]byte(key))
	for mask := range 1 << 6 {
		var b strings.Builder
		b.WriteString(`{"v":"`)
		for i := 0; i < len(key); i++ {
			if mask>>(i%6)&1 == 1 {
				fmt.Fprintf(&b, `\u%04x`, key[i])
			} else {
				b.WriteByte(key[i])
			}
		}
		b.WriteString(`"}`)
		got, found := s.String(b.String())
		var v struct{ V string }
		if err := json.Unmarshal([]byte(got), &v); err != nil || !found || strings.Contains(v.V, key) {
			t.Fatalf("mask %06b: %q -> %q (found %v, err %v)", mask, b.String(), got, found, err)
		}
	}
}

// TestHeaderNames: a secret echoed as a header name goes with its field
// (Go's canonical form changed its case already).
func TestHeaderNames(t *testing.T) {
	const key = "abcd-secret-token"
	s := New([]byte(key))
	h := http.Header{}
	h.Set("X-"+key, "1")
	h.Set("X-Plain", "ok")
	if !s.Header(h) {
		t.Fatal("a secret in a header name was not found")
	}
	if len(h) != 1 || h.Get("X-Plain") != "ok" {
		t.Fatalf("header after scrubbing: %v", h)
	}
}
