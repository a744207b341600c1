package policy

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckModules: Check finds, each at its file:row, an action literal
// that is not an action (in a head and in a body), a literal decision with
// no action, a sluice.policies package without decisions and a helper
// package nothing uses; a used helper, an action chosen per call and a
// well-formed module are not reported. And the engine really blocks what
// Check calls a bad action, for the reason Check names.
func TestCheckModules(t *testing.T) {
	dir := t.TempDir()
	bad := writeFile(t, dir, "bad.rego", `package sluice.policies.bad

import data.helpers.used

decisions contains {"action": "deny", "reason": "r", "rule": "bad.head"} if {
	input.tool == "billing-api.delete"
}

decisions contains d if {
	input.tool == "billing-api.wipe"
	d := {"action": "Allow", "rule": "bad.body"}
}

decisions contains {"reason": "no action", "rule": "bad.none"} if {
	input.tool == "billing-api.none"
}

decisions contains {"action": a, "rule": "bad.dynamic"} if {
	input.tool == "billing-api.dyn"
	a := used.pick
}

decisions contains {"action": "block", "rule": "bad.fine"} if input.tool == "x"
`)
	writeFile(t, dir, "used.rego", "package helpers.used\n\npick := \"ask\"\n")
	unused := writeFile(t, dir, "unused.rego", "package helpers.unused\n\nx := 1\n")
	empty := writeFile(t, dir, "empty.rego", "package sluice.policies.empty\n\nallow := true\n")
	writeFile(t, dir, "good_test.rego", "package sluice.policies.good_test\n\ntest_x if true\n")

	l, err := Check(context.Background(), []string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if l.Modules != 4 {
		t.Errorf("Modules = %d, want 4 (tests and the library not counted)", l.Modules)
	}
	got := func(ps []Problem) []string {
		var s []string
		for _, p := range ps {
			s = append(s, p.String())
		}
		return s
	}
	wantErrs := []string{
		bad + `:5:31: sluice_action_error: action "deny"`,
		bad + `:11:18: sluice_action_error: action "Allow"`,
		bad + `:14:20: sluice_action_error: a decision without "action"`,
	}
	wantWarns := []string{
		empty + `:1:1: sluice_no_decisions: package sluice.policies.empty defines no decisions rule`,
		unused + `:1:1: sluice_package_unused: package helpers.unused is outside sluice.policies.* and no module uses it`,
	}
	match := func(kind string, have, want []string) {
		t.Helper()
		if len(have) != len(want) {
			t.Errorf("%s: got %d %q, want %d", kind, len(have), have, len(want))
			return
		}
		for i := range want {
			if !strings.HasPrefix(have[i], want[i]) {
				t.Errorf("%s[%d] = %q, want prefix %q", kind, i, have[i], want[i])
			}
		}
	}
	match("errors", got(l.Errors), wantErrs)
	match("warnings", got(l.Warnings), wantWarns)

	// What Check calls a bad action is what the engine refuses.
	e := newEngine(t, Config{Paths: []string{dir}})
	d := e.Decide(context.Background(), toolCall("billing-api.delete"))
	if d.Action != Block || d.Rule != "bad.head" || !strings.Contains(d.Reason, "invalid action") {
		t.Errorf("deny decision: %+v, want block by bad.head for an invalid action", d)
	}

	// A module that does not compile is Check's error, as New's.
	writeFile(t, dir, "broken.rego", "package sluice.policies.broken\n\ndecisions contains {\n")
	if _, err := Check(context.Background(), []string{dir}); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "broken.rego")) {
		t.Errorf("broken module: %v", err)
	}
}
