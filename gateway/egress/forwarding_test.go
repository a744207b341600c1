package egress

import (
	"net/http"
	"testing"
)

// TestStripRequestHeaders is THREATS F8 at the one function every raw
// egress request passes: a client's claims about where the request came
// from or what it was are removed in any case; the rest stays.
func TestStripRequestHeaders(t *testing.T) {
	tests := []struct {
		name  string
		strip bool
	}{
		{"Forwarded", true},                // RFC 7239
		{"X-Forwarded-For", true},          // de facto
		{"x-forwarded-host", true},         // any case
		{"X-FORWARDED-PROTO", true},        //
		{"X-Forwarded-Prefix", true},       // Spring, Traefik
		{"X-Forwarded", true},              // the bare form
		{"X-Real-Ip", true},                // nginx
		{"Via", true},                      // RFC 9110 7.6.3
		{"True-Client-Ip", true},           // Akamai, Cloudflare
		{"Cf-Connecting-Ip", true},         // Cloudflare
		{"Fastly-Client-Ip", true},         // Fastly
		{"X-Cluster-Client-Ip", true},      // Rackspace, Riverbed
		{"X-Original-Url", true},           // IIS URL rewrite: a path policy never saw
		{"X-Rewrite-Url", true},            //
		{"X-Http-Method-Override", true},   // a method policy never saw
		{"X-Envoy-External-Address", true}, // Envoy trusts x-envoy-* from inside
		{"Proxy-Authorization", true},      // hop-by-hop, as before
		{"Authorization", false},
		{"User-Agent", false},
		{"X-Forward-Reason", false}, // not a forwarding field
		{"Accept", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{tt.name: {"v"}}
			stripRequestHeaders(h)
			if got := len(h) == 0; got != tt.strip {
				t.Errorf("%s stripped = %v, want %v", tt.name, got, tt.strip)
			}
		})
	}
}
