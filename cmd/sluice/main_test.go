package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/vault"
)

// cli runs the command as main would, with stdin and captured output.
func cli(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	err = run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), err
}

// demoConfig writes the demo's files into a fresh directory, with an
// upstream address nothing listens on (these tests make no upstream call),
// and returns the config's path.
func demoConfig(t *testing.T) string {
	t.Helper()
	path, err := writeDemoFiles(t.TempDir(), "http://127.0.0.1:9", os.Getuid(), demoApprover{})
	if err != nil {
		t.Fatalf("writeDemoFiles: %v", err)
	}
	return path
}

// setSecret stores the demo connector's secret, as validate and serve need it.
func setSecret(t *testing.T, cfg, value string) {
	t.Helper()
	if _, _, err := cli(t, value, "secrets", "set", demoSecret, "--config", cfg); err != nil {
		t.Fatalf("secrets set: %v", err)
	}
}

func TestValidate(t *testing.T) {
	// An approver who can log in: without one the ask rule is a problem.
	good, err := writeDemoFiles(t.TempDir(), "http://127.0.0.1:9", os.Getuid(), demoApprover{Name: "fran", TokenSHA256: strings.Repeat("ab", 32)})
	if err != nil {
		t.Fatal(err)
	}
	setSecret(t, good, "validate-secret-value")

	typo := filepath.Join(filepath.Dir(good), "typo.yaml")
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(typo, bytes.Replace(data, []byte("    credential:"), []byte("    credentail:"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	badRule := filepath.Join(filepath.Dir(good), "badrule.yaml")
	if err := os.WriteFile(badRule, bytes.Replace(data, []byte("action: ask"), []byte("action: maybe"), 1), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		config  string
		wantErr bool
		want    []string
	}{
		{"good config", good, false, []string{"ok: 1 connectors, 4 tools, 4 rules"}},
		{"typo'd key is named with its path", typo, true, []string{"connectors[0].credentail", "unknown key"}},
		{"bad action is named with its key", badRule, true, []string{"policies[2].action", "maybe"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := cli(t, "", "validate", "--config", tc.config)
			if (err != nil) != tc.wantErr {
				t.Fatalf("validate err = %v, want error %v; output:\n%s", err, tc.wantErr, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}

	// A spec with an operation that cannot be understood: the rest loads,
	// validate prints the skip with its JSON pointer as a warning and exits
	// 0; --strict makes it an error.
	t.Run("skipped operations are warnings, errors with --strict", func(t *testing.T) {
		spec := filepath.Join(filepath.Dir(good), demoSpec)
		sdata, err := os.ReadFile(spec)
		if err != nil {
			t.Fatal(err)
		}
		broken := "paths:\n  /broken/{id}:\n    get:\n      operationId: broken\n      responses: {\"200\": {description: ok}}\n"
		if err := os.WriteFile(spec, bytes.Replace(sdata, []byte("paths:\n"), []byte(broken), 1), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.WriteFile(spec, sdata, 0o644)
		out, _, err := cli(t, "", "validate", "--config", good)
		if err != nil {
			t.Fatalf("validate: %v\n%s", err, out)
		}
		for _, w := range []string{"warning: tickets: skipped GET /broken/{id} (broken): #/paths/~1broken~1{id}/get:", "{id} has no path parameter", "ok: 1 connectors, 4 tools, 4 rules, 0 modules, 1 warnings"} {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q:\n%s", w, out)
			}
		}
		out, _, err = cli(t, "", "validate", "--strict", "--config", good)
		if err == nil || !strings.Contains(out, "error:") || !strings.Contains(out, "strict") || !strings.Contains(out, "GET /broken/{id} (broken)") {
			t.Errorf("validate --strict err = %v, output:\n%s\nwant an error naming the skipped operation", err, out)
		}
		out, errOut, err := cli(t, "", "tools", "--config", good)
		if err != nil || !strings.Contains(errOut, "skipped GET /broken/{id}") || !strings.Contains(out, "tickets_list_tickets") {
			t.Errorf("tools: err %v, stderr %q, stdout %q: want the skip on stderr and aliases listed", err, errOut, out)
		}
	})

	t.Run("missing explicit config is named, not replaced by defaults", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "nope.yaml")
		out, _, err := cli(t, "", "validate", "--config", missing)
		if err == nil || !strings.Contains(out, "nope.yaml") {
			t.Fatalf("validate err = %v, output %q: want an error naming nope.yaml", err, out)
		}
	})
}

func TestDefaultsFallback(t *testing.T) {
	t.Chdir(t.TempDir()) // no ./sluice.yaml here
	out, _, err := cli(t, "", "tools")
	if err != nil {
		t.Fatalf("tools on embedded defaults: %v", err)
	}
	if strings.TrimSpace(out) != "TOOL  ALIAS  RISK  METHOD  PATH" {
		t.Errorf("tools on embedded defaults = %q, want only the header (no connectors)", out)
	}
	// An error names where the config came from.
	_, _, err = cli(t, "", "tools", "--agent", "nobody")
	if err == nil || !strings.Contains(err.Error(), "embedded defaults") {
		t.Errorf("tools --agent nobody err = %v, want it to name the embedded defaults", err)
	}
}

func TestSecrets(t *testing.T) {
	cfgPath := demoConfig(t)
	const value = "s3cr3t-Value-0123456789"
	var outputs []string
	record := func(o, e string, err error) error {
		outputs = append(outputs, o, e)
		if err != nil {
			outputs = append(outputs, err.Error())
		}
		return err
	}

	if err := record(cli(t, value+"\n", "secrets", "set", "api-key", "--config", cfgPath)); err != nil {
		t.Fatalf("set: %v", err)
	}
	if err := record(cli(t, value, "secrets", "set", "api-key", "--scope", "connector:tickets", "--config", cfgPath)); err != nil {
		t.Fatalf("set connector scope: %v", err)
	}

	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	store, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.Get(context.Background(), "api-key", vault.ScopeProject)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if string(got.Reveal()) != value {
		t.Errorf("stored value has %d bytes, want %d (exactly one trailing newline stripped)", got.Len(), len(value))
	}

	out, _, err := cli(t, "", "secrets", "list", "--config", cfgPath)
	_ = record(out, "", err)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	for _, want := range []string{"api-key", "project", "connector:tickets"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`\d{4}-\d{2}-\d{2}T`).MatchString(out) {
		t.Errorf("list shows no update time:\n%s", out)
	}

	if err := record(cli(t, "", "secrets", "rm", "api-key", "--config", cfgPath)); err != nil {
		t.Fatalf("rm: %v", err)
	}
	if _, err := store.Get(context.Background(), "api-key", vault.ScopeProject); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("Get after rm: err = %v, want ErrNotFound", err)
	}
	if _, err := store.Get(context.Background(), "api-key", vault.ConnectorScope("tickets")); err != nil {
		t.Errorf("rm of the project scope removed the connector scope too: %v", err)
	}
	err = record(cli(t, "", "secrets", "rm", "api-key", "--config", cfgPath))
	if !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("second rm: err = %v, want ErrNotFound", err)
	}

	refusals := []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"empty stdin", "", []string{"NAME"}, "empty value"},
		{"only a newline", "\n", []string{"NAME"}, "empty value"},
		{"CR inside the value (header smuggling, THREATS D6)", value + "\r\nX-Evil: 1", []string{"NAME"}, "forbidden byte"},
		{"second trailing newline is kept and refused", value + "\n\n", []string{"NAME"}, "forbidden byte"},
		{"bad name", value, []string{"../etc"}, "invalid secret name"},
		{"bad scope", value, []string{"NAME", "--scope", "team:x"}, "invalid scope"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"secrets", "set", "--config", cfgPath}, tc.args...)
			err := record(cli(t, tc.stdin, args...))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}

	for i, o := range outputs {
		if strings.Contains(o, value) || strings.Contains(o, "s3cr3t") {
			t.Errorf("output %d contains the secret value: %q", i, o)
		}
	}
}

func TestSecretsRefusesVaultBackend(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	yaml := "secrets:\n  backend: vault\n  vault:\n    address: https://vault.internal:8200\n    auth: { method: token, token_file: t }\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := cli(t, "", "secrets", "list", "--config", cfg)
	if err == nil || !strings.Contains(err.Error(), "only the local store") {
		t.Fatalf("secrets list on vault backend: err = %v, want it to say only the local store is managed", err)
	}
}

// writeAuditLog writes n records with the real audit writer.
func writeAuditLog(t *testing.T, path string, n int) {
	t.Helper()
	l, err := audit.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := l.Append(context.Background(), audit.Record{RequestID: "req-" + string(rune('a'+i)), Event: "decision", Fields: map[string]any{"decision": "allow", "tool": "tickets.list_tickets"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestAuditVerify(t *testing.T) {
	tests := []struct {
		name     string
		tamper   func(lines []string) []string
		wantErr  bool
		wantLine string
	}{
		{"intact", func(l []string) []string { return l }, false, "ok: 3 records, chain intact"},
		{"edited decision", func(l []string) []string {
			l[1] = strings.Replace(l[1], `"allow"`, `"block"`, 1)
			return l
		}, true, "line 2"},
		{"deleted record", func(l []string) []string { return append(l[:1], l[2:]...) }, true, "line 2"},
		{"reordered records", func(l []string) []string {
			l[1], l[2] = l[2], l[1]
			return l
		}, true, "line 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.log")
			writeAuditLog(t, path, 3)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
			if len(lines) != 3 {
				t.Fatalf("log has %d lines, want 3", len(lines))
			}
			if err := os.WriteFile(path, []byte(strings.Join(tc.tamper(lines), "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out, _, err := cli(t, "", "audit", "verify", "--file", path)
			if (err != nil) != tc.wantErr {
				t.Fatalf("audit verify err = %v, want error %v; output %q", err, tc.wantErr, out)
			}
			if !strings.Contains(out, tc.wantLine) {
				t.Errorf("output %q lacks %q", out, tc.wantLine)
			}
			if tc.wantErr && !strings.HasPrefix(out, "FAIL: ") {
				t.Errorf("output %q: want FAIL: line N: reason", out)
			}
		})
	}
}

func TestPolicyEval(t *testing.T) {
	cfg := demoConfig(t)
	dir := filepath.Dir(cfg)
	input := func(tool, method, path string) string {
		f := filepath.Join(dir, strings.ReplaceAll(tool, ".", "_")+".json")
		doc := map[string]any{
			"version": 1, "kind": "tool_call", "tool": tool, "connector": "tickets",
			"caller":    map[string]string{"sandbox": "sb", "agent": "demo-agent", "user": "you"},
			"operation": map[string]any{"id": tool, "method": method, "path": path, "risk": "read"},
			"request":   map[string]any{"method": method, "host": "tickets.example.com", "path": path},
		}
		b, _ := json.Marshal(doc)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	tests := []struct {
		name          string
		input         string
		wantAction    string
		wantApprovers []string
	}{
		{"demo sample input: delete is blocked by the catch-all", filepath.Join(dir, demoInput), "block", nil},
		{"list is allowed", input("tickets.list_tickets", "GET", "/tickets"), "allow", nil},
		{"refund asks finance", input("tickets.create_refund", "POST", "/refunds"), "ask", []string{"group:finance"}},
		{"unknown tool falls to the catch-all", input("other.thing", "GET", "/"), "block", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := cli(t, "", "policy", "eval", "--config", cfg, "--input", tc.input)
			if err != nil {
				t.Fatalf("policy eval: %v", err)
			}
			var d struct {
				Action      string         `json:"action"`
				Reason      string         `json:"reason"`
				Rule        string         `json:"rule"`
				Approvers   []string       `json:"approvers"`
				Obligations map[string]any `json:"obligations"`
			}
			if err := json.Unmarshal([]byte(out), &d); err != nil {
				t.Fatalf("output is not a decision: %v\n%s", err, out)
			}
			if d.Action != tc.wantAction || d.Rule == "" {
				t.Errorf("decision = %+v, want action %s with a rule", d, tc.wantAction)
			}
			if strings.Join(d.Approvers, ",") != strings.Join(tc.wantApprovers, ",") {
				t.Errorf("approvers = %v, want %v", d.Approvers, tc.wantApprovers)
			}
		})
	}

	t.Run("unknown input key is an error", func(t *testing.T) {
		f := filepath.Join(dir, "typo.json")
		if err := os.WriteFile(f, []byte(`{"kind":"tool_call","tool":"tickets.list_tickets","toool":"x"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := cli(t, "", "policy", "eval", "--config", cfg, "--input", f)
		if err == nil || !strings.Contains(err.Error(), "toool") {
			t.Fatalf("err = %v, want it to name the unknown key toool", err)
		}
	})
}

func TestPolicyTest(t *testing.T) {
	cfg := demoConfig(t)
	t.Run("shipped library passes", func(t *testing.T) {
		out, _, err := cli(t, "", "policy", "test", "--config", cfg)
		if err != nil {
			t.Fatalf("policy test: %v\n%s", err, out)
		}
		if !strings.Contains(out, "PASS  sluice.") || !regexp.MustCompile(`(?m)^[1-9]\d* passed, 0 failed, 0 errors`).MatchString(out) {
			t.Errorf("output lacks PASS lines or the summary:\n%s", out)
		}
	})
	t.Run("a failing test of the team's own fails the run", func(t *testing.T) {
		dir := t.TempDir()
		mod := `package sluice.policies.team

decisions contains {"action": "block", "reason": "no deletes", "rule": "team.no_delete"} if {
	input.operation.method == "DELETE"
}
`
		test := `package sluice.policies.team_test

import data.sluice.policies.team

test_delete_blocked if {
	count(team.decisions) == 1 with input as {"operation": {"method": "DELETE"}}
}

test_get_blocked_too_wrong if {
	count(team.decisions) == 1 with input as {"operation": {"method": "GET"}}
}
`
		for name, body := range map[string]string{"team.rego": mod, "team_test.rego": test} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		out, _, err := cli(t, "", "policy", "test", "--config", cfg, dir)
		if err == nil {
			t.Fatalf("policy test passed with a failing test:\n%s", out)
		}
		for _, want := range []string{"PASS  sluice.policies.team_test.test_delete_blocked", "FAIL  sluice.policies.team_test.test_get_blocked_too_wrong", "1 failed"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})
}

func TestTools(t *testing.T) {
	cfg := demoConfig(t)
	tests := []struct {
		name    string
		args    []string
		want    []string
		wantErr string
	}{
		{"all", nil, []string{
			"tickets.create_refund  tickets_create_refund  write  POST",
			"tickets.delete_ticket  tickets_delete_ticket  write  DELETE  /tickets/{id}",
			"tickets.get_ticket     tickets_get_ticket     read   GET     /tickets/{id}",
			"tickets.list_tickets   tickets_list_tickets   read   GET     /tickets",
		}, ""},
		{"granted to demo-agent", []string{"--agent", "demo-agent"}, []string{"tickets.list_tickets"}, ""},
		{"unknown agent", []string{"--agent", "nobody"}, nil, `no agent "nobody"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := cli(t, "", append([]string{"tools", "--config", cfg}, tc.args...)...)
			checkCLI(t, out, err, tc.want, tc.wantErr)
		})
	}
	t.Run("json has schemas", func(t *testing.T) {
		out, _, err := cli(t, "", "tools", "--config", cfg, "--json")
		if err != nil {
			t.Fatal(err)
		}
		var tools []toolJSON
		if err := json.Unmarshal([]byte(out), &tools); err != nil {
			t.Fatalf("not JSON: %v", err)
		}
		if len(tools) != 4 {
			t.Fatalf("got %d tools, want 4", len(tools))
		}
		for _, tl := range tools {
			var schema map[string]any
			if err := json.Unmarshal(tl.Schema, &schema); err != nil || schema["type"] != "object" {
				t.Errorf("%s: schema %s is not an object schema", tl.Name, tl.Schema)
			}
		}
	})
}

func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo starts the whole gateway; skipped with -short")
	}
	dir := t.TempDir()
	out, _, err := cli(t, "", "demo", "--dir", dir)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{
		"scripted stand-in for sandboxed code",
		"1. GET  /v1/tools",
		"tickets.list_tickets",
		"the upstream saw the API key in X-Api-Key on 1 request(s), 0 without it",
		"the agent's reply does not contain the key",
		"403 policy_block; the upstream saw 0 delete(s)",
		"tickets.create_refund",
		"/metrics",
		"sluice audit verify --config " + filepath.Join(dir, "sluice.yaml"),
		"audit: ok:",
		"demo ok:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if strings.Contains(out, "FAIL") {
		t.Errorf("demo output has a FAIL:\n%s", out)
	}

	// The key the demo generated is in the sealed store, and nowhere in
	// the output, the gateway log or the audit log.
	cfg, err := config.Load(filepath.Join(dir, "sluice.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := store.Get(context.Background(), demoSecret, vault.ScopeProject)
	if err != nil || key.Len() < 16 {
		t.Fatalf("demo key in store: len %d, err %v", key.Len(), err)
	}
	for name, text := range map[string]string{"output": out, "gateway.log": readFile(t, filepath.Join(dir, "gateway.log")), "audit.log": readFile(t, cfg.Audit.Path)} {
		if strings.Contains(text, string(key.Reveal())) {
			t.Errorf("%s contains the demo API key", name)
		}
	}

	// The command the demo prints works on what it left behind.
	vout, _, err := cli(t, "", "audit", "verify", "--config", filepath.Join(dir, "sluice.yaml"))
	if err != nil || !strings.Contains(vout, "chain intact") {
		t.Errorf("audit verify after the demo: err %v, output %q", err, vout)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDeployExampleLoads(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "deploy", "sluice.yaml"))
	if err != nil {
		t.Fatalf("deploy/sluice.yaml: %v", err)
	}
	if len(cfg.Connectors) != 1 || len(cfg.Policies) == 0 || cfg.Gateway.HoldWait.Std() != 30*time.Second {
		t.Errorf("deploy/sluice.yaml loaded as %+v", cfg)
	}
	if _, err := os.Stat(cfg.Connectors[0].Spec); err != nil {
		t.Errorf("deploy/sluice.yaml spec %s: %v", cfg.Connectors[0].Spec, err)
	}
	// The example's spec and rules provision too, not just decode.
	out, _, err := cli(t, "", "tools", "--config", filepath.Join("..", "..", "deploy", "sluice.yaml"))
	if err != nil || !strings.Contains(out, "tickets.list_tickets") {
		t.Errorf("tools on deploy/sluice.yaml: err %v, output %q", err, out)
	}
}

func TestTrimOneNewline(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"none", "abc", "abc"},
		{"LF", "abc\n", "abc"},
		{"CRLF", "abc\r\n", "abc"},
		{"only one LF", "abc\n\n", "abc\n"},
		{"lone CR stays", "abc\r", "abc\r"},
		{"empty", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(trimOneNewline([]byte(tc.in))); got != tc.want {
				t.Errorf("trimOneNewline(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for a logger writing while a test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serving is a `sluice serve` run in process by startServe.
type serving struct {
	stderr *syncBuffer
	done   chan error
	cancel context.CancelFunc
}

// startServe runs `sluice serve args...` until the test ends or stop.
func startServe(t *testing.T, args ...string) *serving {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sv := &serving{stderr: &syncBuffer{}, done: make(chan error, 1), cancel: cancel}
	go func() {
		sv.done <- run(ctx, append([]string{"serve"}, args...), strings.NewReader(""), io.Discard, sv.stderr)
	}()
	return sv
}

// stop ends serve's context and waits for it to return without an error.
func (sv *serving) stop(t *testing.T) {
	t.Helper()
	sv.cancel()
	select {
	case err := <-sv.done:
		if err != nil {
			t.Fatalf("serve after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop within 30s of its context ending")
	}
}

func TestServe(t *testing.T) {
	cfgPath := demoConfig(t)
	setSecret(t, cfgPath, "serve-secret-value")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	sv := startServe(t, "--config", cfgPath, "--log-format", "json")
	stderr, done := sv.stderr, sv.done
	waitFor := func(what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(stderr.String(), what) {
			select {
			case err := <-done:
				t.Fatalf("serve returned %v before logging %q:\n%s", err, what, stderr)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log after 30s:\n%s", what, stderr)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor(`"msg":"ready"`)
	if _, err := os.Stat(cfg.Gateway.SandboxSocket); err != nil {
		t.Fatalf("sandbox socket: %v", err)
	}
	// SIGHUP reloads the policy; serve has registered for it before ready.
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(`"msg":"policy: reloaded"`)
	sv.stop(t)
	if !strings.Contains(stderr.String(), `"msg":"stopped"`) {
		t.Errorf("no stopped line:\n%s", stderr)
	}
	if strings.Contains(stderr.String(), "serve-secret-value") {
		t.Error("the log contains the secret value")
	}
}

// With a flush delay longer than the test, info lines reach stderr only
// through serve's flush on the way out: none is lost when it stops.
func TestServeFlushesLogAtExit(t *testing.T) {
	cfgPath := demoConfig(t)
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	sv := startServe(t, "--config", cfgPath, "--log-flush", "1h")
	stderr := sv.stderr
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(cfg.Gateway.SandboxSocket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sandbox socket after 30s:\n%s", stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(stderr.String(), `"msg":"starting"`) {
		t.Fatalf("an info line was written before its flush delay:\n%s", stderr)
	}
	sv.stop(t)
	for _, want := range []string{`"msg":"starting"`, `"msg":"stopped"`} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("no %s line after serve returned:\n%s", want, stderr)
		}
	}
}

func TestServeBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"log format", []string{"serve", "--log-format", "xml"}, "--log-format"},
		{"log level", []string{"serve", "--log-level", "loud"}, "--log-level"},
		{"log flush", []string{"serve", "--log-flush", "-1s"}, "--log-flush must not be negative"},
		{"debug on every address", []string{"serve", "--debug-listen", "0.0.0.0:6060"}, "want a loopback IP address"},
		{"debug on a name", []string{"serve", "--debug-listen", "localhost:6060"}, "want a loopback IP address"},
		{"debug without a port", []string{"serve", "--debug-listen", "127.0.0.1"}, "--debug-listen"},
		{"unknown verb", []string{"frobnicate"}, "unknown command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := cli(t, "", tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestDemoKeepStopsOnContext(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo starts the whole gateway; skipped with -short")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--keep", "--dir", t.TempDir()}, strings.NewReader(""), out, io.Discard)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), "keep running; Ctrl-C stops them") {
		select {
		case err := <-done:
			t.Fatalf("demo --keep returned %v before waiting:\n%s", err, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo --keep never said it keeps running:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel() // what Ctrl-C does through signal.NotifyContext
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo --keep after Ctrl-C: %v\n%s", err, out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("demo --keep did not stop within 30s")
	}
	if !strings.Contains(out.String(), "demo ok:") {
		t.Errorf("no final verdict:\n%s", out)
	}
}

// TestAuditVerifyRecreated: after the log file is deleted the gateway's
// writer starts a new file with an audit_log_recreated marker; verify
// checks that file from its marker (saying the earlier records are
// elsewhere), checks old+new as one chain, and refuses a new file that
// does not continue the old one.
func TestAuditVerifyRecreated(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	l, err := audit.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, err := l.Append(ctx, audit.Record{RequestID: "r" + strconv.Itoa(i), Event: "decision"}); err != nil {
			t.Fatal(err)
		}
	}
	old := filepath.Join(dir, "audit.log.1")
	if err := os.Link(path, old); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil { // deleted (or rotated away) under the writer
		t.Fatal(err)
	}
	// The first append after the deletion is refused (the loss is not
	// hidden); the next one starts the new file with the marker.
	_, _ = l.Append(ctx, audit.Record{RequestID: "r3", Event: "decision"})
	if _, err := l.Append(ctx, audit.Record{RequestID: "r4", Event: "decision"}); err != nil {
		t.Fatalf("append after re-creation: %v", err)
	}
	l.Close()
	other := filepath.Join(dir, "other.log")
	writeAuditLog(t, other, 2)

	tests := []struct {
		name    string
		files   []string
		wantErr bool
		want    string
	}{
		{"the re-created file alone", []string{path}, false, "starts with an audit_log_recreated record"},
		{"old then new", []string{old, path}, false, "chain intact"},
		{"new then old", []string{path, old}, true, "FAIL: " + old},
		{"a file that does not continue the old one", []string{old, other}, true, "FAIL: " + other},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"audit", "verify"}
			for _, f := range tc.files {
				args = append(args, "--file", f)
			}
			out, _, err := cli(t, "", args...)
			if (err != nil) != tc.wantErr || !strings.Contains(out, tc.want) {
				t.Fatalf("err %v (want error %v), output %q, want it to contain %q", err, tc.wantErr, out, tc.want)
			}
		})
	}
}

// checkCLI fails t unless a CLI run ended as wanted: with an error
// containing wantErr, or, when wantErr is "", without one and with every
// string of want in its output.
func checkCLI(t *testing.T, out string, err error, want []string, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("err = %v, want %q", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// TestAuditVerifyUnfinishedWrite: a log whose last line lost its end (a
// write cut short by a full disk) is named an unfinished write, not a
// broken chain, and still fails; bytes that are not the next record's
// start are a FAIL.
func TestAuditVerifyUnfinishedWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	writeAuditLog(t, path, 3)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	cut := strings.Join(lines[:2], "") + lines[2][:len(lines[2])/2]
	if err := os.WriteFile(path, []byte(cut), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := cli(t, "", "audit", "verify", "--file", path)
	if err == nil || !strings.Contains(err.Error(), "unfinished write at line 3") || !strings.Contains(err.Error(), "not tampering") {
		t.Fatalf("audit verify err = %v, want the unfinished write named; output %q", err, out)
	}
	for _, want := range []string{"UNFINISHED: " + path + " line 3: unfinished write", "start of record seq 3",
		"removes these " + strconv.Itoa(len(lines[2])/2) + " bytes", "the 2 records before them verify"} {
		if !strings.Contains(out, want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "FAIL") {
		t.Errorf("output %q calls an unfinished write a FAIL", out)
	}

	// Control: the same cut with another seq is not the record due next.
	forged := strings.Replace(cut, `{"seq":3`, `{"seq":9`, 1)
	if err := os.WriteFile(path, []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err = cli(t, "", "audit", "verify", "--file", path)
	if err == nil || !strings.HasPrefix(out, "FAIL: "+path+" line 3: partial last line without newline that is not the start of record seq 3") {
		t.Errorf("forged tail: err %v output %q, want FAIL naming a partial line that is not record seq 3", err, out)
	}
}
