package gateway

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"
)

// call is the head of a tool call that reaches the tickets upstream; the
// cases below break it in one place each.
const callLine = "POST /v1/tools/tickets.list_tickets HTTP/1.1"
const callHead = "Host: sluice\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"

// TestMalformedHeadsGetJSON: every request head that Go's HTTP server
// would refuse itself, with its own text/plain answer, is refused by the
// strict checker first with sluice's JSON error, the designed status and
// code, and nothing reaches a handler or the upstream. Before, each case
// marked "go" below got Go's "400 Bad Request" (431, 505, 417) in
// text/plain.
func TestMalformedHeadsGetJSON(t *testing.T) {
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil)
	big := strings.Repeat("a", 70<<10)
	tests := []struct {
		name   string
		req    string
		status int
		code   refusal.Code
	}{
		{"well-formed control", callLine + "\r\n" + callHead + "\r\n{}", 200, ""},
		// Request line (RFC 9112 3).
		{"go: method not a token (RFC 9110 9.1)", "PO(ST /v1/tools/tickets.list_tickets HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: method with a tab", "POST\t/v1/tools/tickets.list_tickets HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: method with a byte above 0x7f", "P\xc3\x96ST /v1/tools/tickets.list_tickets HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: empty method", " /v1/tools/tickets.list_tickets HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: method only", "POST\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: no version (HTTP/0.9 shape)", "POST /v1/tools/tickets.list_tickets\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: two spaces after the method", "POST  /v1/tools/tickets.list_tickets HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: space inside the target", "POST /v1/tools/tickets. list_tickets HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: control byte in the target (RFC 3986 2)", "POST /v1/tools/tickets.\x01list_tickets HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: DEL in the target", "POST /v1/tools/tickets.\x7flist_tickets HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: target in no request form (RFC 9112 3.2)", "POST v1/tools/tickets.list_tickets HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: absolute form with a bad authority", "GET http://[::1/x HTTP/1.1\r\nHost: sluice\r\n\r\n", 400, refusal.SchemaViolation},
		{"go: CONNECT with a bad authority", "CONNECT [::1:443 HTTP/1.1\r\nHost: sluice\r\n\r\n", 400, refusal.SchemaViolation},
		{"go: lowercase version (RFC 9112 2.3)", "POST /v1/tools/tickets.list_tickets http/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: version with two digits", "POST /v1/tools/tickets.list_tickets HTTP/1.10\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: text after the version", "POST /v1/tools/tickets.list_tickets HTTP/1.1 x\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: HTTP/2.0 that is not the preface", "POST /v1/tools/tickets.list_tickets HTTP/2.0\r\n" + callHead + "\r\n{}", 505, refusal.SchemaViolation},
		{"go: HTTP/3.0", "POST /v1/tools/tickets.list_tickets HTTP/3.0\r\n" + callHead + "\r\n{}", 505, refusal.SchemaViolation},
		{"NUL in the request line", "POST /v1/tools/tickets.list_tickets\x00 HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"bare CR in the request line", "POST /v1/tools/tickets.list_tickets\r HTTP/1.1\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"bare LF after the request line (RFC 9112 2.2)", callLine + "\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: empty line before the first request (RFC 9112 2.2 allows only after a message)", "\r\n" + callLine + "\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		// Header fields (RFC 9112 5, RFC 9110 5).
		{"header line without a colon", callLine + "\r\n" + callHead + "X-A b\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"space before the colon", callLine + "\r\n" + callHead + "X-A : b\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"NUL in a header name", callLine + "\r\n" + callHead + "X-\x00A: b\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"byte above 0x7f in a header name", callLine + "\r\n" + callHead + "X-\xffA: b\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"NUL in a header value", callLine + "\r\n" + callHead + "X-A: b\x00c\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"bare CR in a header value", callLine + "\r\n" + callHead + "X-A: b\rc\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"obs-fold (RFC 9112 5.2)", callLine + "\r\n" + callHead + "X-A: b\r\n c\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"obs-fold on the first header line", callLine + "\r\n X-A: b\r\n" + callHead + "\r\n{}", 400, refusal.SchemaViolation},
		{"go: no Host in HTTP/1.1 (RFC 9112 3.2)", callLine + "\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"two Host fields (RFC 9112 3.2)", callLine + "\r\n" + callHead + "Host: other\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"go: malformed Host (RFC 9112 3.2)", callLine + "\r\nHost: a<b\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", 400, refusal.SchemaViolation},
		{"go: Expect other than 100-continue (RFC 9110 10.1.1)", callLine + "\r\n" + callHead + "Expect: teapot\r\n\r\n{}", 417, refusal.SchemaViolation},
		{"go: Transfer-Encoding in HTTP/1.0 (RFC 9112 6.1)", "POST /v1/tools/tickets.list_tickets HTTP/1.0\r\nHost: sluice\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400, refusal.SchemaViolation},
		// Size (RFC 6585 5).
		{"go: header section over 64 KiB", callLine + "\r\n" + callHead + "X-Big: " + big + "\r\n\r\n{}", 431, refusal.HeaderTooLarge},
		{"go: request line over 64 KiB", "POST /v1/tools/tickets.list_tickets?" + big + " HTTP/1.1\r\n" + callHead + "\r\n{}", 431, refusal.HeaderTooLarge},
		{"go: header section over 64 KiB, never ended", callLine + "\r\n" + callHead + "X-Big: " + big, 431, refusal.HeaderTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := up.requests.Load()
			c := rawConn(t, g, agentA)
			go func() { _, _ = io.WriteString(c, tc.req) }()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("read response: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d; body %q", resp.StatusCode, tc.status, body)
			}
			if tc.code == "" {
				if n := up.requests.Load() - before; n != 1 {
					t.Errorf("the upstream got %d requests, want 1", n)
				}
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json; body %q", ct, body)
			}
			if got := errCode(body); got != string(tc.code) {
				t.Errorf("code %q, want %q; body %q", got, tc.code, body)
			}
			if !resp.Close {
				t.Errorf("the refusal does not close the connection")
			}
			// One log line for the refusal, under the request ID the
			// caller got.
			var eb refusal.Body
			_ = json.Unmarshal(body, &eb)
			if rid := eb.Error.RequestID; rid == "" {
				t.Errorf("no request_id in %q", body)
			} else if !logged(g, `"msg":"sandbox socket: refused a malformed request"`, `"request_id":"`+rid+`"`, `"code":"`+string(tc.code)+`"`, `"agent":"agent-a"`) {
				t.Errorf("no log line for request %s", rid)
			}
			// Nothing of a refused head is served: the connection ends.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, _ := io.Copy(io.Discard, c); n != 0 {
				t.Errorf("%d more bytes after the refusal", n)
			}
			if n := up.requests.Load() - before; n != 0 {
				t.Errorf("the upstream got %d requests, want 0", n)
			}
		})
	}
}

// logged reports whether one line of g's log has every part.
func logged(g *testGateway, parts ...string) bool {
	for _, line := range strings.Split(g.logBuf.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// TestStrictAfterUpgrade: a request that names Upgrade is answered as
// plain HTTP (nothing on the sandbox socket switches protocols), so the
// next request on the same connection is still checked byte for byte. Go's
// server alone would join the obs-fold and serve it.
func TestStrictAfterUpgrade(t *testing.T) {
	g := startGateway(t, "http://127.0.0.1:1", "", nil)
	tests := []struct{ name, first string }{
		{"Upgrade websocket", "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"},
		{"Upgrade h2c", "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nUpgrade: h2c\r\n\r\n"},
		{"PRI method", "PRI /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, g, agentA)
			br := bufio.NewReader(c)
			if _, err := io.WriteString(c, tc.first); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("first response: %v", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusSwitchingProtocols || resp.Close {
				t.Fatalf("first response %d (close=%v): want a kept-alive HTTP answer", resp.StatusCode, resp.Close)
			}
			if _, err := io.WriteString(c, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nX-A: a\r\n b\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("second response: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest || errCode(body) != string(refusal.SchemaViolation) || !strings.Contains(string(body), "obs-fold") {
				t.Fatalf("second request: %d %s, want 400 schema_violation naming obs-fold", resp.StatusCode, body)
			}
		})
	}
}
