package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/policy"
)

// writeLog writes decision records as the gateway does: n calls of
// t.read (allowed by policies[0]), one refund asked by policies[1] and let
// through by a grant, one record without an input and one cut.
func writeLog(t *testing.T, path string, n int) {
	t.Helper()
	l, err := audit.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	add := func(rec *call.Record, in *policy.Input) {
		if in != nil {
			raw, err := json.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			rec.Input = raw
		}
		rec.Kind, rec.Decided, rec.Agent, rec.Sandbox = call.KindToolCall, true, "a", "sb"
		fs := call.AppendFields(make([]audit.Field, 0, 20), rec, call.EventDecision, "")
		if _, err := l.Append(ctx, audit.Record{RequestID: rec.RequestID, Event: call.EventDecision, Sorted: fs}); err != nil {
			t.Fatal(err)
		}
	}
	// Recorded as the gateway records them, findings filled in by the
	// decision (replay's one-pass path), except the grant's: an input
	// recorded before findings existed is decoded strictly and scanned.
	input := func(tool string) *policy.Input {
		return &policy.Input{Kind: "tool_call", Tool: tool, Connector: "t", Caller: policy.Caller{Agent: "a", Sandbox: "sb"},
			Findings: []policy.Finding{}, Time: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	}
	for i := range n {
		add(&call.Record{RequestID: fmt.Sprint("r", i), Tool: "t.read", Decision: call.Decision{Action: "allow", Rule: "policies[0]"}}, input("t.read"))
	}
	refund := input("t.refund")
	refund.Findings = nil
	add(&call.Record{RequestID: "g", Tool: "t.refund", Decision: call.Decision{Action: "allow", Rule: "grant:G1",
		Reason: "always allowed by bob (grant G1 from hold H1; policy policies[1] asked)"}}, refund)
	add(&call.Record{RequestID: "old", Tool: "t.read", Decision: call.Decision{Action: "allow", Rule: "policies[0]"}}, nil)
	add(&call.Record{RequestID: "cut", Tool: "t.read", Decision: call.Decision{Action: "allow", Rule: "policies[0]"}, InputCut: "input", InputSize: 1 << 20}, nil)
}

func TestRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, 200)
	ctx := context.Background()
	engine := func(rules ...policy.Rule) *policy.Engine {
		e, err := policy.New(ctx, policy.Config{Rules: rules})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	// The policy that made the log: nothing changes.
	same := engine(policy.Rule{Match: "t.read", Action: "allow"}, policy.Rule{Match: "t.refund", Action: "ask", Approvers: []string{"bob"}})
	rep, err := Run(ctx, same, []string{path}, Options{Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Decisions != 203 || rep.Replayed != 201 || rep.Unchanged != 201 || rep.Changed != 0 || len(rep.Changes) != 0 ||
		rep.Skipped[SkipNoInput] != 1 || rep.Skipped[SkipTruncated] != 1 {
		t.Fatalf("replay with the same policy: %+v", rep)
	}
	// A loosening: refunds allowed. The grant's call was an ask: ask → allow.
	loose := engine(policy.Rule{Match: "t.read", Action: "allow"}, policy.Rule{Match: "t.refund", Action: "allow"})
	if rep, err = Run(ctx, loose, []string{path}, Options{}); err != nil {
		t.Fatal(err)
	}
	if rep.Loosened != 1 || len(rep.Changes) != 1 || rep.Changes[0].From != "ask" || rep.Changes[0].To != "allow" ||
		rep.Changes[0].FromRule != "policies[1]" || rep.Changes[0].Examples[0].RequestID != "g" {
		t.Fatalf("replay with a loosening: %+v", rep)
	}
	// A tightening of reads: every read changes, listed with its first examples in log order.
	tight := engine(policy.Rule{Match: "t.read", Action: "block"}, policy.Rule{Match: "t.refund", Action: "ask", Approvers: []string{"bob"}})
	if rep, err = Run(ctx, tight, []string{path}, Options{Workers: 3}); err != nil {
		t.Fatal(err)
	}
	c := rep.Changes
	if rep.Changed != 200 || rep.Loosened != 0 || len(c) != 1 || c[0].Count != 200 || len(c[0].Examples) != maxExamples ||
		c[0].Examples[0].Line != 1 || c[0].Examples[2].Line != 3 {
		t.Fatalf("replay with a tightening: %+v", rep)
	}
	// --since past the log: nothing read.
	if rep, err = Run(ctx, tight, []string{path}, Options{Since: time.Now().Add(time.Hour)}); err != nil || rep.Decisions != 0 {
		t.Fatalf("since after every record: %+v %v", rep, err)
	}
}

// TestRunBrokenChain: an edited record is an error naming the file and
// line, and no report, however many records the workers decided before
// the break was found; an unfinished last write is only skipped.
func TestRunBrokenChain(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	writeLog(t, path, 600)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eng, err := policy.New(ctx, policy.Config{Rules: []policy.Rule{{Match: "*", Action: "allow"}}})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	lines[449] = strings.Replace(lines[449], `"decision":"allow"`, `"decision":"block"`, 1)
	bad := filepath.Join(dir, "edited.log")
	if err := os.WriteFile(bad, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(ctx, eng, []string{path, bad}, Options{Workers: 2})
	var be *BrokenChainError
	if !errors.As(err, &be) || be.File != bad || be.Line != 450 || !strings.Contains(be.Reason, "hash mismatch") || rep != nil {
		t.Fatalf("edited line 450: report %v, error %v", rep, err)
	}
	if !strings.Contains(err.Error(), bad+" line 450") || !strings.Contains(err.Error(), "nothing was replayed") {
		t.Fatalf("error %q does not name the file and line", err)
	}
	cut := filepath.Join(dir, "cut.log")
	if err := os.WriteFile(cut, data[:len(data)-30], 0o600); err != nil {
		t.Fatal(err)
	}
	if rep, err = Run(ctx, eng, []string{cut}, Options{}); err != nil || rep.Skipped[SkipUnfinished] != 1 ||
		rep.Files[0].Verified != 602 || rep.Decisions != 602 {
		t.Fatalf("unfinished last write: %+v, %v", rep, err)
	}
}

// benchRego is test/bench's tool-call module: replay decides with it.
const benchRego = `package sluice.policies.bench

import rego.v1

decisions contains {"action": "allow", "reason": "small amount", "rule": "bench.small"} if {
	input.kind == "tool_call"
	input.tool == "bench.create_item"
	input.args.body.amount <= 1000
}

decisions contains {"action": "ask", "reason": "large amount", "rule": "bench.large"} if {
	input.kind == "tool_call"
	input.args.body.amount > 1000
}

decisions contains {"action": "block", "reason": "forbidden tag", "rule": "bench.tag"} if {
	input.kind == "tool_call"
	some t in input.args.body.tags
	t == "forbidden"
}
`

// writeBenchLog writes n records shaped as test/bench's replay row writes
// them: bench.create_item with varying amounts, decided by benchRego.
func writeBenchLog(b testing.TB, path string, n int) {
	writeRecords(b, path, n, func(i int) (*policy.Input, call.Decision) {
		amount := (i * 37) % 1200
		body := map[string]any{"name": "widget", "amount": amount, "currency": "EUR", "note": "bench", "tags": []string{"a", "b", "c"},
			"lines": []any{map[string]any{"sku": "w-1", "qty": 2}, map[string]any{"sku": "w-2", "qty": 1}}}
		d := call.Decision{Action: "allow", Rule: "bench.small", Reason: "small amount"}
		if amount > 1000 {
			d = call.Decision{Action: "ask", Rule: "bench.large", Reason: "large amount"}
		}
		return itemInput(i, body), d
	})
}

// itemInput is the recorded input of the i-th bench.create_item call with body.
func itemInput(i int, body map[string]any) *policy.Input {
	return &policy.Input{Version: policy.InputVersion, Kind: "tool_call",
		Caller:    policy.Caller{Sandbox: "sb-1", Agent: "agent-a", Session: fmt.Sprintf("s-%d", i%50), User: "alice"},
		Connector: "bench", Tool: "bench.create_item",
		Operation: policy.Operation{ID: "createItem", Method: "POST", Path: "/items", Risk: "write", Tags: []string{}},
		Args:      map[string]any{"path": map[string]any{}, "query": map[string]any{}, "headers": map[string]any{}, "body": body},
		Request: policy.Request{Method: "POST", Host: "127.0.0.1:9", Path: "/items", Query: map[string][]string{},
			Headers: map[string][]string{"Content-Type": {"application/json"}}},
		Findings: []policy.Finding{},
		Time:     time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second)}
}

// writeRecords writes n decision records as the gateway writes them:
// record i carries the input and decision mk gives.
func writeRecords(tb testing.TB, path string, n int, mk func(i int) (*policy.Input, call.Decision)) {
	l, err := audit.OpenWith(path, audit.Options{Sync: audit.SyncInterval, SyncInterval: 10 * time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for i := range n {
		in, d := mk(i)
		raw, err := json.Marshal(in)
		if err != nil {
			tb.Fatal(err)
		}
		rec := call.Record{RequestID: fmt.Sprintf("req-%d", i), Kind: call.KindToolCall, Transport: call.HTTP, Sandbox: in.Caller.Sandbox, Agent: in.Caller.Agent,
			Session: in.Caller.Session, User: in.Caller.User, Tool: in.Tool, DestHost: "127.0.0.1", Decided: true, Input: raw, Decision: d}
		fs := call.AppendFields(make([]audit.Field, 0, 20), &rec, call.EventDecision, "")
		if _, err := l.AppendWritten(ctx, audit.Record{RequestID: rec.RequestID, Event: call.EventDecision, Sorted: fs}); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkRun is replay's cost per record (read, verify, decode, decide,
// compare) on one worker; test/bench's replay row measures the rate.
func BenchmarkRun(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "audit.log")
	const n = 5000
	writeBenchLog(b, path, n)
	rp := filepath.Join(dir, "bench.rego")
	if err := os.WriteFile(rp, []byte(benchRego), 0o644); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	eng, err := policy.New(ctx, policy.Config{Rules: []policy.Rule{{Match: "*", Action: "allow"}}, Paths: []string{rp}})
	if err != nil {
		b.Fatal(err)
	}
	for _, noMemo := range []bool{false, true} {
		b.Run(fmt.Sprintf("NoMemo=%v", noMemo), func(b *testing.B) {
			cpu0 := cpuTime()
			for range b.N {
				rep, err := Run(ctx, eng, []string{path}, Options{Workers: 1, NoMemo: noMemo})
				if err != nil || rep.Replayed != n || rep.Changed != 0 || rep.RuleOnly != 0 {
					b.Fatalf("replay: %+v %v", rep, err)
				}
			}
			// CPU time, not wall time: the machine is shared, and CPU per
			// record is what bounds the rate on a given number of cores.
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*n)/1000, "cpu-µs/record")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
