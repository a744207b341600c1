package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

// mcpStdioMaxMessage bounds one message either way (the gateway's own
// limit, gateway.mcp.max_message_bytes, is enforced there).
const mcpStdioMaxMessage = 64 << 20

func mcpStdioCmd(_ *globals) *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "mcp-stdio",
		Short: "Bridge an MCP client on stdio to the gateway's MCP door (run inside a sandbox)",
		Long: `mcp-stdio is for agent frameworks that only launch MCP servers as commands.
It speaks MCP's stdio transport (one JSON-RPC message per line) to the framework
and streamable HTTP to the gateway at SLUICE_MCP_URL (sandboxd sets it to
http://127.0.0.1:3128/mcp in every sandbox). It relays messages unchanged:
every decision is the gateway's, and the sandbox's identity is the relay's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if url == "" {
				url = os.Getenv("SLUICE_MCP_URL")
			}
			if url == "" {
				return errors.New("mcp-stdio: no gateway URL: set SLUICE_MCP_URL (sandboxd does) or --url")
			}
			b := &stdioBridge{url: url, out: cmd.OutOrStdout(), log: cmd.ErrOrStderr(),
				client: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16}}}
			return b.run(cmd.Context(), cmd.InOrStdin())
		},
	}
	cmd.Flags().StringVar(&url, "url", "", "the gateway's MCP URL (default: $SLUICE_MCP_URL)")
	return cmd
}

// stdioBridge relays MCP messages between stdio and streamable HTTP.
type stdioBridge struct {
	url    string
	client *http.Client
	log    io.Writer

	outMu sync.Mutex
	out   io.Writer

	mu      sync.Mutex
	session string // Mcp-Session-Id, once the gateway assigned one
	version string // the negotiated protocol version
}

// rpcHead is what the bridge reads of a message: enough to route it.
type rpcHead struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Result *struct {
		ProtocolVersion string `json:"protocolVersion"`
	} `json:"result,omitempty"`
}

func (b *stdioBridge) run(ctx context.Context, in io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), mcpStdioMaxMessage)
	var posts, listener sync.WaitGroup
	listening := false
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		msg := bytes.Clone(line)
		var h rpcHead
		_ = json.Unmarshal(msg, &h) // a malformed message is the gateway's to refuse
		if h.Method == "initialize" {
			// In order: the session id it opens is needed by the rest.
			b.post(ctx, msg, h)
			if !listening && b.sessionID() != "" {
				listening = true
				listener.Add(1)
				go func() { defer listener.Done(); b.listen(ctx) }()
			}
			continue
		}
		posts.Add(1)
		go func() { defer posts.Done(); b.post(ctx, msg, h) }()
	}
	err := sc.Err()
	if err != nil {
		fmt.Fprintf(b.log, "mcp-stdio: stdin: %v\n", err)
	}
	// stdin closed: let the calls in flight finish, end the session,
	// then stop listening.
	posts.Wait()
	if sid := b.sessionID(); sid != "" {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		if req, rerr := http.NewRequestWithContext(dctx, http.MethodDelete, b.url, nil); rerr == nil {
			req.Header.Set("Mcp-Session-Id", sid)
			if resp, derr := b.client.Do(req); derr == nil {
				resp.Body.Close()
			}
		}
		dcancel()
	}
	cancel()
	listener.Wait()
	return err
}

func (b *stdioBridge) sessionID() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.session
}

func (b *stdioBridge) headers(h http.Header) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.session != "" {
		h.Set("Mcp-Session-Id", b.session)
	}
	if b.version != "" {
		h.Set("MCP-Protocol-Version", b.version)
	}
}

// post sends one message and relays whatever the gateway answers.
func (b *stdioBridge) post(ctx context.Context, msg []byte, h rpcHead) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url, bytes.NewReader(msg))
	if err != nil {
		b.fail(h, "the request could not be made: "+err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	b.headers(req.Header)
	resp, err := b.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			b.fail(h, "the gateway could not be reached at "+b.url+": "+err.Error())
		}
		return
	}
	defer resp.Body.Close()
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" && h.Method == "initialize" {
		b.mu.Lock()
		b.session = sid
		b.mu.Unlock()
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusNoContent:
	case ct == "text/event-stream":
		b.relayEvents(resp.Body, h.Method == "initialize")
	default:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, mcpStdioMaxMessage))
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) == nil && string(m["jsonrpc"]) == `"2.0"` {
			if h.ID != nil && (m["id"] == nil || string(m["id"]) == "null") {
				m["id"] = h.ID // the gateway refused before reading the id
				body, _ = json.Marshal(m)
			}
			b.emit(body, h.Method == "initialize")
			return
		}
		b.fail(h, fmt.Sprintf("the gateway answered HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body))))
	}
}

// listen keeps the session's standalone event stream open (list_changed
// and other server notifications), reconnecting until ctx ends.
func (b *stdioBridge) listen(ctx context.Context) {
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url, nil)
		if err != nil {
			return
		}
		req.Header.Set("Accept", "text/event-stream")
		b.headers(req.Header)
		resp, err := b.client.Do(req)
		if err == nil {
			if resp.StatusCode == http.StatusMethodNotAllowed || resp.StatusCode == http.StatusNotFound {
				resp.Body.Close()
				return // no stream offered, or the session is gone
			}
			if resp.StatusCode == http.StatusOK {
				b.relayEvents(resp.Body, false)
			}
			resp.Body.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// relayEvents writes each server-sent event's data as one stdio message.
func (b *stdioBridge) relayEvents(r io.Reader, initialize bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), mcpStdioMaxMessage)
	var data []byte
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 {
				b.emit(data, initialize)
				data = nil
			}
		case strings.HasPrefix(line, "data:"):
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")...)
		}
	}
	if len(data) > 0 {
		b.emit(data, initialize)
	}
}

// emit writes one message to stdout, on one line.
func (b *stdioBridge) emit(msg []byte, initialize bool) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, msg); err != nil {
		fmt.Fprintf(b.log, "mcp-stdio: the gateway sent a message that is not JSON (%d bytes); dropped\n", len(msg))
		return
	}
	if initialize {
		var h rpcHead
		if json.Unmarshal(buf.Bytes(), &h) == nil && h.Result != nil && h.Result.ProtocolVersion != "" {
			b.mu.Lock()
			b.version = h.Result.ProtocolVersion
			b.mu.Unlock()
		}
	}
	buf.WriteByte('\n')
	b.outMu.Lock()
	defer b.outMu.Unlock()
	_, _ = b.out.Write(buf.Bytes())
}

// fail answers a request the gateway did not answer with a JSON-RPC
// error; a failed notification is only reported on stderr.
func (b *stdioBridge) fail(h rpcHead, why string) {
	if h.ID == nil {
		fmt.Fprintf(b.log, "mcp-stdio: %s\n", why)
		return
	}
	m, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": h.ID, "error": map[string]any{"code": -32603, "message": "mcp-stdio: " + why}})
	b.emit(m, false)
}
