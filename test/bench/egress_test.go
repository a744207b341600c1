//go:build linux

package bench

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// egressGW is the gateway and sandbox relay the egress and DNS sections
// share: agent-a may reach pkg.test; the relay (a process of its own)
// listens in the namespace on a proxy port and a DNS port, as in a sandbox.
type egressGW struct {
	g         *gw
	relay     *proc
	proxyPort int
	dnsPort   int
}

func (w *world) egress() (*egressGW, error) { return w.egressWith(&w.eg, &w.egErr, "egress", "") }

// egressAgainst is egress with the gateway built at BENCH_AGAINST (the
// relay is this tree's, as the sandbox's would be).
func (w *world) egressAgainst() (*egressGW, error) {
	bin, _, err := w.againstBin()
	if err != nil {
		return nil, err
	}
	return w.egressWith(&w.egAt, &w.egAtErr, "egress-against", bin)
}

// egressWith starts the egress gateway name (binary bin, "" = this
// tree's) and its relay once, keeping the result or the error in *eg, *egErr.
func (w *world) egressWith(eg **egressGW, egErr *error, name, bin string) (*egressGW, error) {
	if *eg != nil || *egErr != nil {
		return *eg, *egErr
	}
	g, err := w.startGateway(w.t, gwOpts{Name: name, Egress: []string{"pkg.test"}, Bin: bin})
	if err != nil {
		*egErr = err
		return nil, err
	}
	e := &egressGW{g: g, proxyPort: freePort(), dnsPort: freePort()}
	e.relay, err = startRelay(w.t, w.ns, relayChild{NetNS: w.ns.path(), Gateway: g.sock, ProxyPort: e.proxyPort, DNSPort: e.dnsPort})
	if err != nil {
		*egErr = err
		return nil, err
	}
	*eg = e
	return e, nil
}

// meters are the CPU meters of sluice's rows: the gateway and the relay.
func (e *egressGW) meters() []*cpuMeter {
	return []*cpuMeter{{name: "gateway", pgid: e.g.pid()}, {name: "relay", pgid: e.relay.cmd.Process.Pid}}
}

// proxyClient uses the HTTP proxy at addr (in the namespace), keep-alive.
func (w *world) proxyClient(addr string) *http.Client {
	pu, _ := url.Parse("http://" + addr)
	tr := w.ns.transport()
	tr.Proxy = http.ProxyURL(pu)
	tr.TLSClientConfig = &tls.Config{RootCAs: w.caPool}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// directClient reaches pkg.test without a proxy (the name is pinned to
// egressIP, as the namespace's hosts file says).
func (w *world) directClient() *http.Client {
	tr := w.ns.transport()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, _ := net.SplitHostPort(addr)
		return w.ns.dial(ctx, network, net.JoinHostPort(egressIP, port))
	}
	tr.TLSClientConfig = &tls.Config{RootCAs: w.caPool}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// startSquid runs squid in the foreground in the namespace with its own
// config, pid file and logs; caching off.
func startSquid(t *testing.T, w *world) (string, int, error) {
	if _, err := lookPath("squid"); err != nil {
		return "", 0, err
	}
	d := filepath.Join(w.dir, "squid")
	if err := os.MkdirAll(d, 0o777); err != nil {
		return "", 0, err
	}
	_ = os.Chmod(d, 0o777)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort())
	conf := fmt.Sprintf(`http_port %s
pid_filename %s/squid.pid
cache_log %s/cache.log
access_log none
cache_store_log none
cache deny all
cache_mem 8 MB
coredump_dir %s
netdb_filename none
hosts_file /etc/hosts
dns_nameservers 127.0.0.1
shutdown_lifetime 0 seconds
forwarded_for delete
via off
acl all src all
http_access allow all
`, addr, d, d, d)
	cf := filepath.Join(d, "squid.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return "", 0, err
	}
	p := start(t, w.ns, "squid", "-N", "-f", cf)
	if err := waitTCP(w.ns, addr, p); err != nil {
		return "", 0, fmt.Errorf("squid: %w (%s)", err, lastLines(readFile(filepath.Join(d, "cache.log")), 3))
	}
	return addr, p.cmd.Process.Pid, nil
}

// startTinyproxy runs tinyproxy in the foreground in the namespace.
func startTinyproxy(t *testing.T, w *world) (string, int, error) {
	if _, err := lookPath("tinyproxy"); err != nil {
		return "", 0, err
	}
	d := filepath.Join(w.dir, "tinyproxy")
	if err := os.MkdirAll(d, 0o777); err != nil {
		return "", 0, err
	}
	_ = os.Chmod(d, 0o777)
	port := freePort()
	conf := fmt.Sprintf(`User nobody
Group nogroup
Port %d
Listen 127.0.0.1
Timeout 600
MaxClients 256
PidFile "%s/tinyproxy.pid"
LogFile "%s/tinyproxy.log"
LogLevel Critical
DisableViaHeader Yes
ConnectPort 443
`, port, d, d)
	cf := filepath.Join(d, "tinyproxy.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return "", 0, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p := start(t, w.ns, "tinyproxy", "-d", "-c", cf)
	if err := waitTCP(w.ns, addr, p); err != nil {
		return "", 0, fmt.Errorf("tinyproxy: %w", err)
	}
	return addr, p.cmd.Process.Pid, nil
}

// benchEgress is section 2: one table for plain HTTP, one for CONNECT.
func benchEgress(t *testing.T, w *world) []*section {
	intro := "`GET`s for a 30-byte page through each forward proxy, all in the same namespace. Requests/s: %d clients, each on its own kept-alive connection, for %s per row in %d turns; latency: one client, sequential, the rows sampled in turns. " +
		"The upstream listens on %s (a \"public\" address on the namespace's loopback, so the gateway's guard admits it); every proxy resolves `pkg.test` itself " +
		"(squid and tinyproxy from the namespace's hosts file, sluice through its DNS policy and upstream). " +
		"sluice is measured as a sandbox sees it: through the sandbox relay's TCP proxy port, which stamps the identity and forwards to the gateway socket."
	ts := "5s"
	if smoke() {
		ts = "0.5s"
	}
	plain := &section{Title: "Egress proxy: plain HTTP (keep-alive)", Baseline: "direct", Rate: "requests/s", Intro: fmt.Sprintf(intro, egressConc, ts, turns(), egressIP+":80")}
	tun := &section{Title: "Egress proxy: CONNECT keep-alive (TLS inside one tunnel)", Baseline: "direct", Rate: "requests/s",
		Intro: fmt.Sprintf(intro, egressConc, ts, turns(), egressIP+":443") + " The client opens one CONNECT tunnel and one TLS session, then sends every request inside it: the row is the per-request cost of relaying the tunnel's bytes."}
	n := iterations(2000)
	// Each proxy's start names the process groups its rows' CPU time is
	// charged to (cpuMeter), beside this test process (clients, upstream).
	group := func(name string, pid int) func() []*cpuMeter {
		return func() []*cpuMeter { return []*cpuMeter{{name: name, pgid: pid}} }
	}
	type proxy struct {
		name  string
		start func() (string, func() []*cpuMeter, error)
	}
	proxies := []proxy{
		{"squid", func() (string, func() []*cpuMeter, error) {
			addr, pid, err := startSquid(t, w)
			return addr, group("squid", pid), err
		}},
		{"tinyproxy", func() (string, func() []*cpuMeter, error) {
			addr, pid, err := startTinyproxy(t, w)
			return addr, group("tinyproxy", pid), err
		}},
		{goFloor, func() (string, func() []*cpuMeter, error) {
			addr, pid, err := startGoProxy(t, w.ns)
			return addr, group("go proxy", pid), err
		}},
		{"sluice (via sandbox relay)", func() (string, func() []*cpuMeter, error) {
			e, err := w.egress()
			if err != nil {
				return "", nil, err
			}
			return fmt.Sprintf("127.0.0.1:%d", e.proxyPort), e.meters, nil
		}},
	}
	sl := "sluice (via sandbox relay)"
	if againstRev() != "" {
		proxies = append(proxies, proxy{againstName(sl), func() (string, func() []*cpuMeter, error) {
			e, err := w.egressAgainst()
			if err != nil {
				return "", nil, err
			}
			return fmt.Sprintf("127.0.0.1:%d", e.proxyPort), e.meters, nil
		}})
	}
	dur := 5 * time.Second
	if smoke() {
		dur = 500 * time.Millisecond
	}
	type target struct {
		name   string
		mk     func() *http.Client
		meters func() []*cpuMeter
		err    error
	}
	targets := []target{{name: "direct", mk: w.directClient, meters: func() []*cpuMeter { return nil }}}
	for _, p := range proxies {
		addr, meters, err := p.start()
		targets = append(targets, target{name: p.name, err: err, meters: meters, mk: func() *http.Client { return w.proxyClient(addr) }})
	}
	for _, k := range []struct {
		s *section
		u string
	}{{plain, "http://pkg.test/plain"}, {tun, "https://pkg.test/tls"}} {
		var ps []*probe
		for _, tg := range targets {
			p := &probe{name: tg.name, err: tg.err}
			if tg.err == nil {
				c := tg.mk()
				p.fn = func() error { return getOK(context.Background(), c, k.u) }
			}
			ps = append(ps, p)
		}
		interleave(ps, n, 20)
		k.s.addProbes(ps)
		// Requests/s: turns of dur/turns() per row.
		var tps []*tput
		for _, tg := range targets {
			if r := k.s.find(tg.name); r != nil && len(r.Lat) > 0 {
				tps = append(tps, &tput{row: r, cpu: append(tg.meters(), &cpuMeter{name: "test process (clients, upstream)"}), mk: func() (func() error, func()) {
					c := tg.mk()
					return func() error { return getOK(context.Background(), c, k.u) }, c.CloseIdleConnections
				}})
			}
		}
		throughputRounds(tps, egressConc, dur, turns())
		if note := cpuNote(tps); note != "" {
			k.s.Notes = append(k.s.Notes, note)
		}
		if againstRev() != "" {
			againstVerdicts(k.s, sluiceCPU(tps), sl)
		}
	}
	plain.Verdicts = append(plain.Verdicts,
		verdictRatio("issue 22: plain HTTP requests/s ≥ 1.5× squid", plain.find(sl), plain.find("squid"), 1.5),
		verdictRatio("issue 6: plain HTTP requests/s ≥ 1.2× squid", plain.find(sl), plain.find("squid"), 1.2))
	tun.Verdicts = append(tun.Verdicts,
		verdictRatio("issue 22: CONNECT keep-alive requests/s ≥ 1.1× squid", tun.find(sl), tun.find("squid"), 1.1),
		verdictRatio("issue 6: CONNECT keep-alive requests/s ≥ 0.85× direct", tun.find(sl), tun.find("direct"), 0.85))
	for _, sec := range []*section{plain, tun} {
		if f, q := sec.find(goFloor), sec.find("squid"); f != nil && q != nil && f.QPS > 0 && q.QPS > 0 {
			sec.Notes = append(sec.Notes, fmt.Sprintf("The floor, a bare Go forward proxy (no policy, audit or log), runs at %.2f× squid: what Go's net/http alone costs on this path.", f.QPS/q.QPS))
		}
	}
	plain.Notes = append(plain.Notes, "sluice decides each request with Rego (kind `http`), resolves through its DNS cache, dials through the guard and writes audit records (on /dev/shm here); squid, tinyproxy and the Go floor only forward.",
		"The Go floor is this test binary re-executed as a bare forward proxy: net/http's server, httputil.ReverseProxy for plain HTTP, a hijacked connection and io.Copy each way (splice(2) between the TCP sockets) for CONNECT. The sandbox relay also runs as a process of its own: it hands each accepted connection to the gateway, so its CPU is paid per connection, not per request.")
	tun.Notes = append(tun.Notes, "For CONNECT the policy, resolution and audit happen once per tunnel; the rows measure the byte relay (client → relay → gateway → upstream and back for sluice, client → proxy → upstream for the peers).")
	if againstRev() != "" {
		for _, sec := range []*section{plain, tun} {
			sec.Notes = append(sec.Notes, againstNote(w, sl)+"; its requests/s are sampled in the same turns, with its gateway's and relay's CPU per request")
		}
	}
	var bulk []bulkTarget
	for _, tg := range targets {
		if againstRev() != "" && tg.name == againstName(sl) {
			continue // the 100 MiB rows compare peers, not revisions
		}
		bulk = append(bulk, bulkTarget{name: tg.name, mk: tg.mk, meters: tg.meters, err: tg.err})
	}
	return []*section{plain, tun, benchBulk(bulk)}
}

// goFloor is the bare Go forward proxy's row.
const goFloor = "Go net/http forward proxy (floor)"

// egressConc is the number of concurrent clients in a requests/s row.
const egressConc = 8

// tput is one row's throughput measurement, accumulated over rounds.
type tput struct {
	row  *row
	mk   func() (func() error, func())
	cpu  []*cpuMeter // processes charged with the timed part of each turn
	done int64
	took time.Duration
	err  error
}

// throughputRounds measures every row for d in total, as rounds turns of
// d/rounds each, so that outside load falls on every row alike.
func throughputRounds(ts []*tput, conc int, d time.Duration, rounds int) {
	for range rounds {
		for _, tp := range ts {
			if tp.err != nil {
				continue
			}
			var at []time.Duration
			n, took, err := throughputN(conc, d/time.Duration(rounds), tp.mk, func() {
				for _, m := range tp.cpu {
					at = append(at, m.read())
				}
			})
			if err != nil {
				tp.err = err
				continue
			}
			tp.done += n
			tp.took += took
			for i, m := range tp.cpu {
				m.used += at[len(tp.cpu)+i] - at[i]
			}
		}
	}
	for _, tp := range ts {
		switch {
		case tp.err != nil:
			tp.row.Note = strings.TrimPrefix(tp.row.Note+"; ", "; ") + "requests/s not measured: " + oneLine(tp.err.Error())
		case tp.took > 0:
			tp.row.QPS = float64(tp.done) / tp.took.Seconds()
		}
	}
}

// throughput runs conc workers, each made by mk (its own connection; the
// second function closes it), for d and returns the completed requests
// per second. The first error ends it.
func throughput(conc int, d time.Duration, mk func() (func() error, func())) (float64, error) {
	n, took, err := throughputN(conc, d, mk, nil)
	if err != nil {
		return 0, err
	}
	return float64(n) / took.Seconds(), nil
}

// throughputN is throughput's count of completed calls and the time taken.
// mark, if not nil, is called as the timed part starts and as it ends
// (after the workers' warm-up calls, before their connections close).
func throughputN(conc int, d time.Duration, mk func() (func() error, func()), mark func()) (int64, time.Duration, error) {
	fns := make([]func() error, conc)
	for i := range fns {
		var done func()
		fns[i], done = mk()
		defer done()                     // close the worker's connections
		if err := fns[i](); err != nil { // connect and warm
			return 0, 0, fmt.Errorf("warm-up: %w", err)
		}
	}
	var done atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if mark != nil {
		mark()
	}
	t0 := time.Now()
	for _, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := fn(); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				done.Add(1)
			}
		}()
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	took := time.Since(t0)
	if mark != nil {
		mark()
	}
	if e := firstErr.Load(); e != nil {
		return 0, 0, e.(error)
	}
	return done.Load(), took, nil
}

// verdictRatio says whether row's throughput is at least goal × base's.
func verdictRatio(goal string, row, base *row, min float64) string {
	if row == nil || base == nil || row.QPS == 0 || base.QPS == 0 {
		return goal + ": not measured"
	}
	r := row.QPS / base.QPS
	if r >= min {
		return fmt.Sprintf("%s: **met** (%.2f×)", goal, r)
	}
	return fmt.Sprintf("%s: **not met** (%.2f×)", goal, r)
}
