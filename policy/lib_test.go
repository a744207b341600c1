package policy

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestRegoLibrary runs the shipped rego/*_test.rego through OPA's tester, so
// `go test` fails when the library's own tests fail.
func TestRegoLibrary(t *testing.T) {
	rep, err := Test(context.Background(), nil, nil)
	if err != nil {
		t.Fatalf("Test: %v", err)
	}
	for _, r := range rep.Results {
		if r.Outcome != "pass" {
			t.Errorf("%s:%d %s.%s: %s %s", r.File, r.Row, r.Package, r.Name, r.Outcome, r.Error)
		}
		if !strings.HasPrefix(r.File, libraryPrefix) {
			t.Errorf("result %s from %s, want only the library", r.Name, r.File)
		}
	}
	if !rep.OK() || rep.Passed < 10 {
		t.Errorf("report = %+v, want at least 10 passing tests", rep)
	}
}

func TestTestUserModules(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "freeze.rego", freezeModule)
	writeFile(t, dir, "freeze_test.rego", `package sluice.policies.freeze_test

import data.sluice.main

test_freeze_blocks if {
	d := main.decision with input as {"version": 1, "kind": "tool_call", "tool": "billing-api.get_invoice"}
	d.rule == "freeze.invoices"
}

# uses the rules passed to Test, compiled into data like New does
test_rules_allow_customers if {
	d := main.decision with input as {"version": 1, "kind": "tool_call", "tool": "billing-api.get_customer"}
	d.action == "allow"
}

test_deliberately_wrong if {
	d := main.decision with input as {"version": 1, "kind": "tool_call", "tool": "billing-api.get_invoice"}
	d.action == "allow"
}

test_builtin_error if {
	10 / count(input.none) == 1 with input as {"none": []}
}
`)
	rep, err := Test(context.Background(), []string{dir}, gatewayRules)
	if err != nil {
		t.Fatalf("Test: %v", err)
	}
	want := map[string]string{
		"test_freeze_blocks":         "pass",
		"test_rules_allow_customers": "pass",
		"test_deliberately_wrong":    "fail",
		"test_builtin_error":         "error",
	}
	got := map[string]string{}
	for _, r := range rep.Results {
		if r.Package == "data.sluice.policies.freeze_test" {
			got[r.Name] = r.Outcome
		}
	}
	for name, outcome := range want {
		if got[name] != outcome {
			t.Errorf("%s = %q, want %q", name, got[name], outcome)
		}
	}
	if rep.OK() || rep.Failed != 1 || rep.Errored != 1 {
		t.Errorf("report counts passed=%d failed=%d errored=%d, want one failure and one error", rep.Passed, rep.Failed, rep.Errored)
	}
}

func TestTestRejectsHTTPSend(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "x_test.rego", "package x_test\n\ntest_net if http.send({\"method\": \"GET\", \"url\": \"http://127.0.0.1:1\"})\n")
	_, err := Test(context.Background(), []string{dir}, nil)
	var ce *CompileError
	if !errors.As(err, &ce) || ce.Problems[0].Code != "rego_type_error" || !strings.Contains(err.Error(), "http.send is disabled") {
		t.Fatalf("Test error = %v, want rego_type_error naming http.send", err)
	}
}
