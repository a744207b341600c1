package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// fastRig is a door with one session initialized over raw HTTP, as the
// go-sdk client initializes it, whose pipeline hook answers every call
// with a document naming the tool and the arguments it got: a call the
// fast path and the SDK read differently gives a different result.
type fastRig struct {
	d       *Door
	srv     *httptest.Server
	sid     string
	version string

	mu  sync.Mutex
	got []call.Request
}

func newFastRig(t testing.TB) *fastRig {
	rig := &fastRig{}
	schema := json.RawMessage(`{"type":"object"}`)
	rig.d = New(Deps{
		Identify: func(*http.Request) (wire.Identity, bool) {
			return wire.Identity{Sandbox: "sb", Agent: "a", Session: "s", User: "u"}, true
		},
		Tools: func(context.Context, wire.Identity) ([]call.Tool, *refusal.Error) {
			return []call.Tool{
				{Name: "t.get", Alias: "t_get", Method: "GET", Schema: schema},
				{Name: "t.typed", Alias: "t_typed", Method: "POST", Schema: schema, OutputSchema: json.RawMessage(`{"type":"object"}`)},
				{Name: "t.strict", Method: "POST", Schema: json.RawMessage(`{"type":"object","required":["x"],"additionalProperties":false,"properties":{"x":{"type":"integer"}}}`)},
			}, nil
		},
		Call: func(_ context.Context, r call.Request) call.Outcome {
			rig.mu.Lock()
			rig.got = append(rig.got, r)
			rig.mu.Unlock()
			if r.Tool == "t.refuse" {
				e := refusal.New(http.StatusForbidden, refusal.PolicyBlock, "blocked by policy: no")
				return call.Outcome{RequestID: "r-no", Status: e.Status, Refusal: e}
			}
			body, _ := json.Marshal(map[string]any{"tool": r.Tool, "args": json.RawMessage(r.Args), "transport": r.Transport})
			return call.Outcome{RequestID: "r-1", Status: 200, Reply: &call.Reply{Status: 200, Body: json.RawMessage(body), Headers: map[string][]string{"X-A": {"<&>"}}}}
		},
		Poll: func(context.Context, wire.Identity, string, time.Duration) call.Outcome {
			e := refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold")
			return call.Outcome{Status: 404, Refusal: e}
		},
		Output: func(_ string, body []byte) bool { return json.Valid(body) && body[0] == '{' },
	})
	rig.srv = httptest.NewServer(rig.d)
	t.Cleanup(rig.srv.Close)
	st, h, msgs := rig.post(t, http.Header{"Accept": {"application/json, text/event-stream"}},
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientInfo":{"name":"t","version":"1"},"protocolVersion":"2025-11-25","capabilities":{}}}`)
	if st != 200 || len(msgs) != 1 || h.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %d %v %s", st, h, msgs)
	}
	rig.sid, rig.version = h.Get("Mcp-Session-Id"), "2025-11-25"
	if st, _, _ := rig.post(t, rig.headers(), `{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`); st != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d", st)
	}
	return rig
}

// headers are what the go-sdk client sends with a tools/call.
func (rig *fastRig) headers() http.Header {
	return http.Header{
		"Accept":               {"application/json, text/event-stream"},
		"Mcp-Session-Id":       {rig.sid},
		"Mcp-Protocol-Version": {rig.version},
	}
}

// post sends one message and returns the status, the headers and the
// JSON-RPC messages of the answer (an application/json body, or the data
// of each SSE event); a plain-text error gives none.
func (rig *fastRig) post(t testing.TB, h http.Header, body string) (int, http.Header, []json.RawMessage) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, rig.srv.URL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h.Clone()
	req.Header.Set("Content-Type", "application/json")
	resp, err := rig.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var msgs []json.RawMessage
	switch ct := resp.Header.Get("Content-Type"); {
	case strings.HasPrefix(ct, "application/json"):
		msgs = append(msgs, b)
	case strings.HasPrefix(ct, "text/event-stream"):
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				msgs = append(msgs, json.RawMessage(d))
			}
		}
	}
	return resp.StatusCode, resp.Header, msgs
}

// asSDK sends body with headers h and reports whether the fast path took
// it. When it did, it sends the same message again with the fast path off
// and fails t unless the SDK served it as the same call (the pipeline got
// the same request) with the same JSON-RPC answer.
func (rig *fastRig) asSDK(t testing.TB, h http.Header, body string) bool {
	t.Helper()
	before := rig.d.FastCalls()
	rig.mu.Lock()
	n := len(rig.got)
	rig.mu.Unlock()
	st, fh, fast := rig.post(t, h, body)
	if rig.d.FastCalls() == before {
		return false
	}
	rig.d.noFast = true
	sst, _, slow := rig.post(t, h, body)
	rig.d.noFast = false
	if st != 200 || fh.Get("Content-Type") != "application/json" || len(fast) != 1 {
		t.Fatalf("fast path took %s: answered %d %v %s", body, st, fh, fast)
	}
	if sst != 200 || len(slow) != 1 {
		t.Fatalf("fast path took %s, which the SDK answers %d %s (fast path: %s)", body, sst, slow, fast)
	}
	var a, b any
	if json.Unmarshal(fast[0], &a) != nil || json.Unmarshal(slow[0], &b) != nil || !reflect.DeepEqual(a, b) {
		t.Fatalf("%s:\nfast path: %s\nSDK:       %s", body, fast[0], slow[0])
	}
	if m, _ := a.(map[string]any); m["result"] == nil {
		t.Fatalf("fast path took %s and answered no result: %s", body, fast[0])
	}
	rig.mu.Lock()
	defer rig.mu.Unlock()
	if len(rig.got) != n+2 {
		t.Fatalf("%s: the pipeline got %d calls, want 1 from each path", body, len(rig.got)-n)
	}
	f, s := rig.got[n], rig.got[n+1]
	if f.Identity != s.Identity || f.Tool != s.Tool || f.Transport != s.Transport || !jsonEqual(f.Args, s.Args) {
		t.Fatalf("%s: the pipeline got\nfast path: %+v\nSDK:       %+v", body, f, s)
	}
	return true
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// TestFastPathAsSDK: the fast path takes the go-sdk client's canonical
// tools/call and answers it exactly as the SDK does; everything outside
// its narrow form goes to the SDK (the answer is then the SDK's own).
func TestFastPathAsSDK(t *testing.T) {
	rig := newFastRig(t)
	h := rig.headers()
	with := func(k, v string) http.Header {
		c := h.Clone()
		if v == "" {
			c.Del(k)
		} else {
			c.Set(k, v)
		}
		return c
	}
	callOf := func(params string) string {
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":` + params + `}`
	}
	for _, tc := range []struct {
		name  string
		h     http.Header
		body  string
		taken bool
	}{
		{"the go-sdk client's call", h, callOf(`{"name":"t.get","arguments":{"query":{"limit":5}}}`), true},
		{"by alias", h, callOf(`{"name":"t_get","arguments":{}}`), true},
		{"a tool with an outputSchema", h, callOf(`{"name":"t.typed","arguments":{"a":[1,2]}}`), true},
		{"no arguments", h, callOf(`{"name":"t.get"}`), true},
		{"string id", h, `{"jsonrpc":"2.0","id":"abc-1","method":"tools/call","params":{"name":"t.get","arguments":{}}}`, true},
		{"members in another order", h, `{"params":{"arguments":{},"name":"t.get"},"method":"tools/call","id":-3,"jsonrpc":"2.0"}`, true},
		{"arguments with HTML and unicode", h, callOf(`{"name":"t.get","arguments":{"q":"<a&b> \u00e9 é"}}`), true},
		{"arguments its inputSchema refuses (the SDK does not check them: the pipeline does)", h, callOf(`{"name":"t.strict","arguments":{"y":"z"}}`), true},
		{"whitespace", h, "\n { \"jsonrpc\" : \"2.0\" , \"id\" : 8 , \"method\" : \"tools/call\" , \"params\" : { \"name\" : \"t.get\" } } \n", true},

		{"a progress token (needs the SDK's stream)", h, callOf(`{"name":"t.get","arguments":{},"_meta":{"progressToken":"p"}}`), false},
		{"sluice.await_hold", h, callOf(`{"name":"sluice.await_hold","arguments":{"hold_id":"h"}}`), false},
		{"a tool not listed", h, callOf(`{"name":"t.refuse","arguments":{}}`), false},
		{"an escaped name", h, callOf(`{"name":"t\u002eget","arguments":{}}`), false},
		{"arguments not an object", h, callOf(`{"name":"t.get","arguments":[1]}`), false},
		{"arguments null", h, callOf(`{"name":"t.get","arguments":null}`), false},
		{"an unknown params member", h, callOf(`{"name":"t.get","arguments":{},"x":1}`), false},
		{"params member twice", h, callOf(`{"name":"t.get","name":"t.typed"}`), false},
		{"Name capitalised", h, callOf(`{"Name":"t.get"}`), false},
		{"fractional id", h, `{"jsonrpc":"2.0","id":7.0,"method":"tools/call","params":{"name":"t.get"}}`, false},
		{"id past 2^53", h, `{"jsonrpc":"2.0","id":9007199254740993,"method":"tools/call","params":{"name":"t.get"}}`, false},
		{"escaped string id", h, `{"jsonrpc":"2.0","id":"a\u0041","method":"tools/call","params":{"name":"t.get"}}`, false},
		{"no id (a notification)", h, `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"t.get"}}`, false},
		{"no protocol version header", with("Mcp-Protocol-Version", ""), callOf(`{"name":"t.get"}`), false},
		{"another supported version", with("Mcp-Protocol-Version", "2025-06-18"), callOf(`{"name":"t.get"}`), false},
		{"the sessionless version", with("Mcp-Protocol-Version", "2026-07-28"), callOf(`{"name":"t.get"}`), false},
		{"an Mcp-Method header", with("Mcp-Method", "tools/call"), callOf(`{"name":"t.get"}`), false},
		{"Last-Event-ID", with("Last-Event-ID", "x_1"), callOf(`{"name":"t.get"}`), false},
		{"Accept without SSE", with("Accept", "application/json"), callOf(`{"name":"t.get"}`), false},
		{"Accept */*", with("Accept", "*/*"), callOf(`{"name":"t.get"}`), false},
		{"tools/list", h, `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}`, false},
		{"ping", h, `{"jsonrpc":"2.0","id":9,"method":"ping"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rig.asSDK(t, tc.h, tc.body); got != tc.taken {
				t.Errorf("fast path took it: %v, want %v", got, tc.taken)
			}
		})
	}
}

// TestFastPathSessionEnds: a DELETE ends the fast path's session before
// the SDK's, so a call after it is the SDK's to refuse (404), not run.
func TestFastPathSessionEnds(t *testing.T) {
	rig := newFastRig(t)
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t.get"}}`
	if !rig.asSDK(t, rig.headers(), body) {
		t.Fatal("the fast path did not take a canonical call")
	}
	req, _ := http.NewRequest(http.MethodDelete, rig.srv.URL, nil)
	req.Header = rig.headers()
	resp, err := rig.srv.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %v %v", err, resp)
	}
	resp.Body.Close()
	rig.mu.Lock()
	n := len(rig.got)
	rig.mu.Unlock()
	before := rig.d.FastCalls()
	st, _, _ := rig.post(t, rig.headers(), body)
	if st != http.StatusNotFound || rig.d.FastCalls() != before {
		t.Errorf("a call on the ended session: %d, fast calls %d → %d; want the SDK's 404", st, before, rig.d.FastCalls())
	}
	rig.mu.Lock()
	defer rig.mu.Unlock()
	if len(rig.got) != n {
		t.Errorf("the pipeline ran a call on an ended session")
	}
}

// TestFastPathDuplicateInFlight: a second call with the id of one in
// flight is refused as the SDK refuses it, and not run.
func TestFastPathDuplicateInFlight(t *testing.T) {
	rig := newFastRig(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	inner := rig.d.deps.Call
	rig.d.deps.Call = func(ctx context.Context, r call.Request) call.Outcome {
		entered <- struct{}{}
		<-release
		return inner(ctx, r)
	}
	body := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t.get"}}`
	done := make(chan int)
	go func() {
		st, _, _ := rig.post(t, rig.headers(), body)
		done <- st
	}()
	<-entered
	st, _, msgs := rig.post(t, rig.headers(), body)
	close(release)
	if st != http.StatusBadRequest || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"code":-32600`) || !strings.Contains(string(msgs[0]), `"id":5`) {
		t.Errorf("duplicate in flight: %d %s", st, msgs)
	}
	if st := <-done; st != 200 {
		t.Errorf("the first call: %d", st)
	}
	if rig.d.FastCalls() != 1 {
		t.Errorf("fast calls %d, want 1", rig.d.FastCalls())
	}
}

// TestFastPathGoClient: the go-sdk client's calls take the fast path and
// read its application/json answers, a refusal included; a call with a
// progress token still goes to the SDK.
func TestFastPathGoClient(t *testing.T) {
	rig := newFastRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: rig.srv.URL, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "t.get", Arguments: map[string]any{"q": 1}})
	if err != nil || r.IsError || !strings.Contains(r.Content[0].(*sdk.TextContent).Text, `"args":{"q":1}`) {
		t.Fatalf("call: %v %+v", err, r)
	}
	r, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "t.typed", Arguments: map[string]any{}})
	if err != nil || r.IsError || r.StructuredContent == nil {
		t.Fatalf("typed call: %v %+v", err, r)
	}
	if rig.d.FastCalls() != 2 {
		t.Fatalf("fast calls %d, want 2", rig.d.FastCalls())
	}
	p := &sdk.CallToolParams{Name: "t.get", Arguments: map[string]any{}}
	p.SetProgressToken("tok")
	if r, err := cs.CallTool(ctx, p); err != nil || r.IsError {
		t.Fatalf("call with a progress token: %v %+v", err, r)
	}
	if rig.d.FastCalls() != 2 {
		t.Errorf("a call with a progress token took the fast path")
	}
}

// FuzzFastPathAsSDK: for any message and headers, whatever the fast path
// takes the SDK serves as the same call with the same answer.
func FuzzFastPathAsSDK(f *testing.F) {
	for _, s := range []struct{ body, version, accept, extra string }{
		{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t.get","arguments":{"body":{"a":1}}}}`, "2025-11-25", "application/json, text/event-stream", ""}, // the go-sdk client's call
		{`{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"t_typed"}}`, "2025-11-25", "text/event-stream;q=1, application/json", ""},                      // alias, string id
		{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t.get","_meta":{"progressToken":1}}}`, "2025-11-25", "application/json, text/event-stream", ""},  // progress: the SDK's
		{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t.get"}}`, "2025-11-25", "application/json, text/event-stream", "Mcp-Name: t.get"},               // standard headers: the SDK's
		{`{"jsonrpc":"2.0","id":1e0,"method":"tools/call","params":{"name":"t.get"}}`, "2025-06-18", "*/*", ""},                                                            // the SDK reads 1e0 as 1
	} {
		f.Add(s.body, s.version, s.accept, s.extra)
	}
	rig := newFastRig(f)
	f.Fuzz(func(t *testing.T, body, version, accept, extra string) {
		h := http.Header{}
		for _, kv := range [][2]string{{"Accept", accept}, {"Mcp-Protocol-Version", version}} {
			if kv[1] != "" {
				h.Set(kv[0], kv[1])
			}
		}
		if k, v, ok := strings.Cut(extra, ":"); ok {
			h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		}
		h.Set("Mcp-Session-Id", rig.sid)
		for k, vs := range h {
			for _, v := range vs {
				if !validHeader(k, v) {
					return // not a request an HTTP client can send
				}
			}
		}
		rig.asSDK(t, h, body)
	})
}

func validHeader(k, v string) bool {
	if k == "" {
		return false
	}
	for _, c := range k {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	for _, c := range v {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// FuzzAppendString: the fast path writes a string byte for byte as
// encoding/json does.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", `{"a":"b\\c"}`, "<&>\n\r\t\x00\x1f\x7f", "é\u2028\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var buf bytes.Buffer
		if err := appendString(&buf, s); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(s)
		if !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("appendString(%q) = %s, encoding/json %s", s, buf.Bytes(), want)
		}
	})
}

// blocker holds rig's pipeline calls: each reports on entered, then waits
// until the gate it found open is released or its context ends (reported
// on ctxEnded). It counts the calls it got.
type blocker struct {
	entered  chan struct{}
	ctxEnded chan error
	calls    atomic.Int64
	mu       sync.Mutex
	gate     chan struct{}
}

func (rig *fastRig) block() *blocker {
	b := &blocker{entered: make(chan struct{}, 64), ctxEnded: make(chan error, 64), gate: make(chan struct{})}
	inner := rig.d.deps.Call
	rig.d.deps.Call = func(ctx context.Context, r call.Request) call.Outcome {
		b.calls.Add(1)
		b.mu.Lock()
		gate := b.gate
		b.mu.Unlock()
		b.entered <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			b.ctxEnded <- ctx.Err()
		}
		return inner(ctx, r)
	}
	return b
}

// hold makes the calls that enter from now on wait for release.
func (b *blocker) hold() (release func()) {
	g := make(chan struct{})
	b.mu.Lock()
	b.gate = g
	b.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(g) }) }
}

// The same call in the form the fast path takes and in one it leaves to
// the SDK (a progress token needs the SDK's stream).
const (
	fastForm = `{"jsonrpc":"2.0","id":ID,"method":"tools/call","params":{"name":"t.get","arguments":{}}}`
	sdkForm  = `{"jsonrpc":"2.0","id":ID,"method":"tools/call","params":{"name":"t.get","arguments":{},"_meta":{"progressToken":"p"}}}`
)

// TestDuplicateIDAcrossPaths: a call whose id is in flight on the other
// path (the SDK's or the fast path's) of the same session is refused as
// the SDK refuses a duplicate among its own calls (400, -32600, the id),
// and never run: exactly one call reaches the pipeline. The paths are
// raced at the same instant as well as taken in turn.
func TestDuplicateIDAcrossPaths(t *testing.T) {
	rig := newFastRig(t)
	b := rig.block()
	for _, tc := range []struct{ name, first, second, id string }{
		{"SDK call in flight, fast duplicate", sdkForm, fastForm, `11`},
		{"fast call in flight, SDK duplicate", fastForm, sdkForm, `12`},
		{"string ids, SDK first", sdkForm, fastForm, `"dup-a"`},
		{"string ids, fast first", fastForm, sdkForm, `"dup-b"`},
		{"an escaped string id to the SDK, its plain form in flight on the fast path", fastForm, strings.Replace(sdkForm, "ID", `"dup\u002dc"`, 1), `"dup-c"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := b.calls.Load()
			release := b.hold()
			defer time.AfterFunc(5*time.Second, release).Stop() // both ran: fail, not hang
			done := make(chan int, 1)
			go func() {
				st, _, _ := rig.post(t, rig.headers(), strings.Replace(tc.first, "ID", tc.id, 1))
				done <- st
			}()
			<-b.entered
			st, _, msgs := rig.post(t, rig.headers(), strings.Replace(tc.second, "ID", tc.id, 1))
			release()
			if st != http.StatusBadRequest || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"code":-32600`) || !strings.Contains(string(msgs[0]), "duplicate in-flight request ID") {
				t.Errorf("the duplicate: %d %s; want 400 with JSON-RPC error -32600", st, msgs)
			}
			var m struct{ ID json.RawMessage }
			if len(msgs) == 1 && (json.Unmarshal(msgs[0], &m) != nil || !jsonEqual(m.ID, []byte(tc.id))) {
				t.Errorf("the duplicate's answer names id %s, want %s", m.ID, tc.id)
			}
			if st := <-done; st != http.StatusOK {
				t.Errorf("the first call: %d", st)
			}
			if n := b.calls.Load() - before; n != 1 {
				t.Errorf("the pipeline got %d calls, want 1", n)
			}
		})
	}
	t.Run("raced at the same instant", func(t *testing.T) {
		// Each round sends both forms with one id at once; a call is held
		// until one of the two answers came back, which is the refused
		// one unless both ran (then both wait 2s and the count shows it).
		for round := range 30 {
			before := b.calls.Load()
			release := b.hold()
			id := strconv.Itoa(1000 + round)
			start := make(chan struct{})
			sts := make(chan int, 2)
			for _, form := range []string{fastForm, sdkForm} {
				go func() {
					<-start
					st, _, _ := rig.post(t, rig.headers(), strings.Replace(form, "ID", id, 1))
					release()
					sts <- st
				}()
			}
			close(start)
			timer := time.AfterFunc(2*time.Second, release)
			x, y := <-sts, <-sts
			timer.Stop()
			for len(b.entered) > 0 {
				<-b.entered
			}
			if n := b.calls.Load() - before; n != 1 || x+y != http.StatusOK+http.StatusBadRequest {
				t.Fatalf("round %d: statuses %d %d, %d calls reached the pipeline; want one run, one 400", round, x, y, n)
			}
		}
	})
}

// TestDeleteWaitsForCalls: a DELETE of a session answers 204 only once
// the calls in flight on it have ended, without cancelling them, and the
// calls' requests then carry no result (an empty event stream) — what the
// SDK does for its own calls, and so the fast path for its calls. A call
// sent while the DELETE waits is not run.
func TestDeleteWaitsForCalls(t *testing.T) {
	for _, tc := range []struct{ name, form string }{{"SDK", sdkForm}, {"fast path", fastForm}} {
		t.Run(tc.name, func(t *testing.T) {
			rig := newFastRig(t)
			b := rig.block()
			release := b.hold()
			defer time.AfterFunc(10*time.Second, release).Stop()
			type answer struct {
				st   int
				h    http.Header
				msgs []json.RawMessage
			}
			callDone := make(chan answer, 1)
			go func() {
				st, h, msgs := rig.post(t, rig.headers(), strings.Replace(tc.form, "ID", "21", 1))
				callDone <- answer{st, h, msgs}
			}()
			<-b.entered
			delDone := make(chan int, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodDelete, rig.srv.URL, nil)
				req.Header = rig.headers()
				resp, err := rig.srv.Client().Do(req)
				if err != nil {
					delDone <- -1
					return
				}
				resp.Body.Close()
				delDone <- resp.StatusCode
			}()
			select {
			case st := <-delDone:
				t.Fatalf("DELETE answered %d while a call was in flight", st)
			case err := <-b.ctxEnded:
				t.Fatalf("the call in flight was cancelled by the DELETE: %v", err)
			case <-time.After(300 * time.Millisecond):
			}
			if tc.form == fastForm {
				// While the DELETE waits, the fast path takes no call (the
				// SDK's closing session refuses it); the SDK form is not
				// sent here: a POST on a closing SDK session cancels the
				// SDK's calls in flight (its write fails), its own quirk.
				before, calls := rig.d.FastCalls(), b.calls.Load()
				rig.post(t, rig.headers(), strings.Replace(fastForm, "ID", "22", 1))
				if rig.d.FastCalls() != before || b.calls.Load() != calls {
					t.Errorf("a call sent while the DELETE waited was run")
				}
			}
			release()
			if st := <-delDone; st != http.StatusNoContent {
				t.Errorf("DELETE: %d, want 204", st)
			}
			a := <-callDone
			if a.st != http.StatusOK || !strings.HasPrefix(a.h.Get("Content-Type"), "text/event-stream") || len(a.msgs) != 0 {
				t.Errorf("the call in flight at the DELETE: %d %s %s; want 200 and an empty event stream", a.st, a.h.Get("Content-Type"), a.msgs)
			}
			if n := b.calls.Load(); n != 1 {
				t.Errorf("the pipeline got %d calls, want 1", n)
			}
		})
	}
}

// FuzzEachMember: for any input json.Valid accepts, eachMember walks a
// top-level object exactly as encoding/json's decoder reads it — the same
// names (those written in plain ASCII without escapes: no other name is
// one the fast path knows) and the same values, in order —
// and refuses anything that is not an object.
func FuzzEachMember(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { "a" : 1 , "b":[1,{"c":"}"}],"d":"x\"y\\","e":{"f":[]} } `, `[1]`, `"s"`, `{"a":{"b":{"c":[[["]"]]]}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t.get","arguments":{"q":"<a&b> é"}}}`, `{"a":true,"b":null,"c":-1.5e3}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := []byte(s)
		if !json.Valid(b) {
			return
		}
		type member struct{ k, v string }
		var got []member
		ok := eachMember(b, func(k, v []byte) bool {
			got = append(got, member{string(k), string(v)})
			return true
		})
		d := json.NewDecoder(bytes.NewReader(b))
		tok, _ := d.Token()
		if tok != json.Delim('{') {
			if ok {
				t.Fatalf("eachMember walked %q, which is not an object", s)
			}
			return
		}
		if !ok {
			t.Fatalf("eachMember refused the object %q", s)
		}
		var want []member
		for d.More() {
			k, _ := d.Token()
			var v json.RawMessage
			if err := d.Decode(&v); err != nil {
				t.Fatal(err)
			}
			want = append(want, member{k.(string), string(v)})
		}
		if len(got) != len(want) {
			t.Fatalf("%q: eachMember %q, decoder %q", s, got, want)
		}
		for i := range got {
			_, plain := plainString(json.RawMessage(`"`+got[i].k+`"`), len(got[i].k))
			if (plain && got[i].k != want[i].k) || got[i].v != want[i].v {
				t.Fatalf("%q: member %d: eachMember %q, decoder %q", s, i, got[i], want[i])
			}
		}
	})
}
