//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/relay"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Built binaries and the reason the host cannot run the suite ("" = it can).
var (
	sluiceBin, sandboxdBin string
	skipReason             string
	moduleRoot             string
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	if os.Getenv(upstreamEnv) != "" {
		return serveUpstream() // a child: the tool upstream, in its own process
	}
	if os.Getenv(authzPeerEnv) != "" {
		return serveAuthzPeer() // a child: the bare ext_authz peer (extauthz_test.go)
	}
	if os.Getenv(relayChildEnv) != "" {
		return serveRelay() // a child: the sandbox relay (egress_procs_test.go)
	}
	if os.Getenv(goProxyChildEnv) != "" {
		return serveGoProxy() // a child: the bare Go forward proxy
	}
	switch {
	case os.Geteuid() != 0:
		skipReason = "the bench suite needs root: it creates network namespaces and sandboxes"
	default:
		if _, err := exec.LookPath("ip"); err != nil {
			skipReason = "the bench suite needs iproute2's `ip`: " + err.Error()
		}
	}
	if skipReason != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "sluice-bench-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The sandbox init is exec'd by path from inside a user namespace.
	if err := os.Chmod(dir, 0o711); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		fmt.Fprintln(os.Stderr, "bench: cannot find the module root with `go env GOMOD`:", err)
		return 1
	}
	moduleRoot = filepath.Dir(strings.TrimSpace(string(gomod)))
	// BENCH_SRC builds the gateway from another checkout of the module (for
	// example an exported commit while the working tree is mid-edit). The
	// sandbox init always comes from this tree: it must match the
	// in-process sandboxd manager.
	gwSrc := moduleRoot
	if s := os.Getenv("BENCH_SRC"); s != "" {
		gwSrc = s
	}
	sluiceBin, sandboxdBin = filepath.Join(dir, "sluice"), filepath.Join(dir, "sandboxd")
	for _, b := range []struct{ out, pkg, src string }{{sluiceBin, "./cmd/sluice", gwSrc}, {sandboxdBin, "./cmd/sandboxd", moduleRoot}} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Dir = b.src
		// CGO_ENABLED=0: the sandbox init's setuid must reach every thread.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: go build %s: %v\n%s", b.pkg, err, out)
			return 1
		}
	}
	return m.Run()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ---------------------------------------------------------------------------
// Samples

// smoke is true for a smoke run: -short, the race detector, or any run
// without SLUICE_BENCH=full (so `go test ./...` never spends minutes here
// nor rewrites test/report/bench.md).
func smoke() bool {
	return testing.Short() || raceEnabled || os.Getenv("SLUICE_BENCH") != "full"
}

// iterations is how many samples a latency row takes: full or smoke.
func iterations(full int) int {
	if smoke() {
		return max(20, full/100)
	}
	return full
}

// turns is how many turns a throughput row is split into: rows take turns
// so that outside load falls on each alike (one turn in a smoke run).
func turns() int {
	if smoke() {
		return 1
	}
	return 5
}

// sample runs fn n times after warm warm-up runs and returns the sorted
// latencies. The first error ends the row.
func sample(n, warm int, fn func() error) ([]time.Duration, error) {
	for range warm {
		if err := fn(); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	lat := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := fn(); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return lat, nil
}

// pct is the p-th percentile (0..100) of sorted samples.
func pct(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// ---------------------------------------------------------------------------
// Network namespace

// netns is a network namespace with lo up, the "public" egress address on
// lo and its own /etc/hosts and /etc/resolv.conf (bind-mounted by `ip netns
// exec`). Nothing in it can reach another host.
type netns struct{ name string }

// egressIP is the upstreams' "public" address, on the namespace's own lo:
// the guard classifies it as public, and a packet to it never leaves.
const egressIP = "11.0.0.1"

const nsHosts = `127.0.0.1 localhost
::1 localhost
` + egressIP + ` pkg.test
`

func newNetns(t testing.TB) *netns {
	t.Helper()
	n := &netns{name: "sluice-bench-" + randHex(4)}
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", n.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.name).Run() })
	run("-n", n.name, "link", "set", "lo", "up")
	run("-n", n.name, "addr", "add", egressIP+"/32", "dev", "lo")
	etc := filepath.Join("/etc/netns", n.name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(etc) })
	if err := os.WriteFile(filepath.Join(etc, "hosts"), []byte(nsHosts), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

// do runs fn on an OS thread inside the namespace; sockets made in fn keep
// the namespace. A thread that cannot get back stays locked and dies.
func (n *netns) do(fn func() error) error {
	return relay.InNetNS(n.path(), fn)
}

func (n *netns) path() string { return filepath.Join("/run/netns", n.name) }

// listen opens a listener inside the namespace.
func (n *netns) listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := n.do(func() (err error) { l, err = net.Listen(network, addr); return err }); err != nil {
		t.Fatalf("listen %s in %s: %v", addr, n.name, err)
	}
	return l
}

// dial connects from inside the namespace.
func (n *netns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() (err error) {
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// transport is a keep-alive HTTP transport whose connections are made in
// the namespace.
func (n *netns) transport() *http.Transport {
	return &http.Transport{MaxIdleConnsPerHost: 8, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return n.dial(ctx, network, addr)
	}}
}

// freePort is a TCP/UDP port free in the namespace: 20000-29999 lies below
// the ephemeral range, and the namespace is the test's own.
var portMu sync.Mutex
var nextPort = 20000 + int(time.Now().UnixNano()%5000)

func freePort() int {
	portMu.Lock()
	defer portMu.Unlock()
	nextPort++
	return nextPort
}

// ---------------------------------------------------------------------------
// Processes

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 4<<20 { // keep the head; a chatty peer must not fill memory
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a process the suite started; stop ends it by its own pid.
type proc struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
	err    error
}

// start runs argv inside ns (nil = the host namespace) with its output
// captured; it is stopped at cleanup.
func start(t testing.TB, ns *netns, argv ...string) *proc {
	t.Helper()
	if ns != nil {
		argv = append([]string{"ip", "netns", "exec", ns.name}, argv...)
	}
	p := &proc{cmd: exec.Command(argv[0], argv[1:]...), out: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	// Its own process group: stop ends the helpers it forks too (dnsmasq
	// forks one per TCP connection), and nothing else.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", argv[0], err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(p.stop)
	return p
}

func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	// The group is signalled only while its leader lives, so the id
	// cannot have been reused by someone else's group.
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.exited
	}
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// rssBytes is the resident set of pid from /proc/PID/status.
func rssBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("rss: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("rss: no VmRSS for pid %d", pid)
}

// waitTCP waits until addr accepts a connection inside ns.
func waitTCP(ns *netns, addr string, p *proc) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := ns.dial(context.Background(), "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		if p != nil && !p.running() {
			return fmt.Errorf("wait %s: process exited: %v: %s", addr, p.err, lastLines(p.out.String(), 5))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("wait %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lastLines is the end of a log, for a "not measured" reason.
func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}

// version runs argv and returns its first output line ("" if it fails).
func version(argv ...string) string {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil && len(out) == 0 {
		return "not installed"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line)
}

// sandboxClient speaks to a gateway socket as sandboxd would: each
// connection starts with the identity preamble, then HTTP (keep-alive).
func sandboxClient(sock string, id wire.Identity) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 8, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return wire.Dial(ctx, sock, id)
	}}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

func sortDur(s []time.Duration) []time.Duration {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// probe is one row's operation, sampled by interleave.
type probe struct {
	name, note string
	fn         func() error
	lat        []time.Duration
	err        error
}

// interleave samples every probe n times in rounds: each round runs every
// probe in turn for a block of n/40 calls (at least one), after one
// untimed call that brings the row's process and caches back. Load from
// elsewhere on a shared machine thus falls on every row alike, while each
// timed call finds its row warm, as in a steady stream. A probe's first
// error ends that probe only.
func interleave(ps []*probe, n, warm int) {
	for _, p := range ps {
		for range warm {
			if p.err == nil {
				if err := p.fn(); err != nil {
					p.err = fmt.Errorf("warm-up: %w", err)
				}
			}
		}
	}
	block := max(1, n/40)
	for done := 0; done < n; done += block {
		k := min(block, n-done)
		for _, p := range ps {
			if p.err != nil {
				continue
			}
			if err := p.fn(); err != nil { // untimed: wake the row
				p.err = err
				continue
			}
			for range k {
				t0 := time.Now()
				if err := p.fn(); err != nil {
					p.err = err
					break
				}
				p.lat = append(p.lat, time.Since(t0))
			}
		}
	}
	for _, p := range ps {
		slices.Sort(p.lat)
	}
}

// addProbes adds each probe as a latency row, in order.
func (s *section) addProbes(ps []*probe) {
	for _, p := range ps {
		s.lat(p.name, p.lat, p.err, p.note)
	}
}
