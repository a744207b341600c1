package gateway

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
			resp, err := via.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{"query":{"limit":5}}`))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
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
