//go:build linux

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// pathCase is one request path tried against the rule blocking /admin*
// (team.no_admin in newInterceptWorld): the status and code it must get
// and, for one that is sent, the path the upstream must receive.
type pathCase struct {
	path   string
	status int
	code   string
	sent   string
}

// pathCases are the spellings of /admin that passed the rule before
// normalisation, the ones refused outright and allowed ones that must
// arrive normalised (THREATS C11).
var pathCases = []pathCase{
	{"//admin", 403, "egress_denied", ""},
	{"/./admin", 403, "egress_denied", ""},
	{"/x/../admin", 403, "egress_denied", ""},
	{"/%2e/admin", 403, "egress_denied", ""},
	{"/%2E%2e/admin", 403, "egress_denied", ""},
	{"/x/.%2e/admin/users", 403, "egress_denied", ""},
	{"/%61dm%69n", 403, "egress_denied", ""},
	{"/x//..//admin", 403, "egress_denied", ""},
	{"/admin%2f..", 400, "schema_violation", ""},
	{"/x%2F..%2Fadmin", 400, "schema_violation", ""},
	{"/x%5c..%5cadmin", 400, "schema_violation", ""},
	{"/x/..;/admin", 400, "schema_violation", ""},
	{"/admin%00.json", 400, "schema_violation", ""},
	{"/x/./y/../ok//z", 200, "", "/x/ok/z"},
	{"/%7Euser/%2e/a%3fb", 200, "", "/~user/a%3Fb"},
}

// rawStatus reads one answer from r and returns its status and error code.
func rawStatus(t *testing.T, r io.Reader) (int, string) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(r), nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	return statusCode(resp)
}

// statusCode reads resp's body and returns its status and error code.
func statusCode(resp *http.Response) (int, string) {
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error.Code
}

// TestRawEgressPathNormalised is THREATS C11: policy decides on the RFC
// 3986-normalised path and the upstream receives exactly that path, or the
// request is refused 400, on the forward proxy, in an intercepted HTTP/1.1
// tunnel and in an intercepted HTTP/2 tunnel.
func TestRawEgressPathNormalised(t *testing.T) {
	requireHost(t)
	w := newInterceptWorld(t)
	check := func(t *testing.T, via string, tc pathCase, status int, code string, before int) {
		t.Helper()
		reqs := w.requests()[before:]
		if status != tc.status || code != tc.code {
			t.Errorf("%s %q: %d %q, want %d %q", via, tc.path, status, code, tc.status, tc.code)
			return
		}
		if tc.status != 200 {
			if len(reqs) != 0 {
				t.Errorf("%s %q: refused, yet the upstream saw %q", via, tc.path, reqs[0].path)
			}
			return
		}
		if len(reqs) != 1 || reqs[0].path != tc.sent {
			t.Errorf("%s %q: upstream saw %v, want exactly %q", via, tc.path, reqs, tc.sent)
		}
	}
	audited := func(t *testing.T, host string) {
		t.Helper()
		g := w.g.For(t)
		g.AwaitAuditFields("decision", map[string]any{"dest_host": host, "kind": "http", "decision": "block", "rule": "team.no_admin"})
		g.AwaitAuditFields("decision", map[string]any{"dest_host": host, "kind": "http", "code": "schema_violation", "reason": "path_refused"})
	}

	h2 := w.client(t, w.gatewayCA)
	tr := h2.Transport.(*http.Transport)
	tr.ForceAttemptHTTP2, tr.DisableKeepAlives = true, false
	defer h2.CloseIdleConnections()
	// Each way in sends one path and reads the answer's status and code.
	for _, via := range []struct {
		name, host, threat, expected string
		send                         func(t *testing.T, path string) (int, string)
	}{
		{"forward proxy", "plain.test",
			"GET http://plain.test/<path> through the proxy with //admin, /./admin, /x/../admin, %2e and %2E%2e dot segments, %61dm%69n, %2F, %5C, ..;, %00",
			"403 team.no_admin for every spelling of /admin; 400 schema_violation (path_refused) for encoded slash, backslash, dot segment with parameters, NUL; allowed paths reach the upstream normalised",
			func(t *testing.T, path string) (int, string) {
				c, err := w.g.Dial(agentA)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				fmt.Fprintf(c, "GET http://plain.test%s HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n", path)
				return rawStatus(t, c)
			}},
		{"intercepted HTTP/1.1", "api.test",
			"inside an intercepted tunnel to api.test (secret bound), GET <path> with the same spellings in HTTP/1.1",
			"the same answers; nothing refused reaches the upstream, allowed paths arrive normalised",
			func(t *testing.T, path string) (int, string) {
				c, br := openTunnel(t, w, agentA, "api.test", w.gatewayCA)
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n", path)
				return rawStatus(t, br)
			}},
		{"intercepted HTTP/2", "other.test",
			"inside an intercepted tunnel to other.test, the same spellings as HTTP/2 :path",
			"the same answers; allowed paths arrive normalised over HTTP/2",
			func(t *testing.T, path string) (int, string) {
				req, err := http.NewRequest("GET", "https://other.test"+path, nil)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := h2.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				if resp.Proto != "HTTP/2.0" {
					t.Fatalf("%s: %s, want HTTP/2.0", path, resp.Proto)
				}
				return statusCode(resp)
			}},
	} {
		t.Run(via.name, func(t *testing.T) {
			cb := casebook.Expect(t, "C11", via.threat, via.expected)
			for _, tc := range pathCases {
				before := len(w.requests())
				st, code := via.send(t, tc.path)
				check(t, via.name, tc, st, code, before)
			}
			audited(t, via.host)
			cb.Observef("%d spellings: each answered as expected; the upstream got only the normalised allowed paths", len(pathCases))
		})
	}
}
