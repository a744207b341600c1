package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// strictValue is what the strict path gives a JSON document:
// encoding/json with UseNumber, then ast.InterfaceToValue.
func strictValue(raw []byte) (ast.Value, error) {
	if !json.Valid(raw) { // what json.Unmarshal refuses, trailing data included
		return nil, errors.New("not one valid JSON document")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return ast.InterfaceToValue(v)
}

// TestParseJSON: the one-pass parser gives the value encoding/json's
// decoding does, and refuses what it refuses.
func TestParseJSON(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"scalars", `[1, -0.5, 1e3, 2E-7, 0, true, false, null, "x"]`},
		{"number text kept", `{"a": 1.50, "b": 100000000000000000000001}`},
		{"escapes", `{"k\n": "a\"b\\c\/d\u00e9\ud83d\ude00"}`},
		{"lone surrogate", `"\ud800x"`},
		{"invalid utf-8 becomes U+FFFD", "\"a\xffb\""},
		{"repeated key keeps the last", `{"a": 1, "b": 2, "a": 3}`},
		{"repeated key, large object", `{"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1,"i":1,"j":1,"k":1,"l":1,"m":1,"n":1,"o":1,"p":1,"q":1,"a":2}`},
		{"nested", ` { "a" : [ { } , [ ] , { "b" : [ 1 ] } ] } `},
		{"empty string key", `{"": ""}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := strictValue([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseJSON([]byte(tc.doc))
			if err != nil {
				t.Fatalf("ParseJSON: %v", err)
			}
			if got.Compare(want) != 0 || got.String() != want.String() {
				t.Fatalf("ParseJSON = %v, want %v", got, want)
			}
		})
	}
	for _, doc := range []string{``, `{`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `01`, `1.`, `-`, `1e`, `"a`, "\"a\tb\"", `"\x"`,
		`tru`, `nul`, `{} {}`, `[1] x`, `{1: 2}`, `+1`, `.5`, strings.Repeat("[", 10001) + strings.Repeat("]", 10001)} {
		if _, serr := strictValue([]byte(doc)); serr == nil {
			t.Fatalf("%q: encoding/json accepts it: a bad case", doc)
		}
		if v, err := ParseJSON([]byte(doc)); err == nil {
			t.Errorf("ParseJSON(%.40q) = %.40v, want an error", doc, v)
		}
	}
}

// FuzzParseJSON: on any bytes the two parsers agree on acceptance and value.
func FuzzParseJSON(f *testing.F) {
	f.Add([]byte(`{"a":[1,"b",null,{"c":true}]}`))                                             // every kind of value
	f.Add([]byte(`"\u00e9\ud83d\ude00"`))                                                      // escapes and a surrogate pair
	f.Add([]byte("\"\xff\""))                                                                  // invalid UTF-8
	f.Add([]byte(`{"a":1,"a":2}`))                                                             // a repeated key
	f.Add([]byte(`-0.0e+00`))                                                                  // number grammar
	f.Add([]byte(`{"x":{"y":[1,"\u0041"]},"input":{"caller":{"a":1},"args":[]},"a":2,"a":3}`)) // skipped, input and repeated fields
	f.Fuzz(func(t *testing.T, doc []byte) {
		want, serr := strictValue(doc)
		got, err := ParseJSON(doc)
		if (serr == nil) != (err == nil) {
			t.Fatalf("%q: encoding/json error %v, ParseJSON error %v", doc, serr, err)
		}
		if err == nil && got.Compare(want) != 0 {
			t.Fatalf("%q: ParseJSON = %v, want %v", doc, got, want)
		}
		// ParseObjectFields accepts exactly the objects (and null), and
		// gives their values as ParseJSON does.
		fs, ferr := ParseObjectFields(doc, []string{"a", "input"}, "input")
		obj, isObj := want.(ast.Object)
		_, isNull := want.(ast.Null)
		if (serr == nil && (isObj || isNull)) != (ferr == nil) {
			t.Fatalf("%q: encoding/json error %v (value %T), ParseObjectFields error %v", doc, serr, want, ferr)
		}
		if ferr == nil && isObj {
			for i, k := range []string{"a", "input"} {
				w := obj.Get(ast.StringTerm(k))
				if (w == nil) != (fs[i] == nil) || w != nil && w.Value.Compare(fs[i].Value) != 0 {
					t.Fatalf("%q: field %s = %v, want %v", doc, k, fs[i], w)
				}
			}
		}
	})
}

// recordedInputs are inputs as the gateway records them (json.Marshal
// after Decide filled the findings), in the shapes that occur.
func recordedInputs() []*Input {
	at := time.Date(2026, 11, 1, 10, 2, 3, 456789000, time.UTC)
	return []*Input{
		{Version: InputVersion, Kind: "tool_call", Caller: Caller{Sandbox: "sb", Agent: "a", Session: "s", User: "u"},
			Connector: "billing", Tool: "billing.create_refund",
			Operation: Operation{ID: "createRefund", Method: "POST", Path: "/refunds", Risk: "write"}, // nil tags
			Args: map[string]any{"body": map[string]any{"amount": json.Number("1200.50"), "note": "é \"quoted\"", "key": "AKIAABCDEFGHIJKLMNOP"},
				"path": map[string]any{}, "query": map[string]any{"q": []any{"x", json.Number("1")}}, "headers": map[string]any{}},
			Request: Request{Method: "POST", Host: "billing.example.com", Path: "/refunds"}, // nil query, headers
			Time:    at},
		{Version: InputVersion, Kind: "http", Caller: Caller{Agent: "a"},
			Operation: Operation{Tags: []string{}},
			Request: Request{Method: "GET", Host: "pypi.org", Port: 443, Path: "/simple/", Query: map[string][]string{"a": {"1", "2"}},
				Headers: map[string][]string{"Accept": {"*/*"}}, Body: "token=ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"},
			Time: at.In(time.FixedZone("CET", 3600))}, // recorded in another zone: decided in UTC
		{Version: InputVersion, Kind: "connect", Request: Request{Host: "example.com", Port: 8443, Query: map[string][]string{}, Headers: map[string][]string{}},
			Envoy: json.RawMessage(`{"attributes":{"request":{"http":{"method":"CONNECT"}}}}`),
			Time:  at},
		{Version: InputVersion, Kind: "tool_call", Tool: "t.x", Args: nil, Operation: Operation{Tags: []string{"a", "b"}}, Time: at},
	}
}

// TestParsedInputMatchesDecide: for every recorded shape, the fast path's
// value is exactly the value Decide builds from the strictly decoded
// input, and the engine decides both alike.
func TestParsedInputMatchesDecide(t *testing.T) {
	ctx := context.Background()
	eng, err := New(ctx, Config{Rules: []Rule{{Match: "billing.*", Action: "ask", Approvers: []string{"group:finance"}}, {Match: "*", Action: "allow"}},
		Egress: map[string][]string{"a": {"pypi.org"}}})
	if err != nil {
		t.Fatal(err)
	}
	for i, in := range recordedInputs() {
		eng.Decide(ctx, in) // fills the findings, as the gateway's decision does before the record
		raw, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		strict, err := DecodeInput(raw)
		if err != nil {
			t.Fatal(err)
		}
		want, err := inputValue(strict)
		if err != nil {
			t.Fatal(err)
		}
		p, err := InputFromJSON(raw)
		if err != nil {
			t.Fatalf("input %d (%s): %v\n%s", i, in.Kind, err, raw)
		}
		if p.value.Compare(want) != 0 {
			t.Fatalf("input %d (%s):\nfast   %v\nstrict %v", i, in.Kind, p.value, want)
		}
		if p.Kind != strict.Kind || p.Tool != strict.Tool {
			t.Fatalf("input %d: kind/tool %q/%q, want %q/%q", i, p.Kind, p.Tool, strict.Kind, strict.Tool)
		}
		if d1, d2 := eng.DecideParsed(ctx, p), eng.Decide(ctx, strict); d1.Action != d2.Action || d1.Rule != d2.Rule || d1.Reason != d2.Reason || d1.Revision != d2.Revision {
			t.Fatalf("input %d: DecideParsed %+v, Decide %+v", i, d1, d2)
		}
	}
	// A finding reaches policy on the fast path too.
	raw, _ := json.Marshal(func() *Input { in := recordedInputs()[0]; eng.Decide(ctx, in); return in }())
	p, err := InputFromJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	if f := p.value.(ast.Object).Get(ast.StringTerm("findings")); f == nil || f.Value.(*ast.Array).Len() == 0 {
		t.Fatalf("the AWS key in the arguments is not a finding: %v", f)
	}
}

// TestInputFromJSONNotCanonical: anything but the recorded shape is left
// to the strict path, never decided on a guess.
func TestInputFromJSONNotCanonical(t *testing.T) {
	in := recordedInputs()[0]
	in.Findings = []Finding{}
	good, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InputFromJSON(good); err != nil {
		t.Fatalf("the recorded shape: %v", err)
	}
	var base map[string]any
	if err := json.Unmarshal(good, &base); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
	}{
		{"unknown field", func(m map[string]any) { m["extra"] = 1 }},
		{"unknown nested field", func(m map[string]any) { m["caller"].(map[string]any)["role"] = "admin" }},
		{"missing field", func(m map[string]any) { delete(m, "tool") }},
		{"findings not scanned (null)", func(m map[string]any) { m["findings"] = nil }},
		{"string field null", func(m map[string]any) { m["tool"] = nil }},
		{"wrong type", func(m map[string]any) { m["version"] = "1" }},
		{"other version", func(m map[string]any) { m["version"] = 2 }},
		{"unknown kind", func(m map[string]any) { m["kind"] = "smtp" }},
		{"zero time", func(m map[string]any) { m["time"] = "0001-01-01T00:00:00Z" }},
		{"bad time", func(m map[string]any) { m["time"] = "yesterday" }},
		{"port 0", func(m map[string]any) { m["request"].(map[string]any)["port"] = 0 }},
		{"empty body", func(m map[string]any) { m["request"].(map[string]any)["body"] = "" }},
		{"null header values", func(m map[string]any) { m["request"].(map[string]any)["headers"] = map[string]any{"A": nil} }},
		{"usage", func(m map[string]any) { m["usage"] = map[string]any{} }},
		{"envoy null", func(m map[string]any) { m["envoy"] = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]any{}
			b, _ := json.Marshal(base)
			_ = json.Unmarshal(b, &m)
			tc.edit(m)
			raw, _ := json.Marshal(m)
			if p, err := InputFromJSON(raw); !errors.Is(err, ErrNotCanonical) {
				t.Fatalf("InputFromJSON = %v, %v; want ErrNotCanonical", p, err)
			}
		})
	}
	if _, err := InputFromJSON([]byte(`{"version":`)); err == nil || errors.Is(err, ErrNotCanonical) {
		t.Fatalf("malformed JSON: %v, want a parse error", err)
	}
}
