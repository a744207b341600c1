package metrics

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/tracing"
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
	body := scrape(g)
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

// TestServerDurationAttrs: http.server.request.duration, recorded through
// tracing.Server with the cached attribute sets, has the convention's
// labels for each method, route and status, as when they were built per
// request.
func TestServerDurationAttrs(t *testing.T) {
	g, err := New()
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/tools/{tool}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("tool") == "bad" {
			w.WriteHeader(http.StatusBadRequest)
		}
	})
	h := tracing.Server(mux, nil, g.ServerDuration, g.ServerAttrs)
	for _, c := range []struct{ method, path string }{{"POST", "/v1/tools/a"}, {"POST", "/v1/tools/b"}, {"POST", "/v1/tools/bad"}, {"BREW", "/v1/tools/a"}, {"GET", "/nowhere"}} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(c.method, c.path, nil))
	}
	body := scrape(g)
	for _, want := range []string{
		`http_server_request_duration_seconds_count{http_request_method="POST",http_response_status_code="200",http_route="/v1/tools/{tool}"} 2`,
		`http_server_request_duration_seconds_count{http_request_method="POST",http_response_status_code="400",http_route="/v1/tools/{tool}"} 1`,
		`http_server_request_duration_seconds_count{http_request_method="_OTHER",http_response_status_code="405",http_route=""} 1`,
		`http_server_request_duration_seconds_count{http_request_method="GET",http_response_status_code="404",http_route=""} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if got, want := len(g.hot.server.m), 4; got != want {
		t.Errorf("%d attribute sets cached, want %d (one per method, route and status)", got, want)
	}
}

// scrape is g's /metrics page.
func scrape(g *Gateway) string {
	rec := httptest.NewRecorder()
	g.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}
