package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/ingress/ingresstest"
)

// countConn counts the bytes a tunnel's client sent and received.
type countConn struct {
	net.Conn
	r, w atomic.Int64
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.Add(int64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.w.Add(int64(n))
	return n, err
}

// spliceTunnel is one CONNECT tunnel to pkg.example:443 over a handed-off
// TCP connection, with TLS to the upstream inside it.
type spliceTunnel struct {
	raw *net.TCPConn // the sandbox's end
	cc  *countConn   // counts the tunnel's bytes (after the CONNECT exchange)
	tc  *tls.Conn
	br  *bufio.Reader
}

func openSpliceTunnel(t *testing.T, be *benchEgress) *spliceTunnel {
	t.Helper()
	c, err := ingresstest.NewHandoffDialer(t, be.sock, agentA, "tcp").DialContext(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	raw := c.(*net.TCPConn)
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(raw, "CONNECT pkg.example:443 HTTP/1.1\r\nHost: pkg.example:443\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// The gateway sends nothing after the 200 before the ClientHello, so
	// this reader holds no tunnel byte.
	resp, err := http.ReadResponse(bufio.NewReader(raw), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	cc := &countConn{Conn: raw}
	tc := tls.Client(cc, &tls.Config{ServerName: "pkg.example", InsecureSkipVerify: true}) // httptest's certificate
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS in the tunnel: %v", err)
	}
	_ = raw.SetDeadline(time.Time{})
	return &spliceTunnel{raw: raw, cc: cc, tc: tc, br: bufio.NewReader(tc)}
}

// get sends one keep-alive request in the tunnel and returns the body.
func (st *spliceTunnel) get(path string) (string, error) {
	_ = st.raw.SetDeadline(time.Now().Add(10 * time.Second))
	defer st.raw.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(st.tc, "GET %s HTTP/1.1\r\nHost: pkg.example\r\n\r\n", path); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(st.br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return string(b), err
}

// connectResults returns the audit result records of CONNECT tunnels.
func connectResults(t *testing.T, g *testGateway) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, r := range auditEvents(t, g) {
		if r.Event == "result" && r.Fields["kind"] == "connect" {
			out = append(out, r.Fields)
		}
	}
	return out
}

// waitConnectResult waits for the one CONNECT result record.
func waitConnectResult(t *testing.T, g *testGateway) map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rs := connectResults(t, g)
		if len(rs) == 1 {
			return rs[0]
		}
		if len(rs) > 1 || time.Now().After(deadline) {
			t.Fatalf("%d CONNECT result records, want 1", len(rs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// asInt reads an audit field that JSON decoded as a number.
func asInt(t *testing.T, f map[string]any, k string) int64 {
	t.Helper()
	switch v := f[k].(type) {
	case float64:
		return int64(v)
	case int64:
		return v
	case int:
		return int64(v)
	}
	t.Fatalf("audit field %s = %#v, want a number", k, f[k])
	return 0
}

// tunnelRelays are the two ways a CONNECT tunnel is relayed: socket to
// socket (relayTCP) and the copy loop (splice), for tests that run both.
var tunnelRelays = []struct {
	name     string
	copyLoop bool
}{
	{"socket to socket", false},
	{"copy loop", true},
}

// TestEgressSplicedTunnel: a CONNECT tunnel between a handed-off sandbox
// TCP socket and a TCP upstream is relayed socket to socket (relayTCP,
// with 1 MiB reads for the bulk of a download); it
// carries a 1 MiB download and small requests intact, its audit record
// counts exactly the bytes the client sent and received, as the copy
// loop's does, and the bytes buffered above the socket before the splice
// are not lost.
func TestEgressSplicedTunnel(t *testing.T) {
	for _, tc := range tunnelRelays {
		t.Run(tc.name, func(t *testing.T) {
			be := startBenchEgress(t, "", nil)
			be.eg.copyLoop.Store(tc.copyLoop)
			st := openSpliceTunnel(t, be)
			for _, path := range []string{"/x", "/bytes/1048576", "/y"} {
				body, err := st.get(path)
				if err != nil {
					t.Fatalf("GET %s in the tunnel: %v", path, err)
				}
				want := "hello " + path
				if path == "/bytes/1048576" {
					want = strings.Repeat("x", 1<<20)
				}
				if body != want {
					t.Fatalf("GET %s: %d bytes, want %d", path, len(body), len(want))
				}
			}
			// close_notify and FIN; the upstream answers in kind, then EOF.
			if err := st.tc.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			_ = st.raw.CloseWrite()
			_ = st.raw.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, st.cc); err != nil {
				t.Fatalf("tunnel end: %v", err)
			}
			rec := waitConnectResult(t, be.g)
			if up, dn := asInt(t, rec, "bytes_up"), asInt(t, rec, "bytes_down"); up != st.cc.w.Load() || dn != st.cc.r.Load() {
				t.Fatalf("audit bytes_up/down %d/%d, client sent/received %d/%d", up, dn, st.cc.w.Load(), st.cc.r.Load())
			}
			if dn := st.cc.r.Load(); dn < 1<<20 {
				t.Fatalf("client received %d bytes, want at least 1 MiB", dn)
			}
			wantDirect := int64(1)
			if tc.copyLoop {
				wantDirect = 0
			}
			if n := be.eg.direct.Load(); n != wantDirect {
				t.Fatalf("%d tunnels relayed by relayTCP, want %d", n, wantDirect)
			}
			// The 1 MiB answer outruns the client's TLS: the relay's reads
			// fill its buffer, and the kernel takes over the download.
			if n := be.eg.bulk.Load(); !tc.copyLoop && n == 0 {
				t.Fatal("no direction of the 1 MiB download was handed to splice(2)")
			}
		})
	}
}

// TestEgressSplicedTunnelIdle: a tunnel relayed by relayTCP still ends when nothing
// moves for egress.idle_timeout, with its result record; and the sandbox
// listener's own idle watchdog (ingress.DefaultHandoffIdle, shortened here) does not cut
// a tunnel that is moving bytes below ingress.Conn's Read and Write.
func TestEgressSplicedTunnelIdle(t *testing.T) {
	t.Run("idles out per egress.idle_timeout", func(t *testing.T) {
		const idle = 300 * time.Millisecond
		be := startBenchEgress(t, "", func(c *config.Config) { c.Egress.IdleTimeout = config.Duration(idle) })
		st := openSpliceTunnel(t, be)
		if _, err := st.get("/x"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_ = st.raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := st.raw.Read(make([]byte, 1))
		if el := time.Since(start); os.IsTimeout(err) || el < idle-50*time.Millisecond {
			t.Fatalf("idle tunnel: read returned %v after %v, want the gateway to close it after %v", err, el, idle)
		}
		if err == nil {
			t.Fatal("idle tunnel: read data, want the end")
		}
		rec := waitConnectResult(t, be.g)
		if asInt(t, rec, "bytes_down") == 0 || asInt(t, rec, "bytes_up") == 0 {
			t.Fatalf("idle tunnel's record counts no bytes: %v", rec)
		}
		if be.eg.direct.Load() != 1 {
			t.Fatal("the tunnel was not relayed by relayTCP")
		}
	})
	t.Run("an active tunnel outlives egress.idle_timeout", func(t *testing.T) {
		// The copies report nothing until they end: the watchdog must see
		// the bytes moving in the kernel.
		const idle = 300 * time.Millisecond
		be := startBenchEgress(t, "", func(c *config.Config) { c.Egress.IdleTimeout = config.Duration(idle) })
		st := openSpliceTunnel(t, be)
		for i := range 12 { // 1.2s, four idle periods
			time.Sleep(idle / 3)
			if _, err := st.get("/x"); err != nil {
				t.Fatalf("request %d, %v into the tunnel: %v", i, time.Duration(i)*idle/3, err)
			}
		}
		if be.eg.direct.Load() != 1 {
			t.Fatal("the tunnel was not relayed by relayTCP")
		}
	})
	t.Run("an active tunnel outlives the listener watchdog", func(t *testing.T) {
		const listenIdle = 100 * time.Millisecond
		be := startBenchEgressIdle(t, "", func(c *config.Config) { c.Egress.IdleTimeout = config.Duration(10 * time.Second) }, listenIdle)
		st := openSpliceTunnel(t, be)
		// 1.2s of requests, one every 50ms: twelve listener periods in
		// which no Read or Write passes through ingress.Conn.
		for i := range 24 {
			time.Sleep(listenIdle / 2)
			if _, err := st.get("/x"); err != nil {
				t.Fatalf("request %d, %v into the tunnel: %v", i, time.Duration(i)*listenIdle/2, err)
			}
		}
		if rs := connectResults(t, be.g); len(rs) != 0 {
			t.Fatalf("the tunnel ended while active: %v", rs)
		}
		if be.eg.direct.Load() != 1 {
			t.Fatal("the tunnel was not relayed by relayTCP")
		}
		st.raw.Close()
		waitConnectResult(t, be.g) // and it still ends when the client goes
	})
}

// TestRelayTCPBulk: a direction whose reads fill relayTCP's buffer moves
// to the bulk buffers; while its bytes keep arriving the tunnel outlives
// its idle period, every byte is counted, and once they stop it idles out.
func TestRelayTCPBulk(t *testing.T) {
	const idle = 200 * time.Millisecond
	sandbox, gwClient := tcpPair(t)
	gwUp, upstream := tcpPair(t)
	var upN, dnN, bulk atomic.Int64
	done := make(chan struct{})
	go func() { defer close(done); relayTCP(gwClient, gwClient, gwUp, idle, &upN, &dnN, &bulk) }()

	chunk := make([]byte, 64<<10)
	const writes = 16 // 1 MiB over ~1s, five idle periods
	go func() {
		for range writes {
			if _, err := upstream.Write(chunk); err != nil {
				return
			}
			time.Sleep(60 * time.Millisecond)
		}
	}()
	_ = sandbox.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, len(chunk)*writes)
	if _, err := io.ReadFull(sandbox, buf); err != nil {
		t.Fatalf("download through the relay: %v (after %d bytes counted)", err, dnN.Load())
	}
	select {
	case <-done:
		t.Fatal("the relay ended during an active bulk download")
	default:
	}
	if bulk.Load() != 1 {
		t.Fatalf("%d directions moved to the bulk buffers, want the download's 1", bulk.Load())
	}
	start := time.Now()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the relay did not idle out after the download stopped")
	}
	if el := time.Since(start); el < idle/2 {
		t.Fatalf("the relay ended %v after the download, before its idle period %v", el, idle)
	}
	if dnN.Load() != int64(len(buf)) || upN.Load() != 0 {
		t.Fatalf("counted %d down, %d up; want %d, 0", dnN.Load(), upN.Load(), len(buf))
	}
}
