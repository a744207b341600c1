//go:build linux

package e2e

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

var (
	sandboxOnce                  sync.Once
	sandboxdBin, agentBin, sbErr = "", "", error(nil)
)

// buildSandboxBins builds sandboxd and the in-sandbox agent, static, into
// a directory the sandbox's unmapped uid can traverse.
func buildSandboxBins(t *testing.T) {
	t.Helper()
	sandboxOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-e2e-sbx-bin-")
		if err != nil {
			sbErr = err
			return
		}
		if sbErr = os.Chmod(dir, 0o711); sbErr != nil {
			return
		}
		if sandboxdBin, sbErr = gwenv.BuildStatic(dir, "./cmd/sandboxd"); sbErr != nil {
			return
		}
		agentBin, sbErr = gwenv.BuildStatic(dir, "./test/e2e/testdata/agent")
	})
	if sbErr != nil {
		t.Fatalf("build sandbox binaries: %v", sbErr)
	}
}

// sandboxState is a state directory for `sandboxd run`, removed when t
// ends: 0711, so a sandbox's init (an unmapped uid) can reach its own
// directory inside it.
func sandboxState(t *testing.T, prefix string) string {
	t.Helper()
	state, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	if err := os.Chmod(state, 0o711); err != nil {
		t.Fatal(err)
	}
	return state
}

// TestSandboxReachesGatewayWithItsIdentity runs code inside a real sandbox
// made by sandboxd: its calls through 127.0.0.1:3128 and through
// /run/sluice/gateway.sock reach the real gateway as exactly the identity
// sandboxd relayed (agent, session, user), get the upstream's answer without
// the credential, and a connection to a listener on the host's loopback fails.
func TestSandboxReachesGatewayWithItsIdentity(t *testing.T) {
	e := newEnv(t)
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("kernel lacks user namespaces")
	}
	buildSandboxBins(t)
	d := mainConfig(e, "sluice")
	g := e.Start(d, e.Write(d))

	// A listener on the host's loopback that must stay unreachable (A1).
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	var hostAccepts sync.WaitGroup
	accepted := make(chan struct{}, 8)
	hostAccepts.Add(1)
	go func() {
		defer hostAccepts.Done()
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()

	state := sandboxState(t, "sluice-e2e-sbx-")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sandboxdBin, "run", "--state-dir", state, "--gateway", g.Sock,
		"--agent", "agent-a", "--session", "sess-42", "--user", "alice",
		"--copy", agentBin+":/workspace/agent", "--timeout", "60s",
		"--", "/workspace/agent", "tickets.list_tickets", host.Addr().String())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxd run: %v\nstdout: %s\nstderr: %s", err, out.String(), errb.String())
	}
	e.Keep(out.Bytes())
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		k, v, _ := strings.Cut(l, " ")
		lines[k] = v
	}
	for _, way := range []string{"tcp", "unix"} {
		if !strings.HasPrefix(lines[way], "200 ") || !strings.Contains(lines[way], `"status":200`) {
			t.Errorf("%s from inside the sandbox: %q, want 200 with the upstream's answer", way, lines[way])
		}
	}
	cb := casebook.Expect(t, "A1", "agent code in a sandbox made by sandboxd dials a listener on the host's loopback ("+host.Addr().String()+")",
		"an error inside the sandbox, no accept on the host; control: the same code reaches the gateway over tcp and unix")
	cb.Observef("escape: %s; control tcp %.40q, unix %.40q", lines["escape"], lines["tcp"], lines["unix"])
	if !strings.HasPrefix(lines["escape"], "error ") {
		t.Errorf("connect to the host's loopback from inside: %q, want an error", lines["escape"])
	}
	select {
	case <-accepted:
		t.Error("the host loopback listener accepted a connection from the sandbox")
	default:
	}

	// The gateway saw exactly the relayed identity on both calls.
	var calls int
	for _, m := range g.LogLines() {
		if m["msg"] != "tool_call" || m["tool"] != "tickets.list_tickets" {
			continue
		}
		calls++
		if m["agent"] != "agent-a" || m["session"] != "sess-42" || m["user"] != "alice" || m["decision"] != "allow" {
			t.Errorf("decision line %v: want agent-a / sess-42 / alice, allowed", m)
		}
		if sb, _ := m["sandbox"].(string); sb == "" {
			t.Errorf("decision line %v has no sandbox id", m)
		}
	}
	if calls != 2 {
		t.Errorf("gateway logged %d list_tickets calls, want 2 (tcp and unix)", calls)
	}
	if n := len(e.Up.Requests()); n != 2 {
		t.Errorf("upstream saw %d requests, want 2", n)
	}
}
