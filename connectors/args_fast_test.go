package connectors

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// decodeArgsSlow is DecodeArgs without its fast path: encoding/json's
// reading of the document, the reference fastArgs is held to.
func decodeArgsSlow(data []byte) (Args, error) {
	return decodeArgs(data, false)
}

// A document fastArgs decodes, encoding/json decodes to the same values;
// one it leaves alone, DecodeArgs decodes as before.
func FuzzFastArgsMatchesDecoder(f *testing.F) {
	for _, s := range fastArgsCases {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFastArgs(t, data)
	})
}

// fastArgsCases are documents on both sides of what the fast path takes.
var fastArgsCases = []string{
	`{}`, ` { } `, `{"body":null}`, `{"path":null,"query":null,"headers":null,"body":null}`,
	`{"path":{"petId":"1"},"query":{"a":[1,2]},"headers":{"X-A":"b"},"body":{"n":-0.5e+3,"t":true,"f":false,"z":null,"s":"x","a":[],"o":{}}}`,
	`{"body":"tab\tescaped \" \\ \/ \b \f \n \r \t end"}`, `{"body":"\u00e9"}`, `{"body":"\ud800"}`, `{"body":"a\u0000b"}`,
	`{"body":"raw` + "\x01" + `control"}`, `{"body":"\x"}`, `{"body":"unterminated}`,
	`{"body":{"a":1,"a":2}}`, `{"body":1,"body":2}`, `{"path":1}`, `{"other":1}`, `{"path":[]}`,
	`{"body":1e400}`, `{"body":-}`, `{"body":01}`, `{"body":1.}`, `{"body":.5}`, `{"body":1e}`, `{"body":+1}`, `{"body":-0}`, `{"body":0.0e-0}`,
	`{"body":tru}`, `{"body":nul}`, `{"body":truex}`, `{"body":[1,]}`, `{"body":{"a":1,}}`, `{"body":[1 2]}`, `{"body":1,}`,
	`{"path":{}} trailing`, `{"path":{}}{}`, `[]`, `"s"`, `1`, ``, `{`, `{"body"`, `{"body":`, `{"body":[`,
	`{"body":` + strings.Repeat("[", 63) + strings.Repeat("]", 63) + `}`,
	`{"body":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`,
	`{"body":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`,
	"{\"body\":\"\u2028\"}", "{\"body\":\"é\"}", "{\n\t\"body\" :\r 1 \n}",
}

func TestFastArgsCases(t *testing.T) {
	taken := 0
	for _, s := range fastArgsCases {
		if checkFastArgs(t, []byte(s)) {
			taken++
		}
	}
	// The cases exercise both sides: the fast path must take the plain
	// documents, or it is no faster than encoding/json.
	for _, s := range []string{`{}`, `{"body":null}`, fastArgsCases[4], fastArgsCases[5], `{"body":-0}`, fastArgsCases[len(fastArgsCases)-5]} {
		if _, ok := fastArgs([]byte(s)); !ok {
			t.Errorf("fastArgs left %q to encoding/json", s)
		}
	}
	if taken == 0 || taken == len(fastArgsCases) {
		t.Errorf("fastArgs took %d of %d cases, want some and not all", taken, len(fastArgsCases))
	}
}

// checkFastArgs holds fastArgs to encoding/json on data and says whether
// the fast path took it.
func checkFastArgs(t *testing.T, data []byte) bool {
	t.Helper()
	want, wantErr := decodeArgsSlow(data)
	got, gotErr := DecodeArgs(data)
	if !reflect.DeepEqual(errString(gotErr), errString(wantErr)) || !reflect.DeepEqual(got, want) {
		t.Fatalf("DecodeArgs(%q) = %#v, %v; encoding/json gives %#v, %v", data, got, gotErr, want, wantErr)
	}
	if len(data) > MaxArgsBytes || !utf8Valid(data) {
		return false
	}
	fast, ok := fastArgs(data)
	if !ok {
		return false
	}
	if wantErr != nil {
		t.Fatalf("fastArgs took %q, which encoding/json refuses: %v", data, wantErr)
	}
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("fastArgs(%q) = %#v, encoding/json gives %#v", data, fast, want)
	}
	// The same values encode the same: nothing is told apart by type.
	a, _ := json.Marshal(fast)
	b, _ := json.Marshal(want)
	if !bytes.Equal(a, b) {
		t.Fatalf("fastArgs(%q) encodes as %s, encoding/json's as %s", data, a, b)
	}
	return true
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func utf8Valid(b []byte) bool { return utf8.Valid(b) }

// BenchmarkDecodeArgs is section 1's tool-call arguments, decoded with the
// fast path and with encoding/json alone.
func BenchmarkDecodeArgs(b *testing.B) {
	doc := []byte(`{"body":{"name":"widget","amount":250,"currency":"EUR","note":"bench","tags":["a","b","c"],"lines":[{"sku":"w-1","qty":2},{"sku":"w-2","qty":1}]}}`)
	for _, fast := range []bool{true, false} {
		name := "encoding-json"
		if fast {
			name = "fast"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodeArgs(doc, fast); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
