package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

const (
	apiKey = "sk_live_51H+x/y=z&q?k"   // has characters every encoding changes
	user   = "alice"                   //
	pass   = "hunter2-correct-horse"   //
	token  = "ghp_0123456789abcdefXYZ" // plain token
)

func TestBytesForms(t *testing.T) {
	s := New([]byte(apiKey), []byte(user+":"+pass), []byte(pass), []byte(token))
	r := Replacement
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"raw", "key=" + apiKey + ";", "key=" + r + ";"},
		{"raw twice", apiKey + " and " + apiKey, r + " and " + r},
		{"base64 std padded", "x " + base64.StdEncoding.EncodeToString([]byte(apiKey)) + " y", "x " + r + " y"},
		{"base64 std raw", "x " + base64.RawStdEncoding.EncodeToString([]byte(apiKey)) + " y", "x " + r + " y"},
		{"base64 url padded", "x " + base64.URLEncoding.EncodeToString([]byte(apiKey)) + " y", "x " + r + " y"},
		{"base64 url raw", "x " + base64.RawURLEncoding.EncodeToString([]byte(apiKey)) + " y", "x " + r + " y"},
		{"basic auth header echoed", "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass)), "Authorization: Basic " + r},
		{"password alone", "pw was " + pass, "pw was " + r},
		{"query escape", "?k=" + url.QueryEscape(apiKey) + "&x=1", "?k=" + r + "&x=1"},
		{"path escape", "/keys/" + url.PathEscape(apiKey) + "/x", "/keys/" + r + "/x"},
		{"query escape lower hex", "?k=sk_live_51H%2bx%2fy%3dz%26q%3fk", "?k=" + r},
		{"hex lower", "h=" + hex.EncodeToString([]byte(token)), "h=" + r},
		{"hex upper", "h=" + strings.ToUpper(hex.EncodeToString([]byte(token))), "h=" + r},
		{"json escaped", `{"echo":"sk_live_51H+x\/y=z\u0026q?k"}`, `{"echo":"` + r + `"}`},
		{"json go escaped", `{"echo":"sk_live_51H+x/y=z\u0026q?k"}`, `{"echo":"` + r + `"}`},
		{"plain token in json", `{"t":"` + token + `"}`, `{"t":"` + r + `"}`},
		{"nothing", "just some ordinary text sk_live_ and ghp_ prefixes", "just some ordinary text sk_live_ and ghp_ prefixes"},
		{"adjacent", token + token, r + r},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found := s.String(tt.in)
			if got != tt.want {
				t.Errorf("String(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if wantFound := tt.in != tt.want; found != wantFound {
				t.Errorf("found = %v, want %v", found, wantFound)
			}
		})
	}
}

// TestEmbeddedBase64 checks the secret is found inside longer base64 at
// each of the three byte alignments, and that no secret byte survives.
func TestEmbeddedBase64(t *testing.T) {
	s := New([]byte(pass))
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for prefix := range 6 {
			name := fmt.Sprintf("%p/prefix%d", enc, prefix)
			t.Run(name, func(t *testing.T) {
				blob := append(bytes.Repeat([]byte{'u'}, prefix), []byte(":"+pass+"@tail")...)
				in := "data=" + enc.EncodeToString(blob)
				got, found := s.String(in)
				if !found || !strings.Contains(got, Replacement) {
					t.Fatalf("secret at offset %d of base64 blob not found: %q", prefix+1, got)
				}
				// What is left of the blob must not decode to text containing
				// any 8-byte run of the secret.
				rest := strings.ReplaceAll(strings.TrimPrefix(got, "data="), Replacement, "")
				if strings.Contains(rest, enc.EncodeToString([]byte(pass))[:8]) {
					t.Fatalf("encoded secret survives in %q", got)
				}
			})
		}
	}
}

func TestShortAndEmptySecrets(t *testing.T) {
	s := New(nil, []byte(""), []byte("abc"), []byte("abcd"))
	if got := s.Ignored(); got != 1 {
		t.Fatalf("Ignored() = %d, want 1 (only \"abc\")", got)
	}
	if got, found := s.String("abc abcd"); got != "abc "+Replacement || !found {
		t.Fatalf("String = %q, %v", got, found)
	}
	var nilS *Scrubber
	if got, found := nilS.String("abcd"); got != "abcd" || found {
		t.Fatalf("nil Scrubber: %q, %v", got, found)
	}
	empty := New()
	if got, found := empty.Bytes([]byte("abcd")); string(got) != "abcd" || found {
		t.Fatalf("empty Scrubber: %q, %v", got, found)
	}
}

func TestNoFalsePositives(t *testing.T) {
	s := New([]byte(apiKey), []byte(user+":"+pass), []byte(pass), []byte(token))
	// Unrelated text, and random base64, hex and bytes that do not contain
	// any of the secrets.
	rng := rand.New(rand.NewPCG(1, 2))
	raw := make([]byte, 64<<10)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	inputs := map[string][]byte{
		"prose":  []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 500)),
		"random": raw,
		"base64": []byte(base64.StdEncoding.EncodeToString(raw)),
		"hex":    []byte(hex.EncodeToString(raw)),
	}
	for name, in := range inputs {
		t.Run(name, func(t *testing.T) {
			got, found := s.Bytes(in)
			if found || !bytes.Equal(got, in) {
				t.Fatalf("false positive on %s input", name)
			}
		})
	}
}

func TestBytesDoesNotModifyInput(t *testing.T) {
	s := New([]byte(token))
	in := []byte("a " + token + " b")
	orig := string(in)
	out, found := s.Bytes(in)
	if !found || string(in) != orig || string(out) != "a "+Replacement+" b" {
		t.Fatalf("Bytes: in %q out %q found %v", in, out, found)
	}
}

func TestReplacementNotRescanned(t *testing.T) {
	// A secret that occurs inside the replacement text must not loop or
	// re-match what was already replaced.
	s := New([]byte("redacted"), []byte("sluice]"))
	got, found := s.String("x redacted y")
	if !found || got != "x "+Replacement+" y" {
		t.Fatalf("got %q, %v", got, found)
	}
}

func TestHeader(t *testing.T) {
	s := New([]byte(token), []byte(user+":"+pass))
	h := http.Header{
		"X-Echo":           {"got " + token},
		"Www-Authenticate": {"Basic realm=x", "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))},
		"Content-Type":     {"application/json"},
	}
	if !s.Header(h) {
		t.Fatal("Header found nothing")
	}
	if got := h.Get("X-Echo"); got != "got "+Replacement {
		t.Errorf("X-Echo = %q", got)
	}
	if got := h.Values("Www-Authenticate"); got[0] != "Basic realm=x" || got[1] != "Basic "+Replacement {
		t.Errorf("Www-Authenticate = %q", got)
	}
	if got := h.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type changed to %q", got)
	}
	clean := http.Header{"A": {"nothing here"}}
	if s.Header(clean) || clean.Get("A") != "nothing here" {
		t.Error("Header reported or changed a clean header")
	}
}

func ExampleScrubber_String() {
	s := New([]byte("alice:hunter2-pw"), []byte("hunter2-pw"))
	out, found := s.String("Authorization: Basic YWxpY2U6aHVudGVyMi1wdw== password=hunter2-pw")
	fmt.Println(out, found)
	// Output:
	// Authorization: Basic [redacted-by-sluice] password=[redacted-by-sluice] true
}

func body64K(withSecret bool) []byte {
	rng := rand.New(rand.NewPCG(3, 4))
	b := make([]byte, 0, 64<<10)
	for len(b) < 64<<10-100 {
		b = append(b, fmt.Sprintf(`{"id":%d,"name":"item-%x","ok":true},`, rng.IntN(1e6), rng.Uint32())...)
	}
	if withSecret {
		b = append(b, token...)
	}
	return b
}

var benchSecrets = [][]byte{[]byte(apiKey), []byte(user + ":" + pass), []byte(token)}

// BenchmarkBytes is the no-match path on a 64 KiB body with 3 secrets (all
// forms); compare with BenchmarkContainsBaseline for the ratio.
func BenchmarkBytes(b *testing.B) {
	s := New(benchSecrets...)
	body := body64K(false)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, found := s.Bytes(body); found {
			b.Fatal("unexpected match")
		}
	}
}

func BenchmarkBytesMatch(b *testing.B) {
	s := New(benchSecrets...)
	body := body64K(true)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, found := s.Bytes(body); !found {
			b.Fatal("no match")
		}
	}
}

// BenchmarkContainsBaseline looks for the 3 raw secrets only.
func BenchmarkContainsBaseline(b *testing.B) {
	body := body64K(false)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		for _, sec := range benchSecrets {
			if bytes.Contains(body, sec) {
				b.Fatal("unexpected match")
			}
		}
	}
}

// FuzzBytes checks that scrubbing never panics, reports found exactly when
// it changed something, and leaves no raw secret behind.
func FuzzBytes(f *testing.F) {
	f.Add([]byte("hunter2-pw"), []byte("x hunter2-pw y"))           // raw
	f.Add([]byte("alice:pw12"), []byte("Basic YWxpY2U6cHcxMg=="))   // base64
	f.Add([]byte("a/b+c=d&e"), []byte("q=a%2Fb%2Bc%3Dd%26e"))       // query escape
	f.Add([]byte("abc"), []byte("abc"))                             // too short
	f.Add([]byte("longer-secret-1"), []byte("zzlongerxsecret-1zz")) // near miss
	f.Fuzz(func(t *testing.T, secret, body []byte) {
		s := New(secret)
		out, found := s.Bytes(body)
		if found == bytes.Equal(out, body) && !(found && bytes.Contains(body, []byte(Replacement))) {
			t.Fatalf("found = %v but output equal to input = %v", found, bytes.Equal(out, body))
		}
		if len(secret) < MinLen || bytes.ContainsAny(secret, Replacement) {
			return // the replacement text itself could rebuild such a secret
		}
		if bytes.Contains(out, secret) {
			t.Fatalf("secret %q survives in %q", secret, out)
		}
	})
}
