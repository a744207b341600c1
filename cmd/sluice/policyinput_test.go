package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/policy"
)

// TestPolicyInputExample: `policy input --tool T --example` prints the
// document the gateway's own builder makes, with arguments from the
// schema; it decodes strictly as an input and `policy eval` decides it as
// the config does.
func TestPolicyInputExample(t *testing.T) {
	cfg := demoConfig(t)
	out, stderr, err := cli(t, "", "policy", "input", "--config", cfg, "--tool", "tickets.create_refund", "--example", "--time", "2026-03-01T12:00:00Z")
	if err != nil {
		t.Fatalf("policy input: %v\n%s", err, stderr)
	}
	in, err := policy.DecodeInput([]byte(out))
	if err != nil {
		t.Fatalf("the printed document is not a valid input: %v\n%s", err, out)
	}
	body, _ := in.Args.(map[string]any)["body"].(map[string]any)
	if in.Tool != "tickets.create_refund" || in.Caller.Agent == "" || body["amount_cents"] == nil || in.Request.Method != "POST" ||
		in.Operation.Tags == nil || in.Time.Format("2006-01-02") != "2026-03-01" {
		t.Fatalf("input %+v: want the refund tool, a granted agent, a body amount from the schema, the request, tags as an array", in)
	}
	f := filepath.Join(t.TempDir(), "in.json")
	if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if dec, _, err := cli(t, "", "policy", "eval", "--config", cfg, "--input", f); err != nil || !strings.Contains(dec, `"action": "ask"`) {
		t.Fatalf("policy eval of the example: %v\n%s", err, dec)
	}
	for _, bad := range [][]string{
		{"--tool", "tickets.create_refund"},                                      // neither --example nor --args
		{"--tool", "tickets.create_refund", "--example", "--args", "{}"},         // both
		{"--tool", "no.such_tool", "--example"},                                  // unknown tool
		{"--tool", "tickets.create_refund", "--args", `{"body":{"amount":"x"}}`}, // fails the schema
	} {
		if _, _, err := cli(t, "", append([]string{"policy", "input", "--config", cfg}, bad...)...); err == nil {
			t.Errorf("policy input %v: want an error", bad)
		}
	}
}
