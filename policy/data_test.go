package policy

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// limitsModule reads its threshold and its allowlist from data documents
// beside it: data.limits (limits/data.json) and data.limits.hosts
// (limits/hosts/data.yaml), as OPA places them.
const limitsModule = `package sluice.policies.limits

decisions contains {"action": "block", "reason": "over the limit", "rule": "limits.amount"} if {
	input.tool == "billing-api.create_refund"
	input.args.body.amount > data.limits.max_amount
}

decisions contains {"action": "allow", "reason": "listed host", "rule": "limits.hosts"} if {
	input.kind == "connect"
	input.request.host in data.limits.hosts.allowed
}
`

const limitsTest = `package sluice.policies.limits_test

import data.sluice.policies.limits

test_over_limit_blocks if {
	some d in limits.decisions with input as {"tool": "billing-api.create_refund", "args": {"body": {"amount": 101}}}
	d.rule == "limits.amount"
}

test_at_limit_passes if {
	count(limits.decisions) == 0 with input as {"tool": "billing-api.create_refund", "args": {"body": {"amount": 100}}}
}

test_listed_host if {
	some d in limits.decisions with input as {"kind": "connect", "request": {"host": "pypi.org"}}
	d.rule == "limits.hosts"
}
`

// writeLimits lays out the policy directory the data tests share.
func writeLimits(t *testing.T, maxAmount string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"limits", "limits/hosts"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, dir, "limits/limits.rego", limitsModule)
	writeFile(t, dir, "limits/limits_test.rego", limitsTest)
	writeFile(t, dir, "limits/data.json", `{"max_amount": `+maxAmount+`}`)
	writeFile(t, dir, "limits/hosts/data.yaml", "allowed:\n  - pypi.org\n  - files.pythonhosted.org\n")
	return dir
}

func refund(amount int) *Input {
	in := toolCall("billing-api.create_refund")
	in.Args = map[string]any{"body": map[string]any{"amount": amount}}
	return in
}

func TestDataDocuments(t *testing.T) {
	dir := writeLimits(t, "100")
	e := newEngine(t, Config{Rules: []Rule{{Match: "*", Action: "allow"}}, Paths: []string{dir}})
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		in     *Input
		action Action
		rule   string
	}{
		{"data.limits.max_amount from limits/data.json: over", refund(101), Block, "limits.amount"},
		{"data.limits.max_amount from limits/data.json: at", refund(100), Allow, "policies[0]"},
		{"data.limits.hosts from limits/hosts/data.yaml", &Input{Kind: "connect", Request: Request{Host: "pypi.org"}}, Allow, "limits.hosts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := e.Decide(ctx, tc.in)
			if d.Action != tc.action || d.Rule != tc.rule {
				t.Fatalf("decision = %+v, want %s by %s", d, tc.action, tc.rule)
			}
			if !strings.HasPrefix(d.Revision, "sha256:") {
				t.Errorf("revision = %q, want the files' digest", d.Revision)
			}
		})
	}

	// The same files under sluice's own tester.
	rep, err := Test(ctx, []string{dir}, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("Test = %+v, %v; want every test passed", rep, err)
	}
	ours := 0
	for _, r := range rep.Results {
		if strings.HasSuffix(r.File, "limits_test.rego") && r.Outcome == "pass" {
			ours++
		}
	}
	if ours != 3 {
		t.Fatalf("limits_test.rego passed %d tests, want 3", ours)
	}
}

// TestDataDocumentsReload: a data change is picked up by Watch; a bad data
// document is refused, naming its file and position, and the previous
// policy (and its data) keeps deciding.
func TestDataDocumentsReload(t *testing.T) {
	dir := writeLimits(t, "100")
	var fails []error
	e := newEngine(t, Config{Rules: []Rule{{Match: "*", Action: "allow"}}, Paths: []string{dir},
		OnReload: func(ok bool, err error) {
			if !ok {
				fails = append(fails, err)
			}
		}})
	ctx := context.Background()
	rev0 := e.Revision()

	writeFile(t, dir, "limits/data.json", "{\n  \"max_amount\": 50,\n  \"oops\" 1\n}")
	err := e.Reload(ctx)
	var ce *CompileError
	if !errors.As(err, &ce) || len(ce.Problems) != 1 {
		t.Fatalf("Reload = %v, want one data problem", err)
	}
	p := ce.Problems[0]
	if p.Code != CodeDataError || !strings.HasSuffix(p.File, filepath.Join("limits", "data.json")) || p.Row != 3 {
		t.Fatalf("problem = %+v, want %s at limits/data.json line 3", p, CodeDataError)
	}
	if d := e.Decide(ctx, refund(80)); d.Action != Allow || e.Revision() != rev0 {
		t.Fatalf("after a bad reload: %+v (revision %s), want the old limit of 100 deciding (revision %s)", d, e.Revision(), rev0)
	}
	if len(fails) != 1 {
		t.Errorf("OnReload failures = %d, want 1", len(fails))
	}

	// YAML: the line is named too.
	writeFile(t, dir, "limits/data.json", `{"max_amount": 100}`)
	writeFile(t, dir, "limits/hosts/data.yaml", "allowed:\n  - pypi.org\n bad: [\n")
	err = e.Reload(ctx)
	if !errors.As(err, &ce) || ce.Problems[0].Code != CodeDataError || !strings.Contains(ce.Problems[0].File, "data.yaml") || ce.Problems[0].Row < 2 {
		t.Fatalf("Reload with bad YAML = %v, want a data problem naming data.yaml and its line", err)
	}
	writeFile(t, dir, "limits/hosts/data.yaml", "allowed: [pypi.org]\n")

	// Hot reload by Watch: the new threshold decides within a second or so.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.Watch(wctx) }()
	time.Sleep(100 * time.Millisecond) // the watch is registered
	writeFile(t, dir, "limits/data.json", `{"max_amount": 50}`)
	deadline := time.Now().Add(5 * time.Second)
	for e.Decide(ctx, refund(80)).Action != Block {
		if time.Now().After(deadline) {
			t.Fatal("the new max_amount never decided")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e.Revision() == rev0 {
		t.Error("revision did not change with the data")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Watch: %v", err)
	}
}

func TestDataDocumentProblems(t *testing.T) {
	for _, tc := range []struct {
		name, file, src, want string
	}{
		{"top level must be an object", "data.json", `[1, 2]`, "top level is an array"},
		{"data.sluice is the library's", "data.json", `{"sluice": {"config": {}}}`, "data.sluice is reserved"},
		{"trailing garbage", "data.json", `{"a": 1} {"b": 2}`, "bad JSON"},
		{"truncated", "data.json", `{"a": `, "unexpected end of input"},
		{"YAML scalar", "data.yaml", "just a string\n", "top level is a string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, tc.file, tc.src)
			_, err := New(context.Background(), Config{Paths: []string{dir}})
			var ce *CompileError
			if !errors.As(err, &ce) || ce.Problems[0].Code != CodeDataError || !strings.Contains(ce.Problems[0].Message, tc.want) ||
				!strings.HasSuffix(ce.Problems[0].File, tc.file) {
				t.Fatalf("New = %v, want a %s naming %s: %q", err, CodeDataError, tc.file, tc.want)
			}
		})
	}
	t.Run("two documents set one value", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "data.json", `{"a": {"b": 1}}`)
		if err := os.MkdirAll(filepath.Join(dir, "a"), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, dir, "a/data.yaml", "b: 2\n")
		_, err := New(context.Background(), Config{Paths: []string{dir}})
		if err == nil || !strings.Contains(err.Error(), "data.a.b is already set by") {
			t.Fatalf("New = %v, want a conflict naming data.a.b", err)
		}
	})
}

// opaBin finds the real opa binary: $SLUICE_OPA_BIN, then the one
// test.sh builds into ~/.cache/sluice, then $PATH.
func opaBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_OPA_BIN"); p != "" {
		return p
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".cache", "sluice", "opa-v1.22.3", "opa")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("opa"); err == nil {
		return p
	}
	t.Skip("the opa binary is absent (test.sh builds it into ~/.cache/sluice/opa-v1.22.3; or set SLUICE_OPA_BIN)")
	return ""
}

// TestDataDocumentsUnderOPA: the same Rego and data pass `opa test` with
// the real binary, so a team's CI can run either.
func TestDataDocumentsUnderOPA(t *testing.T) {
	bin := opaBin(t)
	dir := writeLimits(t, "100")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "test", "-v", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("opa test: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "PASS: 3/3") {
		t.Fatalf("opa test output lacks PASS: 3/3:\n%s", out)
	}
	// And it fails when the data says otherwise: the data is really read.
	writeFile(t, dir, "limits/data.json", `{"max_amount": 1000}`)
	out, err = exec.CommandContext(ctx, bin, "test", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "test_over_limit_blocks") {
		t.Fatalf("opa test with max_amount 1000 = %v, want test_over_limit_blocks to fail:\n%s", err, out)
	}
}
