package policy

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// liveEnvoyPolicy is an opa-envoy-plugin policy run by the adapter
// (gateway/extauthz/testdata/opa-envoy/adapter.rego's shape), and a
// module of sluice's own that reads the caller.
var liveEnvoyPolicy = map[string]string{
	"envoy.rego": `package envoy.authz

import input.attributes.request.http as http_request

default allow := false

allow if {
	http_request.method == "POST"
	input.parsed_path == ["echo"]
	input.parsed_body.name != "forbidden"
	http_request.headers["x-team"] == "blue"
}
`,
	"adapter.rego": `package sluice.policies.envoy

import data.envoy.authz

allowed if authz.allow with input as input.envoy

decisions contains {"action": "allow", "rule": "envoy.authz", "reason": "allowed by envoy.authz"} if {
	input.envoy
	allowed
}

decisions contains {"action": "block", "rule": "envoy.authz", "reason": "denied by envoy.authz"} if {
	input.envoy
	not allowed
}
`,
	"caller.rego": `package sluice.policies.caller

decisions contains {"action": "block", "rule": "caller.mallory", "reason": "not mallory"} if input.caller.user == "mallory"
`,
}

// liveInput is a tool call from Envoy whose input.envoy is edit's
// change of a Check's opa-envoy-plugin document.
func liveInput(t *testing.T, edit func(in *Input, env map[string]any)) *Input {
	t.Helper()
	http := map[string]any{"id": "1234", "method": "POST", "path": "/echo", "host": "api.test",
		"headers": map[string]any{"x-team": "blue", "x-request-id": "3f8e", ":method": "POST"}}
	env := map[string]any{
		"attributes":   map[string]any{"request": map[string]any{"http": http}, "contextExtensions": map[string]any{"agent": "a1"}},
		"parsed_path":  []any{"echo"},
		"parsed_query": map[string]any{},
		"parsed_body":  map[string]any{"name": "widget"},
		"version":      map[string]any{"ext_authz": "v3", "encoding": "protojson"},
	}
	in := &Input{Version: InputVersion, Kind: "tool_call", Tool: "bench.create_item", Connector: "bench",
		Caller:  Caller{Sandbox: "sb", Agent: "a1", Session: "s1", User: "alice"},
		Request: Request{Method: "POST", Host: "api.test", Path: "/echo", Headers: map[string][]string{"X-Request-Id": {"3f8e"}}},
		Time:    time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC),
	}
	if edit != nil {
		edit(in, env)
	}
	raw, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	in.Envoy = raw
	return in
}

func httpOf(env map[string]any) map[string]any {
	return env["attributes"].(map[string]any)["request"].(map[string]any)["http"].(map[string]any)
}

// TestLiveMemoFresh (THREATS F23): Decide answers from its memo only an
// input equal in everything the policy reads. Each field the policy
// reads, changed alone, is decided afresh (and decides otherwise, so an
// answer from memory would be caught); fields it does not read change
// nothing and are answered from memory; every decision equals an
// evaluation without the memo.
func TestLiveMemoFresh(t *testing.T) {
	ctx := patient(t)
	dir := t.TempDir()
	for name, src := range liveEnvoyPolicy {
		writeFile(t, dir, name, src)
	}
	rules := []Rule{{Match: "bench.deny_*", Action: "block"}, {Match: "*", Action: "allow"}}
	e := newEngine(t, Config{Rules: rules, Paths: []string{dir}})
	fresh := newEngine(t, Config{Rules: rules, Paths: []string{dir}, NoMemo: true})
	live := e.cur.Load().live
	if got, want := e.cur.Load().deps().String(), "attributes.request.http.headers.x-team attributes.request.http.method caller.agent caller.user envoy? envoy.attributes.request.http.headers.x-team envoy.attributes.request.http.method envoy.caller.agent envoy.caller.user envoy.envoy? envoy.kind envoy.parsed_body.name envoy.parsed_path envoy.request.host envoy.request.port envoy.tool kind parsed_body.name parsed_path request.host request.port tool"; got != want {
		t.Fatalf("inputPaths:\n got %s\nwant %s", got, want)
	}
	decide := func(in *Input) Decision {
		t.Helper()
		want := fresh.Decide(ctx, in)
		got := e.Decide(ctx, in)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("memo decided %+v, an evaluation %+v", got, want)
		}
		return got
	}
	base := decide(liveInput(t, nil))
	if base.Action != Allow || base.Rule != "envoy.authz" {
		t.Fatalf("base: %+v, want allow by envoy.authz", base)
	}
	read := map[string]func(in *Input, env map[string]any){
		"envoy method":       func(_ *Input, env map[string]any) { httpOf(env)["method"] = "GET" },
		"envoy parsed_path":  func(_ *Input, env map[string]any) { env["parsed_path"] = []any{"echo", "x"} },
		"envoy parsed_body":  func(_ *Input, env map[string]any) { env["parsed_body"] = map[string]any{"name": "forbidden"} },
		"envoy header read":  func(_ *Input, env map[string]any) { httpOf(env)["headers"].(map[string]any)["x-team"] = "red" },
		"envoy absent":       func(in *Input, env map[string]any) { clear(env) },
		"caller.user":        func(in *Input, _ map[string]any) { in.Caller.User = "mallory" },
		"tool (Go's rules)":  func(in *Input, _ map[string]any) { in.Tool = "bench.deny_all" },
		"envoy parsed_body…": func(_ *Input, env map[string]any) { env["parsed_body"] = nil },
	}
	for name, edit := range read {
		evals := live.evals.Load()
		d := decide(liveInput(t, edit))
		if live.evals.Load() != evals+1 {
			t.Errorf("%s changed: not evaluated afresh", name)
		}
		if reflect.DeepEqual(d, base) {
			t.Errorf("%s changed: decided as before (%+v); the case proves nothing", name, d)
		}
	}
	unread := map[string]func(in *Input, env map[string]any){
		"envoy request id":    func(_ *Input, env map[string]any) { httpOf(env)["id"] = "5678" },
		"envoy x-request-id":  func(_ *Input, env map[string]any) { httpOf(env)["headers"].(map[string]any)["x-request-id"] = "9a9a" },
		"envoy parsed_query":  func(_ *Input, env map[string]any) { env["parsed_query"] = map[string]any{"q": []any{"1"}} },
		"envoy body's others": func(_ *Input, env map[string]any) { env["parsed_body"].(map[string]any)["size"] = 3 },
		"caller.session":      func(in *Input, _ map[string]any) { in.Caller.Session = "s2" },
		"time":                func(in *Input, _ map[string]any) { in.Time = in.Time.Add(time.Hour) },
		"request headers":     func(in *Input, _ map[string]any) { in.Request.Headers = map[string][]string{"X-Request-Id": {"b0b0"}} },
	}
	for name, edit := range unread {
		hits := live.hits.Load()
		if d := decide(liveInput(t, edit)); !reflect.DeepEqual(d, base) {
			t.Errorf("%s changed: decided %+v, want %+v", name, d, base)
		}
		if live.hits.Load() != hits+1 {
			t.Errorf("%s changed (not read by the policy): evaluated, want an answer from memory", name)
		}
	}

	// A reload starts a new memo: the same input is decided by the new policy.
	writeFile(t, dir, "caller.rego", `package sluice.policies.caller

decisions contains {"action": "block", "rule": "caller.alice", "reason": "not alice"} if input.caller.user == "alice"
`)
	if err := e.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if d := e.Decide(ctx, liveInput(t, nil)); d.Rule != "caller.alice" || d.Action != Block {
		t.Fatalf("after a reload: %+v, want the new policy's block", d)
	}
}

// TestLiveMemoOff (THREATS F23): a policy that may read more than its
// projection (here the clock) is evaluated for every decision.
func TestLiveMemoOff(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeFile(t, dir, "m.rego", `package sluice.policies.m
decisions contains {"action": "block", "reason": "odd", "rule": "m.odd"} if time.now_ns() % 2 == 1
decisions contains {"action": "allow", "reason": "even", "rule": "m.even"} if time.now_ns() % 2 == 0
`)
	e := newEngine(t, Config{Paths: []string{dir}})
	for range 20 {
		if d := e.Decide(ctx, liveInput(t, nil)); d.Rule == RulePolicyError {
			t.Fatalf("%+v", d)
		}
	}
	live := e.cur.Load().live
	if h, ev := live.hits.Load(), live.evals.Load(); h != 0 || ev != 0 || !strings.Contains(e.cur.Load().deps().off, "time.now_ns") {
		t.Fatalf("memo off (%q): %d hits, %d memo evaluations; want none", e.cur.Load().deps().off, h, ev)
	}
}

// TestLiveKeyProjection: the live memo's key, built from input.envoy
// parsed only where the policy reads it (project), is the key of the
// whole value, whatever shape the document has where the policy looks.
func TestLiveKeyProjection(t *testing.T) {
	dir := t.TempDir()
	for name, src := range liveEnvoyPolicy {
		writeFile(t, dir, name, src)
	}
	e := newEngine(t, Config{Paths: []string{dir}})
	deps := e.cur.Load().deps()
	docs := []string{
		`null`, `{}`, `{"parsed_path":["echo"]}`,
		`{"attributes":{"request":{"http":{"method":"POST","headers":{"x-team":"blue","x-request-id":"1"},"id":"7"}}},"parsed_path":["echo"],"parsed_body":{"name":"w","size":3}}`,
		`{"attributes":{"request":{"http":"POST"}},"parsed_path":"echo","parsed_body":[{"name":"w"}]}`,
		`{"attributes":null,"parsed_body":{"name":{"first":"w"}},"parsed_path":[]}`,
		`{"parsed_body":{"name":"a"},"parsed_body":{"name":"b"}}`, // a repeated key: the last
		`{"attributes":{"request":{"http":{"headers":{"x-team":"a","x-team":"b"}}}}}`,
		`{"envoy":{"kind":"x"},"kind":"tool_call","parsed_body":{"name":"\u00e9\ud83d\ude00"}}`,
		`{"parsed_body":{"name":1.50e1},"attributes":{"request":{"http":{"method":true}}}}`,
		` { "parsed_path" : [ "echo" , "x" ] , "other" : { "deep" : [1, {"a": null}] } } `,
	}
	for _, doc := range docs {
		in := liveInput(t, nil)
		in.Envoy = []byte(doc)
		full, err := inputValue(in)
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		items, err := inputItems(in)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := liveKey(nil, deps, in, items)
		if !ok {
			t.Fatalf("%s: no key", doc)
		}
		if want := deps.key(nil, full); string(got) != string(want) {
			t.Errorf("%s:\nprojected key %q\nwhole key     %q", doc, got, want)
		}
	}
	for _, bad := range []string{`[1]`, `"x"`, `{"parsed_path":[}`, `{"a":1} x`, `{"other":"\x01"}`} {
		in := liveInput(t, nil)
		in.Envoy = []byte(bad)
		items, _ := inputItems(in)
		if _, ok := liveKey(nil, deps, in, items); ok {
			t.Errorf("%s: keyed; want the whole value's error to decide", bad)
		}
		if d := e.Decide(context.Background(), in); d.Rule != RulePolicyError {
			t.Errorf("%s: decided %+v, want a policy_error", bad, d)
		}
	}
}
