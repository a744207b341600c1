//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSandboxdValidate: `sandboxd validate` accepts sizes (1GiB) and says
// them back in its summary; a bad file gets sluice's form of error — the
// file, the key path and its line, one problem a line, every problem —
// and exit 1, printed once.
func TestSandboxdValidate(t *testing.T) {
	buildSandboxBins(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sock := filepath.Join(dir, "relay.sock")
	good := write("good.yaml", "gateway: "+sock+"\nlimits:\n  memory_bytes: 1GiB\n  workspace_bytes: 128MiB\n")
	out, stderr, code := runBin(t, dir, sandboxdBin, "validate", "--config", good)
	if code != 0 || !strings.Contains(out, "ok: api /run/sluice/sandboxd.sock, gateway "+sock) || !strings.Contains(out, "memory 1GiB") ||
		!strings.Contains(out, "workspace 128MiB") || !strings.Contains(out, "warning: gateway: "+sock+": no such file or directory") {
		t.Errorf("validate good.yaml: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"typo.yaml", "host: a\nlimits:\n  pids: 64\n  memroy_bytes: 1GiB\n", "error: config typo.yaml: limits.memroy_bytes: unknown key (line 4)\n"},
		{"size.yaml", "limits:\n  memory_bytes: 1 gigabyte\n", `error: config size.yaml: limits.memory_bytes: "1 gigabyte" is not a size (bytes, or like 512MiB or 1GiB) (line 2)` + "\n"},
		{"small.yaml", "host: a\nlimits:\n  memory_bytes: 8MiB\n", "error: config small.yaml: limits.memory_bytes: must be >= 16MiB, got 8388608 (8MiB) (line 3)\n"},
		{"relative.yaml", "state_dir: var/lib\n", `error: config relative.yaml: state_dir: must be an absolute path, got "var/lib" (line 1)` + "\n"},
		{"two.yaml", "state_dir: var/lib\nlimits:\n  pids: 2\n", `error: config two.yaml: state_dir: must be an absolute path, got "var/lib" (line 1)` + "\n" +
			"error: config two.yaml: limits.pids: must be in 8..1048576, got 2 (line 3)\n"},
	} {
		write(tc.name, tc.body)
		out, stderr, code := runBin(t, dir, sandboxdBin, "validate", "--config", tc.name)
		if code != 1 || out != tc.want || stderr != "" {
			t.Errorf("validate %s: exit %d, stdout %q, stderr %q; want exit 1 and %q", tc.name, code, out, stderr, tc.want)
		}
	}
}

// TestSandboxdDaemonVerbs: with `sandboxd serve` running, create, ls, cp
// (in and out), exec, rm talk to its API socket; `run` goes through the
// daemon rather than failing on its state lock, and destroys its sandbox;
// `id` inside names the sandbox's own user (uid=1000(sandbox)); an unknown
// agent fails a run through the daemon as without one, a wider --egress
// fails the create; a verb on a sandbox that is gone fails with the
// daemon's not_found.
func TestSandboxdDaemonVerbs(t *testing.T) {
	e := newEnv(t)
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("kernel lacks user namespaces")
	}
	buildSandboxBins(t)
	d := mainConfig(e, "daemon")
	g := e.Start(d, e.Write(d))
	dir := sandboxState(t, "sluice-e2e-daemon-")
	cfg := filepath.Join(dir, "sandboxd.yaml")
	api := filepath.Join(dir, "api.sock")
	if err := os.WriteFile(cfg, []byte("api: "+api+"\nstate_dir: "+dir+"/state\ngateway: "+g.Sock+
		"\nlimits:\n  memory_bytes: 512MiB\n  workspace_bytes: 32MiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := exec.Command(sandboxdBin, "serve", "--config", cfg)
	var srvErr strings.Builder
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = srv.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = srv.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if fi, err := os.Stat(api); err == nil && fi.Mode().Type() == os.ModeSocket {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxd serve: no API socket at %s: %s", api, srvErr.String())
		}
	}
	sd := func(args ...string) (string, string, int) {
		t.Helper()
		return runBin(t, dir, sandboxdBin, append([]string{args[0], "--config", cfg}, args[1:]...)...)
	}

	out, stderr, code := sd("create", "--agent", "agent-a", "--session", "cli", "--user", "alice", "--memory", "256MiB")
	id := strings.TrimSpace(out)
	if code != 0 || len(id) != 16 {
		t.Fatalf("create: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	out, _, code = sd("ls")
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "agent-a") || !strings.Contains(out, "256MiB") {
		t.Errorf("ls: exit %d, %q; want %s of agent-a with 256MiB", code, out, id)
	}

	in := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(in, []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, stderr, code := sd("cp", in, id+":/workspace/in.txt"); code != 0 {
		t.Fatalf("cp in: exit %d, %q %q", code, out, stderr)
	}
	out, stderr, code = sd("exec", id, "--", "/bin/sh", "-c", "cat /workspace/in.txt; id; whoami; echo made inside > /workspace/out.txt; echo to-stderr >&2; exit 3")
	if code != 3 || out != "from the host\nuid=1000(sandbox) gid=1000(sandbox) groups=1000(sandbox)\nsandbox\n" || stderr != "to-stderr\n" {
		t.Errorf("exec: exit %d, stdout %q, stderr %q; want 3, the file, the sandbox user's name", code, out, stderr)
	}
	got := filepath.Join(t.TempDir(), "out.txt")
	if out, stderr, code := sd("cp", id+":/workspace/out.txt", got); code != 0 {
		t.Fatalf("cp out: exit %d, %q %q", code, out, stderr)
	}
	if b, err := os.ReadFile(got); err != nil || string(b) != "made inside\n" {
		t.Errorf("cp out: %q, %v", b, err)
	}
	if _, stderr, code := sd("cp", id+":/workspace/../etc/passwd", got); code != 1 || !strings.Contains(stderr, "bad_request") {
		t.Errorf("cp of a path leaving the workspace: exit %d, stderr %q; want 1 bad_request", code, stderr)
	}

	// run goes through the daemon (its state lock is the daemon's).
	out, stderr, code = sd("run", "--agent", "agent-a", "--", "/bin/sh", "-c", "id -un; exit 5")
	if code != 5 || out != "sandbox\n" {
		t.Errorf("run with the daemon up: exit %d, stdout %q, stderr %q; want 5 and sandbox", code, out, stderr)
	}
	// A gateway other than the daemon's cannot be honoured through it.
	if _, stderr, code := sd("run", "--agent", "agent-a", "--no-gateway", "--", "true"); code != 1 || !strings.Contains(stderr, "add --state-dir DIR") {
		t.Errorf("run --no-gateway with the daemon up: exit %d, stderr %q; want 1 asking for --state-dir", code, stderr)
	}
	// Through the daemon too, an agent the gateway does not know fails
	// the run before the command runs, and --egress wider than the
	// agent's list (agent-a has none) fails the create.
	out, stderr, code = sd("run", "--agent", "nobody", "--", "echo", "ran")
	if code != 1 || out != "" || !strings.Contains(stderr, `unknown_agent: agent "nobody" is not configured`) {
		t.Errorf("run --agent nobody with the daemon up: exit %d, stdout %q, stderr %q; want 1 and unknown_agent", code, out, stderr)
	}
	out, stderr, code = sd("create", "--agent", "agent-a", "--egress", "evil.test")
	if code != 1 || out != "" || !strings.Contains(stderr, "(403 egress_not_granted)") || !strings.Contains(stderr, "evil.test") {
		t.Errorf("create --egress evil.test: exit %d, stdout %q, stderr %q; want 1 and egress_not_granted", code, out, stderr)
	}
	out, _, _ = sd("ls")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 {
		t.Errorf("ls after the runs: %q, want the header and %s only (run destroys its sandbox, a refused create makes none)", out, id)
	}

	if out, stderr, code := sd("rm", id); code != 0 {
		t.Errorf("rm: exit %d, %q %q", code, out, stderr)
	}
	out, _, _ = sd("ls")
	if strings.Contains(out, id) {
		t.Errorf("ls after rm: %q", out)
	}
	for _, args := range [][]string{{"rm", id}, {"exec", id, "--", "true"}} {
		if _, stderr, code := sd(args...); code != 1 || !strings.Contains(stderr, "not_found") {
			t.Errorf("%v after rm: exit %d, stderr %q; want 1 and not_found", args, code, stderr)
		}
	}
}
