//go:build linux

package attack

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// forwardingClaims are fields in which a sandbox would claim another
// client address, scheme, host or path to an upstream that trusts its
// proxy: none may reach the upstream.
var forwardingClaims = http.Header{
	"Forwarded":         {"for=10.0.0.7;proto=https;host=admin.internal"},
	"X-Forwarded-For":   {"10.0.0.7, 127.0.0.1"},
	"X-Forwarded-Host":  {"admin.internal"},
	"X-Forwarded-Proto": {"https"},
	"X-Forwarded-Port":  {"443"},
	"X-Forwarded":       {"for=10.0.0.7"},
	"X-Real-Ip":         {"127.0.0.1"},
	"Via":               {"1.1 trusted-lb"},
	"True-Client-Ip":    {"10.0.0.7"},
	"Cf-Connecting-Ip":  {"10.0.0.7"},
	"X-Client-Ip":       {"10.0.0.7"},
	"X-Original-Url":    {"/admin"},
	"X-Rewrite-Url":     {"/admin"},
	"X-Envoy-Internal":  {"true"},
}

// claimsSeen lists the forwarding claims among the field names an
// upstream reports it received (one a line, as GET /headers answers).
func claimsSeen(names string) []string {
	var out []string
	for _, n := range strings.Split(names, "\n") {
		if _, ok := forwardingClaims[http.CanonicalHeaderKey(n)]; ok && n != "" {
			out = append(out, n)
		}
	}
	return out
}

// TestForwardingClaimsStripped is THREATS F8: Forwarded, X-Forwarded-*,
// X-Real-IP, Via and their kin set by the sandbox never reach an upstream,
// on the forward proxy, in an intercepted tunnel (with and without a
// substituted secret) and on a tool call, while the request itself goes
// through (200, its result audited).
func TestForwardingClaimsStripped(t *testing.T) {
	w := newWorld(t)
	g := w.g.For(t)
	const expected = "200; the upstream receives none of the 14 forwarding fields"
	t.Run("forward proxy", func(t *testing.T) {
		cb := casebook.Expect(t, "F8", "GET http://pkg.test/headers through the proxy with Forwarded, X-Forwarded-*, X-Real-IP, Via, True-Client-IP, X-Original-URL …", expected)
		n := len(g.AuditEvent("result", `"dest_host":"pkg.test"`))
		st, body, _ := w.fetch(t, w.proxyClient(agentA, nil), http.MethodGet, "http://pkg.test/headers", "", forwardingClaims)
		seen := claimsSeen(body)
		audited := w.awaitAuditCount(t, "result", `"dest_host":"pkg.test"`, n+1)
		cb.Observef("%d, upstream saw %q, result audited %v", st, seen, audited)
		if st != http.StatusOK || len(seen) != 0 || !strings.Contains(body, "User-Agent") || !audited {
			t.Errorf("%d, upstream saw %q (all: %q), audited %v", st, seen, body, audited)
		}
	})
	t.Run("forward proxy, raw bytes in odd case", func(t *testing.T) {
		cb := casebook.Expect(t, "F8", "raw proxy request with x-FORWARDED-for, FORWARDED and x-real-ip spelled in odd case", expected)
		resp, body, _, _ := w.exchange(t, agentA, "GET http://pkg.test/headers HTTP/1.1\r\nHost: pkg.test\r\nx-FORWARDED-for: 127.0.0.1\r\nFORWARDED: for=127.0.0.1\r\nx-real-ip: 127.0.0.1\r\nConnection: close\r\n\r\n")
		seen := claimsSeen(body)
		cb.Observef("%d, upstream saw %q", resp.StatusCode, seen)
		if resp.StatusCode != http.StatusOK || len(seen) != 0 {
			t.Errorf("%d, upstream saw %q", resp.StatusCode, body)
		}
	})
	for _, host := range []string{"other.test", "api.test"} {
		t.Run("intercepted "+host, func(t *testing.T) {
			hdr := forwardingClaims.Clone()
			what := "intercepted https://" + host + "/headers (no secret bound)"
			if host == "api.test" {
				hdr.Set("Authorization", "Bearer "+w.placeholder)
				what = "intercepted https://api.test/headers with the placeholder substituted"
			}
			cb := casebook.Expect(t, "F8", what+" and the 14 forwarding fields", expected)
			n := len(g.AuditEvent("result", `"dest_host":"`+host+`"`))
			st, body, _ := w.fetch(t, w.proxyClient(agentA, w.gatewayCA), http.MethodGet, "https://"+host+"/headers", "", hdr)
			seen := claimsSeen(body)
			audited := w.awaitAuditCount(t, "result", `"dest_host":"`+host+`"`, n+1)
			cb.Observef("%d, upstream saw %q, result audited %v", st, seen, audited)
			if st != http.StatusOK || len(seen) != 0 || !audited {
				t.Errorf("%d, upstream saw %q (all: %q), audited %v", st, seen, body, audited)
			}
		})
	}
	t.Run("tool call", func(t *testing.T) {
		cb := casebook.Expect(t, "F8", "tool call whose header arguments are X-Forwarded-For, Forwarded, X-Real-IP, Via, True-Client-IP",
			"200; the connector upstream receives none of them")
		r := g.Call(agentA, "tickets.list_tickets",
			`{"headers":{"X-Forwarded-For":"127.0.0.1","Forwarded":"for=127.0.0.1","X-Real-IP":"127.0.0.1","Via":"1.1 lb","True-Client-IP":"127.0.0.1"}}`)
		reqs := w.e.Up.Requests()
		var seen []string
		if len(reqs) > 0 {
			for k := range reqs[len(reqs)-1].Header {
				seen = append(seen, claimsSeen(k)...)
			}
		}
		audited := len(g.AuditEvent("result", r.RequestID)) == 1
		cb.Observef("%s, upstream saw %q, result audited %v", statusText(r.Status, r.Code), seen, audited)
		if r.Status != http.StatusOK || len(reqs) == 0 || len(seen) != 0 || !audited {
			t.Errorf("%d %s, upstream saw %q, audited %v", r.Status, r.Body, seen, audited)
		}
	})
}
