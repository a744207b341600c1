package egress

import (
	"bytes"
	"os"
	"strings"
	"testing"

	mdns "github.com/miekg/dns"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/policy/findings"
)

func TestLabelEntropy(t *testing.T) {
	tests := []struct {
		name, label string
		high        bool
	}{
		{"short", "www", false},
		{"short random", "x7q2k9", false},
		{"natural long name", "release-assets-githubusercontent", false},
		{"natural hyphenated", "files-pythonhosted", false},
		{"repeated byte", strings.Repeat("a", 63), false},
		{"base32 of data", "mzxw6ytboi2dsmrrgu3tqnbtgq2tmnzy", true},
		{"base64-ish of data", "d2h5ihdvdwxkihlvdsbkbyb0aglz", true},
		{"every hex digit, 16 bytes (under the length floor)", "0123456789abcdef", false},
		{"long base36", "k3j4h5g6f7d8s9a0q1w2e3r4t5y6u7i8o9p0zxcvbnm", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, high := highEntropyLabel(tc.label)
			if high != tc.high {
				t.Errorf("highEntropyLabel(%q) = %.2f, %v; want high=%v", tc.label, h, high, tc.high)
			}
		})
	}
	if h := findings.Shannon("ab"); h != 1 {
		t.Errorf("findings.Shannon(ab) = %v, want 1", h)
	}
	if h := findings.Shannon("aaaa"); h != 0 {
		t.Errorf("findings.Shannon(aaaa) = %v, want 0", h)
	}
}

// TestDNSHighEntropySignal: questions through the real sandbox socket whose
// leftmost label looks like encoded data raise the exfiltration metric
// (signal=label_entropy) on every question and write one dns_high_entropy
// audit record per sandbox and base domain per window; natural names raise
// nothing. The signal does not change the answer.
func TestDNSHighEntropySignal(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{"www.allowed.test": "93.184.216.34"})
	g := startEgressGateway(t, up, nil)
	c := g.client(agentA)
	ask := func(t *testing.T, name string) int {
		t.Helper()
		return askDNS(t, c, name, mdns.TypeA)
	}
	count := func() (records int) {
		if b, err := os.ReadFile(g.cfg.Audit.Path); err != nil || len(bytes.TrimSpace(b)) == 0 {
			return 0 // nothing audited yet
		}
		for _, r := range auditEvents(t, g) {
			if r.Event == "dns_high_entropy" {
				records++
				if r.Fields["base_domain"] != "allowed.test" || r.Fields["sandbox"] != agentA.Sandbox {
					t.Errorf("record fields %v", r.Fields)
				}
			}
		}
		return records
	}
	if rc := ask(t, "www.allowed.test"); rc != mdns.RcodeSuccess || count() != 0 {
		t.Fatalf("natural name: rcode %d, %d records; want NOERROR and none", rc, count())
	}
	// NXDOMAIN from the upstream: the signal is raised, the answer unchanged.
	if rc := ask(t, "mzxw6ytboi2dsmrrgu3tqnbtgq2tmnzy.allowed.test"); rc != mdns.RcodeNameError {
		t.Fatalf("rcode %d, want NXDOMAIN", rc)
	}
	if rc := ask(t, "nbswy3dpeb3w64tmmqqhg5lddzxgk3tfmqqgc4tu.allowed.test"); rc != mdns.RcodeNameError {
		t.Fatalf("rcode %d, want NXDOMAIN", rc)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d dns_high_entropy records, want 1 (one per window)", n)
	}
	if n := g.counter(t, "sluice.dns.exfiltration_signals", "signal", "label_entropy"); n != 2 {
		t.Errorf("sluice.dns.exfiltration_signals{signal=label_entropy} = %d, want 2", n)
	}
}
