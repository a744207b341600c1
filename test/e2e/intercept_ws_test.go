//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// wsUpstream is the intercepting world's WebSocket service (paths /ws…):
// it echoes every message, except "whoami", which it answers with the
// Authorization it was upgraded with, and "bye", after which it closes.
var wsUpstream = websocket.Server{
	Handshake: func(*websocket.Config, *http.Request) error { return nil }, // no Origin check
	Handler: func(ws *websocket.Conn) {
		defer ws.Close()
		for {
			var m []byte
			if err := websocket.Message.Receive(ws, &m); err != nil {
				return
			}
			switch string(m) {
			case "whoami":
				m = []byte("you are " + ws.Request().Header.Get("Authorization"))
			case "bye":
				return
			}
			if err := websocket.Message.Send(ws, m); err != nil {
				return
			}
		}
	},
}

// wsDial opens a CONNECT tunnel to host through the gateway's socket, as
// a sandbox's client does, and upgrades a WebSocket to path in it.
func (w *interceptWorld) wsDial(t *testing.T, host, path string, hdr http.Header) (*websocket.Conn, error) {
	t.Helper()
	conn := w.tunnel(t, host, w.gatewayCA)
	cfg, err := websocket.NewConfig("wss://"+host+path, "https://"+host)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		cfg.Header[k] = vs
	}
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return ws, nil
}

// tunnel answers CONNECT host:443 on the gateway's socket and starts TLS
// in it, trusting roots, offering HTTP/1.1.
func (w *interceptWorld) tunnel(t *testing.T, host string, roots *x509.CertPool) net.Conn {
	t.Helper()
	return w.tunnelWith(t, host, &tls.Config{RootCAs: roots, ServerName: host, NextProtos: []string{"http/1.1"}})
}

// tunnelALPN is tunnel through the gateway's CA offering only proto, which
// the gateway must pick.
func (w *interceptWorld) tunnelALPN(t *testing.T, host, proto string) *tls.Conn {
	t.Helper()
	c := w.tunnelWith(t, host, &tls.Config{RootCAs: w.gatewayCA, ServerName: host, NextProtos: []string{proto}})
	if got := c.ConnectionState().NegotiatedProtocol; got != proto {
		t.Fatalf("ALPN chose %q, want %q", got, proto)
	}
	return c
}

func (w *interceptWorld) tunnelWith(t *testing.T, host string, cfg *tls.Config) *tls.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := wire.Dial(ctx, w.g.Sock, agentA)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	fmt.Fprintf(raw, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", host, host)
	br := bufio.NewReader(raw)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %v %v\n%s", host, resp, err, w.g.Stderr())
	}
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatalf("TLS in the tunnel to %s: %v", host, err)
	}
	return tc
}

func wsRoundTrip(t *testing.T, ws *websocket.Conn, m []byte) []byte {
	t.Helper()
	_ = ws.SetDeadline(time.Now().Add(10 * time.Second))
	if err := websocket.Message.Send(ws, m); err != nil {
		t.Fatalf("send: %v", err)
	}
	var got []byte
	if err := websocket.Message.Receive(ws, &got); err != nil {
		t.Fatalf("receive: %v", err)
	}
	return got
}

// TestInterceptWebSocket: a WebSocket upgraded inside an intercepted
// tunnel is decided like any request, gets its placeholder substituted
// toward the bound host, has the secret scrubbed from the upstream's
// messages, and ends with a result record that counts its bytes.
func TestInterceptWebSocket(t *testing.T) {
	requireHost(t)
	w := newInterceptWorld(t)
	bearer := http.Header{"Authorization": {"Bearer " + w.placeholder}}

	t.Run("bound host: secret substituted upstream, scrubbed coming back", func(t *testing.T) {
		ws, err := w.wsDial(t, "api.test", "/ws/chat", bearer)
		if err != nil {
			t.Fatalf("upgrade: %v\n%s", err, w.g.Stderr())
		}
		if got := wsRoundTrip(t, ws, []byte("hello")); string(got) != "hello" {
			t.Fatalf("echo %q", got)
		}
		big := bytes.Repeat([]byte("0123456789abcdef"), 8192) // 128 KiB, one message
		if got := wsRoundTrip(t, ws, big); !bytes.Equal(got, big) {
			t.Fatalf("128 KiB echo came back as %d bytes", len(got))
		}
		d3 := casebook.Expect(t, "D3", "upstream echoes the substituted Authorization inside a WebSocket message (intercepted tunnel)",
			"message scrubbed to [redacted-by-sluice], audit secret_reflected")
		got := wsRoundTrip(t, ws, []byte("whoami"))
		w.e.Keep(got)
		defer func() {
			d3.Observef("message %q, secret in it: %v", got, bytes.Contains(got, []byte(w.e.Secret)))
		}()
		if string(got) != "you are Bearer [redacted-by-sluice]" {
			t.Fatalf("whoami: %q (secret in it: %v)", got, bytes.Contains(got, []byte(w.e.Secret)))
		}
		reqs := w.requests()
		if last := reqs[len(reqs)-1]; last.path != "/ws/chat" || last.auth != "Bearer "+w.e.Secret {
			t.Fatalf("upstream saw path %q, Authorization with the secret: %v", last.path, last.auth == "Bearer "+w.e.Secret)
		}
		ws.Close()
		g := w.g.For(t)
		g.AwaitAuditFields("secret_reflected", map[string]any{"dest_host": "api.test"})
		res := g.AwaitAuditFields("result", map[string]any{"dest_host": "api.test", "kind": "http", "status": float64(101)})
		f := res["fields"].(map[string]any)
		if up, dn := f["bytes_up"].(float64), f["bytes_down"].(float64); up < float64(len(big)) || dn < float64(len(big)) {
			t.Fatalf("result counts %v up, %v down; want at least %d each way", up, dn, len(big))
		}
	})
	t.Run("intercepted host without a binding: relayed as is", func(t *testing.T) {
		ws, err := w.wsDial(t, "other.test", "/ws", bearer)
		if err != nil {
			t.Fatalf("upgrade: %v\n%s", err, w.g.Stderr())
		}
		defer ws.Close()
		if got := wsRoundTrip(t, ws, []byte("whoami")); string(got) != "you are Bearer "+w.placeholder {
			t.Fatalf("whoami %q: the placeholder must go out unchanged", got)
		}
		w.g.For(t).AwaitAuditFields("placeholder_host_mismatch", map[string]any{"dest_host": "other.test", "kind": "http"})
	})
	t.Run("the upstream closing ends the connection", func(t *testing.T) {
		ws, err := w.wsDial(t, "other.test", "/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		_ = ws.SetDeadline(time.Now().Add(10 * time.Second))
		if err := websocket.Message.Send(ws, "bye"); err != nil {
			t.Fatal(err)
		}
		var m []byte
		if err := websocket.Message.Receive(ws, &m); err != io.EOF {
			t.Fatalf("after bye: %q %v, want io.EOF", m, err)
		}
	})
	t.Run("blocked path: 403, nothing upgraded upstream", func(t *testing.T) {
		before := len(w.requests())
		_, err := w.wsDial(t, "api.test", "/admin/ws", bearer)
		if err == nil || !strings.Contains(err.Error(), "bad status") {
			t.Fatalf("upgrade to a blocked path: %v, want the handshake refused", err)
		}
		if n := len(w.requests()) - before; n != 0 {
			t.Fatalf("%d requests reached the upstream", n)
		}
		w.g.For(t).AwaitAuditFields("decision", map[string]any{"dest_host": "api.test", "decision": "block", "rule": "team.no_admin"})
	})
	t.Run("malformed handshake: 400, nothing upstream", func(t *testing.T) {
		cases := []struct{ name, head string }{
			{"version 8", "Sec-WebSocket-Version: 8\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"},
			{"key not 16 bytes", "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: c2hvcnQ=\r\n"},
			{"two keys", "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := len(w.requests())
				conn := w.tunnel(t, "api.test", w.gatewayCA)
				defer conn.Close()
				fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n%s\r\n", tc.head)
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 400 || !bytes.Contains(body, []byte(`"schema_violation"`)) {
					t.Fatalf("got %d %s", resp.StatusCode, body)
				}
				if n := len(w.requests()) - before; n != 0 {
					t.Fatalf("%d requests reached the upstream", n)
				}
			})
		}
	})
}
