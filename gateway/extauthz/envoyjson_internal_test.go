package extauthz

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"unicode/utf8"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/sluice-gw/sluice/policy"
)

// TestEnvoyJSONMatchesMarshal: EnvoyJSON is json.Marshal of EnvoyInput,
// byte for byte (the recorded input keeps its content), and the value
// policy parses from it is the one ast.InterfaceToValue made of the map
// (the decision is unchanged), for the fixtures and for strings that
// encoding/json escapes: quotes, controls, <, >, &, U+2028, invalid
// UTF-8, non-ASCII, in headers, path, query and JSON and form bodies.
func TestEnvoyJSONMatchesMarshal(t *testing.T) {
	type tc struct {
		cr  *authv3.CheckRequest
		r   *Request
		bad bool // a string in it is not UTF-8
	}
	var cases []tc
	for _, cr := range fixtures(t) {
		r, err := Parse(cr)
		if err != nil {
			r = &Request{Path: cr.GetAttributes().GetRequest().GetHttp().GetPath()}
		}
		cases = append(cases, tc{cr, r, false})
	}
	odd := []string{`a"b\c`, "tab\there\nnl\x01\x7f", "<script>&amp;</script>", "line\u2028sep\u2029", "bad\xffutf8\xc3", "日本語 é", "", "{}"}
	for i, s := range odd {
		h := map[string]string{":method": "POST", "x-odd": s, "content-type": "application/json"}
		cr := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			ContextExtensions: map[string]string{"sandbox": s, "agent": "a"},
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: "POST", Path: "/x/" + url.PathEscape(s), Host: "h.test", Headers: h, Body: s}},
		}}
		body := []byte(`{"b":"` + s + `","n":[1,2.50,-3e2,{"z":null,"a":true}],"u":"\u2028<&>"}`)
		if i%2 == 1 {
			body = []byte(`{"dup":1,"dup":2,"s":` + string(must(json.Marshal(s))) + `}`)
		}
		r := &Request{Path: "/x/" + url.PathEscape(s), Query: url.Values{s: {s, "2"}, "k": {}}, Headers: http.Header{"Content-Type": {"application/json"}}, Body: body}
		cases = append(cases, tc{cr, r, !utf8.ValidString(s)})
		form := &Request{Path: "/f", Headers: http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, Body: []byte("a=" + url.QueryEscape(s) + "&b=1&b=2")}
		cases = append(cases, tc{cr, form, !utf8.ValidString(s)})
	}
	for i, c := range cases {
		m, err := EnvoyInput(c.cr, c.r)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		got, err := EnvoyJSON(c.cr, c.r)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("case %d: EnvoyJSON differs from json.Marshal (%v)\ngot  %s\nwant %s", i, err, got, want)
		}
		pv, err := policy.ParseJSON(got)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		// A string that is not UTF-8 (a path or query escape such as %FF;
		// protobuf refuses it in the attributes) reaches policy as the record has it, with U+FFFD, so that the
		// recorded input decides the same on replay; every other value
		// is the map's.
		var mv any = m
		if c.bad {
			d := json.NewDecoder(bytes.NewReader(want))
			d.UseNumber()
			if err := d.Decode(&mv); err != nil {
				t.Fatal(err)
			}
		}
		iv, err := ast.InterfaceToValue(mv)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if pv.Compare(iv) != 0 {
			t.Fatalf("case %d: the parsed value differs from the map's\nparsed %v\nmap    %v", i, pv, iv)
		}
	}
}

func must[T any](b T, err error) T {
	if err != nil {
		panic(err)
	}
	return b
}

// BenchmarkEnvoyStage is input.envoy's share of a Check, the two ways in
// one run: "map" as it was (EnvoyInput, ast.InterfaceToValue for the
// decision, json.Marshal for the recorded input) and "json" as it is
// (EnvoyJSON, policy.ParseJSON, the recorded input's compaction of the
// bytes), on the test/bench request (a POST with a JSON body).
func BenchmarkEnvoyStage(b *testing.B) {
	body := []byte(`{"name":"widget","quantity":3,"tags":["a","b"],"note":"a 170-byte body much like the bench's, with some text in it","nested":{"k":"v","n":1.5}}`)
	cr := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/echo", Host: "127.0.0.1:8080", Scheme: "http", Protocol: "HTTP/1.1", RawBody: body,
			Headers: map[string]string{":authority": "127.0.0.1:8080", ":method": "POST", ":path": "/echo", ":scheme": "http",
				"content-type": "application/json", "content-length": "150", "x-request-id": "bench"},
		}},
		ContextExtensions: map[string]string{"sandbox": "sb-1", "agent": "agent-a", "session": "s-1", "user": "alice"},
	}}
	r, err := Parse(cr)
	if err != nil {
		b.Fatal(err)
	}
	for _, way := range []struct {
		name  string
		stage func() error
	}{
		{"map", func() error {
			m, _ := EnvoyInput(cr, r)
			return valueAndRecord(m, func() (ast.Value, error) { return ast.InterfaceToValue(m) })
		}},
		{"json", func() error {
			raw, _ := EnvoyJSON(cr, r)
			return valueAndRecord(raw, func() (ast.Value, error) { return policy.ParseJSON(raw) })
		}},
	} {
		b.Run(way.name, func(b *testing.B) {
			for b.Loop() {
				if err := way.stage(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// valueAndRecord is what a Check does with input.envoy: its value for
// the decision, and the recorded input's encoding of doc.
func valueAndRecord(doc any, value func() (ast.Value, error)) error {
	if _, err := value(); err != nil {
		return err
	}
	_, err := json.Marshal(doc)
	return err
}
