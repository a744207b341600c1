package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestMCPStdioAnswersWhatTheGatewayDidNot: a request the gateway never
// answered (nothing listening) gets a JSON-RPC error with its own id on
// stdout; a notification only a line on stderr; a JSON-RPC error the
// gateway sent before reading the id gets the request's id.
func TestMCPStdioAnswersWhatTheGatewayDidNot(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/mcp"
	ln.Close()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"the message is larger than 1024 bytes"}}`))
	}))
	defer refusing.Close()
	for _, tc := range []struct {
		name, url, in string
		wantOut       string
		wantErr       string
	}{
		{"gateway unreachable", closed, `{"jsonrpc":"2.0","id":7,"method":"tools/list"}` + "\n", `"id":7`, ""},
		{"notification, unreachable", closed, `{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n", "", "could not be reached"},
		{"refused before the id was read", refusing.URL, `{"jsonrpc":"2.0","id":"a1","method":"tools/call"}` + "\n", `"id":"a1"`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			b := &stdioBridge{url: tc.url, out: &out, log: &errb, client: &http.Client{Timeout: 5 * time.Second}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := b.run(ctx, strings.NewReader(tc.in)); err != nil {
				t.Fatal(err)
			}
			if tc.wantOut == "" && out.Len() != 0 {
				t.Errorf("stdout %q, want nothing", out.String())
			}
			if tc.wantOut != "" {
				var m map[string]any
				if err := json.Unmarshal(out.Bytes(), &m); err != nil || !strings.Contains(out.String(), tc.wantOut) || m["error"] == nil || !strings.HasSuffix(out.String(), "\n") {
					t.Errorf("stdout %q: want one JSON-RPC error line with %s", out.String(), tc.wantOut)
				}
			}
			if !strings.Contains(errb.String(), tc.wantErr) {
				t.Errorf("stderr %q, want %q", errb.String(), tc.wantErr)
			}
		})
	}
}
