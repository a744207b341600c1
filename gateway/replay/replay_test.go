package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	input := func(tool string) *policy.Input {
		return &policy.Input{Kind: "tool_call", Tool: tool, Connector: "t", Caller: policy.Caller{Agent: "a", Sandbox: "sb"},
			Time: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	}
	for i := range n {
		add(&call.Record{RequestID: fmt.Sprint("r", i), Tool: "t.read", Decision: call.Decision{Action: "allow", Rule: "policies[0]"}}, input("t.read"))
	}
	add(&call.Record{RequestID: "g", Tool: "t.refund", Decision: call.Decision{Action: "allow", Rule: "grant:G1",
		Reason: "always allowed by bob (grant G1 from hold H1; policy policies[1] asked)"}}, input("t.refund"))
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
