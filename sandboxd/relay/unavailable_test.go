package relay

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestRelayGatewayUnavailable is THREATS G1's sandbox side: with the
// gateway down (its socket gone), a request through the proxy port or the
// per-sandbox socket gets 503 gateway_unavailable with Retry-After, in
// both the handoff and the copy mode, instead of a closed connection.
func TestRelayGatewayUnavailable(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	gone := filepath.Join(dir, "no-gateway.sock")
	for _, copyMode := range []bool{false, true} {
		name := "handoff"
		if copyMode {
			name = "copy"
		}
		t.Run(name, func(t *testing.T) {
			_, ns := newNetNS(t, "sluice-relay")
			sock := filepath.Join(dir, name, "gateway.sock")
			if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
				t.Fatal(err)
			}
			id := wire.Identity{Sandbox: "sbx-down", Agent: "agent-a", Session: "s1", User: "u", Host: "h"}
			openRelay(t, Options{NetNS: ns, Identity: id, Gateway: gone, SocketPath: sock, Copy: copyMode})
			for _, way := range []struct {
				name string
				c    *http.Client
			}{
				{"proxy port", httpIn(t, ns, "127.0.0.1:3128")},
				{"per-sandbox socket", unixClient(sock)},
			} {
				resp, err := way.c.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{}`))
				if err != nil {
					t.Fatalf("%s: %v, want a 503 answer", way.name, err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"gateway_unavailable"`) || resp.Header.Get("Retry-After") != "1" {
					t.Fatalf("%s: %d %q (Retry-After %q), want 503 gateway_unavailable", way.name, resp.StatusCode, b, resp.Header.Get("Retry-After"))
				}
			}
		})
	}
}

// unixClient is an HTTP client over the per-sandbox socket at path.
func unixClient(path string) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}
