package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestInputValueCaches checks that the interned parts of the input never
// leak from one call into another: every case builds an input after a
// similar one has been cached and compares it with a value built without
// any cache (InterfaceToValue of the JSON shape).
func TestInputValueCaches(t *testing.T) {
	base := func() *Input {
		in := toolCall("billing-api.get_invoice")
		in.Args = nil
		return in
	}
	tests := []struct {
		name   string
		prime  func(*Input) // what is cached first; base() if nil
		change func(*Input)
	}{
		{"same first tag and count, other second tag",
			func(in *Input) { in.Operation.Tags = []string{"billing", "a"} },
			func(in *Input) { in.Operation.Tags = []string{"billing", "b"} }},
		{"same operation, other tags", nil, func(in *Input) { in.Operation.Tags = []string{"billing", "refunds"} }},
		{"same operation, tags split differently", nil, func(in *Input) { in.Operation.Tags = []string{"bill", "ing"} }},
		{"same operation, no tags", nil, func(in *Input) { in.Operation.Tags = nil }},
		{"other session", nil, func(in *Input) { in.Caller.Session = "s-2" }},
		{"long names are not cached", nil, func(in *Input) { in.Tool = strings.Repeat("x", internMaxLen+1); in.Caller.User = in.Tool }},
		{"empty maps", nil, func(in *Input) { in.Request.Query, in.Request.Headers = nil, map[string][]string{} }},
		{"several header values", nil, func(in *Input) {
			in.Request.Headers = map[string][]string{"B": {"2", "1"}, "A": {"x"}, "Accept": {"text/plain"}}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			primed := base()
			if tc.prime != nil {
				tc.prime(primed)
			}
			if _, err := inputValue(primed); err != nil { // fills the caches
				t.Fatal(err)
			}
			in := base()
			tc.change(in)
			got, err := inputValue(in)
			if err != nil {
				t.Fatal(err)
			}
			if want := uncachedInput(t, in); got.Compare(want) != 0 {
				t.Errorf("inputValue = %v\nwant          %v", got, want)
			}
		})
	}
}

// uncachedInput builds the input document from its JSON shape.
func uncachedInput(t *testing.T, in *Input) ast.Value {
	t.Helper()
	multi := func(m map[string][]string) map[string]any {
		out := map[string]any{}
		for k, vs := range m {
			l := []any{}
			for _, v := range vs {
				l = append(l, v)
			}
			out[k] = l
		}
		return out
	}
	tags := []any{}
	for _, tag := range in.Operation.Tags {
		tags = append(tags, tag)
	}
	v, err := ast.InterfaceToValue(map[string]any{
		"version": in.Version, "kind": in.Kind,
		"caller":    map[string]any{"sandbox": in.Caller.Sandbox, "agent": in.Caller.Agent, "session": in.Caller.Session, "user": in.Caller.User},
		"connector": in.Connector, "tool": in.Tool,
		"operation": map[string]any{"id": in.Operation.ID, "method": in.Operation.Method, "path": in.Operation.Path, "risk": in.Operation.Risk, "tags": tags},
		"args":      in.Args,
		"request": map[string]any{"method": in.Request.Method, "host": in.Request.Host, "path": in.Request.Path,
			"query": multi(in.Request.Query), "headers": multi(in.Request.Headers)},
		"time":     in.Time.UTC().Format(time.RFC3339Nano),
		"findings": []any{}, // none in these inputs (scan_test.go has some)
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestInternCacheBounded checks that names an attacker can vary (hosts,
// header names) cannot grow the caches past internMax.
func TestInternCacheBounded(t *testing.T) {
	var c stringCache
	for i := range internMax + 100 {
		s := fmt.Sprintf("host-%d.example", i)
		if got := c.term(s); got.Value.Compare(ast.String(s)) != 0 {
			t.Fatalf("term(%q) = %v", s, got)
		}
	}
	if n := len(c.m); n != internMax {
		t.Errorf("cache holds %d entries, want the bound %d", n, internMax)
	}
}
