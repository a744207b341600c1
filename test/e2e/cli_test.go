//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// runBin runs bin with args in dir and returns stdout, stderr and the exit
// code (-1 if it did not start).
func runBin(t *testing.T, dir, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return out.String(), errb.String(), code
}

// buildCommit is the vcs.revision (with "+modified") that `go version -m`
// reads from bin's build info, or "unknown" when the build carries none
// (-buildvcs=false, or a git worktree, which the go command does not stamp).
func buildCommit(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", bin, err)
	}
	rev, mod := "unknown", false
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == "build" {
			if v, ok := strings.CutPrefix(f[1], "vcs.revision="); ok {
				rev = v
			}
			mod = mod || f[1] == "vcs.modified=true"
		}
	}
	if mod {
		rev += "+modified"
	}
	return rev
}

// TestVersion: `sluice --version` and `sandboxd --version` print the module
// version ("(devel)" from a checkout) and exactly the commit the binary's
// build info carries; `sandboxd serve` logs both in its start-up line.
func TestVersion(t *testing.T) {
	buildSandboxBins(t)
	for _, b := range []struct{ name, bin string }{{"sluice", sluiceBin}, {"sandboxd", sandboxdBin}} {
		out, stderr, code := runBin(t, t.TempDir(), b.bin, "--version")
		want := b.name + " (devel) commit " + buildCommit(t, b.bin) + "\n"
		if code != 0 || out != want {
			t.Errorf("%s --version: exit %d, %q (stderr %q), want %q", b.name, code, out, stderr, want)
		}
	}
	// The start-up line: serve with its API in a fresh directory, stopped
	// once the line is out.
	dir := sandboxState(t, "sluice-e2e-version-")
	cfg := filepath.Join(dir, "sandboxd.yaml")
	if err := os.WriteFile(cfg, []byte("api: "+dir+"/api.sock\nstate_dir: "+dir+"/state\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := exec.Command(sandboxdBin, "serve", "--config", cfg)
	pipe, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "sandboxd serving") {
				lines <- sc.Text()
			}
		}
		close(lines)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(20 * time.Second):
	}
	_ = srv.Process.Signal(os.Interrupt)
	for range lines { // drain until the pipe closes, then reap
	}
	_ = srv.Wait()
	m := regexp.MustCompile(`msg="sandboxd serving" version=\(devel\) commit=(\S+)`).FindStringSubmatch(line)
	if m == nil || m[1] != buildCommit(t, sandboxdBin) {
		t.Errorf("sandboxd serve start-up line: %q, want version=(devel) commit=%s", line, buildCommit(t, sandboxdBin))
	}
}

// TestReadOnlyVerbsCreateNothing: `sluice secrets list`, `tools`,
// `validate` and `policy eval` (--input and --tool) leave a fresh directory exactly as they
// found it (no key file, store, lock or directory), with a config whose
// every path (secrets, store, audit, CA) points into it; and `secrets list`
// and `validate` create nothing beside a key whose store was never written.
func TestReadOnlyVerbsCreateNothing(t *testing.T) {
	dir := t.TempDir()
	spec, err := os.ReadFile("testdata/tickets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"spec.yaml": string(spec),
		"sluice.yaml": `store: sqlite:state/sluice.db
audit: {path: state/audit.log}
secrets: {backend: local, local: {path: state/secrets.json, key_file: state/secrets.key}}
egress: {intercept: {ca_dir: state/ca}}
connectors:
  - {slug: tickets, spec: spec.yaml, base_url: "https://tickets.example.com"}
agents:
  - {name: agent-a, connectors: [tickets]}
policies:
  - {match: tickets.list_tickets, action: allow}
  - {match: "*", action: block}
`,
		"input.json": `{"version": 1, "kind": "tool_call",
  "caller": {"sandbox": "sb-1", "agent": "agent-a", "session": "s1", "user": "alice"},
  "connector": "tickets", "tool": "tickets.list_tickets",
  "operation": {"id": "listTickets", "method": "GET", "path": "/tickets", "risk": "read", "tags": []},
  "args": {}, "request": {"method": "GET", "host": "tickets.example.com", "path": "/tickets", "query": {}, "headers": {}}}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tree := func() []string {
		var names []string
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && p != dir {
				names = append(names, strings.TrimPrefix(p, dir+"/"))
			}
			return nil
		})
		return names
	}
	before := strings.Join(tree(), " ")
	for _, v := range []struct {
		args []string
		out  string // in stdout: the verb did its work
	}{
		{[]string{"secrets", "list"}, "NAME"},
		{[]string{"tools"}, "tickets.list_tickets"},
		{[]string{"validate"}, "ok: 1 connectors"},
		{[]string{"policy", "eval", "--input", "input.json"}, `"allow"`},
		{[]string{"policy", "eval", "--tool", "tickets.list_tickets", "--agent", "agent-a"}, `"allow"`},
	} {
		out, stderr, code := runBin(t, dir, sluiceBin, v.args...)
		if code != 0 || !strings.Contains(out, v.out) {
			t.Errorf("sluice %v: exit %d, stdout %q, stderr %q", v.args, code, out, stderr)
		}
		if after := strings.Join(tree(), " "); after != before {
			t.Errorf("sluice %v changed the directory: %q, was %q", v.args, after, before)
		}
	}
	// A key and no store yet (as after a failed set): still nothing new.
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state/secrets.key"), bytes.Repeat([]byte{7}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	before = strings.Join(tree(), " ")
	for _, args := range [][]string{{"secrets", "list"}, {"validate"}} {
		if _, stderr, code := runBin(t, dir, sluiceBin, args...); code != 0 {
			t.Errorf("sluice %v with a key and no store: exit %d, %s", args, code, stderr)
		}
		if after := strings.Join(tree(), " "); after != before {
			t.Errorf("sluice %v changed the directory: %q, was %q", args, after, before)
		}
	}
}

// TestSandboxdRunFailsFast: a one-shot `sandboxd run` whose gateway socket
// is missing fails before it builds a sandbox, naming the socket; an
// --agent the gateway does not know fails with the gateway's
// unknown_agent before the command runs; a command that does not exist
// says so on stderr with its path (exit 127). Control: a known agent runs.
func TestSandboxdRunFailsFast(t *testing.T) {
	e := newEnv(t)
	buildSandboxBins(t)
	d := mainConfig(e, "runcheck")
	g := e.Start(d, e.Write(d))
	run := func(args ...string) (string, string, int, time.Duration) {
		start := time.Now()
		state := sandboxState(t, "sluice-e2e-run-")
		out, stderr, code := runBin(t, state, sandboxdBin, append([]string{"run", "--state-dir", state}, args...)...)
		return out, stderr, code, time.Since(start)
	}

	missing := filepath.Join(t.TempDir(), "relay.sock")
	out, stderr, code, took := run("--gateway", missing, "--agent", "agent-a", "--", "echo", "ran")
	if code != 1 || out != "" || !strings.Contains(stderr, "gateway socket "+missing) || !strings.Contains(stderr, "no such file or directory") || took > 10*time.Second {
		t.Errorf("missing socket: exit %d in %s, stdout %q, stderr %q; want exit 1 naming the socket", code, took, out, stderr)
	}

	out, stderr, code, _ = run("--gateway", g.Sock, "--agent", "nobody", "--", "echo", "ran")
	if code != 1 || out != "" || !strings.Contains(stderr, `--agent "nobody"`) || !strings.Contains(stderr, `unknown_agent: agent "nobody" is not configured on this gateway`) {
		t.Errorf("unknown agent: exit %d, stdout %q, stderr %q; want exit 1 with unknown_agent", code, out, stderr)
	}

	for _, c := range []struct{ cmd, want string }{
		{"/workspace/no-such-tool", "exec /workspace/no-such-tool: no such file or directory"},
		{"no-such-tool", "exec no-such-tool: not found in PATH /usr/local/bin:/usr/bin:/bin"},
	} {
		out, stderr, code, _ = run("--gateway", g.Sock, "--agent", "agent-a", "--", c.cmd)
		if code != 127 || out != "" || !strings.Contains(stderr, c.want) {
			t.Errorf("missing command %s: exit %d, stdout %q, stderr %q; want 127 and %q", c.cmd, code, out, stderr, c.want)
		}
	}

	out, stderr, code, _ = run("--gateway", g.Sock, "--agent", "agent-a", "--", "echo", "ran")
	if code != 0 || out != "ran\n" {
		t.Errorf("control: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}
