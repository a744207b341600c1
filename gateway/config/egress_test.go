package config

import (
	"strings"
	"testing"
)

func TestValidEgress(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"pypi.org", true},
		{"*.pythonhosted.org", true},
		{"a_b-c.example", true},
		{"", false},
		{"*", false},
		{"*.", false},
		{"py*.org", false},
		{"*.*.org", false},
		{"PyPI.org", false}, // lower case only: one spelling per host
		{"pypi.org:443", false},
		{"user@pypi.org", false},
		{"a..b", false},
		{strings.Repeat("a", 64) + ".org", false},
		{strings.Repeat("a.", 127) + "org", false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			if got := ValidEgress(tc.in); got != tc.ok {
				t.Fatalf("ValidEgress(%q) = %v, want %v", tc.in, got, tc.ok)
			}
		})
	}
}

func TestEgressAndDNSKeys(t *testing.T) {
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"defaults", "", ""},
		{"all keys", "egress: {connect_ports: [8443], max_tunnels_per_caller: 8, idle_timeout: 1m, handshake_timeout: 5s}\ndns: {upstreams: ['127.0.0.53:53', '[::1]:53'], cache_max: 10, timeout: 1s, subdomain_threshold: 5, subdomain_window: 1m}", ""},
		{"bad port", "egress: {connect_ports: [0]}", "egress.connect_ports[0]"},
		{"no tunnels", "egress: {max_tunnels_per_caller: 0}", "egress.max_tunnels_per_caller"},
		{"upstream without port", "dns: {upstreams: [127.0.0.53]}", "dns.upstreams[0]"},
		{"upstream by name", "dns: {upstreams: ['dns.google:53']}", "dns.upstreams[0]"},
		{"bad agent egress", "agents: [{name: a, egress: ['*.*']}]", "agents[0].egress[0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), t.TempDir())
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
