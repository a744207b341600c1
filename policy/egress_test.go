package policy

import (
	"context"
	"errors"
	"testing"
)

// TestEgressAllowlist feeds the engine the inputs the gateway builds for raw
// egress, with agents' allowlists compiled into data.
func TestEgressAllowlist(t *testing.T) {
	e := newEngine(t, Config{
		Egress:       map[string][]string{"builder": {"PyPI.org.", "*.pythonhosted.org"}},
		ConnectPorts: []int{8443},
	})
	builder := Caller{Agent: "builder"}
	tests := []struct {
		name   string
		in     Input
		action Action
		rule   string
	}{
		{"exact host, connect 443", Input{Kind: "connect", Caller: builder, Request: Request{Host: "pypi.org", Port: 443}}, Allow, "egress"},
		{"entry is lower-cased and its dot dropped", Input{Kind: "http", Caller: builder, Request: Request{Host: "pypi.org", Port: 80}}, Allow, "egress"},
		{"configured connect port", Input{Kind: "connect", Caller: builder, Request: Request{Host: "pypi.org", Port: 8443}}, Allow, "egress"},
		{"connect port 22", Input{Kind: "connect", Caller: builder, Request: Request{Host: "pypi.org", Port: 22}}, Block, "default"},
		{"http to a connect-only port", Input{Kind: "http", Caller: builder, Request: Request{Host: "pypi.org", Port: 8443}}, Block, "default"},
		{"suffix, deep name", Input{Kind: "connect", Caller: builder, Request: Request{Host: "a.b.files.pythonhosted.org", Port: 443}}, Allow, "egress"},
		{"suffix does not cover the domain", Input{Kind: "connect", Caller: builder, Request: Request{Host: "pythonhosted.org", Port: 443}}, Block, "default"},
		{"look-alike", Input{Kind: "connect", Caller: builder, Request: Request{Host: "evilpythonhosted.org", Port: 443}}, Block, "default"},
		{"dns, no port", Input{Kind: "dns", Caller: builder, Request: Request{Host: "files.pythonhosted.org"}}, Allow, "egress"},
		{"other agent", Input{Kind: "connect", Caller: Caller{Agent: "other"}, Request: Request{Host: "pypi.org", Port: 443}}, Block, "default"},
		{"tool calls are not opened", Input{Kind: "tool_call", Tool: "pypi.org", Caller: builder, Request: Request{Host: "pypi.org", Port: 443}}, Block, "default"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := e.Decide(context.Background(), &tc.in)
			if d.Action != tc.action || d.Rule != tc.rule {
				t.Fatalf("decided %+v, want %s by %s", d, tc.action, tc.rule)
			}
		})
	}
}

// TestEgressAllowlistRejectsGlobs: only a leading "*." is a wildcard.
func TestEgressAllowlistRejectsGlobs(t *testing.T) {
	for _, bad := range []string{"py*.org", "*", "*.", "a/b", "host:443"} {
		_, err := New(context.Background(), Config{Egress: map[string][]string{"a": {bad}}})
		if err == nil || errors.As(err, new(*CompileError)) {
			t.Errorf("%q: err = %v, want a config error", bad, err)
		}
	}
}
