//go:build linux

package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// startDnsmasq runs dnsmasq in the foreground in the namespace, caching and
// forwarding to the bare responder (the role the gateway's answerer plays).
func startDnsmasq(t *testing.T, w *world) (string, int, error) {
	if _, err := lookPath("dnsmasq"); err != nil {
		return "", 0, err
	}
	port := freePort()
	d := filepath.Join(w.dir, "dnsmasq")
	if err := os.MkdirAll(d, 0o777); err != nil {
		return "", 0, err
	}
	p := start(t, w.ns, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
		"--server="+strings.Replace(w.dnsAddr, ":", "#", 1), "--listen-address=127.0.0.1", "--bind-interfaces",
		"--port="+strconv.Itoa(port), "--cache-size=10000", "--pid-file="+filepath.Join(d, "dnsmasq.pid"), "--log-facility=-")
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitTCP(w.ns, addr, p); err != nil {
		return "", 0, fmt.Errorf("dnsmasq: %w", err)
	}
	return addr, p.cmd.Process.Pid, nil
}

var qpsRe = regexp.MustCompile(`Queries per second:\s+([0-9.]+)`)
var lostRe = regexp.MustCompile(`Queries lost:\s+(\d+)`)

// dnsperfQPS runs dnsperf in the namespace against addr for d.
func dnsperfQPS(w *world, addr string, d time.Duration) (float64, string, error) {
	if _, err := lookPath("dnsperf"); err != nil {
		return 0, "", err
	}
	qf := filepath.Join(w.dir, "dnsperf-queries.txt")
	if err := os.WriteFile(qf, []byte("pkg.test A\n"), 0o644); err != nil {
		return 0, "", err
	}
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), d+60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", w.ns.name, "dnsperf", "-s", host, "-p", port, "-d", qf,
		"-l", strconv.FormatFloat(d.Seconds(), 'f', 1, 64), "-c", "4", "-q", "64", "-t", "1").CombinedOutput()
	if err != nil {
		return 0, "", fmt.Errorf("dnsperf: %w: %s", err, lastLines(string(out), 3))
	}
	m := qpsRe.FindSubmatch(out)
	if m == nil {
		return 0, "", fmt.Errorf("dnsperf: no queries per second in its output: %s", lastLines(string(out), 3))
	}
	q, _ := strconv.ParseFloat(string(m[1]), 64)
	lost := ""
	if l := lostRe.FindSubmatch(out); l != nil && string(l[1]) != "0" {
		lost = "dnsperf lost " + string(l[1]) + " queries"
	}
	return q, lost, nil
}

// dnsProbe asks addr for pkg.test A over one UDP socket made inside the
// namespace (closed at cleanup).
func dnsProbe(t *testing.T, w *world, addr string) (func() error, error) {
	c := &mdns.Client{Net: "udp", Timeout: 5 * time.Second}
	var conn *mdns.Conn
	if err := w.ns.do(func() (err error) { conn, err = c.Dial(addr); return err }); err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.Close() })
	q := new(mdns.Msg)
	q.SetQuestion("pkg.test.", mdns.TypeA)
	return func() error {
		q.Id = mdns.Id()
		r, _, err := c.ExchangeWithConn(q, conn)
		if err != nil {
			return err
		}
		if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 1 {
			return fmt.Errorf("answer: rcode %s, %d records", mdns.RcodeToString[r.Rcode], len(r.Answer))
		}
		return nil
	}, nil
}

// The sluice rows of the DNS section: the relay as sandboxd runs it, and
// with its answer cache off.
const (
	sluiceDNS         = "sluice (relay stub → POST /v1/dns, policy)"
	sluiceDNSUncached = "sluice, stub cache off: every question to the gateway"
)

// benchDNS is section 3.
func benchDNS(t *testing.T, w *world) []*section {
	dur := 10 * time.Second
	if smoke() {
		dur = time.Second
	}
	s := &section{Title: "DNS: queries per second with policy", Baseline: "bare miekg/dns responder", Rate: "queries/s",
		Intro: fmt.Sprintf("Throughput: `dnsperf -c 4 -q 64` asking `pkg.test A` over UDP inside the namespace, %d s per row in %d turns (the mean of the turns). "+
			"Latency: one Go client asking in sequence over one UDP socket, the rows sampled in turns. "+
			"The bare responder is a miekg/dns server that answers from a Go map; dnsmasq caches and forwards to it; "+
			"sluice is the sandbox's resolver: the relay's DNS stub in the namespace, which streams each question to the gateway's `/v1/dns` (two long-lived streams per sandbox; the stub reads queries in batches with recvmmsg, writes the frames of a batch as one chunk and sends replies with sendmmsg) "+
			"over the identity-stamped socket, where it is decided by Rego (kind `dns`, agent-a may resolve pkg.test) and answered from the gateway's cache or the bare responder. "+
			"As sandboxd runs it, the stub reuses the gateway's positive A/AAAA answer to the same question for up to 1 s (never past its TTL; refusals are never reused), so the gateway decides `pkg.test` at most once a second (its answer TTL is longer); the cache-off row sends every question to the gateway.",
			int(dur.Seconds()), turns())}
	n := iterations(2000)
	// Each start also names the processes its row's CPU is charged to
	// (the bare responder is this test process, which dnsperf is not).
	type meters = func() []*cpuMeter
	type target struct {
		name  string
		start func() (string, meters, error)
	}
	targets := []target{
		{"bare miekg/dns responder", func() (string, meters, error) {
			return w.dnsAddr, func() []*cpuMeter { return []*cpuMeter{{name: "test process (responder)"}} }, nil
		}},
		{"dnsmasq (cache, forwarding)", func() (string, meters, error) {
			addr, pid, err := startDnsmasq(t, w)
			return addr, func() []*cpuMeter { return []*cpuMeter{{name: "dnsmasq", pgid: pid}} }, err
		}},
		{sluiceDNS, sluiceDNSAt(t, w, w.egress, true)},
		{sluiceDNSUncached, sluiceDNSAt(t, w, w.egress, false)},
	}
	if againstRev() != "" {
		targets = append(targets, target{againstName(sluiceDNS), sluiceDNSAt(t, w, w.egressAgainst, true)},
			target{againstName(sluiceDNSUncached), sluiceDNSAt(t, w, w.egressAgainst, false)})
		s.Notes = append(s.Notes, againstNote(w, sluiceDNS, sluiceDNSUncached)+"; its queries/s are dnsperf's in the same turns, with its gateway's and relay's CPU per query")
	}
	var ps []*probe
	addrs := map[*probe]string{}
	cpu := map[*probe][]*cpuMeter{}
	for _, tg := range targets {
		p := &probe{name: tg.name}
		ps = append(ps, p)
		addr, ms, err := tg.start()
		if err != nil {
			p.err = err
			continue
		}
		addrs[p], cpu[p] = addr, ms()
		if p.fn, err = dnsProbe(t, w, addr); err != nil {
			p.err = err
		}
	}
	// Where the time goes: the gateway's answerer alone, without the stub.
	const alone = "sluice POST /v1/dns alone"
	var aloneMk func() (func() error, func())
	if e, err := w.egress(); err != nil {
		ps = append(ps, &probe{name: alone, err: err})
	} else {
		aloneMk = func() (func() error, func()) {
			c := sandboxClient(e.g.sock, benchAgent)
			return func() error { return postDNS(c) }, c.CloseIdleConnections
		}
		fn, _ := aloneMk()
		ps = append(ps, &probe{name: alone, note: "keep-alive HTTP on the gateway socket, no stub: its queries/s are 4 Go clients, not dnsperf", fn: fn})
	}
	interleave(ps, n, 20)
	s.addProbes(ps)

	// Throughput in five turns per row.
	qs := map[*probe]float64{}
	asked := map[*probe]float64{} // queries answered in the turns, for CPU per query
	for round := 0; round < turns(); round++ {
		for _, p := range ps {
			r := s.find(p.name)
			if p.err != nil || r == nil || len(r.Lat) == 0 || strings.Contains(r.Note, "not measured") {
				continue
			}
			var q float64
			var err error
			lost := ""
			if p.name == alone {
				q, err = throughput(4, dur/time.Duration(turns()), aloneMk)
			} else {
				at := make([]time.Duration, len(cpu[p]))
				for i, m := range cpu[p] {
					at[i] = m.read()
				}
				q, lost, err = dnsperfQPS(w, addrs[p], dur/time.Duration(turns()))
				for i, m := range cpu[p] {
					m.used += m.read() - at[i]
				}
				asked[p] += q * (dur / time.Duration(turns())).Seconds()
			}
			if err != nil {
				r.Note = strings.TrimPrefix(r.Note+"; ", "; ") + "queries/s not measured: " + oneLine(err.Error())
				continue
			}
			if lost != "" && !strings.Contains(r.Note, "lost") {
				r.Note = strings.TrimPrefix(r.Note+"; ", "; ") + lost + " in a turn"
			}
			qs[p] += q / float64(turns())
		}
	}
	for p, q := range qs {
		if r := s.find(p.name); r != nil && !strings.Contains(r.Note, "not measured") {
			r.QPS = q
		}
	}
	var per []string
	own := map[string]float64{} // sluice's processes' CPU-µs per query, by row
	for _, p := range ps {
		if asked[p] <= 0 || len(cpu[p]) == 0 {
			continue
		}
		var parts []string
		for _, m := range cpu[p] {
			parts = append(parts, fmt.Sprintf("%s %.1f", m.name, float64(m.used.Microseconds())/asked[p]))
			own[p.name] += float64(m.used.Microseconds()) / asked[p]
		}
		per = append(per, p.name+": "+strings.Join(parts, ", "))
	}
	if len(per) > 0 {
		s.Notes = append(s.Notes, "CPU µs per query over the queries/s turns (user+system, /proc/PID/stat of each process group, ÷ queries dnsperf counted answered; dnsperf itself is not counted; the sandbox relay, which runs the stub, is a process of its own): "+strings.Join(per, "; ")+".")
	}
	if againstRev() != "" {
		againstVerdicts(s, own, sluiceDNS, sluiceDNSUncached)
	}
	s.Verdicts = append(s.Verdicts, verdictRatio("issue 22: DNS with the stub cache off queries/s ≥ 1.2× dnsmasq", s.find(sluiceDNSUncached), s.find("dnsmasq (cache, forwarding)"), 1.2))
	s.Verdicts = append(s.Verdicts, verdictRatio("issue 6: DNS queries/s ≥ 1.0× dnsmasq", s.find(sluiceDNS), s.find("dnsmasq (cache, forwarding)"), 1.0))
	return []*section{s}
}

// sluiceDNSAt starts a sluice DNS row on the egress gateway eg gives: its
// relay's stub (cached), or a relay of its own with the stub cache off.
func sluiceDNSAt(t *testing.T, w *world, eg func() (*egressGW, error), cached bool) func() (string, func() []*cpuMeter, error) {
	return func() (string, func() []*cpuMeter, error) {
		e, err := eg()
		if err != nil {
			return "", nil, err
		}
		if cached {
			return fmt.Sprintf("127.0.0.1:%d", e.dnsPort), e.meters, nil
		}
		port := freePort()
		r, err := startRelay(t, w.ns, relayChild{NetNS: w.ns.path(), Gateway: e.g.sock, ProxyPort: freePort(), DNSPort: port, DNSCacheFor: -1})
		if err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("127.0.0.1:%d", port), func() []*cpuMeter {
			return []*cpuMeter{{name: "gateway", pgid: e.g.pid()}, {name: "relay", pgid: r.cmd.Process.Pid}}
		}, nil
	}
}

// postDNS asks the gateway's answerer for pkg.test A over c.
func postDNS(c *http.Client) error {
	q := new(mdns.Msg)
	q.SetQuestion("pkg.test.", mdns.TypeA)
	wire, err := q.Pack()
	if err != nil {
		return err
	}
	resp, err := c.Post("http://sluice/v1/dns", "application/dns-message", bytes.NewReader(wire))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /v1/dns: status %d: %s", resp.StatusCode, oneLine(string(body)))
	}
	a := new(mdns.Msg)
	if err := a.Unpack(body); err != nil {
		return fmt.Errorf("POST /v1/dns: answer: %w", err)
	}
	if a.Rcode != mdns.RcodeSuccess || len(a.Answer) != 1 {
		return fmt.Errorf("POST /v1/dns: rcode %s, %d records", mdns.RcodeToString[a.Rcode], len(a.Answer))
	}
	return nil
}
