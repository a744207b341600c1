//go:build linux

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/sluice-gw/sluice/policy"
)

// flipModule blocks bench.echo when data.flip.block is true.
const flipModule = `package sluice.policies.flip

decisions contains {"action": "block", "reason": "flipped", "rule": "flip.block"} if {
	input.tool == "bench.echo"
	data.flip.block
}
`

// benchPolicyLife is the policy life cycle: the time from a policy change
// (a Rego file written, a data document written, a bundle revision on the
// bundle server) to the first call the new policy decides; and the cost of
// the findings scan on a decision.
func benchPolicyLife(t *testing.T, w *world) []*section {
	return []*section{benchPolicyChange(t, w), benchFindings(t)}
}

func benchPolicyChange(t *testing.T, w *world) *section {
	s := &section{Title: "Policy change → first call decided by it", Baseline: "one allowed call",
		Intro: "The real `sluice serve`; the agent calls `bench.echo` in a loop over the sandbox socket while the policy changes so that the call flips between 200 and 403. " +
			"A row is the time from the change (the file written and renamed into place; the bundle server answering with the next revision) to the first call whose answer is the new decision. " +
			"The gateway watches files (fsnotify, 100 ms debounce) and polls the bundle server every 100 ms with If-None-Match. Goal: at most 1 s (issue 23; OpenShell publishes 10.1 s)."}
	n := iterations(10)
	args := `{"body":` + itemBody + `}`

	g, err := w.startGateway(t, gwOpts{Name: "polchange", Rego: flipModule, Data: `{"flip": {"block": false}}`})
	if err != nil {
		s.skip("one allowed call", err.Error())
		return s
	}
	defer g.p.stop()
	c := sandboxClient(g.sock, benchAgent)
	var base []time.Duration
	for range n * 10 {
		t0 := time.Now()
		if _, err := toolCall(c, "bench.echo", args, 200); err != nil {
			s.skip("one allowed call", err.Error())
			return s
		}
		base = append(base, time.Since(t0))
	}
	base = sortDur(base)
	s.lat("one allowed call", base, nil, "the loop's own step")

	dir := filepath.Dir(g.cfg)
	flip := func(name, src string) func() error {
		return func() error {
			tmp := filepath.Join(dir, "."+name+".tmp")
			if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
				return err
			}
			return os.Rename(tmp, filepath.Join(dir, name))
		}
	}
	regoOn := flipModule + "\nflip_always := true\n"
	blocked := `package sluice.policies.flip

decisions contains {"action": "block", "reason": "flipped", "rule": "flip.block"} if input.tool == "bench.echo"
`
	lat, err := changeLatency(c, args, n, func(i int) func() error {
		if i%2 == 0 {
			return flip("bench.rego", blocked)
		}
		return flip("bench.rego", regoOn)
	})
	s.lat("Rego file written", lat, err, "a module that blocks bench.echo replaces one that does not, and back")
	lat, err = changeLatency(c, args, n, func(i int) func() error {
		return flip("data.json", fmt.Sprintf(`{"flip": {"block": %v}}`, i%2 == 0))
	})
	s.lat("data.json written", lat, err, "data.flip.block toggled; the module is unchanged")

	// The bundle server inside the namespace.
	bl := w.ns.listen(t, "tcp", "127.0.0.1:0")
	var mu sync.Mutex
	cur, etag := policyBundle(t, "r0", false), `"r0"`
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		b, tag := cur, etag
		mu.Unlock()
		if r.Header.Get("If-None-Match") == tag {
			rw.WriteHeader(http.StatusNotModified)
			return
		}
		rw.Header().Set("ETag", tag)
		_, _ = rw.Write(b)
	})}
	go func() { _ = srv.Serve(bl) }()
	defer srv.Close()
	gb, err := w.startGateway(t, gwOpts{Name: "polbundle", Bundle: "http://" + bl.Addr().String() + "/b.tar.gz"})
	if err != nil {
		s.skip("bundle revision", err.Error())
		return s
	}
	defer gb.p.stop()
	cb := sandboxClient(gb.sock, benchAgent)
	lat, err = changeLatency(cb, args, n, func(i int) func() error {
		return func() error {
			b := policyBundle(t, fmt.Sprintf("r%d", i+1), i%2 == 0)
			mu.Lock()
			cur, etag = b, fmt.Sprintf(`"r%d"`, i+1)
			mu.Unlock()
			return nil
		}
	})
	s.lat("bundle revision", lat, err, "the bundle server's next revision blocks bench.echo, the one after allows it (poll 100 ms)")
	for _, name := range []string{"Rego file written", "data.json written", "bundle revision"} {
		if r := s.find(name); r != nil && r.measured() && len(r.Lat) > 0 {
			worst := r.Lat[len(r.Lat)-1]
			verdict := "met"
			if worst > time.Second {
				verdict = "NOT met"
			}
			s.Verdicts = append(s.Verdicts, fmt.Sprintf("%s: slowest of %d changes %s, goal ≤ 1 s: %s", name, len(r.Lat), worst.Round(time.Millisecond), verdict))
		}
	}
	return s
}

// changeLatency makes n changes; after change i the call's status flips
// (403 after even i, 200 after odd i) and the time to the first call with
// the new status is one sample.
func changeLatency(c *http.Client, args string, n int, change func(i int) func() error) ([]time.Duration, error) {
	var out []time.Duration
	for i := range n {
		want := http.StatusForbidden
		if i%2 == 1 {
			want = http.StatusOK
		}
		t0 := time.Now()
		if err := change(i)(); err != nil {
			return nil, err
		}
		for {
			if _, err := toolCall(c, "bench.echo", args, want); err == nil {
				break
			}
			if time.Since(t0) > 30*time.Second {
				return nil, errors.New("the change was not decided within 30s")
			}
		}
		out = append(out, time.Since(t0))
		time.Sleep(150 * time.Millisecond) // past the watch's debounce before the next change
	}
	return sortDur(out), nil
}

// policyBundle is an OPA bundle whose module blocks bench.echo when block.
func policyBundle(t *testing.T, revision string, block bool) []byte {
	roots := []string{"sluice/policies/flip", "flip"}
	b := bundle.Bundle{
		Manifest: bundle.Manifest{Revision: revision, Roots: &roots},
		Data:     map[string]any{"flip": map[string]any{"block": block}},
		Modules:  []bundle.ModuleFile{{URL: "/flip.rego", Path: "/flip.rego", Raw: []byte(flipModule)}},
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).DisableFormat(true).Write(b); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// benchFindings is the findings scan's cost on one decision, in process:
// the engine deciding a typical tool call with the scan, against the same
// decision with the findings given (the scan skipped).
func benchFindings(t *testing.T) *section {
	s := &section{Title: "Findings: the credential scan on a decision", Baseline: "decide, scan skipped",
		Intro: "policy.Engine.Decide in process on a typical refund call's input (path, query and a JSON body of 9 fields, no credential in it), " +
			"with the shipped library and one simple rule. The scan row lets the engine scan the arguments (input.findings) before deciding, as the gateway does on every call; " +
			"the baseline passes findings already made, which skips the scan."}
	ctx := context.Background()
	e, err := policy.New(ctx, policy.Config{Rules: []policy.Rule{{Match: "*", Action: "allow"}}})
	if err != nil {
		s.skip("decide, scan skipped", err.Error())
		return s
	}
	in := func() *policy.Input {
		return &policy.Input{Version: policy.InputVersion, Kind: "tool_call", Tool: "billing-api.create_refund", Connector: "billing-api",
			Caller:    policy.Caller{Sandbox: "sb-1", Agent: "support-bot", Session: "s-1", User: "bob"},
			Operation: policy.Operation{ID: "create_refund", Method: "POST", Path: "/refunds", Risk: "write", Tags: []string{"billing"}},
			Args: map[string]any{"path": map[string]any{"id": "cus_8f2a91"}, "query": map[string]any{"expand": []any{"lines"}},
				"body": map[string]any{"amount": 1250, "currency": "usd", "reason": "Customer was charged twice for the March invoice; refund the duplicate.",
					"metadata": map[string]any{"ticket": "SUP-10432", "requested_by": "support-bot", "idempotency": "550e8400-e29b-41d4-a716-446655440000"}}},
			Request: policy.Request{Method: "POST", Host: "billing.example.com", Path: "/refunds"},
			Time:    time.Now().UTC()}
	}
	block := max(iterations(20000)/10, 1)
	measure := func(skip bool) []time.Duration {
		out := make([]time.Duration, 0, block)
		for range block {
			x := in()
			if skip {
				x.Findings = []policy.Finding{}
			}
			t0 := time.Now()
			if d := e.Decide(ctx, x); d.Action != policy.Allow {
				t.Errorf("decision %+v", d)
				return nil
			}
			out = append(out, time.Since(t0))
		}
		return out
	}
	measure(true) // warm-up, not kept
	measure(false)
	// Blocks in turn, so that load from elsewhere falls on both alike.
	var base, scan []time.Duration
	for range 10 {
		base = append(base, measure(true)...)
		scan = append(scan, measure(false)...)
	}
	base, scan = sortDur(base), sortDur(scan)
	s.lat("decide, scan skipped", base, nil, "")
	s.lat("decide with the scan", scan, nil, "what every call pays")
	return s
}
