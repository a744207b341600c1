package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// memoModules are policies that read the input in every way the
// analysis must follow, and the ways that turn the memo off. Each module
// is the only one of its engine (with the library).
var memoModules = map[string]struct {
	src  string
	deps string // inputPaths's answer
}{
	"paths": {`package sluice.policies.m
decisions contains {"action": "allow", "reason": sprintf("small %v", [input.args.body.amount]), "rule": "m.small"} if {
	input.args.body.amount <= 1000
}
decisions contains {"action": "ask", "reason": "large", "rule": "m.large", "approvers": [input.caller.user]} if {
	input.args.body.amount > 1000
}
decisions contains {"action": "block", "reason": "tag", "rule": "m.tag"} if {
	some t in input.args.body.tags
	t == "forbidden"
}
decisions contains {"action": "ask", "reason": "deep", "rule": "m.deep"} if input.args.body.meta.level > 2
`, "args.body.amount args.body.meta.level args.body.tags caller.agent caller.user kind request.host request.port tool"},
	"dynamic key": {`package sluice.policies.m
decisions contains {"action": "block", "reason": k, "rule": "m.any"} if {
	some k
	input.args.body[k] == "forbidden"
}
decisions contains {"action": "allow", "reason": "ok", "rule": "m.ok"} if input.args.body.amount
`, "args.body caller.agent kind request.host request.port tool"},
	"import alias and functions": {`package sluice.policies.m
import input.args.body as b
big(x) if x > 1000
decisions contains {"action": "ask", "reason": "big", "rule": "m.big"} if big(b.amount)
decisions contains {"action": "allow", "reason": sprintf("%d headers", [count(object.get(input.request, "headers", {}))]), "rule": "m.h"} if true
`, "args.body.amount caller.agent kind request tool"},
	"part of input as input": {`package sluice.policies.m
import input.body as b
big if b.amount > 1000
tagged if input.body.tags
big_args if big with input as input.args
tagged_args if tagged with input as input.args
decisions contains {"action": "ask", "reason": "big", "rule": "m.big"} if {
	input.args
	big_args
}
decisions contains {"action": "block", "reason": "tagged", "rule": "m.tagged"} if {
	input.args
	tagged_args
}
decisions contains {"action": "allow", "reason": "small", "rule": "m.small"} if {
	not input.args
}
`, "args? args.args? args.args.args? args.args.body.amount args.args.body.tags? args.args.caller.agent args.args.kind args.args.request.host args.args.request.port args.args.tool args.body.amount args.body.tags? args.caller.agent args.kind args.request.host args.request.port args.tool body.amount body.tags? caller.agent kind request.host request.port tool"},
	"with input as a document": {`package sluice.policies.m
small if input.amount < 10
decisions contains {"action": "allow", "reason": "as small", "rule": "m.w"} if small with input as {"amount": input.args.body.amount}
`, "off: a with modifier replaces input (input)"},
	"time of the call": {`package sluice.policies.m
decisions contains {"action": "block", "reason": "night", "rule": "m.night"} if {
	[h, _, _] := time.clock(time.parse_rfc3339_ns(input.time))
	h < 6
}
decisions contains {"action": "allow", "reason": "day", "rule": "m.day"} if true
`, "caller.agent kind request.host request.port time tool"},
	"whole input": {`package sluice.policies.m
decisions contains {"action": "allow", "reason": sprintf("%d", [count(input)]), "rule": "m.whole"} if true
`, "off: the policy reads input as a whole (input)"},
	"input by variable key": {`package sluice.policies.m
decisions contains {"action": "allow", "reason": k, "rule": "m.k"} if {
	some k
	input[k] == "t.a"
}
`, "off: the policy reads input as a whole (input[k])"},
	"with input": {`package sluice.policies.m
small if input.args.body.amount < 10
decisions contains {"action": "allow", "reason": "as small", "rule": "m.w"} if small with input.args.body.amount as 1
`, "off: a with modifier replaces input (input.args.body.amount)"},
	"the clock": {`package sluice.policies.m
decisions contains {"action": "allow", "reason": "now", "rule": "m.now"} if time.now_ns() > 0
`, "off: the policy calls time.now_ns, which is not a function of its arguments"},
	"randomness": {`package sluice.policies.m
decisions contains {"action": "allow", "reason": "coin", "rule": "m.coin"} if rand.intn("x", 2) == 0
`, "off: the policy calls rand.intn, which is not a function of its arguments"},
	"a token checked against the clock": {`package sluice.policies.m
decisions contains {"action": "allow", "reason": "jwt", "rule": "m.jwt"} if {
	[ok, _, _] := io.jwt.decode_verify(input.args.body.token, {"secret": "s"})
	ok
}
`, "off: the policy calls io.jwt.decode_verify, which is not a function of its arguments"},
}

var memoRules = []Rule{
	{Match: "t.*", Action: "ask", Approvers: []string{"ops"}},
	{Match: "u.c", Action: "allow"},
	{Match: "*", Action: "block"},
}

func TestInputPaths(t *testing.T) {
	for name, m := range memoModules {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, "m.rego", m.src)
			e := newEngine(t, Config{Rules: memoRules, Paths: []string{dir}})
			if got := e.cur.Load().deps().String(); got != m.deps {
				t.Errorf("inputPaths:\n got %s\nwant %s", got, m.deps)
			}
			if got, want := NewMemo(e, 0).Off(), strings.TrimPrefix(m.deps, "off: "); (got != "") != strings.HasPrefix(m.deps, "off: ") || (got != "" && got != want) {
				t.Errorf("Off() = %q, want %q", got, want)
			}
		})
	}
}

// memoInput is a recorded input drawn from small alphabets, so that many
// inputs share what a policy reads while differing in the rest, and the
// same JSON number is written in several texts (1, 1.0, 1e0: equal in
// Rego, different to sprintf).
func memoInput(r *rand.Rand) []byte {
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	var body []string
	if s := pick("", `"amount":1`, `"amount":1.0`, `"amount":1e0`, `"amount":999`, `"amount":1001`, `"amount":"5"`, `"amount":null`); s != "" {
		body = append(body, s)
	}
	if s := pick("", `"tags":[]`, `"tags":["forbidden"]`, `"tags":["a","forbidden"]`, `"tags":"forbidden"`); s != "" {
		body = append(body, s)
	}
	if s := pick("", `"meta":{"level":1}`, `"meta":{"level":3}`, `"meta":"x"`, `"meta":[3]`, `"x":"forbidden"`); s != "" {
		body = append(body, s)
	}
	if s := pick("", `"token":"a.b.c"`); s != "" {
		body = append(body, s)
	}
	args := pick(`null`, `{}`, `{"body":{`+strings.Join(body, ",")+`}}`, `{"body":[1]}`, `{"body":{`+strings.Join(body, ",")+`},"query":{"q":"x"}}`)
	kind := pick("tool_call", "tool_call", "tool_call", "http")
	in := &Input{Version: InputVersion, Kind: kind, Tool: pick("t.a", "t.b", "u.c", "v.d"), Connector: "c",
		Caller:   Caller{Sandbox: "sb", Agent: pick("a1", "a2"), Session: fmt.Sprint("s", r.IntN(1000)), User: pick("alice", "bob")},
		Args:     json.RawMessage(args),
		Request:  Request{Method: "POST", Host: pick("h1", "h2"), Path: "/x", Headers: map[string][]string{"A": {pick("1", "2")}}},
		Time:     time.Date(2026, 11, 1, r.IntN(24), 30*r.IntN(2), 0, 0, time.UTC),
		Findings: []Finding{},
	}
	if kind == "http" {
		in.Tool = ""
		in.Request.Port = 443
	}
	raw, err := json.Marshal(in)
	if err != nil {
		panic(err)
	}
	return raw
}

// patient is a context whose deadline (ten minutes, for the one test or
// subtest it is made for) replaces the engine's one-second
// DefaultTimeout: on a loaded machine an evaluation can stall past a
// second, and these tests compare decisions, not timeouts.
func patient(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// TestMemoExact decides varied inputs with each module twice, with a
// Memo and without, and compares every decision whole: the memo must
// change no decision, and must answer from memory when it is on.
func TestMemoExact(t *testing.T) {
	const n = 3000
	for name, m := range memoModules {
		t.Run(name, func(t *testing.T) {
			ctx := patient(t)
			dir := t.TempDir()
			writeFile(t, dir, "m.rego", m.src)
			e := newEngine(t, Config{Rules: memoRules, Paths: []string{dir}, Egress: map[string][]string{"a1": {"h1"}}})
			memo := NewMemo(e, 0)
			r := rand.New(rand.NewPCG(1, uint64(len(name))))
			for i := range n {
				raw := memoInput(r)
				pi, err := InputFromJSON(raw)
				if err != nil {
					t.Fatalf("input %d %s: %v", i, raw, err)
				}
				want := e.DecideParsed(ctx, pi)
				if !strings.HasPrefix(m.deps, "off: ") && want.Rule == RulePolicyError {
					t.Fatalf("input %s: policy error %s", raw, want.Reason)
				}
				got := memo.DecideParsed(ctx, pi)
				if name == "randomness" {
					continue // two evaluations of rand.intn may differ; only the memo's being off is checked
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("input %d %s:\nmemo %+v\nwant %+v", i, raw, got, want)
				}
			}
			evals, hits := memo.Stats()
			off := strings.HasPrefix(m.deps, "off: ")
			switch {
			case evals+hits != n:
				t.Errorf("%d evaluations + %d answers from memory, want %d decisions", evals, hits, n)
			case off && hits != 0:
				t.Errorf("memo off, but %d answers from memory", hits)
			case !off && hits < n/2:
				t.Errorf("memo on, but only %d of %d answers from memory", hits, n)
			}
			t.Logf("%d evaluations, %d from memory", evals, hits)
		})
	}
}

// TestMemoReload: a reload empties the memo; the new policy decides.
func TestMemoReload(t *testing.T) {
	ctx := patient(t)
	dir := t.TempDir()
	p := writeFile(t, dir, "m.rego", `package sluice.policies.m
decisions contains {"action": "allow", "reason": "one", "rule": "m.one"} if input.args.body.amount
`)
	e := newEngine(t, Config{Paths: []string{dir}})
	memo := NewMemo(e, 0)
	pi, err := InputFromJSON(memoInput(rand.New(rand.NewPCG(7, 7))))
	if err != nil {
		t.Fatal(err)
	}
	first := memo.DecideParsed(ctx, pi)
	writeFile(t, dir, "m.rego", `package sluice.policies.m
decisions contains {"action": "block", "reason": "two", "rule": "m.two"} if true
`)
	_ = p
	if err := e.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if got := memo.DecideParsed(ctx, pi); got.Rule != "m.two" || got.Action != Block || got.Revision == first.Revision {
		t.Fatalf("after reload: %+v (before %+v)", got, first)
	}
}

// slowModule takes about as long as input.args.body.n says: a policy
// that is slow on purpose, to time out.
const slowModule = `package sluice.policies.slow
decisions contains {"action": "allow", "reason": "counted", "rule": "slow.count"} if {
	count([x | some x in numbers.range(1, input.args.body.n)]) > 0
}
`

func slowInput(t *testing.T, n int) *ParsedInput {
	t.Helper()
	raw, err := json.Marshal(&Input{Version: InputVersion, Kind: "tool_call", Tool: "t.slow", Connector: "t",
		Args: map[string]any{"body": map[string]any{"n": n}}, Time: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), Findings: []Finding{}})
	if err != nil {
		t.Fatal(err)
	}
	pi, err := InputFromJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	return pi
}

// TestMemoKeepsNoPolicyError: a decision the policy did not make (here
// an evaluation past its deadline) is not remembered: the same input
// is evaluated again and decided.
func TestMemoKeepsNoPolicyError(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "slow.rego", slowModule)
	e := newEngine(t, Config{Paths: []string{dir}})
	memo := NewMemo(e, 0)
	pi := slowInput(t, 50000)
	short, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if d := memo.DecideParsed(short, pi); d.Rule != RulePolicyError || d.Reason != "policy: evaluation timed out" {
		t.Fatalf("1 ms budget decided %+v, want a timeout", d)
	}
	long, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	if d := memo.DecideParsed(long, pi); d.Rule != "slow.count" || d.Action != Allow {
		t.Fatalf("after a timeout: memo decided %+v, want slow.count", d)
	}
	if evals, hits := memo.Stats(); evals != 2 || hits != 0 {
		t.Fatalf("%d evaluations, %d from memory; want 2, 0", evals, hits)
	}
}

// FuzzMemo: a sequence of inputs drawn from the fuzzer's bytes, decided
// with one Memo and without, with the module that reads the most paths
// and a module that reads a subtree by a variable key.
func FuzzMemo(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte("a memo must be exact"))
	var engines []*Engine
	for _, name := range []string{"paths", "dynamic key"} {
		dir := f.TempDir()
		writeFile(f, dir, "m.rego", memoModules[name].src)
		e, err := New(context.Background(), Config{Rules: memoRules, Paths: []string{dir}})
		if err != nil {
			f.Fatal(err)
		}
		engines = append(engines, e)
	}
	f.Fuzz(func(t *testing.T, seed []byte) {
		if len(seed) > 64 {
			return
		}
		ctx := patient(t)
		for _, e := range engines {
			memo := NewMemo(e, 0)
			for i := range seed {
				r := rand.New(rand.NewPCG(uint64(seed[i]), uint64(i%3))) // few distinct inputs: repeats
				pi, err := InputFromJSON(memoInput(r))
				if err != nil {
					t.Fatal(err)
				}
				if got, want := memo.DecideParsed(ctx, pi), e.DecideParsed(ctx, pi); !reflect.DeepEqual(got, want) {
					t.Fatalf("input %d: memo %+v, want %+v", i, got, want)
				}
			}
		}
	})
}

// TestMemoBound: a memo whose keys would pass its byte bound stops
// remembering and evaluates, still exactly.
func TestMemoBound(t *testing.T) {
	ctx := patient(t)
	dir := t.TempDir()
	writeFile(t, dir, "m.rego", memoModules["dynamic key"].src)
	e := newEngine(t, Config{Rules: memoRules, Paths: []string{dir}})
	memo := NewMemo(e, 300)
	r := rand.New(rand.NewPCG(5, 5))
	var ins []*ParsedInput
	for range 40 {
		pi, err := InputFromJSON(memoInput(r))
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, pi)
	}
	for round := range 2 {
		for i, pi := range ins {
			if got, want := memo.DecideParsed(ctx, pi), e.DecideParsed(ctx, pi); !reflect.DeepEqual(got, want) {
				t.Fatalf("round %d input %d: memo %+v, want %+v", round, i, got, want)
			}
		}
	}
	evals, hits := memo.Stats()
	if memo.size > 300 || hits == 0 || evals <= 40 {
		t.Fatalf("bound 300 bytes: %d held, %d evaluations, %d from memory; want some of each, at most 300 bytes", memo.size, evals, hits)
	}
}
