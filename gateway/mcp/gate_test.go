package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestCheck is the gate's message check: one JSON-RPC 2.0 object of an
// allowed method (or a response), everything else a JSON-RPC error
// naming what was wrong (JSON-RPC 2.0 section 5.1 codes).
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		code       int
		says       string
	}{
		{"tools/call", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a.b"}}`, 0, ""},
		{"string id", `{"jsonrpc":"2.0","id":"x","method":"ping"}`, 0, ""},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, 0, ""},
		{"response to a server ping", `{"jsonrpc":"2.0","id":3,"result":{}}`, 0, ""},
		{"truncated JSON", `{"jsonrpc":"2.0","id":1,"method":`, codeParseError, "not valid JSON"},
		{"trailing garbage", `{"jsonrpc":"2.0","id":1,"method":"ping"} x`, codeParseError, "not valid JSON"},
		{"batch (MCP 2025-06-18 removed batching)", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, codeInvalidRequest, "batches"},
		{"a string", `"ping"`, codeInvalidRequest, "JSON-RPC 2.0 object"},
		{"null", `null`, codeInvalidRequest, "JSON-RPC 2.0 object"},
		{"version 1.0", `{"jsonrpc":"1.0","id":1,"method":"ping"}`, codeInvalidRequest, `jsonrpc: must be "2.0"`},
		{"no version", `{"id":1,"method":"ping"}`, codeInvalidRequest, `jsonrpc: must be "2.0"`},
		{"object id", `{"jsonrpc":"2.0","id":{},"method":"ping"}`, codeInvalidRequest, "id: must be"},
		{"fractional id", `{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, codeInvalidRequest, "id: must be"},
		{"resources/list (not offered)", `{"jsonrpc":"2.0","id":1,"method":"resources/list"}`, codeMethodNotFound, `"resources/list" is not offered`},
		{"sampling from the client", `{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage"}`, codeMethodNotFound, "not offered"},
		{"response with both result and error", `{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}`, codeInvalidRequest, "one of result or error"},
		{"response without an id", `{"jsonrpc":"2.0","result":{}}`, codeInvalidRequest, "one of result or error"},
		{"duplicate method (the decoders keep the last)", `{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"resources/read"}`, codeInvalidRequest, `"method": given twice`},
		{"Method spelt with a capital (the decoders fold case)", `{"jsonrpc":"2.0","id":1,"Method":"resources/read"}`, codeInvalidRequest, `member "Method"`},
		{"an extra member", `{"jsonrpc":"2.0","id":1,"method":"ping","x":1}`, codeInvalidRequest, `member "x"`},
		{"method of the wrong type", `{"jsonrpc":"2.0","id":1,"method":7}`, codeInvalidRequest, "not a JSON-RPC 2.0 message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, code, msg := check([]byte(tc.body))
			if code != tc.code || !strings.Contains(msg, tc.says) {
				t.Errorf("check(%s) = %d %q; want %d naming %q", tc.body, code, msg, tc.code, tc.says)
			}
		})
	}
}

// FuzzCheck: check never panics, and what it lets through is one JSON-RPC
// 2.0 object whose method, if any, is on the allow-list.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`,               // allowed
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`,                               // batch
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"resources/read"}`, // duplicate key: Go keeps the last
		`{"jsonrpc":"2.0","id":1,"Method":"resources/read"}`,                       // case-insensitive field match
		`{"jsonrpc":"2.0","id":2,"result":{}}`,                                     // a response
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _, code, _ := check(b)
		if code != 0 {
			return
		}
		var e envelope
		if err := json.Unmarshal(bytes.TrimSpace(b), &e); err != nil || e.JSONRPC != "2.0" {
			t.Fatalf("let through %q", b)
		}
		if e.Method != nil && !methods[*e.Method] {
			t.Fatalf("let through method %q", *e.Method)
		}
		m, msg := members(bytes.TrimSpace(b))
		if msg != "" {
			t.Fatalf("let through members of %q", b)
		}
		// The one-pass envelope is what encoding/json decodes.
		if m.JSONRPC != e.JSONRPC || (m.Method == nil) != (e.Method == nil) || (m.Method != nil && *m.Method != *e.Method) ||
			!bytes.Equal(m.ID, e.ID) || (m.Result == nil) != (e.Result == nil) || (m.Error == nil) != (e.Error == nil) {
			t.Fatalf("envelope of %q: one pass %+v, encoding/json %+v", b, m, e)
		}
	})
}

// TestGateBeforeSDK: the gate answers before anything of the SDK or the
// pipeline runs — no identity, an oversized message, a foreign session id.
func TestGateBeforeSDK(t *testing.T) {
	calls := 0
	id := wire.Identity{Sandbox: "sb-1", Agent: "a", Session: "s", User: "u"}
	d := New(Deps{
		Identify: func(r *http.Request) (wire.Identity, bool) {
			if r.Header.Get("X-Test-Id") == "" {
				return wire.Identity{}, false
			}
			i := id
			i.Sandbox = r.Header.Get("X-Test-Id")
			return i, true
		},
		Tools: func(context.Context, wire.Identity) ([]call.Tool, *refusal.Error) { return nil, nil },
		Call: func(context.Context, call.Request) call.Outcome {
			calls++
			return call.Outcome{}
		},
		Poll:            func(context.Context, wire.Identity, string, time.Duration) call.Outcome { return call.Outcome{} },
		MaxMessageBytes: 1024,
	})
	d.owners["sid-of-sb-1"] = id
	post := func(sandbox, sid, body string) (int, map[string]any) {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		if sandbox != "" {
			r.Header.Set("X-Test-Id", sandbox)
		}
		if sid != "" {
			r.Header.Set("Mcp-Session-Id", sid)
		}
		w := httptest.NewRecorder()
		d.ServeHTTP(w, r)
		var m map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &m)
		return w.Code, m
	}
	callMsg := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a.b","arguments":{}}}`
	for _, tc := range []struct {
		name, sandbox, sid, body string
		status                   int
		code                     float64
	}{
		{"no identity", "", "", callMsg, http.StatusForbidden, codeForbidden},
		{"another sandbox's session", "sb-2", "sid-of-sb-1", callMsg, http.StatusNotFound, codeSession},
		{"unknown session", "sb-1", "nope", callMsg, http.StatusNotFound, codeSession},
		{"oversized", "sb-1", "sid-of-sb-1", `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"` + strings.Repeat("a", 2000) + `"}}`, http.StatusRequestEntityTooLarge, codeInvalidRequest},
	} {
		st, m := post(tc.sandbox, tc.sid, tc.body)
		e, _ := m["error"].(map[string]any)
		if st != tc.status || e["code"] != tc.code || m["jsonrpc"] != "2.0" {
			t.Errorf("%s: %d %v; want %d with JSON-RPC error %v", tc.name, st, m, tc.status, tc.code)
		}
	}
	if calls != 0 {
		t.Errorf("the pipeline ran %d calls for refused messages", calls)
	}
}
