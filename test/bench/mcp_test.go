//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// benchMCP is the MCP door's section: an allowed tools/call through the
// gateway's MCP door against the same call over POST /v1/tools (the door's
// own cost), and against a bare go-sdk MCP server whose tool calls the
// upstream itself (what policy, credential, scrub and audit cost over
// MCP).
func benchMCP(t *testing.T, w *world) []*section {
	s := &section{Title: "MCP tools/call", Baseline: "POST /v1/tools",
		Intro: "One allowed call of `bench.create_item` (the 170-byte body of section 1) through one real `sluice serve` with the full pipeline of row 1.7 (schema, the user's Rego module, the stored API key attached and scrubbed for, audit on /dev/shm), " +
			"sequentially; the rows take turns in blocks of 1/40 of their samples. The MCP rows are the official Go SDK's client (" + sdkVersion + ") on one open session; " +
			"the gateway rows are called over the sandbox socket with the identity preamble."}
	n := iterations(2000)
	warm := 20
	args := `{"body":` + itemBody + `}`
	ps := []*probe{}

	g, err := w.startGateway(t, gwOpts{Name: "mcp", Rego: benchRego, Credential: true})
	if err != nil {
		for _, name := range []string{"POST /v1/tools", "MCP tools/call through sluice", sdkRow, plainRow, "bare go-sdk MCP server"} {
			ps = append(ps, &probe{name: name, err: err})
		}
		s.addProbes(ps)
		return []*section{s}
	}
	t.Cleanup(g.p.stop)
	hc := sandboxClient(g.sock, benchAgent)
	ps = append(ps, &probe{name: "POST /v1/tools", note: "the same gateway, the same call over the sandbox API", fn: func() error { _, err := toolCall(hc, "bench.create_item", args, 200); return err }})

	ctx := context.Background()
	// No per-call deadline: cancelling a call's context as soon as its
	// answer arrives would cut the SSE stream before the client drained
	// it, and the next call would pay for a new connection (the bound is
	// the HTTP clients' own).
	call := func(cs *sdk.ClientSession, meta sdk.Meta) func() error {
		return func() error {
			r, err := cs.CallTool(ctx, &sdk.CallToolParams{Meta: meta, Name: "bench.create_item", Arguments: json.RawMessage(args)})
			if err != nil {
				return err
			}
			if r.IsError {
				return fmt.Errorf("isError: %v", r.Content)
			}
			return nil
		}
	}
	connect := func(endpoint string, c *http.Client) (*sdk.ClientSession, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		return sdk.NewClient(&sdk.Implementation{Name: "bench", Version: "1"}, nil).Connect(cctx,
			&sdk.StreamableClientTransport{Endpoint: endpoint, HTTPClient: c, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	}
	const mcpRow = "MCP tools/call through sluice"
	var dials atomic.Int64
	mtr := &http.Transport{MaxIdleConnsPerHost: 8, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		dials.Add(1)
		return wire.Dial(ctx, g.sock, benchAgent)
	}}
	t.Cleanup(func() { t.Logf("MCP dials: %d", dials.Load()) })
	if cs, err := connect("http://sluice/mcp", &http.Client{Transport: mtr}); err != nil {
		ps = append(ps, &probe{name: mcpRow, err: err})
	} else {
		t.Cleanup(func() { cs.Close() })
		ps = append(ps, &probe{name: mcpRow, note: "one MCP session, the pipeline's Call", fn: call(cs, nil)})
	}
	// The same door with the message sent past its fast path: a _meta
	// member (one the SDK ignores) is not the canonical form the fast path
	// takes, so the SDK serves the call, as it served every call before
	// the fast path. The "before" of the fast path, in the same run.
	if cs, err := connect("http://sluice/mcp", &http.Client{Transport: mtr}); err != nil {
		ps = append(ps, &probe{name: sdkRow, err: err})
	} else {
		t.Cleanup(func() { cs.Close() })
		ps = append(ps, &probe{name: sdkRow, note: "the same door, the SDK's session machinery (before the fast path)", fn: call(cs, sdk.Meta{"bench": "sdk-path"})})
	}

	// The same door and fast path under a plain JSON-RPC client (net/http
	// and encoding/json, the session opened by hand): the server's share
	// of the MCP row, without the go-sdk client's own cost.
	if fn, err := plainMCPClient(sandboxClient(g.sock, benchAgent), args); err != nil {
		ps = append(ps, &probe{name: plainRow, err: err})
	} else {
		ps = append(ps, &probe{name: plainRow, note: "the same door, a plain net/http JSON-RPC client", fn: fn})
	}

	// The bare server: the official go-sdk, one tool whose handler sends
	// the arguments' body to the upstream with the API key itself. No
	// validation, policy, scrub or audit.
	const bareRow = "bare go-sdk MCP server"
	up := &http.Client{Transport: w.ns.transport(), Timeout: 30 * time.Second}
	apiURL := fmt.Sprintf("http://127.0.0.1:%d/items", w.apiPort)
	srv := sdk.NewServer(&sdk.Implementation{Name: "bare", Version: "1"}, nil)
	srv.AddTool(&sdk.Tool{Name: "bench.create_item", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		var a struct {
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(req.Params.Arguments, &a); err != nil {
			return nil, err
		}
		hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, apiURL, bytes.NewReader(a.Body))
		hr.Header.Set("Content-Type", "application/json")
		hr.Header.Set("X-Api-Key", w.secret)
		resp, err := up.Do(hr)
		if err != nil {
			return nil, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: string(b)}}, IsError: resp.StatusCode != 200}, nil
	})
	ln := w.ns.listen(t, "tcp", "127.0.0.1:0")
	hs := &http.Server{Handler: sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	if cs, err := connect("http://"+ln.Addr().String()+"/mcp", &http.Client{Transport: w.ns.transport()}); err != nil {
		ps = append(ps, &probe{name: bareRow, err: err})
	} else {
		t.Cleanup(func() { cs.Close() })
		ps = append(ps, &probe{name: bareRow, note: "its tool calls the upstream itself", fn: call(cs, nil)})
	}

	interleave(ps, n, warm)
	s.addProbes(ps)
	s.Notes = append(s.Notes,
		"row POST /v1/tools, the baseline: the gateway's own sandbox API, the same call",
		"row MCP tools/call through sluice: the gateway's MCP door (`/mcp`, streamable HTTP) on one session; the door's fast path (gateway/mcp/fast.go) takes the call and hands it to the same pipeline (`Server.Call`, transport mcp), answering application/json",
		"row "+sdkRow+": the same door and session kind, each call carrying a `_meta` member so that the fast path declines it and the go-sdk server serves it (SSE answer): the door as it was before the fast path",
		"row "+plainRow+": the same door and fast path called by a plain JSON-RPC client (net/http posting the message, encoding/json reading the answer) on a session it initialized by hand: the door's and pipeline's share of the MCP row, without the go-sdk client's",
		"row bare go-sdk MCP server: an MCP server in the test process, in the same namespace, whose tool handler POSTs to the upstream with the API key; what an MCP server without a gateway costs")
	s.Verdicts = append(s.Verdicts,
		ratioP50("issue 19: an allowed MCP tools/call ÷ the same call over POST /v1/tools ≤ 1.2× at p50", s.find(mcpRow), s.find("POST /v1/tools"), 1.2),
		ratioAt("issue 19: an allowed MCP tools/call ÷ POST /v1/tools at p99 (not a goal)", 99, s.find(mcpRow), s.find("POST /v1/tools")),
		ratioAt("issue 19: the MCP door with a plain JSON-RPC client ÷ POST /v1/tools at p50 (the server's share; not a goal)", 50, s.find(plainRow), s.find("POST /v1/tools")),
		ratioAt("issue 19: the same call served by the go-sdk server (no fast path) ÷ POST /v1/tools at p50, the before", 50, s.find(sdkRow), s.find("POST /v1/tools")),
		ratioAt("issue 19: the same call served by the go-sdk server (no fast path) ÷ POST /v1/tools at p99, the before", 99, s.find(sdkRow), s.find("POST /v1/tools")),
		ratioP50("issue 19: MCP through sluice ÷ a bare go-sdk server calling the upstream itself (the cost of policy + credential + scrub + audit over MCP; not a goal)", s.find(mcpRow), s.find(bareRow), 0))
	return []*section{s}
}

// sdkRow is the MCP door's row with its fast path declined.
const sdkRow = "MCP tools/call, SDK-served (no fast path)"

// plainRow is the MCP door called by a plain JSON-RPC client.
const plainRow = "MCP tools/call through sluice, plain JSON-RPC client"

// plainMCPClient opens an MCP session on the gateway's door over c by hand
// (initialize, notifications/initialized) and returns one tools/call of
// bench.create_item with args, checked for a result that is not isError.
func plainMCPClient(c *http.Client, args string) (func() error, error) {
	var sid string
	post := func(body string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, "http://sluice/mcp", strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		return c.Do(req)
	}
	resp, err := post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}`)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if sid = resp.Header.Get("Mcp-Session-Id"); resp.StatusCode != 200 || sid == "" {
		return nil, fmt.Errorf("initialize: status %d, session %q", resp.StatusCode, sid)
	}
	if resp, err = post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil {
		return nil, err
	}
	resp.Body.Close()
	msg := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bench.create_item","arguments":` + args + `}}`
	return func() error {
		resp, err := post(msg)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var m struct {
			Result *struct {
				IsError bool `json:"isError"`
			} `json:"result"`
		}
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/json" {
			return fmt.Errorf("tools/call: status %d, %s (the fast path answers application/json)", resp.StatusCode, ct)
		}
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || m.Result == nil || m.Result.IsError {
			return fmt.Errorf("tools/call: %v %+v", err, m.Result)
		}
		return nil
	}, nil
}

// ratioAt reports row's p-th percentile ÷ base's, with no ceiling.
func ratioAt(goal string, p float64, row, base *row) string {
	if row == nil || base == nil || len(row.Lat) == 0 || len(base.Lat) == 0 {
		return goal + ": not measured"
	}
	return fmt.Sprintf("%s: %.2f×", goal, float64(pct(row.Lat, p))/float64(pct(base.Lat, p)))
}

// sdkVersion is the go-sdk version the MCP rows use (go.mod).
const sdkVersion = "github.com/modelcontextprotocol/go-sdk v1.8.0"

// ratioP50 reports row's median ÷ base's against a ceiling (0 = none).
func ratioP50(goal string, row, base *row, ceiling float64) string {
	if ceiling == 0 {
		return ratioAt(goal, 50, row, base)
	}
	return verdictAt(50, goal, row, base, ceiling)
}
