//go:build linux

package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestGatewayStalledBodies is THREATS B10 (bodies) through the real
// binary: with request_body_timeout 1s and request_body_min_rate 500, a
// request whose body stops arriving (Content-Length, chunked, or trickled
// a byte at a time) is cut with 408 request_timeout within the bound, and
// logged; nothing reaches the upstream. A body that arrives in pieces but
// in time is served.
func TestGatewayStalledBodies(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	d := e.BaseConfig("body")
	d.Gateway()["request_body_timeout"] = "1s"
	d.Gateway()["request_body_min_rate"] = 500
	g := e.Start(d, e.Write(d))
	head := "POST /v1/tools/tickets.list_tickets HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"
	for _, tc := range []struct {
		name, threat string
		first        string        // sent at once
		trickle      time.Duration // then a space every trickle, if set
	}{
		{"content-length body stalls", "a tool call announces Content-Length 100, sends 2 bytes of body and stalls",
			head + "Content-Length: 100\r\n\r\n{}", 0},
		{"chunked body stalls mid-chunk", "a tool call sends a chunked body, one chunk announced as 0x40 bytes, 3 of them sent, then stalls",
			head + "Transfer-Encoding: chunked\r\n\r\n40\r\n{ \"", 0},
		{"body trickles", "a tool call announces Content-Length 1000 and sends its body a byte every 300ms (slowloris on the body)",
			head + "Content-Length: 1000\r\n\r\n", 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := g.For(t)
			c := casebook.Expect(t, "B10", tc.threat+"; request_body_timeout 1s, request_body_min_rate 500",
				"408 request_timeout within the bound (1s plus a second per 500 bytes), connection closed, logged; nothing upstream")
			before := len(e.Up.Requests())
			conn, err := g.Dial(agentA)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			if _, err := io.WriteString(conn, tc.first); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			defer close(stop)
			if tc.trickle > 0 {
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(tc.trickle):
							if _, err := io.WriteString(conn, " "); err != nil {
								return
							}
						}
					}
				}()
			}
			_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
			out, rerr := io.ReadAll(conn)
			took := time.Since(start)
			status, code, _ := gwenv.StatusOf(string(out))
			c.Observef("%d %s after %v, read end: %v; upstream requests %d", status, code, took.Round(100*time.Millisecond), rerr, len(e.Up.Requests())-before)
			if status != http.StatusRequestTimeout || code != "request_timeout" {
				t.Fatalf("answer after %v: %q (%v), want 408 request_timeout", took, out, rerr)
			}
			if rerr != nil {
				t.Errorf("the connection was not closed after the 408: %v", rerr)
			}
			// 1s, plus a second per 500 bytes (the trickle sends ~4 a
			// second), plus the watchdog's grace and a loaded machine.
			if took < time.Second || took > 8*time.Second {
				t.Errorf("cut after %v, want within the 1s bound (plus slack)", took)
			}
			if n := len(e.Up.Requests()) - before; n != 0 {
				t.Errorf("%d upstream requests", n)
			}
			g.AwaitLog("request_timeout", func(l map[string]any) bool {
				return l["code"] == "request_timeout" && l["status"] == float64(408) && l["sandbox"] == agentA.Sandbox
			})
		})
	}
	t.Run("a body in pieces but in time is served", func(t *testing.T) {
		g := g.For(t)
		conn, err := g.Dial(agentA)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, head+"Content-Length: 2\r\nConnection: close\r\n\r\n{")
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(conn, "}")
		_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		out, _ := io.ReadAll(conn)
		if status, _, _ := gwenv.StatusOf(string(out)); status != http.StatusOK {
			t.Errorf("a body in two pieces 300ms apart: %q, want 200", out)
		}
	})
}

// TestGatewayConnectionCaps is THREATS B10 (connection floods) through the
// real binary: with max_connections 6 and max_connections_per_sandbox 3, a
// sandbox's 4th open connection is answered 429 too_many_connections at
// once, another sandbox is still served until the gateway has 6 open, then
// every new connection is 503 gateway_busy at once; both are logged. A
// connection closed gives its place back.
func TestGatewayConnectionCaps(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	d := e.BaseConfig("conns")
	d.Gateway()["max_connections"] = 6
	d.Gateway()["max_connections_per_sandbox"] = 3
	g := e.Start(d, e.Write(d))
	as := func(sb string) wire.Identity {
		id := agentA
		id.Sandbox = sb
		return id
	}
	// hold opens a connection as id and keeps it open (keep-alive) after
	// one served request, so it is counted for certain.
	var held []net.Conn
	hold := func(id wire.Identity) {
		t.Helper()
		conn, err := g.Dial(id)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, conn)
		_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := io.WriteString(conn, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("held connection %d of %s: %v", len(held), id.Sandbox, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("held connection %d of %s: %d", len(held), id.Sandbox, resp.StatusCode)
		}
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	try := func(id wire.Identity) (int, string, time.Duration) {
		start := time.Now()
		out, closed := g.Raw(id, []byte("GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n\r\n"), 10*time.Second)
		status, code, _ := gwenv.StatusOf(out)
		if !closed {
			t.Errorf("%s: the connection was left open", id.Sandbox)
		}
		return status, code, time.Since(start)
	}

	c := casebook.Expect(t, "B10", "one sandbox opens 4 connections with max_connections_per_sandbox 3",
		"the 4th is answered 429 too_many_connections at once and closed, logged; another sandbox is still served")
	for range 3 {
		hold(as("sb-c1"))
	}
	st, code, took := try(as("sb-c1"))
	ost, _, _ := try(as("sb-c2"))
	c.Observef("4th connection: %d %s in %v; another sandbox %d", st, code, took.Round(time.Millisecond), ost)
	if st != http.StatusTooManyRequests || code != "too_many_connections" {
		t.Errorf("4th connection of a sandbox: %d %s, want 429 too_many_connections", st, code)
	}
	if ost != http.StatusOK {
		t.Errorf("another sandbox: %d, want 200", ost)
	}
	g.AwaitLog("over the connection cap (429)", func(l map[string]any) bool {
		return l["code"] == "too_many_connections" && l["sandbox"] == "sb-c1"
	})

	c = casebook.Expect(t, "B10", "three sandboxes hold 6 connections with max_connections 6; a fourth sandbox connects",
		"503 gateway_busy at once and closed, logged; after one connection closes, a new one is served")
	for range 3 {
		hold(as("sb-c2"))
	}
	time.Sleep(1100 * time.Millisecond) // the over-cap log line is at most one a second
	st, code, took = try(as("sb-c3"))
	held[0].Close()
	held = held[1:]
	var after int
	for range 50 { // the gateway sees the close shortly
		if after, _, _ = try(as("sb-c3")); after == http.StatusOK {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Observef("7th connection: %d %s in %v; after one closed: %d", st, code, took.Round(time.Millisecond), after)
	if st != http.StatusServiceUnavailable || code != "gateway_busy" {
		t.Errorf("connection over the total: %d %s, want 503 gateway_busy", st, code)
	}
	if took > 5*time.Second {
		t.Errorf("the refusal took %v: the accept loop must answer at once", took)
	}
	if after != http.StatusOK {
		t.Errorf("after a connection closed: %d, want 200", after)
	}
	g.AwaitLog("over the connection cap (503)", func(l map[string]any) bool {
		return l["code"] == "gateway_busy" && strings.Contains(fmt.Sprint(l["msg"]), "connection cap")
	})
}
