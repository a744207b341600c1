package mcp

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

const clientShareDoc = `{"body":{"id":"it-1","name":"widget","amount":250,"currency":"EUR","note":"bench","tags":["a","b","c"],"lines":[{"sku":"w-1","qty":2},{"sku":"w-2","qty":1}]},"headers":{"Content-Type":["application/json"]},"request_id":"01J000000000000000000000","status":201}`

// BenchmarkClientShare is what a tools/call costs the client alone: the
// go-sdk client (application/json answer, as the fast path writes, and
// SSE, as the go-sdk server writes) against a plain net/http JSON-RPC
// client, all against a server that answers a canned result the size of
// the bench's. It is where the MCP row of test/bench spends what its
// plain-client row does not.
func BenchmarkClientShare(b *testing.B) {
	text, _ := json.Marshal(clientShareDoc)
	resp := `,"result":{"content":[{"type":"text","text":` + string(text) + `}],"structuredContent":` + clientShareDoc + `}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(body, &m)
		w.Header().Set("Content-Type", "application/json")
		switch m.Method {
		case "initialize":
			w.Header().Set("Mcp-Session-Id", "s1")
			io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(m.ID)+`,"result":{"capabilities":{"tools":{}},"protocolVersion":"2025-11-25","serverInfo":{"name":"x","version":"1"}}}`)
		case "tools/call":
			if r.URL.Query().Get("sse") != "" {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "event: message\ndata: "+`{"jsonrpc":"2.0","id":`+string(m.ID)+resp+"\n\n")
				return
			}
			io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(m.ID)+resp)
		case "server/discover":
			w.WriteHeader(404)
			io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(m.ID)+`,"error":{"code":-32601,"message":"no"}}`)
		default:
			w.WriteHeader(202)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	b.Run("nethttp-jsonrpc", func(b *testing.B) {
		msg := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t.get","arguments":{"body":{"name":"widget"}}}}`
		for i := 0; i < b.N; i++ {
			req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(msg))
			req.Header.Set("Content-Type", "application/json")
			r, err := srv.Client().Do(req)
			if err != nil {
				b.Fatal(err)
			}
			var m struct{ Result *struct{ IsError bool } }
			if json.NewDecoder(r.Body).Decode(&m) != nil || m.Result == nil {
				b.Fatal("no result")
			}
			r.Body.Close()
		}
	})
	for _, ep := range []string{"/json", "/sse?sse=1"} {
		b.Run("sdk"+ep, func(b *testing.B) {
			cs, err := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &sdk.StreamableClientTransport{Endpoint: srv.URL + ep, DisableStandaloneSSE: true}, nil)
			if err != nil {
				b.Fatal(err)
			}
			args := json.RawMessage(`{"body":{"name":"widget"}}`)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "t.get", Arguments: args})
				if err != nil || r.IsError {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFastPathDoor is the door's own share of a tools/call on the
// fast path (the gate, the parse, the result's encoding), the pipeline
// stubbed by the fast rig's hook and no network: run it with -cpuprofile
// to see where the door spends.
func BenchmarkFastPathDoor(b *testing.B) {
	rig := newFastRig(b)
	h := rig.headers()
	h.Set("Content-Type", "application/json")
	msg := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t.get","arguments":` + clientShareArgs + `}}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(msg))
		r.Header = h
		w := httptest.NewRecorder()
		rig.d.ServeHTTP(w, r)
		if w.Code != http.StatusOK || rig.d.FastCalls() == 0 {
			b.Fatalf("%d %s", w.Code, w.Body)
		}
	}
}

// clientShareArgs are the bench's arguments (the 170-byte body).
const clientShareArgs = `{"body":{"id":"it-1","name":"widget","amount":250,"currency":"EUR","note":"bench","tags":["a","b","c"],"lines":[{"sku":"w-1","qty":2},{"sku":"w-2","qty":1}]}}`
