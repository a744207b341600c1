package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
)

// TestValidateReportsDoHAllowlist: sluice validate (gateway.Check)
// reports an allowlist entry naming a DoH/DoT endpoint as an error naming
// its path; ordinary entries and a broad glob are not reported.
func TestValidateReportsDoHAllowlist(t *testing.T) {
	tests := []struct {
		name    string
		egress  []string
		wantErr []string
	}{
		{"clean", []string{"pypi.org", "*.pythonhosted.org", "*.google"}, nil},
		{"dns.google", []string{"pypi.org", "dns.google"}, []string{`agents[0].egress[1]: "dns.google" is a DNS-over-HTTPS/TLS endpoint`}},
		{"address and wildcard", []string{"1.1.1.1", "*.cloudflare-dns.com"}, []string{`egress[0]: "1.1.1.1"`, `egress[1]: "*.cloudflare-dns.com"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, "http://127.0.0.1:1", "", func(c *config.Config) { c.Agents[0].Egress = tc.egress })
			err := errors.Join(Check(context.Background(), g.cfg, CheckOptions{}).Errors...)
			if tc.wantErr == nil {
				// The shared config has other problems on purpose (a loopback
				// connector without allow_private, one at the metadata address).
				if err != nil && strings.Contains(err.Error(), "doh_refused") {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted an allowlist naming a DoH endpoint")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) || !strings.Contains(err.Error(), "doh_refused") {
					t.Errorf("Validate error %q does not contain %q", err, w)
				}
			}
		})
	}
}
