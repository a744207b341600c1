package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

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
	up := egresstest.NewDNSUpstream(t, map[string]string{"pkg.example": "93.184.216.34"})
	g := startEgressGateway(t, up, nil)
	upstream := newCountingUpstream(t)
	// The proxy as Serve wires it, but its guarded dialer connects every
	// admitted public address to the loopback upstream.
	closers := len(g.stop.closers)
	eg := g.newProxy()
	if len(g.stop.closers) != closers+2 {
		t.Fatalf("New registered %d closers, want 2 (its upstream pool and its live tunnels)", len(g.stop.closers)-closers)
	}
	eg.dialer = guard.New(guard.Options{Resolver: eg.res, DialFunc: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, upstream.Listener.Addr().String())
	}})
	sock := filepath.Join(g.dir, "proxy.sock")
	sl, err := ingress.Listen(ingress.Options{Socket: sock, TrustedUIDs: g.cfg.Gateway.TrustedRelayUIDs, Log: g.log})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(eg.ServeProxy), ConnContext: ingress.ConnContext}
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
