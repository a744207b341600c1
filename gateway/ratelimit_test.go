package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
)

// TestToolCallRateLimit is THREATS B7: a sandbox flooding tool calls past
// its agent's rate_limit gets 429 rate_limited with Retry-After, nothing
// upstream and an audit record, while another sandbox of the same agent
// is unaffected, and the bucket refills.
func TestToolCallRateLimit(t *testing.T) {
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", func(c *config.Config) {
		for i := range c.Agents {
			if c.Agents[i].Name == "agent-a" {
				c.Agents[i].RateLimit = &config.RateLimit{PerSecond: 0.5, Burst: 2} // one call per 2 s after 2
			}
		}
	})
	flood := g.client(agentA)
	other := agentA
	other.Sandbox = "sb-2"
	call := func(c *http.Client) (*http.Response, string) {
		t.Helper()
		resp, err := c.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{"query":{"limit":5}}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	for i := range 2 {
		if resp, body := call(flood); resp.StatusCode != 200 {
			t.Fatalf("call %d within the burst: %d %s", i, resp.StatusCode, body)
		}
	}
	before := up.requests.Load()
	resp, body := call(flood)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, `"rate_limited"`) || !strings.Contains(body, "0.5 tool calls per second") {
		t.Fatalf("third call: %d %s, want 429 rate_limited naming the limit", resp.StatusCode, body)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "1" && ra != "2" {
		t.Errorf("Retry-After %q, want 1 or 2 (seconds until a token)", ra)
	}
	if up.requests.Load() != before {
		t.Error("a rate-limited call reached the upstream")
	}
	var audited bool
	for _, rec := range auditEvents(t, g) {
		audited = audited || rec.Event == "decision" && rec.Fields["code"] == "rate_limited"
	}
	if !audited {
		t.Error("no audit record of the rate-limited call")
	}
	if resp, body := call(g.client(other)); resp.StatusCode != 200 {
		t.Fatalf("another sandbox of the same agent: %d %s, want its own bucket", resp.StatusCode, body)
	}
	time.Sleep(2100 * time.Millisecond)
	if resp, body := call(flood); resp.StatusCode != 200 {
		t.Fatalf("after the bucket refilled: %d %s", resp.StatusCode, body)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{time.Millisecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}, {0, 1}} {
		if got := refusal.RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("refusal.RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}
