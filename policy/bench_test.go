package policy

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
)

// rules1000 builds 1,000 simple rules shaped like a large deployment: 100
// connectors, each with exact rules, prefix wildcards and a glob, plus a few
// cross-connector globs and a catch-all block.
func rules1000() []Rule {
	var rules []Rule
	for c := 0; len(rules) < 995; c++ {
		slug := fmt.Sprintf("conn-%03d", c)
		for op := 0; op < 6; op++ {
			rules = append(rules, Rule{Match: fmt.Sprintf("%s.op_%d", slug, op), Action: "allow"})
		}
		rules = append(rules,
			Rule{Match: slug + ".get_*", Action: "allow"},
			Rule{Match: slug + ".create_*", Action: "ask", Approvers: []string{"group:" + slug}},
			Rule{Match: slug + ".*_admin", Action: "block"},
			Rule{Match: slug + ".list_*", Action: "allow"},
		)
	}
	rules = append(rules[:995],
		Rule{Match: "*.delete_*", Action: "block"},
		Rule{Match: "*_danger", Action: "block"},
		Rule{Match: "legacy-*", Action: "ask"},
		Rule{Match: "*.purge", Action: "block"},
		Rule{Match: "*", Action: "block"},
	)
	return rules
}

func benchInputs() []*Input {
	var ins []*Input
	for c := 0; c < 100; c += 7 {
		for _, op := range []string{"op_3", "get_invoice", "create_refund", "x_admin", "delete_user", "unknown"} {
			ins = append(ins, toolCall(fmt.Sprintf("conn-%03d.%s", c, op)))
		}
	}
	return ins
}

// benchDecide reports p50 and p99 of per-call durations next to ns/op.
func benchDecide(b *testing.B, rules []Rule) {
	e, err := New(context.Background(), Config{Rules: rules})
	if err != nil {
		b.Fatal(err)
	}
	ins := benchInputs()
	// A long deadline: on a loaded machine a descheduled call must not turn
	// into a timeout (Decide's own default is DefaultTimeout).
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, in := range ins { // warm caches (glob patterns, indices)
		e.Decide(ctx, in)
	}
	samples := make([]time.Duration, 0, b.N)
	cpu := make([]time.Duration, 0, b.N)
	runtime.LockOSThread() // so the thread's CPU clock is this goroutine's
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		in := ins[i%len(ins)]
		c0, t0 := threadCPU(), time.Now()
		d := e.Decide(ctx, in)
		samples = append(samples, time.Since(t0))
		cpu = append(cpu, threadCPU()-c0)
		if d.Rule == RulePolicyError {
			b.Fatalf("call %d (%s) after %v: policy error: %s", i, in.Tool, samples[len(samples)-1], d.Reason)
		}
	}
	b.StopTimer()
	pct := func(s []time.Duration, p float64) float64 {
		return float64(s[int(float64(len(s)-1)*p)].Nanoseconds())
	}
	slices.Sort(samples)
	slices.Sort(cpu)
	b.ReportMetric(pct(samples, 0.50), "p50-ns")
	b.ReportMetric(pct(samples, 0.99), "p99-ns")
	b.ReportMetric(pct(cpu, 0.50), "cpu-p50-ns")
	b.ReportMetric(pct(cpu, 0.99), "cpu-p99-ns")
}

func BenchmarkDecide1000Rules(b *testing.B) {
	rules := rules1000()
	if len(rules) != 1000 {
		b.Fatalf("built %d rules", len(rules))
	}
	benchDecide(b, rules)
}

// BenchmarkDecide1Rule is the baseline: the same inputs against one catch-all.
func BenchmarkDecide1Rule(b *testing.B) {
	benchDecide(b, []Rule{{Match: "*", Action: "allow"}})
}

// TestRules1000Decisions checks the benchmark's policy decides what it should,
// so the benchmark measures real work.
func TestRules1000Decisions(t *testing.T) {
	e := newEngine(t, Config{Rules: rules1000()})
	tests := []struct {
		tool   string
		action Action
		rule   string
	}{
		{"conn-007.op_3", Allow, "policies[73]"},
		{"conn-007.get_invoice", Allow, "policies[76]"},
		{"conn-007.create_refund", Ask, "policies[77]"},
		{"conn-007.x_admin", Block, "policies[78]"},
		{"conn-007.delete_user", Block, "policies[995]"},
		{"legacy-thing", Ask, "policies[997]"},
		{"conn-007.unknown", Block, "policies[999]"}, // the catch-all
	}
	for _, tc := range tests {
		t.Run(tc.tool, func(t *testing.T) {
			d := e.Decide(context.Background(), toolCall(tc.tool))
			if d.Action != tc.action || d.Rule != tc.rule {
				t.Errorf("Decide = %+v, want %v by %s", d, tc.action, tc.rule)
			}
		})
	}
}

// BenchmarkEvalTrivial calibrates the machine: one OPA evaluation of a
// one-line rule on the same input, with no sluice library involved.
func BenchmarkEvalTrivial(b *testing.B) {
	pq, err := rego.New(
		rego.Query("data.x.d"),
		rego.Module("x.rego", "package x\n\nd := {\"action\": \"allow\"} if input.kind == \"tool_call\"\n"),
	).PrepareForEval(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	in, err := inputValue(toolCall("a.b"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pq.Eval(context.Background(), rego.EvalParsedInput(in)); err != nil {
			b.Fatal(err)
		}
	}
}
