package egress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// rawUpstream is a loopback TCP upstream whose every response byte a test
// writes: answer returns the bytes for the n-th request (from 0) of a
// connection.
type rawUpstream struct {
	ln     net.Listener
	answer func(n int, req *http.Request) rawAnswer

	mu    sync.Mutex
	conns []*rawUpConn
}

// rawAnswer is what the upstream does with one request.
type rawAnswer struct {
	raw   string // written as is
	close bool   // the upstream closes the connection after raw
	hang  bool   // nothing is written; the connection is left open
}

// rawUpConn is one accepted connection.
type rawUpConn struct {
	callers []string      // X-Test-Caller of each request on it
	bodies  []int64       // the body size of each request on it
	ended   chan struct{} // closed when its peer (the gateway) closed it
	byPeer  bool          // the gateway closed it, not the upstream
}

func newRawUpstream(t *testing.T, answer func(n int, req *http.Request) rawAnswer) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln, answer: answer}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			uc := &rawUpConn{ended: make(chan struct{})}
			u.mu.Lock()
			u.conns = append(u.conns, uc)
			u.mu.Unlock()
			go u.serve(c, uc)
		}
	}()
	return u
}

func (u *rawUpstream) serve(c net.Conn, uc *rawUpConn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			u.mu.Lock()
			uc.byPeer = true
			u.mu.Unlock()
			close(uc.ended)
			return
		}
		size, _ := io.Copy(io.Discard, req.Body)
		u.mu.Lock()
		uc.callers = append(uc.callers, req.Header.Get("X-Test-Caller"))
		uc.bodies = append(uc.bodies, size)
		u.mu.Unlock()
		a := u.answer(n, req)
		if a.hang {
			continue
		}
		if _, err := io.WriteString(c, a.raw); err != nil || a.close {
			u.mu.Lock()
			uc.byPeer = err != nil // the gateway stopped reading and closed
			u.mu.Unlock()
			close(uc.ended)
			return
		}
	}
}

// snapshot returns the connections so far.
func (u *rawUpstream) snapshot() []rawUpConn {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]rawUpConn, len(u.conns))
	for i, c := range u.conns {
		out[i] = *c
		out[i].callers = append([]string(nil), c.callers...)
		out[i].bodies = append([]int64(nil), c.bodies...)
	}
	return out
}

// waitEnded waits until connection i was closed by the gateway.
func (u *rawUpstream) waitEnded(t *testing.T, i int) {
	t.Helper()
	u.mu.Lock()
	if i >= len(u.conns) {
		u.mu.Unlock()
		t.Fatalf("no upstream connection %d (%d made)", i, len(u.conns))
	}
	c := u.conns[i]
	u.mu.Unlock()
	select {
	case <-c.ended:
	case <-time.After(5 * time.Second):
		t.Fatalf("upstream connection %d is still open", i)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if !c.byPeer {
		t.Fatalf("upstream connection %d was closed by the upstream, not the gateway", i)
	}
}

// rawEgressFor serves raw egress on a sandbox socket of its own, as
// Serve wires it (startBenchEgress's way), with a response-header timeout
// of headerTimeout and a guarded dialer that connects every admitted
// address to u.
func rawEgressFor(t *testing.T, u *rawUpstream, headerTimeout time.Duration) *benchEgress {
	t.Helper()
	up := egresstest.NewDNSUpstream(t, map[string]string{"pkg.example": "93.184.216.34"})
	g := startEgressGateway(t, up, func(c *config.Config) {
		c.Egress.MaxTunnelsPerCaller = 64
		c.Gateway.UpstreamTimeout = config.Duration(headerTimeout)
	})
	eg := g.newProxy()
	eg.dialer = guard.New(guard.Options{Resolver: eg.res, DialFunc: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, u.ln.Addr().String())
	}})
	be := &benchEgress{g: g, eg: eg, sock: filepath.Join(g.dir, "raw.sock"), conns: map[string]map[string]bool{}}
	sl, err := ingress.Listen(ingress.Options{Socket: be.sock, TrustedUIDs: g.cfg.Gateway.TrustedRelayUIDs, Log: g.log})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(eg.ServeProxy), ConnContext: ingress.ConnContext, MaxHeaderBytes: 64 << 10}
	go func() { _ = srv.Serve(ingress.StrictHeads(sl)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return be
}

// getAs sends one GET through the proxy as id, on a sandbox connection of
// its own, and returns the status, body and error code.
func getAs(t *testing.T, be *benchEgress, id wire.Identity, caller string) (int, string, http.Header) {
	t.Helper()
	cl := be.viaProxyAs(t, id)
	defer cl.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, "http://pkg.example/x", nil)
	req.Header.Set("X-Test-Caller", caller)
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("GET as %s: %v", caller, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET as %s: body: %v", caller, err)
	}
	return resp.StatusCode, string(body), resp.Header
}

const okAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"

// TestUpstreamConnectionReuse: an upstream connection carries the next
// request of the same caller to the same destination only when the last
// response ended exactly at its framing's end and allowed reuse; it never
// carries another caller's.
func TestUpstreamConnectionReuse(t *testing.T) {
	other := wire.Identity{Sandbox: "sb-2", Agent: "agent-a", Session: "s-2", User: "alice"}
	tests := []struct {
		name   string
		answer string
		second wire.Identity // the caller of the second request
		want   string        // body both requests get
		reuse  bool          // the second request went on the first's connection
	}{
		{"content-length, same caller: reused", okAnswer, agentA, "hello", true},
		{"chunked with a trailer, same caller: reused",
			"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;ext=1\r\nlo\r\n0\r\nX-Trailer: 1\r\n\r\n", agentA, "hello", true},
		{"1xx before the answer: skipped, reused", "HTTP/1.1 100 Continue\r\n\r\n" + okAnswer, agentA, "hello", true},
		{"no body (204): reused", "HTTP/1.1 204 No Content\r\n\r\n", agentA, "", true},
		{"another caller: never reused", okAnswer, other, "hello", false},
		{"Connection: close: not reused", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello", agentA, "hello", false},
		{"HTTP/1.0: not reused", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello", agentA, "hello", false},
		{"bytes after the response: not reused", okAnswer + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", agentA, "hello", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := newRawUpstream(t, func(int, *http.Request) rawAnswer { return rawAnswer{raw: tc.answer} })
			be := rawEgressFor(t, u, 5*time.Second)
			for i, id := range []wire.Identity{agentA, tc.second} {
				status, body, _ := getAs(t, be, id, id.Sandbox)
				if status != http.StatusOK && status != http.StatusNoContent || body != tc.want {
					t.Fatalf("request %d: %d %q, want %q", i, status, body, tc.want)
				}
			}
			conns := u.snapshot()
			if got := len(conns) == 1; got != tc.reuse {
				t.Fatalf("%d upstream connections for 2 requests; reuse %v, want %v", len(conns), got, tc.reuse)
			}
			for i, c := range conns {
				if len(c.callers) == 2 && c.callers[0] != c.callers[1] {
					t.Fatalf("upstream connection %d carried two callers' requests: %v", i, c.callers)
				}
			}
			if !tc.reuse && tc.second == agentA {
				u.waitEnded(t, 0) // the gateway closed the one it did not reuse
			}
		})
	}
}

// TestUpstreamMalformedResponse: a response whose framing is ambiguous or
// broken is never relayed: the client gets a 502 upstream_error with
// Proxy-Status http_protocol_error, the refusal is audited, and the
// upstream connection is closed rather than pooled (THREATS F1-F4: the
// next request must not read the rest of it as its answer).
func TestUpstreamMalformedResponse(t *testing.T) {
	tests := []struct {
		name, answer string
	}{
		{"Content-Length and Transfer-Encoding", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
		{"two identical Content-Lengths", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"},
		{"conflicting Content-Lengths", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 4\r\n\r\nhello"},
		{"signed Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"},
		{"Transfer-Encoding gzip, chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"},
		{"two Transfer-Encodings", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"},
		{"chunk longer than its size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n"},
		{"bare LF in a chunk line", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"},
		{"bare LF in the head", "HTTP/1.1 200 OK\nContent-Length: 5\r\n\r\nhello"},
		{"obs-fold", "HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 5\r\n\r\nhello"},
		{"space before the colon", "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello"},
		{"control byte in a value", "HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 5\r\n\r\nhello"},
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n"},
		{"HTTP/2 status line", "HTTP/2 200\r\n\r\n"},
		{"unasked 101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"},
		{"body shorter than its Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhello"},
		{"head over 64 KiB", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\nContent-Length: 5\r\n\r\nhello"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := newRawUpstream(t, func(int, *http.Request) rawAnswer {
				return rawAnswer{raw: tc.answer, close: strings.Contains(tc.name, "shorter")}
			})
			be := rawEgressFor(t, u, 5*time.Second)
			status, body, hdr := getAs(t, be, agentA, "a")
			if status != http.StatusBadGateway || errCode([]byte(body)) != string(refusal.UpstreamError) {
				t.Fatalf("got %d %.200q, want 502 upstream_error", status, body)
			}
			if ps := hdr.Get("Proxy-Status"); ps != "sluice; error="+psProtocol {
				t.Errorf("Proxy-Status %q, want error=%s", ps, psProtocol)
			}
			var eb refusal.Body
			_ = json.Unmarshal([]byte(body), &eb)
			found := false
			for _, r := range auditEvents(t, be.g) {
				if r.RequestID == eb.Error.RequestID && r.Fields["code"] == string(refusal.UpstreamError) && r.Fields["upstream_error"] == "malformed_response" {
					found = true
				}
			}
			if !found {
				t.Errorf("no audit record of request %s with code upstream_error and upstream_error malformed_response", eb.Error.RequestID)
			}
			if !strings.Contains(tc.name, "shorter") {
				u.waitEnded(t, 0)
			}
			// The next request gets a connection of its own and its own answer.
			if got := len(u.snapshot()); got != 1 {
				t.Fatalf("%d upstream connections, want 1", got)
			}
		})
	}
}

// TestUpstreamBodyBrokenMidway: a chunked body that breaks after the
// answer was committed (past the first read) cannot be refused with a
// 502 any more: the client's connection is cut, so it never takes a
// truncated body for a complete one, the result record says why, and the
// upstream connection is closed.
func TestUpstreamBodyBrokenMidway(t *testing.T) {
	big := strings.Repeat("x", 40<<10)
	u := newRawUpstream(t, func(int, *http.Request) rawAnswer {
		return rawAnswer{raw: fmt.Sprintf("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\nzz\r\n", len(big), big)}
	})
	be := rawEgressFor(t, u, 5*time.Second)
	cl := be.viaProxy(t)
	resp, err := cl.Get("http://pkg.example/x")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err == nil {
		t.Fatalf("status %d, body error %v: want 200 and a cut body", resp.StatusCode, err)
	}
	u.waitEnded(t, 0)
	found := false
	for _, r := range auditEvents(t, be.g) {
		if r.Event == "result" && r.Fields["upstream_error"] == "broken_body" && r.Fields["code"] == string(refusal.UpstreamError) {
			found = true
		}
	}
	if !found {
		t.Error("no result record with upstream_error broken_body")
	}
}

// TestUpstreamBodyNotReadToEnd: a client that goes away before the end of
// a body leaves the rest unread on the upstream connection; it is closed,
// never pooled, and the next request gets a fresh one.
func TestUpstreamBodyNotReadToEnd(t *testing.T) {
	big := strings.Repeat("x", 4<<20)
	u := newRawUpstream(t, func(n int, _ *http.Request) rawAnswer {
		return rawAnswer{raw: fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(big), big)}
	})
	be := rawEgressFor(t, u, 5*time.Second)
	c, err := wire.Dial(context.Background(), be.sock, agentA)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET http://pkg.example/x HTTP/1.1\r\nHost: pkg.example\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("response: %v", err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	c.Close() // with most of 4 MiB unread
	u.waitEnded(t, 0)
	if status, body, _ := getAs(t, be, agentA, "a"); status != http.StatusOK || len(body) != len(big) {
		t.Fatalf("next request: %d, %d bytes", status, len(body))
	}
	if got := len(u.snapshot()); got != 2 {
		t.Fatalf("%d upstream connections, want 2 (the cut one was not reused)", got)
	}
}

// TestUpstreamHeaderTimeout: an upstream that never answers gets the
// response-header timeout: 502 with Proxy-Status http_response_timeout,
// an audit record, and the connection closed.
func TestUpstreamHeaderTimeout(t *testing.T) {
	u := newRawUpstream(t, func(int, *http.Request) rawAnswer { return rawAnswer{hang: true} })
	be := rawEgressFor(t, u, 300*time.Millisecond)
	start := time.Now()
	status, body, hdr := getAs(t, be, agentA, "a")
	took := time.Since(start)
	if status != http.StatusBadGateway || errCode([]byte(body)) != string(refusal.UpstreamError) || hdr.Get("Proxy-Status") != "sluice; error="+psTimeout {
		t.Fatalf("got %d %q %q, want 502 upstream_error with error=%s", status, body, hdr.Get("Proxy-Status"), psTimeout)
	}
	if took < 300*time.Millisecond || took > 5*time.Second {
		t.Errorf("answered after %v, want the 300ms timeout", took)
	}
	u.waitEnded(t, 0)
	found := false
	for _, r := range auditEvents(t, be.g) {
		if r.Event == "decision" && r.Fields["code"] == string(refusal.UpstreamError) && r.Fields["upstream_error"] == "response_timeout" {
			found = true
		}
	}
	if !found {
		t.Error("no audit record with code upstream_error and upstream_error response_timeout")
	}
}

// TestUpstreamStaleConnectionRetried: an idle connection the upstream
// closed is not used; one it closes on the next request without an answer
// is retried once on a fresh connection for a replayable request (GET),
// and refused for one that is not (a POST with a body).
func TestUpstreamStaleConnectionRetried(t *testing.T) {
	tests := []struct {
		name   string
		answer func(n int, req *http.Request) rawAnswer
		method string
		want   int
	}{
		{"closed while idle", func(int, *http.Request) rawAnswer {
			return rawAnswer{raw: okAnswer, close: true} // no Connection: close said
		}, http.MethodGet, http.StatusOK},
		{"closed on the next request, GET", func(n int, _ *http.Request) rawAnswer {
			if n == 1 {
				return rawAnswer{close: true}
			}
			return rawAnswer{raw: okAnswer}
		}, http.MethodGet, http.StatusOK},
		{"closed on the next request, POST", func(n int, _ *http.Request) rawAnswer {
			if n == 1 {
				return rawAnswer{close: true}
			}
			return rawAnswer{raw: okAnswer}
		}, http.MethodPost, http.StatusBadGateway},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := newRawUpstream(t, tc.answer)
			be := rawEgressFor(t, u, 5*time.Second)
			if status, _, _ := getAs(t, be, agentA, "a"); status != http.StatusOK {
				t.Fatalf("first request: %d", status)
			}
			time.Sleep(50 * time.Millisecond) // the upstream's close arrives
			cl := be.viaProxy(t)
			req, _ := http.NewRequest(tc.method, "http://pkg.example/x", strings.NewReader("body"))
			if tc.method == http.MethodGet {
				req.Body, req.ContentLength = nil, 0
			}
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("second request: %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// TestUpstreamPoolShutdown: after the pool is closed (the server stopping),
// an idle connection is closed and one in use is closed when its exchange
// ends, not pooled.
func TestUpstreamPoolShutdown(t *testing.T) {
	release := make(chan struct{})
	u := newRawUpstream(t, func(n int, _ *http.Request) rawAnswer {
		if n == 0 {
			return rawAnswer{raw: okAnswer}
		}
		<-release
		return rawAnswer{raw: okAnswer}
	})
	be := rawEgressFor(t, u, 5*time.Second)
	if status, _, _ := getAs(t, be, agentA, "a"); status != http.StatusOK {
		t.Fatal(status)
	}
	// The second request, on the idle connection, is in flight while the
	// pool closes.
	done := make(chan int)
	go func() {
		status, _, _ := getAs(t, be, agentA, "a")
		done <- status
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(u.snapshot()[0].callers) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	be.eg.upstreams.closeIdle()
	close(release)
	if status := <-done; status != http.StatusOK {
		t.Fatalf("request in flight at the close: %d", status)
	}
	u.waitEnded(t, 0)
	if _, err := be.eg.upstreams.get(context.Background(), policy.Caller{Sandbox: agentA.Sandbox, Agent: agentA.Agent, Session: agentA.Session, User: agentA.User}, "pkg.example:80"); !errors.Is(err, errPoolClosed) {
		t.Fatalf("get after close: %v, want errPoolClosed", err)
	}
}

// FuzzResponseFraming holds the upstream response reader (readFinalHead
// and upBody) to Go's http.ReadResponse: whatever it accepts, Go accepts
// too, with the same status and framing, the same body bytes, and the
// same bytes left after the body (so the two never disagree on where the
// next response starts). It may refuse more than Go does (that is its
// point), never less.
func FuzzResponseFraming(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloNEXT")                                    // a Content-Length body, then the next response
	f.Add("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nT: 1\r\n\r\nNEXT") // chunked with a trailer
	f.Add("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")                             // 1xx then a final response without a body
	f.Add("HTTP/1.0 200 OK\r\n\r\nuntil the close")                                                   // a body delimited by the close
	f.Add("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")      // CL and TE: refused
	f.Add("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello")                   // repeated Content-Length: refused
	f.Add("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\n\r\n")         // a chunk extension
	f.Add("HTTP/1.1 304 Not Modified\r\nContent-Length: 20\r\n\r\nNEXT")                              // 304: no body whatever the length says
	f.Add("HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n")                               // obs-fold: refused
	f.Fuzz(func(t *testing.T, data string) {
		pool := newUpstreamPool(upstreamOptions{idle: time.Minute, maxIdlePerHost: 1, maxIdlePerCaller: 1})
		c1, c2 := net.Pipe()
		defer c2.Close()
		pc := &upConn{conn: c1, br: bufio.NewReader(strings.NewReader(data))}
		h, err := readFinalHead(pc.br, http.MethodGet)
		if err != nil {
			return
		}
		b := &upBody{p: pool, pc: pc, stop: func() bool { return true }, mode: h.mode, remain: h.length}
		if h.mode == bodyChunked {
			b.chunks = httputil.NewChunkedReader(pc.br)
		}
		ours, err := io.ReadAll(b)
		if err != nil {
			return
		}
		oursRest, _ := io.ReadAll(pc.br)

		gbr := bufio.NewReader(strings.NewReader(data))
		req, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
		var resp *http.Response
		for {
			resp, err = http.ReadResponse(gbr, req)
			if err != nil {
				t.Fatalf("accepted %q, which Go refuses: %v", data, err)
			}
			if resp.StatusCode >= 200 || resp.StatusCode == 101 {
				break
			}
		}
		if resp.StatusCode != h.status {
			t.Fatalf("%q: status %d, Go %d", data, h.status, resp.StatusCode)
		}
		goBody, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%q: body accepted, Go: %v", data, err)
		}
		goRest, _ := io.ReadAll(gbr)
		if string(ours) != string(goBody) || string(oursRest) != string(goRest) {
			t.Fatalf("%q: body %q rest %q; Go: body %q rest %q", data, ours, oursRest, goBody, goRest)
		}
	})
}

// TestUpstreamRequestBody: a request body reaches the upstream whole, with
// a Content-Length or chunked as the client sent it, and the connection
// is reused after the answer.
func TestUpstreamRequestBody(t *testing.T) {
	u := newRawUpstream(t, func(int, *http.Request) rawAnswer { return rawAnswer{raw: okAnswer} })
	be := rawEgressFor(t, u, 5*time.Second)
	const size = 300 << 10 // more than the socket buffers take at once
	for _, tc := range []struct {
		name    string
		chunked bool
	}{{"content-length", false}, {"chunked", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cl := be.viaProxy(t)
			defer cl.CloseIdleConnections()
			var body io.Reader = strings.NewReader(strings.Repeat("b", size))
			if tc.chunked {
				body = io.MultiReader(body) // no length known: sent chunked
			}
			req, _ := http.NewRequest(http.MethodPost, "http://pkg.example/upload", body)
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(got) != "hello" {
				t.Fatalf("%d %q", resp.StatusCode, got)
			}
		})
	}
	conns := u.snapshot()
	if len(conns) != 1 || len(conns[0].bodies) != 2 || conns[0].bodies[0] != size || conns[0].bodies[1] != size {
		t.Fatalf("upstream connections %d, bodies %v; want one connection with two bodies of %d", len(conns), conns[0].bodies, size)
	}
}

// TestProxyUpstreamStatusRecorded: a proxied request the upstream refuses
// (401) has the upstream's status in its result record, its egress line
// and the upstream answers the gateway counts (sluice_upstream_responses_total{path="proxy",class="4xx"}), as a tool
// call's has (THREATS G11).
func TestProxyUpstreamStatusRecorded(t *testing.T) {
	u := newRawUpstream(t, func(int, *http.Request) rawAnswer {
		return rawAnswer{raw: "HTTP/1.1 401 Unauthorized\r\nContent-Length: 3\r\n\r\nno!"}
	})
	be := rawEgressFor(t, u, 5*time.Second)
	status, body, _ := getAs(t, be, agentA, agentA.Sandbox)
	if status != http.StatusUnauthorized || body != "no!" {
		t.Fatalf("GET: %d %q, want the upstream's 401 relayed", status, body)
	}
	var res map[string]any
	deadline := time.Now().Add(5 * time.Second)
	for res == nil && time.Now().Before(deadline) {
		for _, r := range auditEvents(t, be.g) {
			if r.Event == "result" && r.Fields["kind"] == "http" {
				res = r.Fields
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fmt.Sprint(res["status"]) != "401" || fmt.Sprint(res["upstream_status"]) != "401" {
		t.Errorf("result record %v: want status 401 and upstream_status 401", res)
	}
	var line map[string]any
	for l := range strings.Lines(be.g.logBuf.String()) {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "egress" && m["status"] == float64(401) {
			line = m
		}
	}
	if line == nil || line["upstream_status"] != float64(401) {
		t.Errorf("egress line %v: want upstream_status 401", line)
	}
	// What the gateway counts as
	// sluice_upstream_responses_total{path="proxy",class="4xx"}.
	be.g.mu.Lock()
	answered := slices.Clone(be.g.answered)
	be.g.mu.Unlock()
	if want := (upstreamAnswer{"", "proxy", 401}); len(answered) != 1 || answered[0] != want {
		t.Errorf("upstream answers reported %v, want [%v]", answered, want)
	}
}

// TestResponseHeadFields: the response head's fields come out as Go's
// header map would hold them — canonical keys whatever the spelling,
// repeated fields in order, past the shared values' first eight — and
// growing one field's values leaves the others alone.
func TestResponseHeadFields(t *testing.T) {
	var head strings.Builder
	head.WriteString("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nDate: d\r\nSet-Cookie: a=1\r\nX-One: 1\r\nSet-Cookie: b=2\r\n")
	want := http.Header{"Content-Type": {"text/plain"}, "Date": {"d"}, "Set-Cookie": {"a=1", "b=2", "c=3"}, "X-One": {"1"}}
	for i := range 10 {
		k := fmt.Sprintf("X-F%d", i)
		fmt.Fprintf(&head, "%s: v%d\r\n", strings.ToLower(k), i)
		want[k] = []string{fmt.Sprintf("v%d", i)}
	}
	head.WriteString("Set-Cookie: c=3\r\nContent-Length: 0\r\n\r\n")
	want["Content-Length"] = []string{"0"}
	budget := maxResponseHead
	h, err := readResponseHead(bufio.NewReader(strings.NewReader(head.String())), http.MethodGet, &budget, true)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h.header, want) {
		t.Fatalf("header\n got %v\nwant %v", h.header, want)
	}
	h.header["Date"] = append(h.header["Date"], "e")
	h.header.Add("X-One", "2")
	if got := h.header["Content-Type"]; len(got) != 1 || got[0] != "text/plain" {
		t.Fatalf("Content-Type became %q after other fields grew", got)
	}
	if got := h.header["Set-Cookie"]; !slices.Equal(got, []string{"a=1", "b=2", "c=3"}) {
		t.Fatalf("Set-Cookie became %q after other fields grew", got)
	}
}
