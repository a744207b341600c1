package gateway

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestProxyUpstreamConnectionsPerCaller: absolute-form requests reuse an
// upstream connection for the same caller and host, and never send two
// callers' requests over one connection (THREATS F1-F4: a caller who
// desynchronises a connection confuses only its own responses).
func TestProxyUpstreamConnectionsPerCaller(t *testing.T) {
	be := startBenchEgress(t, "", nil)
	callers := []struct {
		name string
		id   wire.Identity
	}{
		{"agent-a in sb-1", agentA},
		{"agent-a in sb-2", wire.Identity{Sandbox: "sb-2", Agent: "agent-a", Session: "s-2", User: "alice"}},
		{"agent-a in sb-1, another session", wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-9", User: "alice"}},
	}
	for round := range 3 {
		for _, c := range callers {
			cl := be.viaProxyAs(t, c.id)
			req, _ := http.NewRequest(http.MethodGet, "http://pkg.example/x", nil)
			req.Header.Set("X-Test-Caller", c.name)
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatalf("round %d, %s: %v", round, c.name, err)
			}
			resp.Body.Close()
			cl.CloseIdleConnections() // a new sandbox connection each time: only the gateway can reuse
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("round %d, %s: %d", round, c.name, resp.StatusCode)
			}
		}
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	perCaller := map[string]int{}
	for conn, cs := range be.conns {
		if len(cs) != 1 {
			t.Errorf("upstream connection %s carried requests of %d callers: %v", conn, len(cs), cs)
		}
		for c := range cs {
			perCaller[c]++
		}
	}
	for _, c := range callers {
		if perCaller[c.name] != 1 {
			t.Errorf("%s used %d upstream connections for 3 sequential requests, want 1 (reuse)", c.name, perCaller[c.name])
		}
	}
}

// TestUpstreamPoolEviction: a caller's transport is kept while used, let go
// after the idle time, and the least recently used goes first when the pool
// is full.
func TestUpstreamPoolEviction(t *testing.T) {
	made := 0
	newPool := func() *upstreamPool {
		return newUpstreamPool(time.Hour, func() *http.Transport { made++; return &http.Transport{} })
	}
	caller := func(i int) policy.Caller { return policy.Caller{Sandbox: fmt.Sprintf("sb-%d", i), Agent: "a"} }
	tests := []struct {
		name string
		run  func(p *upstreamPool) string // "" when the pool behaved
	}{
		{"same caller, same transport", func(p *upstreamPool) string {
			if p.get(caller(1)) != p.get(caller(1)) || len(p.m) != 1 {
				return "a caller got two transports"
			}
			return ""
		}},
		{"callers never share", func(p *upstreamPool) string {
			if p.get(caller(1)) == p.get(caller(2)) {
				return "two callers share a transport"
			}
			return ""
		}},
		{"idle transports are let go", func(p *upstreamPool) string {
			p.get(caller(1))
			p.m[caller(1)].used = time.Now().Add(-2 * time.Hour)
			p.swept = time.Time{}
			p.get(caller(2))
			if _, ok := p.m[caller(1)]; ok || len(p.m) != 1 {
				return "a transport idle for 2h was kept"
			}
			return ""
		}},
		{"full pool drops the least recently used", func(p *upstreamPool) string {
			for i := range maxPooledCallers {
				p.get(caller(i))
			}
			p.m[caller(7)].used = time.Now().Add(-time.Minute)
			p.get(caller(maxPooledCallers))
			if _, ok := p.m[caller(7)]; ok || len(p.m) != maxPooledCallers {
				return fmt.Sprintf("after overflow: %d callers, oldest kept %v", len(p.m), ok)
			}
			return ""
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			made = 0
			if msg := tc.run(newPool()); msg != "" {
				t.Fatal(msg)
			}
			if made == 0 {
				t.Fatal("no transport was made")
			}
		})
	}
}
