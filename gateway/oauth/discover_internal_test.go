package oauth

import (
	"strings"
	"testing"
)

// TestBearerParam: the resource_metadata parameter of a 401's Bearer
// challenge (RFC 9728 5.1, RFC 9110 11.6.1), quoted or not, among other
// parameters and other challenges.
func TestBearerParam(t *testing.T) {
	for _, tc := range []struct {
		h, want string
		ok      bool
	}{
		{`Bearer resource_metadata="https://mcp.example/.well-known/oauth-protected-resource/mcp"`, "https://mcp.example/.well-known/oauth-protected-resource/mcp", true},
		{`Bearer realm="mcp", error="invalid_token", resource_metadata="https://m/x"`, "https://m/x", true},
		{`bearer resource_metadata=https://m/x, scope="a b"`, "https://m/x", true},
		{`Basic realm="x", Bearer resource_metadata="https://m/x"`, "https://m/x", true},
		{`Bearer resource_metadata="https://m/\"x\""`, `https://m/"x"`, true},
		{`Bearer realm="mcp"`, "", false},
		{`Basic realm="x"`, "", false},
		{`Bearer resource_metadata="unterminated`, "", false},
		{`Bearer error="a, resource_metadata=https://evil/"`, "", false}, // inside a quoted value
	} {
		got, ok := bearerParam(tc.h, "resource_metadata")
		if got != tc.want || ok != tc.ok {
			t.Errorf("bearerParam(%q) = %q, %v; want %q, %v", tc.h, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzBearerParam: any header value parses without panicking, and what is
// found is a substring of it once quoting is undone.
func FuzzBearerParam(f *testing.F) {
	f.Add(`Bearer resource_metadata="https://m/x"`) // quoted
	f.Add(`Bearer a=b, resource_metadata=c`)        // token value after another parameter
	f.Add(`Bearer resource_metadata="\`)            // a trailing escape
	f.Add(`Bearer =`)                               // no name
	f.Fuzz(func(t *testing.T, h string) {
		v, ok := bearerParam(h, "resource_metadata")
		if ok && !strings.Contains(strings.ReplaceAll(h, `\`, ""), strings.ReplaceAll(v, `\`, "")) {
			t.Fatalf("bearerParam(%q) = %q: not in the header", h, v)
		}
	})
}
