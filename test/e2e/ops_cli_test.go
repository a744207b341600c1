//go:build linux

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// readmeExample returns the fenced blocks (language, body) that follow the
// README's `<!-- example: NAME` marker, up to the next heading or marker;
// a block indented inside a list item is dedented.
func readmeExample(t *testing.T, name string) [][2]string {
	t.Helper()
	src, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(src), "<!-- example: "+name)
	if i < 0 {
		t.Fatalf("README.md has no <!-- example: %s marker", name)
	}
	rest := string(src[i+1:])
	if j := strings.Index(rest, "<!-- example:"); j >= 0 {
		rest = rest[:j]
	}
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	var out [][2]string
	for _, m := range regexp.MustCompile("(?s)\n( *)```(\\w+)\n(.*?)\n *```").FindAllStringSubmatch(rest, -1) {
		var lines []string
		for _, l := range strings.Split(m[3], "\n") {
			lines = append(lines, strings.TrimPrefix(l, m[1]))
		}
		out = append(out, [2]string{m[2], strings.Join(lines, "\n") + "\n"})
		if m[2] == "sh" {
			break // the example ends with its commands
		}
	}
	return out
}

// shellCommands splits a README sh block into commands (comments and
// blank lines dropped), each as its words; the README's commands use no
// quoting.
func shellCommands(block string) [][]string {
	var out [][]string
	for _, l := range strings.Split(block, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		out = append(out, strings.Fields(l))
	}
	return out
}

// sluiceArgs turns a README command line ("sluice …" or "go run
// ./cmd/sluice …") into the arguments for the built binary.
func sluiceArgs(t *testing.T, words []string) []string {
	t.Helper()
	switch {
	case len(words) > 3 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/sluice":
		return words[3:]
	case len(words) > 1 && words[0] == "sluice":
		return words[1:]
	}
	t.Fatalf("README command %q does not run sluice", strings.Join(words, " "))
	return nil
}

// TestREADMEPolicyTestWithConfig runs the README's example exactly: its
// policies: block in a config (with the e2e tickets spec and rego:
// [policies/]), its _test.rego as policies/config_test.rego, and its
// command. Every one of the example's tests passes; without
// --with-config (no rule loaded) each of them fails, so the flag is what
// makes them pass.
func TestREADMEPolicyTestWithConfig(t *testing.T) {
	requireHost(t)
	blocks := readmeExample(t, "policy test --with-config")
	if len(blocks) != 3 || blocks[0][0] != "yaml" || blocks[1][0] != "rego" || blocks[2][0] != "sh" {
		t.Fatalf("README example: want a yaml, a rego and an sh block, got %v", blocks)
	}
	dir := t.TempDir()
	spec, err := os.ReadFile("testdata/tickets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pol map[string]any
	if err := yaml.Unmarshal([]byte(blocks[0][1]), &pol); err != nil {
		t.Fatalf("README yaml: %v", err)
	}
	cfg := map[string]any{
		"store":      "sqlite:state/sluice.db",
		"audit":      map[string]any{"path": "state/audit.log"},
		"secrets":    map[string]any{"backend": "local", "local": map[string]any{"path": "state/secrets.json", "key_file": "state/secrets.key"}},
		"connectors": []map[string]any{{"slug": "tickets", "spec": "spec.yaml", "base_url": "https://tickets.example.com"}},
		"agents":     []map[string]any{{"name": "support-bot", "connectors": []string{"tickets"}}},
		"policies":   pol["policies"],
		"rego":       []string{"policies/"},
		// Someone who can approve the example's ask rule, as validate wants.
		"approvers": map[string]any{"users": []map[string]any{{"name": "fran", "groups": []string{"finance"}, "token_sha256": strings.Repeat("ab", 32)}}},
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "policies"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"sluice.yaml": data, "spec.yaml": spec, "policies/config_test.rego": []byte(blocks[1][1])} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmds := shellCommands(blocks[2][1])
	if len(cmds) != 1 {
		t.Fatalf("README sh block: want one command, got %q", cmds)
	}
	args := sluiceArgs(t, cmds[0])
	tests := regexp.MustCompile(`(?m)^(test_\w+) if`).FindAllStringSubmatch(blocks[1][1], -1)
	if len(tests) < 3 {
		t.Fatalf("README rego: want its tests, found %v", tests)
	}

	out, stderr, code := runBin(t, dir, sluiceBin, args...)
	if code != 0 || !strings.Contains(out, " 0 failed, 0 errors") {
		t.Errorf("sluice %v: exit %d\n%s%s", args, code, out, stderr)
	}
	for _, m := range tests {
		if !strings.Contains(out, "PASS  sluice.policies.config_test."+m[1]+"\n") {
			t.Errorf("with --with-config, %s did not pass:\n%s", m[1], out)
		}
	}
	without := slicesWithout(args, "--with-config")
	out, _, code = runBin(t, dir, sluiceBin, without...)
	if code == 0 {
		t.Errorf("sluice %v: exit 0, want the example's tests to fail without the config's rules\n%s", without, out)
	}
	for _, m := range tests {
		if !strings.Contains(out, "FAIL  sluice.policies.config_test."+m[1]+" ") {
			t.Errorf("without --with-config, %s did not fail:\n%s", m[1], out)
		}
	}
	// And the config it tests is one validate accepts, the _test.rego not
	// counted as a module.
	out, stderr, code = runBin(t, dir, sluiceBin, "validate")
	if code != 0 || !strings.Contains(out, "ok: 1 connectors, 5 tools, 3 rules, 0 modules, 0 warnings") {
		t.Errorf("validate: exit %d\n%s%s", code, out, stderr)
	}
}

func slicesWithout(s []string, drop string) []string {
	var out []string
	for _, v := range s {
		if v != drop {
			out = append(out, v)
		}
	}
	return out
}

// TestPolicyEvalToolMatchesGateway: `sluice policy eval --tool` decides on
// the input the gateway builds. A module blocks tickets.list_tickets with
// a reason that spells out the input's request (path, host, query as the
// upstream request has it), args, caller and operation; the reason the
// gateway logs for a real call and the reason eval prints for the same
// call are the same string. A call the gateway refuses before policy gets
// the same code from eval (unknown_tool, not_granted, schema_violation).
func TestPolicyEvalToolMatchesGateway(t *testing.T) {
	e := newEnv(t)
	pol := filepath.Join(e.Dir, "policies")
	if err := os.MkdirAll(pol, 0o755); err != nil {
		t.Fatal(err)
	}
	module := `package sluice.policies.evalcheck

decisions contains {"action": "block", "rule": "evalcheck.echo", "reason": sprintf("path=%s host=%s query=%v args=%v caller=%v op=%v method=%s", [
	input.request.path, input.request.host, input.request.query, input.args, input.caller, input.operation, input.request.method,
])} if {
	input.tool == "tickets.list_tickets"
}
`
	if err := os.WriteFile(filepath.Join(pol, "evalcheck.rego"), []byte(module), 0o644); err != nil {
		t.Fatal(err)
	}
	d := mainConfig(e, "evaltool")
	d["rego"] = []string{pol}
	path := e.Write(d)
	g := e.Start(d, path)
	g.AwaitReady()

	const args = `{"query":{"limit":5,"tag":["b","a"]},"headers":{"X-Forwarded-For":"10.9.9.9"}}`
	r := g.For(t).Do(agentA, http.MethodPost, "/v1/tools/tickets.list_tickets", args, nil)
	if r.Status != http.StatusForbidden || r.Code != "policy_block" {
		t.Fatalf("gateway call: %d %s %s", r.Status, r.Code, r.Body)
	}
	// The decision's reason is in the call's audit record (the log line's
	// reason is the refusal code).
	var gwReason string
	for deadline := time.Now().Add(30 * time.Second); gwReason == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, rec := range g.For(t).AuditRecords() {
			if f, _ := rec["fields"].(map[string]any); rec["request_id"] == r.RequestID && f["rule"] == "evalcheck.echo" {
				gwReason, _ = f["reason"].(string)
			}
		}
	}
	if !strings.Contains(gwReason, "path=/tickets") || !strings.Contains(gwReason, `"tag": ["b", "a"]`) {
		t.Fatalf("gateway reason %q does not show the input", gwReason)
	}

	eval := func(extra ...string) (string, string, int) {
		a := append([]string{"policy", "eval", "--config", path, "--agent", agentA.Agent, "--sandbox", agentA.Sandbox,
			"--session", agentA.Session, "--user", agentA.User}, extra...)
		return runBin(t, e.Dir, sluiceBin, a...)
	}
	out, stderr, code := eval("--tool", "tickets.list_tickets", "--args", args)
	if code != 0 || !strings.Contains(out, `"action": "block"`) || !strings.Contains(out, `"rule": "evalcheck.echo"`) {
		t.Fatalf("policy eval: exit %d\n%s%s", code, out, stderr)
	}
	var dec struct{ Action, Rule, Reason string }
	if err := json.Unmarshal([]byte(out), &dec); err != nil {
		t.Fatalf("policy eval output: %v\n%s", err, out)
	}
	if dec.Reason != gwReason {
		t.Errorf("eval's reason differs from the gateway's:\n eval    %q\n gateway %q", dec.Reason, gwReason)
	}

	// By its alias, as a call may name it: the same tool, the same input.
	out, stderr, code = runBin(t, e.Dir, sluiceBin, "tools", "--json", "--config", path)
	var tools []struct{ Name, Alias string }
	if err := json.Unmarshal([]byte(out), &tools); code != 0 || err != nil {
		t.Fatalf("tools --json: exit %d, %v\n%s", code, err, stderr)
	}
	alias := ""
	for _, tl := range tools {
		if tl.Name == "tickets.list_tickets" {
			alias = tl.Alias
		}
	}
	out, stderr, code = eval("--tool", alias, "--args", args)
	var byAlias struct{ Reason string }
	if err := json.Unmarshal([]byte(out), &byAlias); alias == "" || alias == "tickets.list_tickets" || code != 0 || err != nil || byAlias.Reason != gwReason {
		t.Errorf("eval by alias %q: exit %d, %v, reason %q\n%s", alias, code, err, byAlias.Reason, stderr)
	}

	// Refused before policy: the same code from both.
	for _, c := range []struct {
		name, tool, args string
		id               bool // call as agent-b (granted nothing)
		code             string
	}{
		{"unknown tool", "tickets.no_such_tool", `{}`, false, "unknown_tool"},
		{"not granted", "tickets.list_tickets", `{}`, true, "not_granted"},
		{"schema", "tickets.create_refund", `{"body":{"amount":"lots"}}`, false, "schema_violation"},
	} {
		id := agentA
		if c.id {
			id = agentB
		}
		r := g.For(t).Do(id, http.MethodPost, "/v1/tools/"+c.tool, c.args, nil)
		a := []string{"policy", "eval", "--config", path, "--agent", id.Agent, "--tool", c.tool, "--args", c.args}
		out, stderr, code := runBin(t, e.Dir, sluiceBin, a...)
		if r.Code != c.code || code == 0 || !strings.Contains(stderr, fmt.Sprintf("the gateway refuses this call before policy: %d %s", r.Status, c.code)) || out != "" {
			t.Errorf("%s: gateway %d %s; eval exit %d, stdout %q, stderr %q", c.name, r.Status, r.Code, code, out, stderr)
		}
	}
}

// TestValidateRegoModules: validate reports, through the real binary, a
// decision whose action is not an action (error, file:row:col, exit 1),
// a sluice.policies package without decisions and an unused helper
// package (warnings), and counts the modules in its summary once the error
// is fixed; allow_private: [127.0.0.1] (a bare address, /32) covers a
// 127.0.0.1 base_url exactly, so no narrowing warning.
func TestValidateRegoModules(t *testing.T) {
	e := newEnv(t)
	pol := filepath.Join(e.Dir, "policies")
	if err := os.MkdirAll(pol, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"bad.rego":    "package sluice.policies.bad\n\ndecisions contains {\"action\": \"deny\", \"rule\": \"bad.x\"} if input.tool == \"tickets.delete_ticket\"\n",
		"empty.rego":  "package sluice.policies.empty\n\nallow := true\n",
		"helper.rego": "package helpers.nobody\n\nx := 1\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(pol, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := mainConfig(e, "validaterego")
	d["rego"] = []string{pol}
	d["connectors"].([]map[string]any)[0]["allow_private"] = []string{"127.0.0.1"}
	path := e.Write(d)
	out, stderr, code := runBin(t, e.Dir, sluiceBin, "validate", "--config", path)
	for _, want := range []string{
		": rego: " + filepath.Join(pol, "bad.rego") + `:3:31: sluice_action_error: action "deny": want allow, ask or block`,
		"warning: rego: " + filepath.Join(pol, "empty.rego") + ":1:1: sluice_no_decisions: package sluice.policies.empty defines no decisions rule",
		"warning: rego: " + filepath.Join(pol, "helper.rego") + ":1:1: sluice_package_unused: package helpers.nobody is outside sluice.policies.*",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
	if code != 1 || strings.Contains(out, "allow_private[0]") {
		t.Errorf("validate: exit %d (want 1), output:\n%s%s", code, out, stderr)
	}

	files["bad.rego"] = strings.Replace(files["bad.rego"], `"deny"`, `"block"`, 1)
	if err := os.WriteFile(filepath.Join(pol, "bad.rego"), []byte(files["bad.rego"]), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code = runBin(t, e.Dir, sluiceBin, "validate", "--config", path)
	if code != 0 || !strings.Contains(out, "ok: 1 connectors, 5 tools, 6 rules, 3 modules, 3 warnings") {
		t.Errorf("validate after the fix: exit %d\n%s%s", code, out, stderr)
	}
}

// TestREADMEDemoKeep runs the README's demo commands exactly (the
// directory replaced by a temporary one): `demo --keep --dir D` and, while
// it runs, `approvals list --config D/sluice.yaml --token-file
// D/approver-token`, which lists the refund the demo leaves held. While it
// runs, a second demo in D is refused before it writes anything, naming
// the running demo's pid; once it stopped, a demo in D runs again.
func TestREADMEDemoKeep(t *testing.T) {
	requireHost(t)
	blocks := readmeExample(t, "demo --keep")
	if len(blocks) != 1 || blocks[0][0] != "sh" {
		t.Fatalf("README example: want one sh block, got %v", blocks)
	}
	cmds := shellCommands(blocks[0][1])
	if len(cmds) != 2 {
		t.Fatalf("README demo example: want two commands, got %q", cmds)
	}
	dir := filepath.Join(t.TempDir(), "demo")
	subst := func(words []string) []string {
		args := sluiceArgs(t, words)
		out := make([]string, len(args))
		for i, a := range args {
			out[i] = strings.ReplaceAll(a, "/tmp/sluice-demo", dir)
		}
		return out
	}
	demoArgs, listArgs := subst(cmds[0]), subst(cmds[1])
	if demoArgs[0] != "demo" || listArgs[0] != "approvals" {
		t.Fatalf("README demo example: %q, %q", demoArgs, listArgs)
	}

	demo := exec.Command(sluiceBin, demoArgs...)
	demo.Dir = t.TempDir()
	pipe, err := demo.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	demo.Stderr = demo.Stdout
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var printed strings.Builder
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		admin := ""
		for sc.Scan() {
			l := sc.Text()
			printed.WriteString(l + "\n")
			if v, ok := strings.CutPrefix(l, "admin URL  "); ok {
				admin, _, _ = strings.Cut(v, " ")
			}
			if strings.Contains(l, "Ctrl-C stops them") {
				ready <- admin
			}
		}
		done <- demo.Wait()
	}()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = demo.Process.Signal(syscall.SIGINT)
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			_ = demo.Process.Kill()
			return fmt.Errorf("demo did not stop within 30s of SIGINT")
		}
	}
	t.Cleanup(func() { _ = stop() })
	var admin string
	select {
	case admin = <-ready:
	case err := <-done:
		t.Fatalf("demo --keep exited early: %v\n%s", err, printed.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("demo --keep not running after 90s")
	}

	// The admin URL printed has the real port, and the config names it.
	if !regexp.MustCompile(`^http://127\.0\.0\.1:[1-9][0-9]*$`).MatchString(admin) {
		t.Errorf("admin URL printed: %q", admin)
	}
	cfg, _ := os.ReadFile(filepath.Join(dir, "sluice.yaml"))
	if !strings.Contains(string(cfg), "admin_listen: "+strings.TrimPrefix(admin, "http://")+" ") {
		t.Errorf("the demo's config does not name %s:\n%s", admin, cfg)
	}
	if fi, err := os.Stat(filepath.Join(dir, "approver-token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("approver-token: %v, mode %v; want 0600", err, fi)
	}

	out, stderr, code := runBin(t, t.TempDir(), sluiceBin, listArgs...)
	if code != 0 || !regexp.MustCompile(`(?m)^[0-9a-f]{32}\s+pending\s+tickets\.create_refund\s+demo-agent\s+you\s`).MatchString(out) {
		t.Errorf("sluice %v: exit %d\n%s%s", listArgs, code, out, stderr)
	}

	// A second demo in the same directory: refused, nothing written.
	snapshot := func() map[string]string {
		m := map[string]string{}
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			switch d.Name() { // what the running gateway itself writes
			case "gateway.log", "audit.log", "sluice.db", "sluice.db-wal", "sluice.db-shm":
				return nil
			}
			b, _ := os.ReadFile(p)
			fi, _ := d.Info()
			m[d.Name()] = fmt.Sprintf("%s %v %x", fi.Mode(), fi.ModTime().UnixNano(), b)
			return nil
		})
		return m
	}
	before := snapshot()
	out, stderr, code = runBin(t, t.TempDir(), sluiceBin, "demo", "--dir", dir)
	want := fmt.Sprintf("%s is in use by a running demo (pid %d holds %s)", dir, demo.Process.Pid, filepath.Join(dir, "demo.lock"))
	if code != 1 || !strings.Contains(stderr, want) || strings.Contains(out, "sluice demo:") {
		t.Errorf("second demo: exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, stderr, want)
	}
	after := snapshot()
	if len(after) != len(before) {
		t.Errorf("second demo changed the file list: %d files, was %d", len(after), len(before))
	}
	for name, was := range before {
		if after[name] != was {
			t.Errorf("second demo changed %s", name)
		}
	}

	if err := stop(); err != nil {
		t.Fatalf("demo --keep on SIGINT: %v\n%s", err, printed.String())
	}
	if !strings.Contains(printed.String(), "demo ok:") {
		t.Errorf("demo --keep output:\n%s", printed.String())
	}
	// The lock ended with the process: the directory is free again.
	out, stderr, code = runBin(t, t.TempDir(), sluiceBin, "demo", "--dir", dir)
	if code != 0 || !strings.Contains(out, "demo ok:") {
		t.Errorf("demo after the first stopped: exit %d\n%s%s", code, out, stderr)
	}
}
