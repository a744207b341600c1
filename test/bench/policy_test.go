//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/replay"
	"github.com/sluice-gw/sluice/policy"
)

// benchPolicy measures issue 23's goals: what recording each decision's
// input costs an allowed call, and how fast `sluice policy replay`
// decides a recorded audit log again.
func benchPolicy(t *testing.T, w *world) []*section {
	return []*section{benchRecordInputs(t, w), benchReplay(t, w)}
}

// benchRecordInputs: two gateways that differ only in
// audit.record_inputs, sampled in turns.
func benchRecordInputs(t *testing.T, w *world) *section {
	s := &section{Title: "Recording decision inputs", Baseline: "allowed call, audit.record_inputs: false",
		Intro: "The full allowed-call configuration of row 1.7 (schema validation, a Rego module, the cached credential, audit on /dev/shm), one gateway with `audit.record_inputs: false` and one with the default (every decision record carries its input document); the two are sampled in turns."}
	n := iterations(2000)
	args := `{"body":` + itemBody + `}`
	var ps []*probe
	for _, o := range []struct {
		name string
		opts gwOpts
	}{
		{"allowed call, audit.record_inputs: false", gwOpts{Name: "inputs-off", Rego: benchRego, Credential: true, NoInputs: true}},
		{"allowed call, audit.record_inputs: true", gwOpts{Name: "inputs-on", Rego: benchRego, Credential: true}},
	} {
		g, err := w.startGateway(t, o.opts)
		if err != nil {
			ps = append(ps, &probe{name: o.name, err: err})
			continue
		}
		t.Cleanup(g.p.stop)
		c := sandboxClient(g.sock, benchAgent)
		ps = append(ps, &probe{name: o.name, fn: func() error { _, err := toolCall(c, "bench.create_item", args, 200); return err }})
	}
	interleave(ps, n, 20)
	s.addProbes(ps)
	s.Verdicts = append(s.Verdicts, verdictLat("issue 23: recording inputs costs an allowed call ≤ 1.05× (p50)",
		s.find("allowed call, audit.record_inputs: true"), s.find("allowed call, audit.record_inputs: false"), 1.05))
	return s
}

// benchReplay writes an audit log of recorded decisions with the real
// writer and replays it with the bench's policy (the Rego module of the
// tool-call rows and `*: allow`), against the same decisions made in
// memory by the same engine on as many workers: the baseline is what
// deciding alone costs, so the ratio is what reading and verifying the
// log adds.
func benchReplay(t *testing.T, _ *world) *section {
	records := iterations(100000)
	s := &section{Title: "Policy replay", Baseline: "decide in memory (same engine, same workers)", Rate: "decisions/s",
		Intro: fmt.Sprintf("An audit log of %d decision records, each with its input (bench.create_item with varying amounts and tags), written by the gateway's own audit writer; "+
			"`sluice policy replay`'s engine (gateway/replay) verifies the chain and decides every record again with the Rego module of the tool-call rows, on %d workers.", records, runtime.GOMAXPROCS(0))}
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	ins, err := writeDecisionLog(path, records)
	if err != nil {
		s.skip(s.Baseline, err.Error())
		s.skip("replay", err.Error())
		return s
	}
	rp := filepath.Join(dir, "bench.rego")
	if err := os.WriteFile(rp, []byte(benchRego), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eng, err := policy.New(ctx, policy.Config{Rules: []policy.Rule{{Match: "*", Action: "allow"}}, Paths: []string{rp}})
	if err != nil {
		t.Fatal(err)
	}
	// Both rows run with the collector's target `sluice policy replay`
	// sets (replay.GCPercent), restored after the section.
	defer debug.SetGCPercent(debug.SetGCPercent(replay.GCPercent))
	workers := runtime.GOMAXPROCS(0)
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := i; j < len(ins); j += workers {
				eng.Decide(ctx, ins[j])
			}
		}()
	}
	wg.Wait()
	s.add(&row{Name: s.Baseline, QPS: float64(len(ins)) / time.Since(t0).Seconds(), Note: "policy.Engine.Decide on the decoded inputs"})
	var r *row
	for _, noMemo := range []bool{false, true} {
		name := "replay"
		if noMemo {
			name = "replay --no-memo"
		}
		t0 = time.Now()
		rep, err := replay.Run(ctx, eng, []string{path}, replay.Options{NoMemo: noMemo})
		if err != nil {
			s.skip(name, err.Error())
			return s
		}
		el := time.Since(t0).Seconds()
		if rep.Replayed != records || rep.Changed != 0 {
			t.Errorf("replay of %d records: replayed %d, changed %d; want all, none changed", records, rep.Replayed, rep.Changed)
		}
		note := fmt.Sprintf("gateway/replay.Run: read, verify, decode, decide, compare; %d policy evaluations (memo %s)", rep.Evaluated, rep.Memo)
		if x := s.add(&row{Name: name, QPS: float64(rep.Replayed) / el, Note: note}); !noMemo {
			r = x
		}
	}
	v := "not met"
	if r.QPS >= 20000 {
		v = "**met**"
	}
	s.Verdicts = append(s.Verdicts, fmt.Sprintf("issue 23: replay ≥ 20,000 decisions/s over a %d-record audit log on these %d cores: %s (%.0f/s)", records, runtime.NumCPU(), v, r.QPS))
	return s
}

// writeDecisionLog writes n decision records shaped as the gateway writes
// them (call.AppendFields with a recorded input) and returns the inputs.
func writeDecisionLog(path string, n int) ([]*policy.Input, error) {
	l, err := audit.OpenWith(path, audit.Options{Sync: audit.SyncInterval, SyncInterval: 10 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	ctx := context.Background()
	ins := make([]*policy.Input, n)
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		var body map[string]any
		if err := json.Unmarshal([]byte(itemBody), &body); err != nil {
			return nil, err
		}
		body["amount"] = (i * 37) % 1200 // some over 1000: the module asks
		in := &policy.Input{Version: policy.InputVersion, Kind: "tool_call",
			Caller:    policy.Caller{Sandbox: "sb-1", Agent: "agent-a", Session: fmt.Sprintf("s-%d", i%50), User: "alice"},
			Connector: "bench", Tool: "bench.create_item",
			Operation: policy.Operation{ID: "createItem", Method: "POST", Path: "/items", Risk: "write", Tags: []string{}},
			Args:      map[string]any{"path": map[string]any{}, "query": map[string]any{}, "headers": map[string]any{}, "body": body},
			Request: policy.Request{Method: "POST", Host: "127.0.0.1:9", Path: "/items", Query: map[string][]string{},
				Headers: map[string][]string{"Content-Type": {"application/json"}}},
			// The gateway records the input after the decision filled
			// in its findings (none in this body).
			Findings: []policy.Finding{},
			Time:     start.Add(time.Duration(i) * time.Second)}
		raw, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		// The engine decides what replay decides: the input as recorded.
		if ins[i], err = policy.DecodeInput(raw); err != nil {
			return nil, err
		}
		rec := call.Record{RequestID: fmt.Sprintf("req-%d", i), Kind: call.KindToolCall, Transport: call.HTTP, Sandbox: "sb-1", Agent: "agent-a",
			Session: in.Caller.Session, User: "alice", Tool: "bench.create_item", DestHost: "127.0.0.1", Decided: true, Input: raw}
		rec.Decision = call.Decision{Action: "allow", Rule: "bench.small", Reason: "small amount"}
		if body["amount"].(int) > 1000 {
			rec.Decision = call.Decision{Action: "ask", Rule: "bench.large", Reason: "large amount"}
		}
		fs := call.AppendFields(make([]audit.Field, 0, 20), &rec, call.EventDecision, "")
		if _, err := l.AppendWritten(ctx, audit.Record{RequestID: rec.RequestID, Event: call.EventDecision, Sorted: fs}); err != nil {
			return nil, err
		}
	}
	return ins, nil
}
