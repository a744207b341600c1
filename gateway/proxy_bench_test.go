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
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
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
	g         *testGateway
	sock      string
	plain     *httptest.Server       // :80 upstream
	tlsServer *httptest.Server       // :443 upstream
	requests  atomic.Int64           // requests the upstreams received
	onRequest atomic.Pointer[func()] // if set, called by the upstreams before they answer

	mu    sync.Mutex
	conns map[string]map[string]bool // upstream connection (client address) → X-Test-Caller values seen on it
}

// startBenchEgress serves raw egress with the audit log in auditDir (the
// test gateway's own directory if empty); edit, if not nil, changes the
// configuration further.
func startBenchEgress(b testing.TB, auditDir string, edit func(*config.Config)) *benchEgress {
	b.Helper()
	up := newDNSUpstream(b, map[string]string{"pkg.example": "93.184.216.34"})
	g := startEgressGateway(b, up, func(c *config.Config) {
		c.Egress.MaxTunnelsPerCaller = 64
		if auditDir != "" {
			c.Audit.Path = filepath.Join(auditDir, "audit.log")
		}
		if edit != nil {
			edit(c)
		}
	})
	be := &benchEgress{g: g, conns: map[string]map[string]bool{}}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		be.requests.Add(1)
		if f := be.onRequest.Load(); f != nil {
			(*f)()
		}
		if c := r.Header.Get("X-Test-Caller"); c != "" {
			be.mu.Lock()
			if be.conns[r.RemoteAddr] == nil {
				be.conns[r.RemoteAddr] = map[string]bool{}
			}
			be.conns[r.RemoteAddr][c] = true
			be.mu.Unlock()
		}
		_, _ = io.WriteString(w, "hello "+r.URL.Path)
	})
	be.plain, be.tlsServer = httptest.NewServer(hello), httptest.NewTLSServer(hello)
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
func (be *benchEgress) viaProxy(b testing.TB) *http.Client { return be.viaProxyAs(b, agentA) }

// viaProxyAs is viaProxy for the caller id.
func (be *benchEgress) viaProxyAs(b testing.TB, id wire.Identity) *http.Client {
	if err := id.Validate(); err != nil {
		b.Fatal(err)
	}
	proxyURL, _ := url.Parse("http://sluice-proxy")
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), MaxIdleConnsPerHost: 1,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the httptest certificate names example.com
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, be.sock, id)
		},
	}}
}

// relay is a keep-alive client whose proxy is a bare CONNECT relay on a
// Unix socket: it reads the CONNECT head, answers 200 and copies bytes both
// ways to the TLS upstream, with no identity, policy, audit or checks. It
// has the tunnel's hops and nothing else: the floor for any CONNECT proxy.
func (be *benchEgress) relay(b testing.TB) *http.Client {
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
// for the audit writer's fsyncs. The "-sync-interval" rows are the same
// with audit.sync: interval (10ms): records written, fsynced in the
// background. "http/proxy-audit-tmpfs-uncached" gives every request a query
// of its own, so each one misses the policy decision cache
// (egress_decisions.go) and is evaluated by Rego: the worst case.
func BenchmarkEgress(b *testing.B) { benchmarkEgress(b, false) }

// BenchmarkEgressParallel is BenchmarkEgress with 8 concurrent clients.
func BenchmarkEgressParallel(b *testing.B) { benchmarkEgress(b, true) }

func benchmarkEgress(b *testing.B, par bool) {
	be := startBenchEgress(b, "", nil)
	shm, shmInterval := be, be
	if dir, err := os.MkdirTemp("/dev/shm", "sluice-bench-"); err == nil {
		b.Cleanup(func() { os.RemoveAll(dir) })
		shm = startBenchEgress(b, dir, nil)
		shmInterval = startBenchEgress(b, filepath.Join(dir, "interval"), func(c *config.Config) {
			c.Audit.Sync, c.Audit.SyncInterval = config.AuditSyncInterval, config.Duration(10*time.Millisecond)
		})
	}
	interval := startBenchEgress(b, "", func(c *config.Config) {
		c.Audit.Sync, c.Audit.SyncInterval = config.AuditSyncInterval, config.Duration(10*time.Millisecond)
	})
	get := func(b *testing.B, c *http.Client, u string) bool {
		b.Helper()
		resp, err := c.Get(u)
		if err != nil {
			b.Error(err) // Error, not Fatal: RunParallel's goroutines call it too
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "hello /x" {
			b.Errorf("%s: %d %q", u, resp.StatusCode, body)
			return false
		}
		return true
	}
	var uniq atomic.Int64
	for _, tc := range []struct {
		name, url string
		client    func(testing.TB) *http.Client
		distinct  bool // a query unique per request: every decision misses the cache
	}{
		{"http/direct", "http://pkg.example/x", func(testing.TB) *http.Client { return be.direct() }, false},
		{"http/proxy", "http://pkg.example/x", be.viaProxy, false},
		{"http/proxy-audit-tmpfs", "http://pkg.example/x", shm.viaProxy, false},
		{"http/proxy-audit-tmpfs-uncached", "http://pkg.example/x", shm.viaProxy, true},
		{"http/proxy-sync-interval", "http://pkg.example/x", interval.viaProxy, false},
		{"http/proxy-sync-interval-tmpfs", "http://pkg.example/x", shmInterval.viaProxy, false},
		{"connect/direct", "https://pkg.example/x", func(testing.TB) *http.Client { return be.direct() }, false},
		{"connect/tunnel", "https://pkg.example/x", be.viaProxy, false},
		{"connect/bare-relay", "https://pkg.example/x", be.relay, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			url := func() string {
				if tc.distinct {
					return tc.url + "?n=" + strconv.FormatInt(uniq.Add(1), 10)
				}
				return tc.url
			}
			if par {
				// 8 clients, each on its own kept-alive connection, as
				// test/bench measures requests/s.
				b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					c := tc.client(b)
					defer c.CloseIdleConnections()
					for pb.Next() {
						if !get(b, c, url()) {
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
				return
			}
			c := tc.client(b)
			if !get(b, c, url()) { // dial, CONNECT and handshake outside the timing
				return
			}
			b.ResetTimer()
			for range b.N {
				if !get(b, c, url()) {
					return
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.StopTimer()
			c.CloseIdleConnections()
		})
	}
}
