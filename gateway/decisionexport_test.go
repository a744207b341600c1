package gateway

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/policylife"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestDecisionLogFromRecords: the export is fed from the audit records of
// decisions, so every decision of every entrance is exported exactly once
// with its entrance — a tool call allowed, one blocked, an ask (its
// hold_created record), raw egress through the forward proxy twice (the
// second decided from the one-second decision cache) — and the
// evaluations GET /v1/tools makes to hide blocked tools are not.
func TestDecisionLogFromRecords(t *testing.T) {
	g, col := startExporting(t, "")
	c := g.client(agentA)
	for range 3 { // three listings: each evaluates every granted tool
		resp, err := c.Get("http://sluice/v1/tools")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET /v1/tools: %d", resp.StatusCode)
		}
	}
	for _, tc := range []struct {
		tool, args string
		status     int
	}{
		{"tickets.list_tickets", `{}`, 200},
		{"tickets.delete_ticket", `{"path":{"id":"1"}}`, 403},
		{"tickets.create_refund", `{"body":{"amount":7,"reason":"dup"}}`, 202},
	} {
		if r := doCall(t, c, tc.tool, tc.args); r.status != tc.status {
			t.Fatalf("%s: %d %s", tc.tool, r.status, r.raw)
		}
	}
	// Raw egress through the forward proxy: agent-a has no egress
	// allowlist, so policy blocks it; the same request again within the
	// second is decided from the decision cache. Nothing is dialled.
	pc := &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "sluice"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, g.cfg.Gateway.SandboxSocket, agentA)
		},
	}}
	for range 2 {
		resp, err := pc.Get("http://pypi.org/simple/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("forward proxy to a host not allowed: %d", resp.StatusCode)
		}
	}

	// The decisions, as the audit log has them.
	want := map[string]string{} // request ID → entrance
	for _, r := range auditEvents(t, g) {
		d, _ := r.Fields[call.KeyDecision].(string)
		if d == "" || (r.Event != call.EventDecision && r.Event != "hold_created") {
			continue
		}
		if _, dup := want[r.RequestID]; dup {
			t.Fatalf("two decision records for %s", r.RequestID)
		}
		e, _ := r.Fields[call.KeyKind].(string)
		if e == "" {
			e = "tool_call"
			if tr, _ := r.Fields[call.KeyTransport].(string); tr != "" {
				e += "/" + tr
			}
		}
		want[r.RequestID] = e
	}
	entrances := slices.Sorted(func(yield func(string) bool) {
		for _, e := range want {
			if !yield(e) {
				return
			}
		}
	})
	if len(want) != 5 || !slices.Equal(entrances, []string{"http", "http", "tool_call/http", "tool_call/http", "tool_call/http"}) {
		t.Fatalf("decision records: %v; want 5 (allow, block, the hold, two proxied requests)", want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		col.mu.Lock()
		n := len(col.events)
		col.mu.Unlock()
		if n >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // anything more would have come with the flushes since
	col.mu.Lock()
	events := slices.Clone(col.events)
	col.mu.Unlock()
	got := map[string]string{}
	for _, ev := range events {
		rid, _ := ev["request_id"].(string)
		labels, _ := ev["labels"].(map[string]any)
		e, _ := labels[policylife.EntranceLabel].(string)
		if _, dup := got[rid]; dup || rid == "" {
			raw, _ := json.Marshal(ev)
			t.Fatalf("an event that is not one decision record's (twice, or with no request ID: a GET /v1/tools evaluation?): %s", raw)
		}
		got[rid] = e
		if res, _ := ev["result"].(map[string]any); res["action"] == nil || res["rule"] == nil {
			t.Errorf("event %s has no result: %v", rid, ev["result"])
		}
		// Inputs are recorded by default: the record's input (the
		// gateway's own encoding, call.EncodedJSON) is exported with it.
		if in, _ := ev["input"].(map[string]any); strings.HasPrefix(e, "tool_call") && in["tool"] == nil {
			t.Errorf("tool call event %s has no input: %v", rid, ev["input"])
		}
	}
	t.Logf("exported: %v", got)
	for rid, e := range want {
		if got[rid] != e {
			t.Errorf("decision %s: exported with entrance %q, want %q (exported: %v)", rid, got[rid], e, got)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("exported %d events %v, want exactly the %d decisions %v", len(got), got, len(want), want)
	}
}

// startExporting starts startHolds's gateway with decision_logs POSTed to
// a loopback collector every 20ms, and extra lines under decision_logs.
func startExporting(t *testing.T, extra string) (*testGateway, *logCollector) {
	t.Helper()
	col := &logCollector{}
	cs := httptest.NewServer(col)
	t.Cleanup(cs.Close)
	g := startHolds(t, newUpstream(t), `
decision_logs:
  url: `+cs.URL+`/logs
  flush: 20ms
`+extra, nil)
	return g, col
}
