//go:build linux

package e2e

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

var (
	mcpAgentOnce sync.Once
	mcpAgentBin  string
	mcpAgentErr  error
)

// mcpTSDir installs (once; test/tools/mcp-ts.sh) the TypeScript MCP SDK
// under /opt, which a sandbox sees read-only, and returns its directory.
func mcpTSDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("nodejs is not installed (./test.sh installs Debian's nodejs and npm)")
	}
	out, err := exec.Command("../tools/mcp-ts.sh").Output()
	if err != nil {
		t.Fatalf("test/tools/mcp-ts.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// sandboxdConfig lets a sandbox hold a copy of the sluice binary.
func sandboxdConfig(t *testing.T, state string) string {
	t.Helper()
	p := filepath.Join(state, "sandboxd.yaml")
	if err := os.WriteFile(p, []byte("limits:\n  file_bytes: 268435456\n  workspace_bytes: 536870912\n  memory_bytes: 1073741824\n  exec_timeout: 120s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// sandboxRun starts `sandboxd run` for agent-a with argv, its stdout read
// line by line into lines.
func sandboxRun(t *testing.T, ctx context.Context, g *gwenv.Gateway, copies []string, env []string, argv ...string) (*exec.Cmd, <-chan string, *strings.Builder) {
	t.Helper()
	state := sandboxState(t, "sluice-e2e-mcp-")
	args := []string{"--config", sandboxdConfig(t, state), "run", "--state-dir", state, "--gateway", g.Sock,
		"--agent", "agent-a", "--session", "sess-mcp", "--user", "alice", "--timeout", "90s", "--output-bytes", "1048576"}
	for _, c := range copies {
		args = append(args, "--copy", c)
	}
	for _, e := range env {
		args = append(args, "--env", e)
	}
	cmd := exec.CommandContext(ctx, sandboxdBin, append(append(args, "--"), argv...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines, &stderr
}

// approveWhenHeld approves agent-a's first pending hold as carol.
func approveWhenHeld(t *testing.T, g *gwenv.Gateway) string {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, _, m := g.AdminDo(http.MethodGet, "/api/v1/holds?status=pending", gwenv.CarolToken, "")
		if st != http.StatusOK {
			continue
		}
		hs, _ := m["holds"].([]any)
		for _, h := range hs {
			hm, _ := h.(map[string]any)
			if hm["status"] != "pending" {
				continue
			}
			id := hm["id"].(string)
			if st, body, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+id+"/approve", gwenv.CarolToken, `{"reason":"ok"}`); st != http.StatusOK {
				t.Fatalf("approve %s: %d %s", id, st, body)
			}
			return id
		}
	}
	t.Fatal("no pending hold to approve")
	return ""
}

// TestMCPClientsInSandbox: the official Go and TypeScript MCP clients,
// running inside real sandboxes made by sandboxd, reach the gateway's door
// at SLUICE_MCP_URL through sandboxd's relay, as the sandbox's identity:
// they list the tools, an allowed call returns the upstream's answer (the
// credential attached outside, never in the reply), a blocked call is
// isError policy_block, and the TypeScript client's ask call shows
// progress, then returns the result after an approval.
func TestMCPClientsInSandbox(t *testing.T) {
	e := newEnv(t)
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("kernel lacks user namespaces")
	}
	buildSandboxBins(t)
	mcpAgentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-e2e-mcp-bin-")
		if err == nil {
			err = os.Chmod(dir, 0o711)
		}
		if err == nil {
			mcpAgentBin, err = gwenv.BuildStatic(dir, "./test/e2e/testdata/mcpagent")
		}
		mcpAgentErr = err
	})
	if mcpAgentErr != nil {
		t.Fatal(mcpAgentErr)
	}
	tsDir := mcpTSDir(t)
	script, err := filepath.Abs("testdata/mcp_client.mjs")
	if err != nil {
		t.Fatal(err)
	}
	d := mainConfig(e, "sluice")
	withApprovers(d, gwenv.CarolToken)
	d.Gateway()["hold_wait"] = "30s"
	g := e.Start(d, e.Write(d))
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()

	check := func(client string, got map[string]string) {
		t.Helper()
		for _, want := range []string{"tickets.list_tickets", "tickets.create_refund", "sluice.await_hold"} {
			if !strings.Contains(got["tools"], want) {
				t.Errorf("%s in a sandbox: tools %q lack %s", client, got["tools"], want)
			}
		}
		if strings.Contains(got["tools"], "tickets.delete_ticket") {
			t.Errorf("%s in a sandbox: tools list the blocked tickets.delete_ticket", client)
		}
		if !strings.HasPrefix(got["allowed"], "false ") || !strings.Contains(got["allowed"], `"status":200`) {
			t.Errorf("%s in a sandbox: allowed call %q; want the upstream's 200", client, got["allowed"])
		}
		if !strings.HasPrefix(got["blocked"], "true ") || !strings.Contains(got["blocked"], "policy_block: ") {
			t.Errorf("%s in a sandbox: blocked call %q; want isError policy_block", client, got["blocked"])
		}
		e.Keep([]byte(got["allowed"] + got["blocked"] + got["ask"]))
	}

	// The Go SDK's client.
	cmd, lines, stderr := sandboxRun(t, ctx, g, []string{mcpAgentBin + ":/workspace/mcpagent"}, nil, "/workspace/mcpagent")
	got := map[string]string{}
	for l := range lines {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go client in a sandbox: %v\n%v\n%s", err, got, stderr)
	}
	if got["url"] != "http://127.0.0.1:3128/mcp" {
		t.Errorf("SLUICE_MCP_URL in a sandbox is %q, want http://127.0.0.1:3128/mcp", got["url"])
	}
	check("the Go client", got)

	// The TypeScript SDK's client, under Debian's nodejs.
	cmd, lines, stderr = sandboxRun(t, ctx, g, []string{script + ":/workspace/client.mjs"}, []string{"MCP_TS_DIR=" + tsDir}, "/usr/bin/node", "/workspace/client.mjs")
	got = map[string]string{}
	approved := ""
	for l := range lines {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
		if k == "progress-first" {
			approved = approveWhenHeld(t, g)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("typescript client in a sandbox: %v\n%v\n%s", err, got, stderr)
	}
	check("the TypeScript client", got)
	if approved == "" || got["progress"] == "0" {
		t.Errorf("the TypeScript client's ask call: no progress before the approval (progress %q)", got["progress"])
	}
	if !strings.HasPrefix(got["ask"], "false ") || !strings.Contains(got["ask"], `"status":`) {
		t.Errorf("the TypeScript client's ask call after approval: %q; want the upstream's result", got["ask"])
	}
	// Every call the sandboxes made is the relayed identity's.
	var calls int
	for _, m := range g.LogLines() {
		if m["msg"] != "tool_call" {
			continue
		}
		calls++
		if m["agent"] != "agent-a" || m["session"] != "sess-mcp" || m["user"] != "alice" {
			t.Errorf("decision line %v: want agent-a / sess-mcp / alice (the relay's identity)", m)
		}
	}
	if calls < 5 {
		t.Errorf("the gateway logged %d calls from the sandboxes, want at least 5", calls)
	}
}

// TestMCPStdioBridgeInSandbox: `sluice mcp-stdio`, inside a real sandbox,
// under the Go SDK's stdio client (CommandTransport on `sandboxd run`):
// initialize, tools/list and an allowed and a blocked call go through the
// sandbox's relay to the gateway's door.
func TestMCPStdioBridgeInSandbox(t *testing.T) {
	e := newEnv(t)
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("kernel lacks user namespaces")
	}
	buildSandboxBins(t)
	d := mainConfig(e, "sluice")
	g := e.Start(d, e.Write(d))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	state := sandboxState(t, "sluice-e2e-mcpstdio-")
	var stderr strings.Builder
	cmd := exec.Command(sandboxdBin, "--config", sandboxdConfig(t, state), "run", "--state-dir", state, "--gateway", g.Sock,
		"--agent", "agent-a", "--session", "sess-stdio", "--user", "alice", "--timeout", "60s",
		"--copy", sluiceBin+":/workspace/sluice", "--", "/workspace/sluice", "mcp-stdio")
	cmd.Stderr = &stderr
	c := sdk.NewClient(&sdk.Implementation{Name: "stdio-go", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect over sluice mcp-stdio: %v\n%s", err, stderr.String())
	}
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list over stdio: %v\n%s", err, stderr.String())
	}
	var names []string
	for _, tl := range lt.Tools {
		names = append(names, tl.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "tickets.list_tickets") {
		t.Errorf("tools over stdio: %v", names)
	}
	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.list_tickets", Arguments: map[string]any{}})
	if err != nil || r.IsError || structured(t, r)["status"] != float64(200) {
		t.Errorf("allowed call over stdio: %v %+v", err, r)
	}
	if r != nil {
		e.Keep([]byte(toolText(r)))
	}
	r, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.delete_ticket", Arguments: map[string]any{"path": map[string]any{"id": "T-1"}}})
	if err != nil || !r.IsError || !strings.HasPrefix(toolText(r), "policy_block: ") {
		t.Errorf("blocked call over stdio: %v %q", err, toolText(r))
	}
	if err := cs.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	line := g.AwaitLog("the stdio call's decision line", func(m map[string]any) bool {
		return m["msg"] == "tool_call" && m["session"] == "sess-stdio" && m["decision"] == "allow"
	})
	if line["agent"] != "agent-a" {
		t.Errorf("decision line %v: want the relayed agent-a", line)
	}
}
