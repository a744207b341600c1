package egress

import (
	"bufio"
	"bytes"
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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/ingress/ingresstest"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// benchEgress is raw egress served on its own sandbox socket, exactly as
// Serve wires it (sandbox listener, ingress.StrictHeads, the proxy handler), whose
// guarded dialer connects every admitted public address to a loopback
// upstream: pkg.example resolves to a public address, is classified and
// admitted as usual, and only the final connect goes to 127.0.0.1.
type benchEgress struct {
	g         *testGateway
	sock      string
	eg        *Proxy
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
	return startBenchEgressIdle(b, auditDir, edit, ingress.DefaultHandoffIdle)
}

// startBenchEgressIdle is startBenchEgress with the sandbox listener's
// idle period for handed-off connections (tests shorten it).
func startBenchEgressIdle(b testing.TB, auditDir string, edit func(*config.Config), listenIdle time.Duration) *benchEgress {
	b.Helper()
	up := egresstest.NewDNSUpstream(b, map[string]string{"pkg.example": "93.184.216.34"})
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
		if size, ok := strings.CutPrefix(r.URL.Path, "/bytes/"); ok {
			n, _ := strconv.Atoi(size)
			_, _ = w.Write(bytes.Repeat([]byte{'x'}, max(n, 0))) // a download of n bytes
			return
		}
		_, _ = io.WriteString(w, "hello "+r.URL.Path)
	})
	be.plain, be.tlsServer = httptest.NewServer(hello), httptest.NewTLSServer(hello)
	b.Cleanup(be.plain.Close)
	b.Cleanup(be.tlsServer.Close)
	eg := g.newProxy()
	eg.dialer = guard.New(guard.Options{Resolver: eg.res, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, _ := net.SplitHostPort(addr)
		to := be.plain.Listener.Addr().String()
		if port == "443" {
			to = be.tlsServer.Listener.Addr().String()
		}
		return (&net.Dialer{}).DialContext(ctx, network, to)
	}})
	be.eg = eg
	be.sock = filepath.Join(g.dir, "bench.sock")
	sl, err := ingress.Listen(ingress.Options{Socket: be.sock, TrustedUIDs: g.cfg.Gateway.TrustedRelayUIDs, Log: g.log, HandoffIdle: listenIdle})
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(eg.ServeProxy),
		ConnContext:       ingress.ConnContext,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	go func() { _ = srv.Serve(ingress.StrictHeads(sl)) }()
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

// viaHandoff is viaProxy over connections handed off as sandboxd's relay
// hands them (the sandbox's TCP socket itself, so tunnels are relayed
// socket to socket by relayTCP).
func (be *benchEgress) viaHandoff(b testing.TB) *http.Client {
	proxyURL, _ := url.Parse("http://sluice-proxy")
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), MaxIdleConnsPerHost: 1,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the httptest certificate names example.com
		DialContext:     ingresstest.NewHandoffDialer(b, be.sock, agentA, "tcp").DialContext,
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
// "connect/tunnel-handoff" hands the client's TCP socket over as sandboxd's
// relay does, so the tunnel is relayed socket to socket (relayTCP);
// "-copyloop" is the same through ingress.Conn's readers (splice), as before
// relayTCP; the "connect-1MiB" rows download 1 MiB per request. cpu-µs/op
// is the whole process's CPU time per request (client and upstreams
// included), which the machine's other load disturbs less than ns/op.
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
	// loop relays its tunnels with the copy loop even when they could be
	// relayed socket to socket (Proxy.tunnel).
	loop := startBenchEgress(b, "", nil)
	loop.eg.copyLoop.Store(true)
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
		want := "hello /x"
		if strings.HasSuffix(u, "/bytes/1048576") {
			want = strings.Repeat("x", 1<<20)
		}
		if resp.StatusCode != http.StatusOK || string(body) != want {
			b.Errorf("%s: %d %.40q", u, resp.StatusCode, body)
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
		{"connect/tunnel-handoff", "https://pkg.example/x", be.viaHandoff, false},
		{"connect/tunnel-handoff-copyloop", "https://pkg.example/x", loop.viaHandoff, false},
		{"connect-1MiB/direct", "https://pkg.example/bytes/1048576", func(testing.TB) *http.Client { return be.direct() }, false},
		{"connect-1MiB/tunnel-handoff", "https://pkg.example/bytes/1048576", be.viaHandoff, false},
		{"connect-1MiB/tunnel-handoff-copyloop", "https://pkg.example/bytes/1048576", loop.viaHandoff, false},
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
				cpu0 := cpuTime()
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
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
				return
			}
			c := tc.client(b)
			if !get(b, c, url()) { // dial, CONNECT and handshake outside the timing
				return
			}
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				if !get(b, c, url()) {
					return
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
			b.StopTimer()
			c.CloseIdleConnections()
		})
	}
}

// BenchmarkTunnelRelay compares the two ways a CONNECT tunnel's bytes are
// relayed between two TCP sockets, outside any HTTP: relayTCP (for a
// handed-off sandbox socket: a copy loop, 1 MiB reads for bulk) and splice's
// copy loop. "pingpong" sends 30 bytes through and 30 back per op, as a small
// request in a kept-alive tunnel does; "1MiB" sends 1 MiB down per op.
// cpu-µs/op is the process's user+system CPU time per op, which the
// machine's other load disturbs less than the wall time.
func BenchmarkTunnelRelay(b *testing.B) {
	for _, mode := range []string{"relayTCP", "copyloop"} {
		for _, load := range []string{"pingpong", "1MiB"} {
			b.Run(load+"/"+mode, func(b *testing.B) {
				sandbox, gwClient := tcpPair(b)
				gwUp, upstream := tcpPair(b)
				var upN, dnN atomic.Int64
				done := make(chan struct{})
				go func() {
					defer close(done)
					if mode == "relayTCP" {
						var bulk atomic.Int64
						relayTCP(gwClient, gwClient, gwUp, time.Minute, &upN, &dnN, &bulk)
					} else {
						splice(gwClient, gwClient, gwUp, time.Minute, &upN, &dnN)
					}
				}()
				msg := make([]byte, 30)
				size := len(msg)
				if load == "1MiB" {
					msg, size = make([]byte, 1<<20), 1<<20
				}
				buf := make([]byte, size)
				cpu0 := cpuTime()
				b.ResetTimer()
				for range b.N {
					if load == "pingpong" {
						if _, err := sandbox.Write(msg); err != nil {
							b.Fatal(err)
						}
						if _, err := io.ReadFull(upstream, buf); err != nil {
							b.Fatal(err)
						}
						if _, err := upstream.Write(msg); err != nil {
							b.Fatal(err)
						}
						if _, err := io.ReadFull(sandbox, buf); err != nil {
							b.Fatal(err)
						}
						continue
					}
					go func() { _, _ = upstream.Write(msg) }()
					if _, err := io.ReadFull(sandbox, buf); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
				sandbox.Close()
				upstream.Close()
				<-done
				if want := int64(b.N) * int64(size); dnN.Load() != want {
					b.Fatalf("relayed %d bytes down, want %d", dnN.Load(), want)
				}
			})
		}
	}
}

// tcpPair is two ends of a loopback TCP connection.
func tcpPair(b testing.TB) (*net.TCPConn, *net.TCPConn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
