package guard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// directTo is a Direct whose dials are counted, for a loopback upstream.
func directTo(t *testing.T, allow []netip.Prefix) (*Direct, *atomic.Int32) {
	t.Helper()
	var dials atomic.Int32
	d := New(Options{OnDial: func(string, netip.AddrPort) { dials.Add(1) }})
	dt := NewDirect(d, allow, Transport(d, allow, 5*time.Second, 4))
	t.Cleanup(dt.CloseIdleConnections)
	return dt, &dials
}

// countingServer starts a loopback server for h that counts its
// connections reaching state.
func countingServer(t *testing.T, h http.HandlerFunc, state http.ConnState) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == state {
			n.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &n
}

func post(t *testing.T, rt http.RoundTripper, ctx context.Context, url, body string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(b), nil
}

// TestDirectKeepsConnectionsAndPeeksBeforeReuse: calls reuse one
// connection (one dial, one connection at the server); a connection the
// server closed while it was idle is found closed by the peek and a new
// one is dialled, so a POST (which no client may resend) still succeeds.
func TestDirectKeepsConnectionsAndPeeksBeforeReuse(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"got":"`+string(b)+`"}`)
	}, http.StateNew)
	dt, dials := directTo(t, loopback)

	var reused []bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }})
	for i := range 5 {
		resp, body, err := post(t, dt, ctx, srv.URL+"/x", "a")
		if err != nil || resp.StatusCode != 200 || body != `{"got":"a"}` {
			t.Fatalf("call %d: %v %v %q", i, err, resp, body)
		}
	}
	if dials.Load() != 1 || conns.Load() != 1 {
		t.Fatalf("5 calls made %d dials and %d server connections, want 1 each (kept alive)", dials.Load(), conns.Load())
	}
	if want := []bool{false, true, true, true, true}; !equalBools(reused, want) {
		t.Fatalf("GotConn reused = %v, want %v", reused, want)
	}

	srv.CloseClientConnections() // the server closes the idle connection
	time.Sleep(50 * time.Millisecond)
	resp, body, err := post(t, dt, context.Background(), srv.URL+"/x", "b")
	if err != nil || resp.StatusCode != 200 || body != `{"got":"b"}` {
		t.Fatalf("call after the server closed the idle connection: %v %v %q", err, resp, body)
	}
	if dials.Load() != 2 {
		t.Fatalf("%d dials, want 2: the closed connection was not noticed before reuse", dials.Load())
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDirectDialsThroughTheGuard: a destination the guard refuses is
// never connected to, and the refusal is the guard's DeniedError.
func TestDirectDialsThroughTheGuard(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the upstream was reached")
	}))
	defer srv.Close()
	dt, dials := directTo(t, nil) // loopback not allowed
	_, _, err := post(t, dt, context.Background(), srv.URL+"/x", "a")
	var de *DeniedError
	if !errors.As(err, &de) {
		t.Fatalf("err = %v, want a *DeniedError", err)
	}
	if dials.Load() != 0 {
		t.Fatalf("%d dials, want none", dials.Load())
	}
}

// TestDirectBoundsTheExchange: the context's deadline and its end bound
// an upstream that never answers; an answer's head larger than the
// transport's bound is refused; a connection left that way is not kept.
func TestDirectBoundsTheExchange(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hang":
			<-release
		case "/bighead":
			w.Header().Set("X-Big", strings.Repeat("a", 70<<10))
		case "/early":
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, "final")
		}
	}))
	defer srv.Close()
	defer close(release)
	dt, _ := directTo(t, loopback)
	dt.maxHead = 64 << 10

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, _, err := post(t, dt, ctx, srv.URL+"/hang", "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung upstream: err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("hung upstream held the call %s", d)
	}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, _, err := post(t, dt, ctx, srv.URL+"/hang", "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call: err = %v, want context.Canceled", err)
	}

	if _, _, err := post(t, dt, context.Background(), srv.URL+"/bighead", "a"); !errors.Is(err, errHeadTooLarge) {
		t.Fatalf("70 KiB head: err = %v, want errHeadTooLarge", err)
	}

	resp, body, err := post(t, dt, context.Background(), srv.URL+"/early", "a")
	if err != nil || resp.StatusCode != 200 || body != "final" {
		t.Fatalf("103 then 200: %v %v %q", err, resp, body)
	}
}

// TestDirectLeavesHTTPSToTheTransport: an https request goes to the
// wrapped transport, which negotiates HTTP/2 as before.
func TestDirectLeavesHTTPSToTheTransport(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto) }))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	dt, dials := directTo(t, loopback)
	dt.Transport.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	resp, body, err := post(t, dt, context.Background(), srv.URL+"/x", "a")
	if err != nil || resp.StatusCode != 200 || body != "HTTP/2.0" {
		t.Fatalf("https: %v %v %q, want 200 over HTTP/2.0", err, resp, body)
	}
	if dials.Load() != 1 {
		t.Fatalf("%d guarded dials, want 1", dials.Load())
	}
}

// TestDirectNeverReusesAConnectionWithStrayBytes (THREATS F22): an
// upstream that sends a second, unasked-for response (with its answer,
// or later on the idle connection) would have the next call on that
// connection, possibly another sandbox's, read the answer it chose. The
// connection is closed at the answer's end when bytes follow it, and
// refused by the idle peek when they come later; the next call dials
// anew and reads its own answer.
func TestDirectNeverReusesAConnectionWithStrayBytes(t *testing.T) {
	const smuggled = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"
	for _, tc := range []struct {
		name  string
		later bool // the stray response comes while the connection is idle
	}{{"with the answer", false}, {"while idle", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var accepted *atomic.Int32
			srv, accepted := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				c, bw, err := w.(http.Hijacker).Hijack() // the raw bytes of a hostile upstream
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n%c", 'A'+accepted.Load()-1)
				if tc.later {
					bw.Flush()
					time.Sleep(30 * time.Millisecond)
				}
				bw.WriteString(smuggled)
				bw.Flush()
				time.Sleep(time.Second) // open: only the client can refuse the connection
			}, http.StateNew)
			dt, dials := directTo(t, loopback)
			url := srv.URL + "/x"
			if _, body, err := post(t, dt, context.Background(), url, "1"); err != nil || body != "A" {
				t.Fatalf("first call: %v %q", err, body)
			}
			time.Sleep(80 * time.Millisecond)
			_, body, err := post(t, dt, context.Background(), url, "2")
			if err != nil || body != "B" {
				t.Fatalf("second call read %q (%v), want its own answer B", body, err)
			}
			if dials.Load() != 2 || accepted.Load() != 2 {
				t.Fatalf("%d dials, %d connections: the connection with stray bytes was reused", dials.Load(), accepted.Load())
			}
		})
	}
}

// TestDirectClosesIdleConnections: a kept connection is closed once it
// has waited idleFor with no call, as the transport closes its idle
// ones, without another call to notice it.
func TestDirectClosesIdleConnections(t *testing.T) {
	srv, closed := countingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }, http.StateClosed)
	dt, _ := directTo(t, loopback)
	dt.idleFor = 50 * time.Millisecond
	if _, body, err := post(t, dt, context.Background(), srv.URL+"/x", "a"); err != nil || body != "ok" {
		t.Fatalf("call: %v %q", err, body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for closed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the idle connection is still open 5s after its 50ms idle time")
		}
		time.Sleep(10 * time.Millisecond)
	}
	dt.mu.Lock()
	kept, armed := len(dt.idle), dt.janitor != nil
	dt.mu.Unlock()
	if kept != 0 || armed {
		t.Fatalf("after the sweep: %d hosts kept, janitor armed %v; want none", kept, armed)
	}
}
