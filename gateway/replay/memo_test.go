package replay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/policy"
)

// variedLog writes n bench.create_item records whose inputs vary in what
// policies read (amounts in several number texts, tags, a nested level,
// the hour, the user) and in what they do not (session, time of the
// minute, request id), recorded as decided by benchRego.
func variedLog(t *testing.T, path string, n int) {
	writeRecords(t, path, n, func(i int) (*policy.Input, call.Decision) {
		amounts := []any{5, 999, 1000, 1001, 2500, 1.5, "12", nil}
		tags := [][]string{{"a"}, {"a", "forbidden"}, {}, nil}
		body := map[string]any{"amount": amounts[(i*7)%len(amounts)], "tags": tags[(i/3)%len(tags)], "note": fmt.Sprint("n", i)}
		if i%5 == 0 {
			body["meta"] = map[string]any{"level": i % 4}
		}
		in := itemInput(i, body)
		in.Caller.User = []string{"alice", "bob", "carol"}[i%3]
		in.Time = in.Time.Add(time.Duration(i%24) * time.Hour)
		return in, call.Decision{Action: "allow", Rule: "bench.small", Reason: "small amount"}
	})
}

// candidates are policies a reviewer might replay: one that reads a few
// paths (the memo on), one that reads the time (on, but every record
// is its own projection), one that names the amount in its rule (every
// distinct amount text its own change row) and one that reads input
// whole (off).
var candidates = map[string]struct {
	rego  string
	memo  string
	evals int // the most evaluations the memo may make of variedLog's records
}{
	"tightening": {`package sluice.policies.c
decisions contains {"action": "ask", "reason": "large", "rule": "c.large", "approvers": [input.caller.user]} if input.args.body.amount > 900
decisions contains {"action": "block", "reason": "tag", "rule": "c.tag"} if "forbidden" in input.args.body.tags
decisions contains {"action": "block", "reason": "deep", "rule": "c.deep"} if input.args.body.meta.level > 2
`, "on", 200},
	"night": {`package sluice.policies.c
decisions contains {"action": "block", "reason": "night", "rule": "c.night"} if {
	[h, _, _] := time.clock(time.parse_rfc3339_ns(input.time))
	h < 6
}
`, "on", 3000}, // every record has its own time: the memo on, no projection twice
	"rule names the amount": {`package sluice.policies.c
decisions contains {"action": "allow", "reason": "a", "rule": sprintf("c.amount.%v", [input.args.body.amount])} if input.args.body.amount
`, "on", 200},
	"whole input": {`package sluice.policies.c
decisions contains {"action": "ask", "reason": "many", "rule": "c.many"} if count(input.args.body) > 3
decisions contains {"action": "allow", "reason": "w", "rule": "c.w"} if is_object(input)
`, "off: the policy reads input as a whole (input)", 3000},
}

// TestRunMemoExact replays a varied log with each candidate with the
// memo and without, on several workers, and wants the same report:
// every change row (tool, from, to, rules), its count and first
// examples, and the skipped counts. Per decision, policy's
// TestMemoExact and FuzzMemo compare each Decision whole.
func TestRunMemoExact(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	const n = 3000
	variedLog(t, path, n)
	ctx := context.Background()
	for name, c := range candidates {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "c.rego"), []byte(c.rego), 0o644); err != nil {
				t.Fatal(err)
			}
			eng, err := policy.New(ctx, policy.Config{Rules: []policy.Rule{{Match: "*", Action: "allow"}}, Paths: []string{dir}})
			if err != nil {
				t.Fatal(err)
			}
			// A minute per evaluation: the comparison is of decisions,
			// not of what a loaded machine times out (TestRunTimeout).
			with, err := Run(ctx, eng, []string{path}, Options{Workers: 3, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			without, err := Run(ctx, eng, []string{path}, Options{Workers: 2, NoMemo: true, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if with.Replayed != n || with.Changed+with.RuleOnly == 0 {
				t.Fatalf("replayed %d of %d, %d changed: the candidate must change calls for the comparison to mean something", with.Replayed, n, with.Changed+with.RuleOnly)
			}
			if with.Memo != c.memo || without.Memo != "off: Options.NoMemo" || without.Evaluated != n {
				t.Fatalf("memo %q (want %q), without %q evaluating %d", with.Memo, c.memo, without.Memo, without.Evaluated)
			}
			if with.Evaluated > c.evals || c.memo != "on" && with.Evaluated != n {
				t.Errorf("memo %s: %d evaluations for %d records", c.memo, with.Evaluated, n)
			}
			t.Logf("%d evaluations with the memo for %d records; %d change rows", with.Evaluated, n, len(with.Changes))
			for _, r := range []*Report{with, without} {
				r.Seconds, r.Evaluated, r.Memo = 0, 0, ""
			}
			if !reflect.DeepEqual(with, without) {
				t.Fatalf("reports differ:\nmemo    %+v\nno memo %+v", with, without)
			}
		})
	}
}

// slowRego is slow on purpose: it counts up to input.args.body.n.
const slowRego = `package sluice.policies.slow
decisions contains {"action": "allow", "reason": "counted", "rule": "slow.count"} if {
	count([x | some x in numbers.range(1, input.args.body.n)]) > 0
}
`

// TestRunTimeout: a record whose evaluation runs out of time is evaluated
// once more with the longer budget; one that runs out again is skipped
// as an evaluation timeout, never a change to policy_error.
func TestRunTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	const n, slow = 40, 3
	writeRecords(t, path, n, func(i int) (*policy.Input, call.Decision) {
		count := 1
		if i%10 == 5 && i/10 < slow {
			count = 300000 + i // distinct: each slow record is evaluated, not answered by the memo
		}
		return itemInput(i, map[string]any{"n": count}), call.Decision{Action: "allow", Rule: "slow.count", Reason: "counted"}
	})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "slow.rego"), []byte(slowRego), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eng, err := policy.New(ctx, policy.Config{Paths: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	// Given longer, the slow records are decided: all unchanged.
	rep, err := Run(ctx, eng, []string{path}, Options{Workers: 2, Timeout: 20 * time.Millisecond, RetryTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != n || rep.Unchanged != n || rep.Retried < slow || len(rep.Skipped) != 0 {
		t.Fatalf("retry with a minute: %+v", rep)
	}
	// Out of time twice: skipped with the reason, not a change.
	// (On a loaded machine a fast record may run out of time twice too:
	// it is skipped the same way, never a change.)
	rep, err = Run(ctx, eng, []string{path}, Options{Workers: 2, Timeout: 20 * time.Millisecond, RetryTimeout: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Skipped[SkipTimeout] < slow || rep.Replayed+rep.Skipped[SkipTimeout] != n || rep.Unchanged != rep.Replayed ||
		rep.Changed != 0 || rep.RuleOnly != 0 || len(rep.Changes) != 0 || rep.Retried < slow || len(rep.Skipped) != 1 {
		t.Fatalf("retry with 40 ms: %+v", rep)
	}
}
