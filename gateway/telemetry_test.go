package gateway

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
)

// scrape fetches the admin listener's /metrics.
func scrape(t *testing.T, g *testGateway) string {
	t.Helper()
	resp, err := http.Get("http://" + g.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// sample is the value of the series line that starts with series ("" when
// there is none).
func sample(m, series string) string {
	for _, l := range strings.Split(m, "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			return rest
		}
	}
	return ""
}

// TestMetricsFromTheStart scrapes /metrics before any call: every sluice
// family is there with zero-valued series, and so are the Go runtime and
// process families (open fds, RSS, goroutines).
func TestMetricsFromTheStart(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	m := scrape(t, g)
	for _, series := range []string{
		`sluice_decisions_total{action="allow",rule="default"}`,
		`sluice_policy_reloads_total{result="error"}`,
		`sluice_connections_refused_total{code="untrusted_peer"}`,
		`sluice_audit_failures_total`,
		`sluice_secret_reflected_total`,
		`sluice_upstream_responses_total{class="5xx",connector="tickets",path="tool_call"}`,
		`sluice_egress_active`,
		`sluice_dns_answers_total{rcode="NOERROR"}`,
		`sluice_dns_exfiltration_signals_total`,
		`sluice_request_duration_seconds_count{decision="allow"}`,
		`sluice_approval_latency_seconds_count{decision="approved"}`,
		`sluice_approval_latency_seconds_count{decision="denied"}`,
		`sluice_holds_pending`,
	} {
		if v := sample(m, series); v != "0" {
			t.Errorf("%s = %q right after start, want 0", series, v)
		}
	}
	if v := sample(m, `sluice_policy_reloads_total{result="ok"}`); v != "1" {
		t.Errorf(`sluice_policy_reloads_total{result="ok"} = %q after start, want 1 (the first load)`, v)
	}
	for _, family := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_open_fds", "process_resident_memory_bytes", "process_max_fds"} {
		if !regexp.MustCompile(`(?m)^` + family + ` [0-9.e+]+$`).MatchString(m) {
			t.Errorf("family %s missing from /metrics", family)
		}
	}
	if regexp.MustCompile(`(?m)^sluice_[a-z_]*\.`).MatchString(m) {
		t.Error("a sluice metric name is not Prometheus-style")
	}
	// The README names the families as they are scraped, and names them all.
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	// A name in double quotes is a JSON key (the store export's header)
	// or a cookie (the connect flow's), not a metric family.
	for _, sm := range regexp.MustCompile(`(?:^|[^"\w])(sluice_[a-z_]+)`).FindAllStringSubmatch(string(readme), -1) {
		n := sm[1]
		named[n] = true
		if !regexp.MustCompile(`(?m)^# TYPE ` + n + ` `).MatchString(m) {
			t.Errorf("README names %s; /metrics has no such family", n)
		}
	}
	for _, f := range regexp.MustCompile(`(?m)^# TYPE (sluice_[a-z_]+) `).FindAllStringSubmatch(m, -1) {
		if !named[f[1]] {
			t.Errorf("/metrics family %s is not in the README", f[1])
		}
	}
}

// TestMetricsHoldPendingAndApprovalLatency: the pending gauge goes 0 → 1
// → 0 around a hold and its approval; the latency histogram counts one.
func TestMetricsHoldPendingAndApprovalLatency(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	c := g.client(agentA)
	if v := sample(scrape(t, g), "sluice_holds_pending"); v != "0" {
		t.Fatalf("sluice_holds_pending before the call = %q, want 0", v)
	}
	r := doCall(t, c, "tickets.create_refund", refund)
	id, st := holdOf(t, r)
	if r.status != 202 || st != "pending" {
		t.Fatalf("ask: %d %s, want 202 pending", r.status, r.raw)
	}
	m := scrape(t, g)
	if v := sample(m, "sluice_holds_pending"); v != "1" {
		t.Fatalf("sluice_holds_pending while held = %q, want 1", v)
	}
	if v := sample(m, `sluice_decisions_total{action="ask",rule="policy:tickets.create_refund:ask"}`); v != "1" {
		t.Errorf("ask decision by its rule's name = %q, want 1", v)
	}
	ar := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", `{"reason":"ok"}`)
	if _, st := holdOf(t, ar); ar.status != 200 || st != "executed" {
		t.Fatalf("approve: %d %s", ar.status, ar.raw)
	}
	m = scrape(t, g)
	if v := sample(m, "sluice_holds_pending"); v != "0" {
		t.Errorf("sluice_holds_pending after approval = %q, want 0", v)
	}
	if v := sample(m, `sluice_approval_latency_seconds_count{decision="approved"}`); v != "1" {
		t.Errorf("approval latency count = %q, want 1", v)
	}
	if v := sample(m, `sluice_approval_latency_seconds_count{decision="denied"}`); v != "0" {
		t.Errorf("denied latency count = %q, want 0", v)
	}
}

// TestMetricsRuleLabelSurvivesReorder: the same call under two configs
// whose policies are in opposite orders is counted under the same rule
// label (the rule's match and action, not its index).
func TestMetricsRuleLabelSurvivesReorder(t *testing.T) {
	up := newUpstream(t)
	labels := make([]string, 2)
	for i, reverse := range []bool{false, true} {
		g := startGateway(t, up.URL, "", func(c *config.Config) {
			if reverse {
				// The catch-all must stay last to keep the same decisions.
				slices.Reverse(c.Policies[:len(c.Policies)-1])
			}
		})
		if r := doCall(t, g.client(agentA), "tickets.list_tickets", `{}`); r.status != 200 {
			t.Fatalf("call: %d %s", r.status, r.raw)
		}
		got := regexp.MustCompile(`sluice_decisions_total\{action="allow",rule="([^"]*)"\} 1`).FindStringSubmatch(scrape(t, g))
		if got == nil {
			t.Fatalf("config %d: no allow decision counted", i)
		}
		labels[i] = got[1]
	}
	if labels[0] != labels[1] || labels[0] != "policy:tickets.list_tickets:allow" {
		t.Fatalf("rule labels %q and %q, want both policy:tickets.list_tickets:allow", labels[0], labels[1])
	}
}
