//go:build linux

package attack

import (
	"net/http"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// TestGatewayStrictParsingToolRoute is THREATS F1–F3 on the tool API: the
// same malformed shapes as TestGatewayStrictParsing, sent as a tool call
// (POST /v1/tools/…, which agent-a may call and which would reach the
// upstream), are 400 schema_violation before validation, policy or any
// upstream request.
func TestGatewayStrictParsingToolRoute(t *testing.T) {
	w := newWorld(t)
	const target = "POST /v1/tools/tickets.list_tickets HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"
	const body = `{"query":{},"path":{}}` // valid: only parsing can refuse it
	cases := []struct{ id, name, req string }{
		{"F1", "Content-Length and Transfer-Encoding (smuggling)", target + "Content-Length: 22\r\nTransfer-Encoding: chunked\r\n\r\n15\r\n" + body + "\r\n0\r\n\r\n"},
		{"F1", "conflicting Content-Length", target + "Content-Length: 22\r\nContent-Length: 23\r\n\r\n" + body + " "},
		{"F1", "duplicate identical Content-Length", target + "Content-Length: 22\r\nContent-Length: 22\r\n\r\n" + body},
		{"F1", "Transfer-Encoding xchunked", target + "Transfer-Encoding: xchunked\r\n\r\n15\r\n" + body + "\r\n0\r\n\r\n"},
		{"F2", "bare LF after the chunk size (CVE-2025-22871)", target + "Transfer-Encoding: chunked\r\n\r\n16\n" + body + "\r\n0\r\n\r\n"},
		{"F2", "lone CR inside a header value", target + "X-A: a\rb\r\nContent-Length: 22\r\n\r\n" + body},
		{"F3", "obs-fold", target + "X-A: a\r\n b\r\nContent-Length: 22\r\n\r\n" + body},
		{"F3", "NUL in a header value", target + "X-A: a\x00b\r\nContent-Length: 22\r\n\r\n" + body},
		{"F3", "space before the colon", target + "X-A : b\r\nContent-Length: 22\r\n\r\n" + body},
		{"F3", "0x80 in a header name", target + "X-\x80: b\r\nContent-Length: 22\r\n\r\n" + body},
	}
	for _, tc := range cases {
		t.Run(tc.id+" "+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, tc.id, tc.name+" (tool API: POST /v1/tools/tickets.list_tickets, raw bytes on the sandbox socket)",
				"400 schema_violation, 0 upstream requests")
			before := len(w.e.Up.Requests())
			resp, got, _, _ := w.exchange(t, agentA, tc.req)
			n := len(w.e.Up.Requests()) - before
			c.Observef("%d %s, upstream requests %d", resp.StatusCode, errCode(got), n)
			if resp.StatusCode != http.StatusBadRequest || errCode(got) != "schema_violation" {
				t.Errorf("got %d %q, want 400 schema_violation", resp.StatusCode, got)
			}
			if n != 0 {
				t.Errorf("the call got past parsing: %d upstream requests", n)
			}
		})
	}
	t.Run("F1 control: the same call, well formed", func(t *testing.T) {
		c := casebook.Expect(t, "F1", "control: POST /v1/tools/tickets.list_tickets with one Content-Length",
			"200 and 1 upstream request (the refusals above are the parser's)")
		before := len(w.e.Up.Requests())
		resp, got, _, _ := w.exchange(t, agentA, target+"Content-Length: 22\r\nConnection: close\r\n\r\n"+body)
		n := len(w.e.Up.Requests()) - before
		c.Observef("%d, upstream requests %d", resp.StatusCode, n)
		if resp.StatusCode != http.StatusOK || n != 1 {
			t.Fatalf("control: %d %q, %d upstream requests", resp.StatusCode, got, n)
		}
	})
}
