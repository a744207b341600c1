//go:build linux

package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// TestSandboxWhileGatewayDown is THREATS G1's sandbox side: code in a real
// sandbox calls a tool while the gateway is killed (-9). Both ways out
// answer 503 gateway_unavailable, from sandboxd's relay, rather than a
// reset connection; nothing reaches the upstream.
func TestSandboxWhileGatewayDown(t *testing.T) {
	e := newEnv(t)
	buildSandboxBins(t)
	d := mainConfig(e, "down")
	g := e.Start(d, e.Write(d))
	g.Kill9()
	cb := casebook.Expect(t, "G1", "a tool call from inside a sandbox (3128 and the per-sandbox socket) while the gateway is killed",
		"503 gateway_unavailable from sandboxd's relay on both, nothing upstream")

	state := sandboxState(t, "sluice-e2e-down-")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sandboxdBin, "run", "--state-dir", state, "--gateway", g.Sock,
		"--agent", "agent-a", "--session", "sess-down", "--user", "alice",
		"--copy", agentBin+":/workspace/agent", "--timeout", "60s",
		"--", "/workspace/agent", "tickets.list_tickets", "127.0.0.1:1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxd run: %v\nstdout: %s\nstderr: %s", err, out.String(), errb.String())
	}
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		k, v, _ := strings.Cut(l, " ")
		lines[k] = v
	}
	cb.Observef("tcp %.60q; unix %.60q; upstream requests %d", lines["tcp"], lines["unix"], len(e.Up.Requests()))
	for _, way := range []string{"tcp", "unix"} {
		if !strings.HasPrefix(lines[way], "503 ") || !strings.Contains(lines[way], `"gateway_unavailable"`) {
			t.Errorf("%s with the gateway down: %q, want 503 gateway_unavailable", way, lines[way])
		}
	}
	if n := len(e.Up.Requests()); n != 0 {
		t.Errorf("%d upstream requests with the gateway down", n)
	}
}
