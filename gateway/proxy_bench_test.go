package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// benchEgress is raw egress served on its own sandbox socket, exactly as
// Serve wires it (sandbox listener, strictHeads, the proxy handler), whose
// guarded dialer connects every admitted public address to a loopback
// upstream: pkg.example resolves to a public address, is classified and
// admitted as usual, and only the final connect goes to 127.0.0.1.
type benchEgress struct {
	sock      string
	plain     *httptest.Server // :80 upstream
	tlsServer *httptest.Server // :443 upstream
}

func startBenchEgress(b *testing.B, auditDir string) *benchEgress {
	b.Helper()
	up := newDNSUpstream(b, map[string]string{"pkg.example": "93.184.216.34"})
	g := startEgressGateway(b, up, func(c *config.Config) {
		c.Egress.MaxTunnelsPerCaller = 64
		if auditDir != "" {
			c.Audit.Path = filepath.Join(auditDir, "audit.log")
		}
	})
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello "+r.URL.Path) })
	be := &benchEgress{plain: httptest.NewServer(hello), tlsServer: httptest.NewTLSServer(hello)}
	b.Cleanup(be.plain.Close)
	b.Cleanup(be.tlsServer.Close)
	eg := g.Server.newRawEgress()
	eg.dialer = guard.New(guard.Options{Resolver: eg.res, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, _ := net.SplitHostPort(addr)
		to := be.plain.Listener.Addr().String()
		if port == "443" {
			to = be.tlsServer.Listener.Addr().String()
		}
		return (&net.Dialer{}).DialContext(ctx, network, to)
	}})
	be.sock = filepath.Join(g.dir, "bench.sock")
	sl, err := listenSandbox(be.sock, g.cfg.Gateway.TrustedRelayUIDs, g.log, func(Code) {})
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(eg.serveProxy),
		ConnContext:       connContext,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	go func() { _ = srv.Serve(strictHeads{sl}) }()
	b.Cleanup(func() { _ = srv.Close() })
	return be
}

// viaProxy is a keep-alive client that uses the bench socket as its proxy.
func (be *benchEgress) viaProxy(b *testing.B) *http.Client {
	line, err := wire.Encode(agentA)
	if err != nil {
		b.Fatal(err)
	}
	proxyURL, _ := url.Parse("http://sluice-proxy")
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), MaxIdleConnsPerHost: 1,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the httptest certificate names example.com
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "unix", be.sock)
			if err == nil {
				_, err = c.Write(line)
			}
			return c, err
		},
	}}
}

// relay is a keep-alive client whose proxy is a bare CONNECT relay on a
// Unix socket: it reads the CONNECT head, answers 200 and copies bytes both
// ways to the TLS upstream, with no identity, policy, audit or checks. It
// has the tunnel's hops and nothing else: the floor for any CONNECT proxy.
func (be *benchEgress) relay(b *testing.B) *http.Client {
	sock := filepath.Join(b.TempDir(), "relay.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				up, err := net.Dial("tcp", be.tlsServer.Listener.Addr().String())
				if err != nil {
					return
				}
				defer up.Close()
				_, _ = io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n")
				go func() { _, _ = io.Copy(up, br) }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	proxyURL, _ := url.Parse("http://relay")
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), MaxIdleConnsPerHost: 1,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
}

// direct is a keep-alive client that dials the upstreams itself.
func (be *benchEgress) direct() *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 1,
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true, ServerName: "pkg.example"},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			to := be.plain.Listener.Addr().String()
			if _, port, _ := net.SplitHostPort(addr); port == "443" {
				to = be.tlsServer.Listener.Addr().String()
			}
			return (&net.Dialer{}).DialContext(ctx, network, to)
		},
	}}
}

// BenchmarkEgress compares keep-alive requests through the forward proxy
// (plain HTTP, each request decided and audited) and inside one CONNECT
// tunnel (HTTPS, spliced) with the same requests sent directly, in the
// same run. The tunnel's upstream is dialled once; every later request is
// only bytes through the splice.
//
// "http/proxy-audit-tmpfs" keeps the audit log on /dev/shm, where fsync is
// nearly free: the difference to "http/proxy" is the time a request waits
// for the audit writer's fsyncs.
func BenchmarkEgress(b *testing.B) {
	be := startBenchEgress(b, "")
	shm := be
	if dir, err := os.MkdirTemp("/dev/shm", "sluice-bench-"); err == nil {
		b.Cleanup(func() { os.RemoveAll(dir) })
		shm = startBenchEgress(b, dir)
	}
	get := func(b *testing.B, c *http.Client, u string) {
		b.Helper()
		resp, err := c.Get(u)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "hello /x" {
			b.Fatalf("%s: %d %q", u, resp.StatusCode, body)
		}
	}
	for _, tc := range []struct {
		name, url string
		client    func(*testing.B) *http.Client
	}{
		{"http/direct", "http://pkg.example/x", func(*testing.B) *http.Client { return be.direct() }},
		{"http/proxy", "http://pkg.example/x", be.viaProxy},
		{"http/proxy-audit-tmpfs", "http://pkg.example/x", shm.viaProxy},
		{"connect/direct", "https://pkg.example/x", func(*testing.B) *http.Client { return be.direct() }},
		{"connect/tunnel", "https://pkg.example/x", be.viaProxy},
		{"connect/bare-relay", "https://pkg.example/x", be.relay},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := tc.client(b)
			get(b, c, tc.url) // dial, CONNECT and handshake outside the timing
			b.ResetTimer()
			for range b.N {
				get(b, c, tc.url)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.StopTimer()
			c.CloseIdleConnections()
		})
	}
}
