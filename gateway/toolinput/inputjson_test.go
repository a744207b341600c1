package toolinput

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/policy"
)

// appendJSONCase is a tool call's input as toolinput builds it, with
// args decoded from doc and the strings s in every string field.
func appendJSONCase(doc []byte, s string) *policy.Input {
	in := &policy.Input{Version: 3, Kind: "tool_call", Caller: policy.Caller{Sandbox: "sb-" + s, Agent: "a", Session: s, User: "u<&>", Egress: "not recorded"},
		Connector: "c", Tool: "c.t" + s, Operation: policy.Operation{ID: s, Method: "POST", Path: "/x/{id}", Risk: "write", Tags: []string{s, "b"}},
		Request: policy.Request{Method: "POST", Host: "api.example", Path: "/x/" + s, Query: map[string][]string{"b": {s, "2"}, "a": nil, s: {}},
			Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: s},
		Time: time.Date(2026, 12, 2, 16, 30, 0, 123456789, time.FixedZone("x", 3600))}
	if a, err := connectors.DecodeArgs(doc); err == nil {
		in.Args = map[string]any{"path": orEmptyMap(a.Path), "query": orEmptyMap(a.Query), "headers": orEmptyMap(a.Headers), "body": a.Body}
	}
	return in
}

func orEmptyMap(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

func checkAppendJSON(t *testing.T, in *policy.Input) {
	t.Helper()
	want, werr := json.Marshal(in)
	got, ok := AppendJSON(nil, in)
	if !ok {
		return // encoded by json.Marshal instead
	}
	if werr != nil {
		t.Fatalf("AppendJSON encoded an input json.Marshal refuses (%v): %s", werr, got)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendJSON:\n%s\njson.Marshal:\n%s", got, want)
	}
}

func TestAppendJSONIsMarshal(t *testing.T) {
	body := []byte(`{"path":{"id":"7"},"query":{"q":["x",1.5e3,-0,true,null]},"headers":{"X-A":"<b>&"},"body":{"z":{},"a":[],"m":"\u2028é\ud800","n":-0.0}}`)
	for _, in := range []*policy.Input{
		appendJSONCase([]byte(`{"body":{"name":"widget","amount":250,"tags":["a","b"],"lines":[{"sku":"w-1","qty":2}]}}`), "plain"),
		appendJSONCase(body, "html <script>&'\"\\ \x00 \xff \u2029"),
		appendJSONCase([]byte(`{}`), ""),
		{}, // every zero value: nil maps and slices are null
		{Kind: "tool_call", Args: map[string]any{"body": json.Number("")}},   // Marshal's 0: left to it
		{Kind: "tool_call", Args: map[string]any{"body": json.Number("1x")}}, // Marshal refuses: left to it
		{Kind: "tool_call", Args: map[string]any{"body": 1.5}},               // not a decoded type: left to it
		{Kind: "tool_call", Args: []any(nil)},                                // typed nil
		{Kind: "tool_call", Args: map[string]any(nil)},                       // typed nil
		{Kind: "tool_call", Request: policy.Request{Port: 8443}, Operation: policy.Operation{Tags: []string{}}},
		{Kind: "tool_call", Usage: &policy.Usage{ApprovedBefore: true, Agent: policy.UsageWindows{Minute: policy.UsageWindow{Count: 2, Sum: 0.1}}}},
		{Kind: "http", Envoy: json.RawMessage(`{"a": 1}`)},  // left to json.Marshal
		{Kind: "tool_call", Findings: []policy.Finding{{}}}, // left to json.Marshal
		{Kind: "tool_call", Findings: []policy.Finding{}},
		{Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, // Marshal refuses the year
	} {
		checkAppendJSON(t, in)
	}
	// Tool calls, escapes and all, are encoded here, not left to json.Marshal.
	for _, in := range []*policy.Input{appendJSONCase([]byte(`{"body":{"a":1}}`), "x"), appendJSONCase(body, "<&>\xff\u2028")} {
		if in.Args == nil {
			t.Fatal("the case's arguments did not decode")
		}
		if _, ok := AppendJSON(nil, in); !ok {
			t.Fatalf("AppendJSON left a tool call's input to json.Marshal: %+v", in)
		}
	}
}

func FuzzAppendJSON(f *testing.F) {
	f.Add([]byte(`{"body":{"name":"widget","amount":250,"tags":["a","b"]}}`), "s")
	f.Add([]byte(`{"query":{"q":["<&>",1e400]},"body":"\u00e9"}`), "\xff<")
	f.Fuzz(func(t *testing.T, doc []byte, s string) {
		checkAppendJSON(t, appendJSONCase(doc, s))
	})
}

// AppendJSON writes policy.Input's fields by name: a field added to the
// input (or to its caller, operation or request) must be added there too,
// or the recorded input would lose it.
func TestAppendJSONKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		v    any
		want []string
	}{
		{policy.Input{}, []string{"Version", "Kind", "Caller", "Connector", "Tool", "Operation", "Args", "Request", "Time", "Envoy", "Findings", "Usage"}},
		{policy.Caller{}, []string{"Sandbox", "Agent", "Session", "User", "Egress"}},
		{policy.Operation{}, []string{"ID", "Method", "Path", "Risk", "Tags"}},
		{policy.Request{}, []string{"Method", "Host", "Port", "Path", "Query", "Headers", "Body"}},
	} {
		rt := reflect.TypeOf(c.v)
		var got []string
		for i := range rt.NumField() {
			got = append(got, rt.Field(i).Name)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s has fields %v; AppendJSON (inputjson.go) writes %v", rt, got, c.want)
		}
	}
}

// BenchmarkAppendJSON is section 1's recorded input, encoded by AppendJSON
// and by json.Marshal.
func BenchmarkAppendJSON(b *testing.B) {
	in := appendJSONCase([]byte(`{"body":{"name":"widget","amount":250,"currency":"EUR","note":"bench","tags":["a","b","c"],"lines":[{"sku":"w-1","qty":2},{"sku":"w-2","qty":1}]}}`), "bench")
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := AppendJSON(nil, in); !ok {
				b.Fatal("not encoded")
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
