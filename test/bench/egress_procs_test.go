//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/relay"
)

// The egress rows' processes: the sandbox relay and a bare Go forward
// proxy run as children of their own (this test binary again), so that
// each row's CPU time can be charged to the process that spent it.

const (
	relayChildEnv   = "SLUICE_BENCH_RELAY"    // the relay's options, JSON
	goProxyChildEnv = "SLUICE_BENCH_GO_PROXY" // the floor proxy's listen address
)

// relayChild is what the relay child is told.
type relayChild struct {
	NetNS     string
	Gateway   string
	ProxyPort int
	DNSPort   int

	DNSCacheFor time.Duration
}

// startRelay runs the sandbox relay for agent-a in a process of its own,
// listening in ns; ready once its proxy port accepts.
func startRelay(t testing.TB, ns *netns, o relayChild) (*proc, error) {
	b, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	p := start(t, nil, "env", relayChildEnv+"="+string(b), os.Args[0], "-test.run=^$")
	if err := waitTCP(ns, fmt.Sprintf("127.0.0.1:%d", o.ProxyPort), p); err != nil {
		return nil, fmt.Errorf("relay: %w: %s", err, lastLines(p.out.String(), 3))
	}
	return p, nil
}

// serveRelay is the relay child's main: open the relay as sandboxd does
// (every connection handed to the gateway) and hold it until signalled or
// orphaned.
func serveRelay() int {
	var o relayChild
	if err := json.Unmarshal([]byte(os.Getenv(relayChildEnv)), &o); err != nil {
		fmt.Fprintln(os.Stderr, "bench relay:", err)
		return 1
	}
	r, err := relay.Open(context.Background(), relay.Options{NetNS: o.NetNS, Identity: benchAgent, Gateway: o.Gateway,
		ProxyPort: o.ProxyPort, DNSPort: o.DNSPort, MaxConns: 4096, DNSCacheFor: o.DNSCacheFor,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench relay:", err)
		return 1
	}
	waitEnd()
	_ = r.Close()
	return 0
}

// waitEnd returns on SIGTERM or SIGINT, or when the parent is gone.
func waitEnd() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	parent := os.Getppid()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-sig:
			return
		case <-tick.C:
			if os.Getppid() != parent {
				return
			}
		}
	}
}

// startGoProxy runs the floor: a bare Go forward proxy (net/http and
// httputil.ReverseProxy for plain HTTP, a hijacked io.Copy each way for
// CONNECT; no policy, audit or log) in ns, as squid runs.
func startGoProxy(t testing.TB, ns *netns) (string, int, error) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort())
	p := start(t, ns, "env", goProxyChildEnv+"="+addr, os.Args[0], "-test.run=^$")
	if err := waitTCP(ns, addr, p); err != nil {
		return "", 0, fmt.Errorf("go proxy: %w: %s", err, lastLines(p.out.String(), 3))
	}
	return addr, p.cmd.Process.Pid, nil
}

// serveGoProxy is the floor proxy child's main.
func serveGoProxy() int {
	l, err := net.Listen("tcp", os.Getenv(goProxyChildEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench go proxy:", err)
		return 1
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 128, DisableCompression: true}
	rp := &httputil.ReverseProxy{Transport: tr, Rewrite: func(*httputil.ProxyRequest) {}} // the absolute URL as sent
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			rp.ServeHTTP(rw, r)
			return
		}
		up, err := net.DialTimeout("tcp", r.Host, 10*time.Second)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadGateway)
			return
		}
		c, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			up.Close()
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n")
		if n := brw.Reader.Buffered(); n > 0 {
			b, _ := brw.Reader.Peek(n)
			_, _ = up.Write(b)
		}
		go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
		_, _ = io.Copy(c, up)
		c.Close()
		up.Close()
	})
	go func() { waitEnd(); os.Exit(0) }()
	_ = (&http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}).Serve(l)
	return 0
}

// cpuMeter charges a row's turns with the CPU time of one process (and
// every process in its group).
type cpuMeter struct {
	name string
	pgid int // 0: this test process alone
	used time.Duration
}

// read is the group's user+system time so far, from /proc/PID/stat (every
// thread, living and exited).
func (m *cpuMeter) read() time.Duration {
	if m.pgid == 0 {
		return procCPU(os.Getpid())
	}
	ents, _ := os.ReadDir("/proc")
	var sum time.Duration
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pid == m.pgid || procGroup(pid) == m.pgid {
			sum += procCPU(pid)
		}
	}
	return sum
}

// userHZ is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

// statFields are /proc/PID/stat's fields after the command name.
func statFields(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

func procGroup(pid int) int {
	f := statFields(pid)
	if len(f) < 3 {
		return -1
	}
	g, _ := strconv.Atoi(f[2])
	return g
}

func procCPU(pid int) time.Duration {
	f := statFields(pid)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / userHZ
}

// cpuNote is one line naming every row's CPU time per request, by process.
func cpuNote(ts []*tput) string {
	var parts []string
	for _, tp := range ts {
		if tp.done == 0 || len(tp.cpu) == 0 {
			continue
		}
		var ps []string
		for _, m := range tp.cpu {
			ps = append(ps, fmt.Sprintf("%s %.1f", m.name, float64(m.used.Microseconds())/float64(tp.done)))
		}
		parts = append(parts, fmt.Sprintf("%s: %s", tp.row.Name, strings.Join(ps, ", ")))
	}
	if len(parts) == 0 {
		return ""
	}
	return "CPU µs per request over the requests/s turns (user+system, /proc/PID/stat of each process group, ÷ completed requests; on 2 cores requests/s follows the sum): " +
		strings.Join(parts, "; ") + "."
}
