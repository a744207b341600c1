package gateway

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/config"
)

// BenchmarkMCPCall compares one allowed call through the MCP door with the
// same call over POST /v1/tools, on one gateway (audit on /dev/shm), in
// process, so that a CPU profile shows what the door adds.
func BenchmarkMCPCall(b *testing.B) {
	up := newUpstream(b)
	g := startGateway(b, up.URL, "", func(c *config.Config) {
		c.Audit.Path = filepath.Join(b.TempDir(), "audit.log")
		if dir, err := os.MkdirTemp("/dev/shm", "sluice-bench-"); err == nil {
			b.Cleanup(func() { os.RemoveAll(dir) })
			c.Audit.Path = filepath.Join(dir, "audit.log")
		}
	})
	b.Run("post", func(b *testing.B) {
		via := g.client(agentA)
		for i := 0; i < b.N; i++ {
			postListTickets(b, via)
		}
	})
	b.Run("mcp", func(b *testing.B) {
		ctx := context.Background()
		cs, err := sdk.NewClient(&sdk.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx,
			&sdk.StreamableClientTransport{Endpoint: "http://sluice/mcp", HTTPClient: &http.Client{Transport: g.client(agentA).Transport}, DisableStandaloneSSE: true}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer cs.Close()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.list_tickets", Arguments: map[string]any{"query": map[string]any{"limit": 5}}})
			if err != nil || r.IsError {
				b.Fatalf("%v %+v", err, r)
			}
		}
	})
}

// BenchmarkMCPCallRatio makes one allowed call over POST /v1/tools and the
// same call through the MCP door in every iteration, alternating, and
// reports the median of each and their ratio: on a shared, loaded machine
// the two halves see the same load, so the ratio (mcp/post) is what to
// compare across changes, not the absolute times.
func BenchmarkMCPCallRatio(b *testing.B) {
	up := newUpstream(b)
	g := startGateway(b, up.URL, "", func(c *config.Config) {
		c.Audit.Path = filepath.Join(b.TempDir(), "audit.log")
		if dir, err := os.MkdirTemp("/dev/shm", "sluice-bench-"); err == nil {
			b.Cleanup(func() { os.RemoveAll(dir) })
			c.Audit.Path = filepath.Join(dir, "audit.log")
		}
	})
	via := g.client(agentA)
	ctx := context.Background()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: "http://sluice/mcp", HTTPClient: &http.Client{Transport: g.client(agentA).Transport}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	post := func() { postListTickets(b, via) }
	viaMCP := func() {
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.list_tickets", Arguments: map[string]any{"query": map[string]any{"limit": 5}}})
		if err != nil || r.IsError {
			b.Fatalf("%v %+v", err, r)
		}
	}
	for range 20 { // warm both paths: connections, the decision cache
		post()
		viaMCP()
	}
	ps, ms := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		post()
		t1 := time.Now()
		viaMCP()
		ps, ms = append(ps, t1.Sub(t0)), append(ms, time.Since(t1))
	}
	b.StopTimer()
	med := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	p, m := med(ps), med(ms)
	b.ReportMetric(float64(p.Microseconds()), "post-µs")
	b.ReportMetric(float64(m.Microseconds()), "mcp-µs")
	b.ReportMetric(float64(m)/float64(p), "mcp/post")
}
