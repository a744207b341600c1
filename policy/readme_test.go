package policy

import (
	"context"
	"os"
	"regexp"
	"testing"
)

// TestREADMEExamples compiles and tests the Rego examples of rego/README.md:
// the first rego block is a module, the second its test.
func TestREADMEExamples(t *testing.T) {
	src, err := os.ReadFile("../rego/README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```rego\n(.*?)```").FindAllSubmatch(src, -1)
	if len(blocks) != 2 {
		t.Fatalf("found %d rego blocks in README.md, want 2", len(blocks))
	}
	dir := t.TempDir()
	writeFile(t, dir, "billing.rego", string(blocks[0][1]))
	writeFile(t, dir, "billing_test.rego", string(blocks[1][1]))
	rules := []Rule{
		{Match: "billing-api.get_*", Action: "allow"},
		{Match: "billing-api.create_refund", Action: "ask", Approvers: []string{"group:finance"}},
		{Match: "*", Action: "block", Reason: "not on the list"},
	}
	rep, err := Test(context.Background(), []string{dir}, rules)
	if err != nil {
		t.Fatalf("Test: %v", err)
	}
	found := false
	for _, r := range rep.Results {
		if r.Name == "test_big_refund_asks_cfo" {
			found = r.Outcome == "pass"
		}
	}
	if !found || !rep.OK() {
		t.Fatalf("README test did not pass: %+v", rep)
	}
	e := newEngine(t, Config{Rules: rules, Paths: []string{dir}})
	night := toolCall("billing-api.get_invoice")
	night.Time = night.Time.Add(12 * 60 * 60e9) // midnight
	if d := e.Decide(context.Background(), night); d.Rule != "billing.hours" {
		t.Errorf("night call decided %+v, want billing.hours", d)
	}
}
