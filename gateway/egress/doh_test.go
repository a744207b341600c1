package egress

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/gateway/refusal"
)

// TestDoHEndpointsRefused: CONNECT (and absolute-form http) to a well-known
// DoH/DoT endpoint or to port 853 is refused with 403 egress_denied, a
// Proxy-Status header and an audit record with reason doh_refused, even
// though the agent's allowlist names every one of them; nothing is
// resolved (the DNS upstream sees no query).
func TestDoHEndpointsRefused(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{"dns.google": "93.184.216.34", "pkg.example": "93.184.216.34"})
	g := startEgressGateway(t, up, func(c *config.Config) {
		c.Agents[0].Egress = append(c.Agents[0].Egress, "dns.google", "cloudflare-dns.com", "*.cloudflare-dns.com",
			"one.one.one.one", "dns.quad9.net", "doh.opendns.com", "1.1.1.1", "8.8.8.8", "9.9.9.9")
		c.Egress.ConnectPorts = []int{853, 8443}
	})
	tests := []struct{ name, req, host string }{
		{"dns.google", "CONNECT dns.google:443 HTTP/1.1\r\nHost: dns.google:443\r\n\r\n", "dns.google"},
		{"DNS.Google. (case, trailing dot)", "CONNECT DNS.Google.:443 HTTP/1.1\r\nHost: dns.google:443\r\n\r\n", "dns.google"},
		{"cloudflare-dns.com", "CONNECT cloudflare-dns.com:443 HTTP/1.1\r\nHost: cloudflare-dns.com:443\r\n\r\n", "cloudflare-dns.com"},
		{"mozilla.cloudflare-dns.com (wildcard entry)", "CONNECT mozilla.cloudflare-dns.com:443 HTTP/1.1\r\nHost: x\r\n\r\n", "mozilla.cloudflare-dns.com"},
		{"one.one.one.one", "CONNECT one.one.one.one:443 HTTP/1.1\r\nHost: x\r\n\r\n", "one.one.one.one"},
		{"dns.quad9.net", "CONNECT dns.quad9.net:443 HTTP/1.1\r\nHost: x\r\n\r\n", "dns.quad9.net"},
		{"doh.opendns.com", "CONNECT doh.opendns.com:443 HTTP/1.1\r\nHost: x\r\n\r\n", "doh.opendns.com"},
		{"1.1.1.1", "CONNECT 1.1.1.1:443 HTTP/1.1\r\nHost: x\r\n\r\n", "1.1.1.1"},
		{"8.8.8.8", "CONNECT 8.8.8.8:443 HTTP/1.1\r\nHost: x\r\n\r\n", "8.8.8.8"},
		{"9.9.9.9", "CONNECT 9.9.9.9:443 HTTP/1.1\r\nHost: x\r\n\r\n", "9.9.9.9"},
		{"IPv4-mapped 1.1.1.1", "CONNECT [::ffff:1.1.1.1]:443 HTTP/1.1\r\nHost: x\r\n\r\n", ""},
		{"IPv6 2606:4700:4700::1111", "CONNECT [2606:4700:4700::1111]:443 HTTP/1.1\r\nHost: x\r\n\r\n", "2606:4700:4700::1111"},
		{"DoT port 853 on an allowed host (in connect_ports)", "CONNECT pkg.example:853 HTTP/1.1\r\nHost: x\r\n\r\n", "pkg.example"},
		{"DoT port 853 on dns.google", "CONNECT dns.google:853 HTTP/1.1\r\nHost: x\r\n\r\n", "dns.google"},
		{"plain http to dns.google", "GET http://dns.google/dns-query?dns=AAAB HTTP/1.1\r\nHost: dns.google\r\n\r\n", "dns.google"},
		{"plain http to port 853", "GET http://pkg.example:853/ HTTP/1.1\r\nHost: pkg.example:853\r\n\r\n", "pkg.example"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := up.Queries.Load()
			resp, body, _, _ := exchange(t, g, tc.req)
			if resp.StatusCode != http.StatusForbidden || errCode(body) != string(refusal.EgressDenied) {
				t.Fatalf("got %d %s, want 403 egress_denied: %s", resp.StatusCode, errCode(body), body)
			}
			if ps := resp.Header.Get("Proxy-Status"); ps != "sluice; error="+psDenied {
				t.Errorf("Proxy-Status = %q", ps)
			}
			if !strings.Contains(string(body), "DNS") {
				t.Errorf("the refusal does not say why: %s", body)
			}
			if n := up.Queries.Load() - before; n != 0 {
				t.Errorf("the DNS upstream saw %d queries", n)
			}
			found := false
			for _, r := range auditEvents(t, g) {
				if r.Event == "decision" && r.Fields["reason"] == "doh_refused" && (tc.host == "" || r.Fields["dest_host"] == tc.host) {
					found = true
				}
			}
			if !found {
				t.Errorf("no audit record with reason doh_refused for %q", tc.host)
			}
		})
	}
	// Control: an ordinary allowed host on 443 is not caught by the list
	// (it gets past the DoH check and policy: the refusal, if any, is not
	// doh_refused). pkg.example resolves to a public address nobody
	// listens on in a test; the SNI check refuses the garbage hello first.
	t.Run("control: allowed ordinary host", func(t *testing.T) {
		resp, body, _, _ := exchange(t, g, "CONNECT pkg.example:443 HTTP/1.1\r\nHost: pkg.example:443\r\n\r\n")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("got %d %s, want 200 Connection Established", resp.StatusCode, body)
		}
	})
}

func TestIsDoHEndpoint(t *testing.T) {
	tests := []struct {
		host string
		port int
		want bool
	}{
		{"dns.google", 443, true},
		{"dns.google.", 443, true},
		{"security.cloudflare-dns.com", 443, true},
		{"cloudflare-dns.com", 443, true},
		{"notcloudflare-dns.com", 443, false},
		{"dns.google.evil.example", 443, false},
		{"8.8.4.4", 443, true},
		{"::ffff:8.8.8.8", 443, true},
		{"2001:4860:4860::8888", 443, true},
		{"93.184.216.34", 443, false},
		{"pypi.org", 443, false},
		{"pypi.org", 853, true},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			if got := isDoHEndpoint(tc.host, tc.port); got != tc.want {
				t.Errorf("isDoHEndpoint(%q, %d) = %v, want %v", tc.host, tc.port, got, tc.want)
			}
		})
	}
}
