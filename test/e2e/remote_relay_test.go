//go:build linux

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestSandboxThroughRemoteGateway: sandboxd on a "host" apart from the
// gateway reaches it over mutual TLS (sandboxd gateway_tls → gateway
// relay_tls). Code inside a real sandbox calls a tool through 3128 and
// through /run/sluice/gateway.sock; both arrive with the identity sandboxd
// relayed and the host its certificate names. A sandboxd whose
// certificate does not name its host refuses to start, and one with a
// certificate from another CA is refused by the gateway.
func TestSandboxThroughRemoteGateway(t *testing.T) {
	e := newEnv(t)
	buildSandboxBins(t)
	const node = "node-a.sandbox.test"
	pki := gwenv.NewRelayPKI(t, e.Dir, node)
	d := mainConfig(e, "remote")
	addr := fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(9000)) // below the ephemeral range, in the env's own namespace
	d.Gateway()["relay_tls"] = map[string]any{"listen": addr, "cert_file": pki.ServerCert, "key_file": pki.ServerKey, "client_ca_file": pki.CA}
	g := e.Start(d, e.Write(d))

	state := sandboxState(t, "sluice-e2e-remote-")
	sbxConfig := func(host, cert, key string) string {
		p := filepath.Join(state, host+"-"+filepath.Base(cert)+".yaml")
		y := fmt.Sprintf("state_dir: %s\nhost: %s\ngateway_tls: {address: %q, cert_file: %s, key_file: %s, ca_file: %s}\n",
			filepath.Join(state, "st"), host, addr, cert, key, pki.CA)
		if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// sandboxd runs in the env's namespace, where the gateway listens: the
	// TCP connection is the remote path; nothing uses the gateway's socket.
	run := func(cfg string, argv ...string) (string, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		// nsenter joins only the network namespace (ip netns exec would
		// also remount /sys, hiding the cgroup hierarchies).
		args := append([]string{"--net=/run/netns/" + e.NS.Name, sandboxdBin, "run", "--config", cfg,
			"--agent", "agent-a", "--session", "sess-remote", "--user", "alice",
			"--copy", agentBin + ":/workspace/agent", "--timeout", "60s", "--"}, argv...)
		cmd := exec.CommandContext(ctx, "nsenter", args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}

	t.Run("a tool call from inside arrives with the sandbox's identity", func(t *testing.T) {
		out, errOut, err := run(sbxConfig(node, pki.ClientCert, pki.ClientKey), "/workspace/agent", "tickets.list_tickets", "127.0.0.1:1")
		if err != nil {
			t.Fatalf("sandboxd run: %v\nstdout: %s\nstderr: %s\ngateway: %s", err, out, errOut, g.Stderr())
		}
		e.Keep([]byte(out))
		lines := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			k, v, _ := strings.Cut(l, " ")
			lines[k] = v
		}
		for _, way := range []string{"tcp", "unix"} {
			if !strings.HasPrefix(lines[way], "200 ") || !strings.Contains(lines[way], `"status":200`) {
				t.Errorf("%s from inside the sandbox: %q, want 200 with the upstream's answer", way, lines[way])
			}
		}
		calls := 0
		for _, m := range g.For(t).LogLines() {
			if m["msg"] == "tool_call" && m["session"] == "sess-remote" {
				calls++
				if m["agent"] != "agent-a" || m["user"] != "alice" || m["decision"] != "allow" {
					t.Errorf("decision line %v: want agent-a / alice, allowed", m)
				}
			}
		}
		if calls != 2 {
			t.Errorf("gateway logged %d calls of session sess-remote, want 2 (tcp and unix)", calls)
		}
	})
	t.Run("a certificate that does not name the host: sandboxd refuses to start", func(t *testing.T) {
		_, errOut, err := run(sbxConfig("node-b.sandbox.test", pki.ClientCert, pki.ClientKey), "/bin/true")
		if err == nil || !strings.Contains(errOut, `does not name host "node-b.sandbox.test"`) {
			t.Fatalf("run: %v\n%s", err, errOut)
		}
	})
	t.Run("a certificate from another CA: the gateway refuses the connection", func(t *testing.T) {
		out, _, _ := run(sbxConfig(node, pki.OtherCert, pki.OtherKey), "/workspace/agent", "tickets.list_tickets", "127.0.0.1:1")
		if strings.Contains(out, "tcp 200") || strings.Contains(out, "unix 200") {
			t.Fatalf("a relay with a foreign certificate got through: %s", out)
		}
		g.For(t).AwaitLog("TLS handshake refused", func(m map[string]any) bool {
			s, _ := m["msg"].(string)
			return strings.Contains(s, "TLS handshake failed")
		})
	})
}
