package policy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatewayRules mirrors the policies list of the example sluice.yaml.
var gatewayRules = []Rule{
	{Match: "billing-api.get_*", Action: "allow"},                                             // policies[0]
	{Match: "billing-api.create_refund", Action: "ask", Approvers: []string{"group:finance"}}, // policies[1]
	{Match: "billing-api.create_refund", Action: "ask", Approvers: []string{"alice", "group:finance"}},
	{Match: "billing-api.*_admin", Action: "block", Reason: "admin operations are off limits"}, // policies[3]
	{Match: "*.delete_*", Action: "block"},                                                     // policies[4]
	{Match: "crm.list_contacts", Action: "allow"},                                              // policies[5]
	{Match: "crm.list_contacts", Action: "block", Reason: "crm is read-only today"},            // policies[6]
}

// toolCall builds the input the gateway builds for a tool call.
func toolCall(tool string) *Input {
	connector, op, _ := strings.Cut(tool, ".")
	return &Input{
		Version:   InputVersion,
		Kind:      "tool_call",
		Caller:    Caller{Sandbox: "sb-1", Agent: "support-bot", Session: "s-1", User: "bob"},
		Connector: connector,
		Tool:      tool,
		Operation: Operation{ID: op, Method: "GET", Path: "/v1/" + op, Risk: "read", Tags: []string{"billing"}},
		Args:      map[string]any{"path": map[string]any{"id": "in_123"}},
		Request: Request{
			Method:  "GET",
			Host:    "billing.example.com",
			Path:    "/v1/" + op,
			Query:   map[string][]string{"expand": {"lines"}},
			Headers: map[string][]string{"Accept": {"application/json"}},
		},
		Time: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC),
	}
}

func writeFile(t testing.TB, dir, name, src string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

const freezeModule = `package sluice.policies.freeze

decisions contains {"action": "block", "reason": "invoices are frozen", "rule": "freeze.invoices"} if {
	input.tool == "billing-api.get_invoice"
}
`

func TestDecide(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "freeze.rego", freezeModule)
	writeFile(t, dir, "egress.rego", `package sluice.policies.egress

decisions contains {"action": "allow", "reason": "package index", "rule": "egress.pypi"} if {
	input.kind in {"http", "connect", "dns"}
	input.request.host == "pypi.org"
}

decisions contains {"action": "ask", "reason": "big refund", "rule": "refund.big", "approvers": ["group:cfo"]} if {
	input.tool == "billing-api.create_refund"
	input.args.body.amount > 1000
}
`)
	e := newEngine(t, Config{Rules: gatewayRules, Paths: []string{dir}})

	bigRefund := toolCall("billing-api.create_refund")
	bigRefund.Args = map[string]any{"body": map[string]any{"amount": 5000}}
	pypi := &Input{Kind: "connect", Request: Request{Host: "pypi.org"}}
	evil := &Input{Kind: "connect", Request: Request{Host: "evil.example"}}

	tests := []struct {
		name      string
		in        *Input
		action    Action
		rule      string
		approvers []string
		reason    string
	}{
		{"prefix rule allows", toolCall("billing-api.get_customer"), Allow, "policies[0]", nil, "matched billing-api.get_*"},
		{"ask collects approvers", toolCall("billing-api.create_refund"), Ask, "policies[1]", []string{"alice", "group:finance"}, ""},
		{"module ask adds its approvers", bigRefund, Ask, "refund.big", []string{"alice", "group:cfo", "group:finance"}, "big refund"},
		{"glob star matches dots", toolCall("billing-api.get_x.y_admin"), Block, "policies[3]", nil, "admin operations are off limits"},
		{"scanned glob blocks", toolCall("crm.delete_contact"), Block, "policies[4]", nil, ""},
		{"block beats allow", toolCall("crm.list_contacts"), Block, "policies[6]", nil, "crm is read-only today"},
		{"no rule blocks", toolCall("crm.get_contact"), Block, "default", nil, "no rule matched"},
		{"module block beats simple allow", toolCall("billing-api.get_invoice"), Block, "freeze.invoices", nil, "invoices are frozen"},
		{"module allows raw egress", pypi, Allow, "egress.pypi", nil, "package index"},
		{"raw egress without a rule blocks", evil, Block, "default", nil, "no rule matched"},
		{"unknown kind blocks", &Input{Kind: "smtp", Tool: "billing-api.get_customer"}, Block, RulePolicyError, nil, ""},
		{"nil input blocks", nil, Block, RulePolicyError, nil, "policy: no input"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := e.Decide(context.Background(), tc.in)
			if d.Action != tc.action || d.Rule != tc.rule {
				t.Fatalf("Decide = %+v, want %v by %s", d, tc.action, tc.rule)
			}
			if !slices.Equal(d.Approvers, tc.approvers) {
				t.Errorf("approvers = %q, want %q", d.Approvers, tc.approvers)
			}
			if tc.reason != "" && d.Reason != tc.reason {
				t.Errorf("reason = %q, want %q", d.Reason, tc.reason)
			}
		})
	}
}

func TestDecideFailsClosed(t *testing.T) {
	tests := []struct {
		name   string
		module string
		in     *Input
		reason string // substring of the Reason
	}{
		{
			name: "divide by zero under strict builtin errors",
			module: `package sluice.policies.broken
decisions contains {"action": "allow", "rule": "x", "reason": sprintf("%v", [10 / count(input.operation.tags)])} if { true }
`,
			in:     &Input{Kind: "tool_call", Tool: "crm.get_contact"},
			reason: "divide by zero",
		},
		{
			name: "conflicting complete rule",
			module: `package sluice.policies.broken
level := 1 if input.kind == "tool_call"
level := 2 if input.tool != ""
decisions contains {"action": "allow", "rule": "x", "reason": "r"} if level > 0
`,
			in:     &Input{Kind: "tool_call", Tool: "crm.get_contact"},
			reason: "eval_conflict_error",
		},
		{
			name: "non-string approver",
			module: `package sluice.policies.broken
decisions contains {"action": "ask", "rule": "x", "reason": "r", "approvers": [1]}
`,
			in:     &Input{Kind: "tool_call", Tool: "crm.get_contact"},
			reason: "approver 1",
		},
		{
			name: "obligations not an object",
			module: `package sluice.policies.broken
decisions contains {"action": "block", "rule": "x", "reason": "r", "obligations": "log"}
`,
			in:     &Input{Kind: "tool_call", Tool: "crm.get_contact"},
			reason: "obligations is string",
		},
		{
			name: "non-string rule id",
			module: `package sluice.policies.broken
decisions contains {"action": "block", "rule": 7, "reason": "r"}
`,
			in:     &Input{Kind: "tool_call", Tool: "crm.get_contact"},
			reason: "rule 7",
		},
		{
			name: "endless loop hits the timeout",
			module: `package sluice.policies.slow
decisions contains {"action": "allow", "rule": "slow", "reason": "r"} if {
	count([x | some x in numbers.range(1, 100000000); x < 0]) == 0
}
`,
			in:     &Input{Kind: "tool_call", Tool: "crm.get_contact"},
			reason: "timed out",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, "m.rego", tc.module)
			// A catch-all allow: only the failure can turn the answer into a block.
			e := newEngine(t, Config{Rules: []Rule{{Match: "*", Action: "allow"}}, Paths: []string{dir}})
			d := e.Decide(context.Background(), tc.in)
			if d.Action != Block || d.Rule != RulePolicyError {
				t.Fatalf("Decide = %+v, want Block by %s", d, RulePolicyError)
			}
			if !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("reason = %q, want it to contain %q", d.Reason, tc.reason)
			}
		})
	}
}

func TestDecideInvalidModuleActionBlocks(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "typo.rego", `package sluice.policies.typo
decisions contains {"action": "deny", "rule": "typo.deny", "reason": "r"}
`)
	e := newEngine(t, Config{Rules: []Rule{{Match: "*", Action: "allow"}}, Paths: []string{dir}})
	d := e.Decide(context.Background(), toolCall("crm.get_contact"))
	if d.Action != Block || d.Rule != "typo.deny" || !strings.Contains(d.Reason, `invalid action deny`) {
		t.Fatalf("Decide = %+v, want Block by typo.deny naming the invalid action", d)
	}
}

func TestNilAndBlockAllEngines(t *testing.T) {
	var nilEngine *Engine
	tests := []struct {
		name   string
		e      *Engine
		reason string
	}{
		{"nil engine", nilEngine, "policy not loaded"},
		{"block all", BlockAll("policy failed to compile at start"), "policy failed to compile at start"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.e.Decide(context.Background(), toolCall("billing-api.get_invoice"))
			if d.Action != Block || d.Reason != tc.reason || d.Rule != RulePolicyError {
				t.Fatalf("Decide = %+v, want Block %q", d, tc.reason)
			}
			if err := tc.e.Reload(context.Background()); err == nil {
				t.Error("Reload succeeded on an engine without configuration")
			}
			if tc.e.Version() != 0 {
				t.Errorf("Version = %d, want 0", tc.e.Version())
			}
		})
	}
}

func TestNewCompileErrors(t *testing.T) {
	tests := []struct {
		name   string
		src    string
		code   string
		row    int
		detail string
	}{
		{"syntax error", "package sluice.policies.x\n\ndecisions contains {\"action\": if {\n", "rego_parse_error", 3, ""},
		{"http.send", "package sluice.policies.x\n\nr := http.send({\"method\": \"GET\", \"url\": \"http://127.0.0.1:1\"})\n", "rego_type_error", 3, "http.send is disabled in sluice"},
		{"net.lookup_ip_addr", "package sluice.policies.x\n\nips := net.lookup_ip_addr(\"example.com\")\n", "rego_type_error", 3, "net.lookup_ip_addr is disabled in sluice"},
		{"net.cidr_contains", "package sluice.policies.x\n\nin_net if net.cidr_contains(\"10.0.0.0/8\", input.request.host)\n", "rego_type_error", 3, "net.cidr_contains is disabled in sluice"},
		{"opa.runtime", "package sluice.policies.x\n\nenv := opa.runtime().env\n", "rego_type_error", 3, "opa.runtime is disabled in sluice"},
		{"reserved package sluice.main", "package sluice.main\n\ndecision := {\"action\": \"allow\"}\n", "sluice_package_error", 1, "reserved"},
		{"nested policies package", "package sluice.policies.team.billing\n\ndecisions contains {\"action\": \"block\"}\n", "sluice_package_error", 1, "sluice.policies.<name>"},
		{"unsafe variable", "package sluice.policies.x\n\ndecisions contains d if { d.action == \"block\" }\n", "rego_unsafe_var_error", 3, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := writeFile(t, dir, "bad.rego", tc.src)
			e, err := New(context.Background(), Config{Paths: []string{dir}})
			if err == nil || e != nil {
				t.Fatalf("New = %v, %v; want an error and no engine", e, err)
			}
			var ce *CompileError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is %T, want *CompileError", err, err)
			}
			p := ce.Problems[0]
			if p.File != file || p.Row != tc.row || p.Code != tc.code {
				t.Errorf("problem = %+v, want %s:%d %s", p, file, tc.row, tc.code)
			}
			if !strings.Contains(err.Error(), file+":") || !strings.Contains(err.Error(), tc.code) || !strings.Contains(err.Error(), tc.detail) {
				t.Errorf("error %q does not name file, code and %q", err, tc.detail)
			}
		})
	}
}

func TestNewRuleErrors(t *testing.T) {
	tests := []struct {
		name string
		rule Rule
		want string
	}{
		{"empty match", Rule{Action: "allow"}, "policies[1].match: empty"},
		{"question mark", Rule{Match: "a.b?", Action: "allow"}, "policies[1].match"},
		{"braces", Rule{Match: "a.{b,c}", Action: "allow"}, "policies[1].match"},
		{"unknown action", Rule{Match: "a.b", Action: "deny"}, "policies[1].action"},
		{"approvers on allow", Rule{Match: "a.b", Action: "allow", Approvers: []string{"x"}}, "policies[1].approvers"},
		{"empty approver", Rule{Match: "a.b", Action: "ask", Approvers: []string{" "}}, "policies[1].approvers[0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rules := []Rule{{Match: "*", Action: "block"}, tc.rule}
			_, err := New(context.Background(), Config{Rules: rules})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error = %v, want it to contain %q", err, tc.want)
			}
			if ValidateRules(rules) == nil {
				t.Error("ValidateRules accepted the rule")
			}
		})
	}
}

func TestNewMissingPath(t *testing.T) {
	_, err := New(context.Background(), Config{Paths: []string{filepath.Join(t.TempDir(), "nope")}})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("New error = %v, want os.ErrNotExist", err)
	}
}

func TestReloadKeepsPreviousPolicy(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "freeze.rego", freezeModule)
	var mu sync.Mutex
	var calls []error
	e := newEngine(t, Config{
		Rules: gatewayRules,
		Paths: []string{dir},
		OnReload: func(ok bool, err error) {
			mu.Lock()
			defer mu.Unlock()
			if ok != (err == nil) {
				t.Errorf("OnReload(%v, %v): ok and err disagree", ok, err)
			}
			calls = append(calls, err)
		},
	})
	in := toolCall("billing-api.get_invoice")
	if d := e.Decide(context.Background(), in); d.Rule != "freeze.invoices" {
		t.Fatalf("before reload: %+v", d)
	}
	v := e.Version()

	writeFile(t, dir, "freeze.rego", "package sluice.policies.freeze\n\ndecisions contains {\n")
	err := e.Reload(context.Background())
	var ce *CompileError
	if !errors.As(err, &ce) || ce.Problems[0].Code != "rego_parse_error" {
		t.Fatalf("Reload = %v, want a *CompileError with rego_parse_error", err)
	}
	if e.Version() != v {
		t.Errorf("Version = %d after a failed reload, want %d", e.Version(), v)
	}
	if d := e.Decide(context.Background(), in); d.Action != Block || d.Rule != "freeze.invoices" {
		t.Errorf("after failed reload: %+v, want the previous policy's block", d)
	}

	writeFile(t, dir, "freeze.rego", "package sluice.policies.freeze\n\ndecisions := set()\n")
	if err := e.Reload(context.Background()); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if e.Version() != v+1 {
		t.Errorf("Version = %d, want %d", e.Version(), v+1)
	}
	if d := e.Decide(context.Background(), in); d.Action != Allow || d.Rule != "policies[0]" {
		t.Errorf("after reload: %+v, want allow by policies[0]", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 || calls[0] == nil || calls[1] != nil {
		t.Errorf("OnReload calls = %v, want [error, nil]", calls)
	}
}

// waitVersion polls until the engine's version exceeds v or the deadline passes.
func waitVersion(t *testing.T, e *Engine, v int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.Version() <= v {
		if time.Now().After(deadline) {
			t.Fatalf("version still %d after 10s, want > %d", e.Version(), v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWatch(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "team")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	single := writeFile(t, t.TempDir(), "single.rego", "package sluice.policies.single\n\ndecisions := set()\n")
	failed := make(chan error, 100)
	e := newEngine(t, Config{Rules: gatewayRules, Paths: []string{dir, single}, OnReload: func(ok bool, err error) {
		if !ok {
			select {
			case failed <- err:
			default:
			}
		}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Watch(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	in := toolCall("billing-api.get_invoice")

	// Writes may land before the watcher is set up; rewrite until a reload shows.
	steps := []struct {
		name  string
		write func()
		rule  string
	}{
		{"new file in a subdirectory", func() { writeFile(t, sub, "freeze.rego", freezeModule) }, "freeze.invoices"},
		{"editor renames a new file over the listed file", func() {
			tmp := writeFile(t, filepath.Dir(single), ".single.rego.tmp", `package sluice.policies.single
decisions contains {"action": "block", "reason": "r", "rule": "single.block"}
`)
			if err := os.Rename(tmp, single); err != nil {
				t.Fatal(err)
			}
		}, "freeze.invoices"}, // both block; freeze.invoices < single.block
		{"file removed", func() {
			if err := os.Remove(filepath.Join(sub, "freeze.rego")); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}, "single.block"},
	}
	for _, s := range steps {
		v := e.Version()
		deadline := time.Now().Add(10 * time.Second)
		for e.Version() == v {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no reload within 10s", s.name)
			}
			s.write()
			for i := 0; i < 50 && e.Version() == v; i++ {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if d := e.Decide(context.Background(), in); d.Rule != s.rule {
			t.Errorf("%s: Decide = %+v, want rule %s", s.name, d, s.rule)
		}
	}

	// A broken file is rejected and the previous policy goes on answering.
	v := e.Version()
	writeFile(t, sub, "broken.rego", "package sluice.policies.broken\n\nx := \n")
	select {
	case err := <-failed:
		var ce *CompileError
		if !errors.As(err, &ce) || ce.Problems[0].Code != "rego_parse_error" {
			t.Errorf("OnReload error = %v, want rego_parse_error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no failed reload reported within 10s")
	}
	if e.Version() != v {
		t.Errorf("Version = %d after a broken file, want %d", e.Version(), v)
	}
	if d := e.Decide(context.Background(), in); d.Rule != "single.block" {
		t.Errorf("after broken file: %+v", d)
	}
	if err := os.Remove(filepath.Join(sub, "broken.rego")); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, e, v)
}

func TestEval(t *testing.T) {
	e := newEngine(t, Config{Rules: gatewayRules})
	tests := []struct {
		name    string
		raw     string
		wantErr string
		rule    string
	}{
		{"tool call", `{"version":1,"kind":"tool_call","tool":"billing-api.get_invoice","args":{"n":1.5},"time":"2025-03-01T12:00:00Z"}`, "", "policies[0]"},
		{"version defaults", `{"kind":"tool_call","tool":"crm.get_contact"}`, "", "default"},
		{"unknown field", `{"kind":"tool_call","tool":"x","credential":"s"}`, "unknown field", ""},
		{"wrong version", `{"version":2,"kind":"tool_call"}`, "version 2", ""},
		{"unknown kind", `{"kind":"smtp"}`, `kind "smtp"`, ""},
		{"trailing data", `{"kind":"dns"} {}`, "trailing data", ""},
		{"bad time", `{"kind":"dns","time":"yesterday"}`, "decode input", ""},
		{"not json", `allow`, "decode input", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := e.Eval(context.Background(), []byte(tc.raw))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Eval error = %v, want %q", err, tc.wantErr)
				}
				if d.Action != Block {
					t.Errorf("Eval on bad input returned %v", d.Action)
				}
				return
			}
			if err != nil || d.Rule != tc.rule {
				t.Fatalf("Eval = %+v, %v; want rule %s", d, err, tc.rule)
			}
		})
	}
}

func TestActionText(t *testing.T) {
	for _, a := range []Action{Block, Ask, Allow} {
		b, err := a.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back Action
		if err := back.UnmarshalText(b); err != nil || back != a {
			t.Errorf("%v round trip = %v, %v", a, back, err)
		}
	}
	if _, err := ParseAction("Allow"); err == nil {
		t.Error(`ParseAction("Allow") accepted a capitalized action`)
	}
	if _, err := Action(9).MarshalText(); err == nil {
		t.Error("MarshalText accepted Action(9)")
	}
}

func TestCapabilitiesExcludeEnvironment(t *testing.T) {
	for _, b := range Capabilities().Builtins {
		if excludedBuiltin(b.Name) {
			t.Errorf("capabilities include %s", b.Name)
		}
	}
}
