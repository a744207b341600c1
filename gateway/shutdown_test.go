package gateway

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// slowDNSUpstream is a real miekg/dns server on 127.0.0.1:0 that answers
// every A question with 93.184.216.34 after delay, counting the questions
// it received.
type slowDNSUpstream struct {
	addr  string
	asked atomic.Int64
}

func newSlowDNSUpstream(t testing.TB, delay time.Duration) *slowDNSUpstream {
	t.Helper()
	u := &slowDNSUpstream{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, q *mdns.Msg) {
		u.asked.Add(1)
		if strings.HasPrefix(q.Question[0].Name, "slow.") {
			time.Sleep(delay)
		}
		m := new(mdns.Msg)
		m.SetReply(q)
		rr, _ := mdns.NewRR(q.Question[0].Name + " 0 IN A 93.184.216.34")
		m.Answer = append(m.Answer, rr)
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u
}

// rawDNSStream opens a DNSStreamType request on a raw sandbox connection
// and returns the connection and the response whose body carries answers.
func rawDNSStream(t *testing.T, g *testGateway) (net.Conn, *http.Response) {
	t.Helper()
	c := rawConn(t, g, agentA)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	head := "POST /v1/dns HTTP/1.1\r\nHost: sluice\r\nContent-Type: " + DNSStreamType + "\r\nTransfer-Encoding: chunked\r\n\r\n"
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("stream head: %v", err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != DNSStreamType {
		t.Fatalf("stream refused: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return c, resp
}

// sendQuestion writes one length-prefixed question as one chunk.
func sendQuestion(t *testing.T, c net.Conn, id uint16, name string) {
	t.Helper()
	q := new(mdns.Msg)
	q.SetQuestion(name, mdns.TypeA)
	q.Id = id
	raw, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	frame := binary.BigEndian.AppendUint16(nil, uint16(len(raw)))
	frame = append(frame, raw...)
	if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(frame), frame); err != nil {
		t.Fatal(err)
	}
}

// readAnswer reads one length-prefixed answer off a stream's body.
func readAnswer(body io.Reader) (*mdns.Msg, error) {
	var l [2]byte
	if _, err := io.ReadFull(body, l[:]); err != nil {
		return nil, err
	}
	buf := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(body, buf); err != nil {
		return nil, err
	}
	m := new(mdns.Msg)
	return m, m.Unpack(buf)
}

// shutdown ends g's Serve as SIGTERM does (its context) and returns how
// long Serve took to return. It puts Serve's result back for the cleanup.
func shutdown(t *testing.T, g *testGateway, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	g.cancel()
	select {
	case err := <-g.done:
		g.done <- err
		if err != nil {
			t.Errorf("serve: %v", err)
		}
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("serve did not return within %v of shutdown", limit)
		return 0
	}
}

// TestShutdownEndsDNSStreams: a graceful shutdown ends the long-lived DNS
// streams of the sandboxes' stubs promptly. Before, Serve waited its whole
// 10s grace for an open stream and returned with the stream still open
// (it ended only at the stream's 2-minute idle time). Now a question in
// flight is still answered, the chunked body ends cleanly (the stub sees
// EOF, not a cut connection, and dials again) and Serve returns as soon as
// the answers in flight are written.
func TestShutdownEndsDNSStreams(t *testing.T) {
	tests := []struct {
		name     string
		inflight bool          // a question the upstream answers after 500ms is in flight at shutdown
		limit    time.Duration // Serve returns within this of the shutdown
	}{
		{"idle stream", false, time.Second},
		{"question in flight is answered first", true, 3 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newSlowDNSUpstream(t, 500*time.Millisecond)
			g := startEgressGateway(t, &dnsUpstream{addr: up.addr}, nil)
			c, resp := rawDNSStream(t, g)
			defer c.Close()
			body := bufio.NewReader(resp.Body)
			sendQuestion(t, c, 1, "a.allowed.test.")
			if m, err := readAnswer(body); err != nil || m.Id != 1 || m.Rcode != mdns.RcodeSuccess {
				t.Fatalf("answer before the shutdown: %v %v", m, err)
			}
			if tc.inflight {
				sendQuestion(t, c, 2, "slow.allowed.test.")
				for deadline := time.Now().Add(5 * time.Second); up.asked.Load() < 2; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the upstream never saw the slow question")
					}
				}
			}
			took := shutdown(t, g, 30*time.Second)
			t.Logf("serve returned %v after the shutdown began", took)
			if took > tc.limit {
				t.Errorf("serve returned %v after the shutdown began, want < %v", took, tc.limit)
			}
			if tc.inflight {
				if m, err := readAnswer(body); err != nil || m.Id != 2 || m.Rcode != mdns.RcodeSuccess {
					t.Fatalf("the question in flight at shutdown: %v %v, want its answer", m, err)
				}
			}
			if _, err := readAnswer(body); !errors.Is(err, io.EOF) {
				t.Fatalf("after the last answer: %v, want io.EOF (a clean end of the chunked body)", err)
			}
		})
	}
}

// TestShutdownStubStreams: the real stub's two streams end at shutdown;
// Serve does not wait for them, and the stub's next question is answered
// at once (not a success: the gateway is gone) instead of hanging.
func TestShutdownStubStreams(t *testing.T) {
	up := newSlowDNSUpstream(t, 0)
	g := startEgressGateway(t, &dnsUpstream{addr: up.addr}, nil)
	fa := streamForwarder(g, agentA)
	t.Cleanup(func() { fa.Close() })
	stub := &dns.Stub{Forward: fa.Forward}
	for i := range 2 { // the forwarder takes its two streams in turn: both open
		if m := stubAsk(t, stub, fmt.Sprintf("q%d.allowed.test.", i), mdns.TypeA); m.Rcode != mdns.RcodeSuccess {
			t.Fatalf("question %d before the shutdown: %s", i, mdns.RcodeToString[m.Rcode])
		}
	}
	if took := shutdown(t, g, 30*time.Second); took > time.Second {
		t.Errorf("serve returned %v after the shutdown began, want < 1s", took)
	}
	start := time.Now()
	m := stubAsk(t, stub, "after.allowed.test.", mdns.TypeA)
	if m.Rcode == mdns.RcodeSuccess {
		t.Errorf("a question after the shutdown was answered NOERROR")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a question after the shutdown took %v, want < 2s", took)
	}
}

// countingUpstream is an httptest upstream that counts its open
// connections.
type countingUpstream struct {
	*httptest.Server
	open atomic.Int64
}

func newCountingUpstream(t *testing.T) *countingUpstream {
	t.Helper()
	u := &countingUpstream{}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello")
	}))
	u.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			u.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			u.open.Add(-1)
		}
	}
	u.Start()
	t.Cleanup(u.Close)
	return u
}

// waitOpen waits up to 2s for u to have want open connections.
func (u *countingUpstream) waitOpen(want int64) int64 {
	deadline := time.Now().Add(2 * time.Second)
	for u.open.Load() != want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return u.open.Load()
}

// TestShutdownClosesIdleUpstreamConnections: the per-caller transports of
// the forward proxy (egress_transport.go) keep upstream connections idle
// for reuse; when Serve stops they are closed, not left open until their
// 90s idle time. Before, every one stayed open.
func TestShutdownClosesIdleUpstreamConnections(t *testing.T) {
	up := newDNSUpstream(t, map[string]string{"pkg.example": "93.184.216.34"})
	g := startEgressGateway(t, up, nil)
	upstream := newCountingUpstream(t)
	// The proxy as Serve wires it, but its guarded dialer connects every
	// admitted public address to the loopback upstream.
	closers := len(g.Server.stop.closers)
	eg := g.Server.newRawEgress()
	if len(g.Server.stop.closers) != closers+2 {
		t.Fatalf("newRawEgress registered %d closers, want 2 (its upstream pool and its live tunnels)", len(g.Server.stop.closers)-closers)
	}
	eg.dialer = guard.New(guard.Options{Resolver: eg.res, DialFunc: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, upstream.Listener.Addr().String())
	}})
	sock := filepath.Join(g.dir, "proxy.sock")
	sl, err := ingress.Listen(ingress.Options{Socket: sock, TrustedUIDs: g.cfg.Gateway.TrustedRelayUIDs, Log: g.log})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(eg.serveProxy), ConnContext: ingress.ConnContext}
	go func() { _ = srv.Serve(ingress.StrictHeads(sl)) }()
	t.Cleanup(func() { _ = srv.Close() })
	callers := []wire.Identity{agentA, {Sandbox: "sb-2", Agent: "agent-a", Session: "s-2", User: "alice"}}
	for _, id := range callers {
		proxyURL, _ := url.Parse("http://sluice-proxy")
		cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, sock, id)
		}}}
		resp, err := cl.Get("http://pkg.example/x")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cl.CloseIdleConnections()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", id.Sandbox, resp.StatusCode)
		}
	}
	if n := upstream.waitOpen(int64(len(callers))); n != int64(len(callers)) {
		t.Fatalf("%d upstream connections open before the shutdown, want %d (one idle per caller)", n, len(callers))
	}
	shutdown(t, g, 30*time.Second)
	if n := upstream.waitOpen(0); n != 0 {
		t.Errorf("%d upstream connections still open after the shutdown, want 0", n)
	}
}

// TestStopHooks: a hook registered before the shutdown runs once when it
// begins, one registered after runs at once, and one unregistered first
// never runs; closers run at every closeAll.
func TestStopHooks(t *testing.T) {
	var h stopHooks
	var before, gone, after, closed int
	h.onStop(func() { before++ })
	h.onStop(func() { gone++ })()
	h.atClose(func() { closed++ })
	h.begin()
	h.begin()
	h.onStop(func() { after++ })()
	h.closeAll()
	h.closeAll()
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"registered before the shutdown", before, 1},
		{"unregistered before the shutdown", gone, 0},
		{"registered after the shutdown began", after, 1},
		{"closer, run by each closeAll", closed, 2},
	} {
		if c.got != c.want {
			t.Errorf("%s: ran %d times, want %d", c.name, c.got, c.want)
		}
	}
}

// TestShutdownEndsTunnels: a CONNECT tunnel is a hijacked connection, so
// http.Server.Shutdown neither waits for it nor ends it. Before, Serve
// returned with the tunnel still open and the process exit then cut it
// with no result record. Now the stopping server ends each open tunnel
// (socket to socket and copy loop alike) and its result record, with the
// bytes it carried, is written before Serve returns.
func TestShutdownEndsTunnels(t *testing.T) {
	for _, tc := range tunnelRelays {
		t.Run(tc.name, func(t *testing.T) {
			be := startBenchEgress(t, "", nil)
			be.eg.copyLoop.Store(tc.copyLoop)
			st := openSpliceTunnel(t, be)
			if _, err := st.get("/x"); err != nil {
				t.Fatalf("GET in the tunnel: %v", err)
			}
			if rs := connectResults(t, be.g); len(rs) != 0 {
				t.Fatalf("%d result records while the tunnel is open, want 0", len(rs))
			}
			shutdown(t, be.g, 5*time.Second)
			// The record is already there when Serve has returned.
			rs := connectResults(t, be.g)
			if len(rs) != 1 {
				t.Fatalf("%d CONNECT result records after shutdown, want 1", len(rs))
			}
			if asInt(t, rs[0], "bytes_down") == 0 || asInt(t, rs[0], "bytes_up") == 0 {
				t.Fatalf("result record counts no bytes: %v", rs[0])
			}
			_ = st.raw.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err := st.raw.Read(make([]byte, 1))
			var ne net.Error
			if err == nil || errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the sandbox's end after shutdown: read err = %v, want the tunnel ended", err)
			}
		})
	}
}

// TestLiveTunnelsAfterClose: a tunnel that registers after the server
// began closing has its connections closed at once, so it cannot outlive
// the stop; closeAll waits for registered tunnels' done.
func TestLiveTunnelsAfterClose(t *testing.T) {
	var ts liveTunnels
	a, b := net.Pipe()
	lt := ts.add(a)
	finished := make(chan struct{})
	go func() {
		_, _ = b.Read(make([]byte, 1)) // ends when closeAll closes a
		lt.done()
		close(finished)
	}()
	ts.closeAll()
	select {
	case <-finished:
	default:
		t.Fatal("closeAll returned before the registered tunnel was done")
	}
	c, d := net.Pipe()
	late := ts.add(c)
	defer late.done()
	if _, err := d.Write([]byte("x")); err == nil {
		t.Fatal("a tunnel registered after closeAll is still open")
	}
	u, v := net.Pipe()
	late.dialled(u)
	if _, err := v.Write([]byte("x")); err == nil {
		t.Fatal("an upstream recorded after closeAll is still open")
	}
}
