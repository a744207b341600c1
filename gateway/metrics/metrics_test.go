package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
)

// TestRuleLabelRepeats: a repeated (match, action) pair gets a suffix; a
// Rego module's rule passes through.
func TestRuleLabelRepeats(t *testing.T) {
	var tel Gateway
	tel.SetRules([]config.Policy{{Match: "a.*", Action: "ask"}, {Match: "b", Action: "allow"}, {Match: "a.*", Action: "ask"}})
	for rule, want := range map[string]string{
		"policies[0]": "policy:a.*:ask", "policies[1]": "policy:b:allow", "policies[2]": "policy:a.*:ask#2",
		"sluice.policies.payments": "sluice.policies.payments", "default": "default",
	} {
		if got := tel.RuleLabel(rule); got != want {
			t.Errorf("RuleLabel(%q) = %q, want %q", rule, got, want)
		}
	}
}

// TestScrape: what the instruments record is on the handler, under the
// names dashboards use, and a status outside 100..599 is counted as
// "other"; the label-set caches return the same series each time.
func TestScrape(t *testing.T) {
	g, err := New()
	if err != nil {
		t.Fatal(err)
	}
	g.Zero([]string{"tickets"})
	g.UpstreamAnswered("tickets", "tool_call", 503)
	g.UpstreamAnswered("tickets", "tool_call", 503)
	g.UpstreamAnswered("", "proxy", 999)
	g.ObserveLatency("allow", 0.002)
	g.ObserveLatency("allow", 0.002)
	g.Refused(refusal.UntrustedPeer)
	g.Reload(false)
	rec := httptest.NewRecorder()
	g.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`sluice_upstream_responses_total{class="5xx",connector="tickets",path="tool_call"} 2`,
		`sluice_upstream_responses_total{class="2xx",connector="tickets",path="tool_call"} 0`,
		`sluice_upstream_responses_total{class="other",connector="",path="proxy"} 1`,
		`sluice_request_duration_seconds_count{decision="allow"} 2`,
		`sluice_request_duration_seconds_count{decision="block"} 0`,
		`sluice_connections_refused_total{code="untrusted_peer"} 1`,
		`sluice_policy_reloads_total{result="error"} 1`,
		`sluice_policy_reloads_total{result="ok"} 0`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
