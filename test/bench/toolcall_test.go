//go:build linux

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// itemBody is the JSON body every tool-call row sends upstream.
const itemBody = `{"name":"widget","amount":250,"currency":"EUR","note":"bench","tags":["a","b","c"],"lines":[{"sku":"w-1","qty":2},{"sku":"w-2","qty":1}]}`

// benchRego is the "+ Rego" row's user module: three rules over the
// arguments, the kind a security team writes first.
const benchRego = `package sluice.policies.bench

import rego.v1

decisions contains {"action": "allow", "reason": "small amount", "rule": "bench.small"} if {
	input.kind == "tool_call"
	input.tool == "bench.create_item"
	input.args.body.amount <= 1000
}

decisions contains {"action": "ask", "reason": "large amount", "rule": "bench.large"} if {
	input.kind == "tool_call"
	input.args.body.amount > 1000
}

decisions contains {"action": "block", "reason": "forbidden tag", "rule": "bench.tag"} if {
	input.kind == "tool_call"
	some t in input.args.body.tags
	t == "forbidden"
}
`

// opaPolicy is the sidecar's policy: the same three rules over the raw
// request the do-it-yourself proxy forwards.
const opaPolicy = `package bench

import rego.v1

default allow := false

allow if {
	input.method == "POST"
	input.path == "/items"
	input.body.amount <= 1000
	not forbidden
}

forbidden if {
	some t in input.body.tags
	t == "forbidden"
}
`

// opaVersion is the sidecar's version, pinned by issue 8.
const opaVersion = "v1.22.3"

// opaBinary returns the OPA binary, building it once into
// $HOME/.cache/sluice/ from the Go module proxy in a throwaway module. A
// smoke run uses only a cached binary.
func opaBinary() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("opa: home: %w", err)
	}
	dir := filepath.Join(home, ".cache", "sluice", "opa-"+opaVersion)
	bin := filepath.Join(dir, "opa")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if smoke() {
		return "", errors.New("OPA " + opaVersion + " is not built yet in " + dir + " (a full run builds it; the smoke run does not)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("opa: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "install", "github.com/open-policy-agent/opa@"+opaVersion)
	cmd.Dir = os.TempDir() // outside the repository: no go.mod, no workspace
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("opa: go install: %w: %s", err, lastLines(string(out), 3))
	}
	return bin, nil
}

// benchToolCalls is section 1.
func benchToolCalls(t *testing.T, w *world) []*section {
	s := &section{Title: "Tool-call overhead by stage", Baseline: "direct call",
		Intro: "One `POST` with a 170-byte JSON body to a loopback upstream (a process of its own, as a real API is) that answers 23 bytes, sent sequentially over a kept-alive connection; the rows take turns in blocks of 1/40 of their samples (each block after one untimed call), so that load from elsewhere falls on every row alike. " +
			"The gateway rows are the real `sluice serve` binary, one process per row, each with the configuration that adds one stage; " +
			"they are called over the sandbox socket with the identity preamble, as the sandbox relay does. " +
			"Every gateway row still resolves the tool, evaluates the shipped Rego library (`policies:`), dials through the guarded dialer, scrubs the reply and writes two audit records; " +
			"rows 1.4–1.7 keep the audit log on `/dev/shm` so that its `fsync` is nearly free, rows 1.8 and 1.9 put it on the disk."}
	n := iterations(2000)
	warm := 20
	apiURL := fmt.Sprintf("http://127.0.0.1:%d", w.apiPort)

	direct := &http.Client{Transport: peerTransport(w), Timeout: 30 * time.Second}
	post := func(c *http.Client, u string) func() error {
		return func() error {
			req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(itemBody))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Api-Key", w.secret)
			resp, err := c.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		}
	}
	ps := []*probe{{name: "direct call", note: "client → upstream process", fn: post(direct, apiURL+"/items")}}

	// A bare Go reverse proxy in the namespace.
	target, _ := url.Parse(apiURL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = peerTransport(w)
	rpl := w.ns.listen(t, "tcp", "127.0.0.1:0")
	rps := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = rps.Serve(rpl) }()
	t.Cleanup(func() { _ = rps.Close() })
	ps = append(ps, &probe{name: "Go httputil.ReverseProxy", note: "no policy, no audit", fn: post(direct, "http://"+rpl.Addr().String()+"/items")})
	rpURL := "http://" + rpl.Addr().String() + "/items"

	// The do-it-yourself stack: the same reverse proxy asking an OPA REST
	// sidecar per request.
	const opaRow = "ReverseProxy + OPA sidecar"
	var opaURL string // the do-it-yourself stack's address, for the throughput rows
	var opaPid int
	if bin, err := opaBinary(); err != nil {
		ps = append(ps, &probe{name: opaRow, err: err})
	} else if sidecar, pid, err := startOPA(t, w, bin); err != nil {
		ps = append(ps, &probe{name: opaRow, err: err})
	} else {
		oc := &http.Client{Transport: peerTransport(w), Timeout: 10 * time.Second}
		h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(rw, "read", http.StatusBadRequest)
				return
			}
			in, _ := json.Marshal(map[string]any{"input": map[string]any{"method": r.Method, "path": r.URL.Path, "body": json.RawMessage(body)}})
			resp, err := oc.Post(sidecar+"/v1/data/bench/allow", "application/json", bytes.NewReader(in))
			if err != nil {
				http.Error(rw, "policy", http.StatusBadGateway)
				return
			}
			var dec struct {
				Result bool `json:"result"`
			}
			derr := json.NewDecoder(resp.Body).Decode(&dec)
			resp.Body.Close()
			if derr != nil || !dec.Result {
				http.Error(rw, "denied", http.StatusForbidden)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			rp.ServeHTTP(rw, r)
		})
		ol := w.ns.listen(t, "tcp", "127.0.0.1:0")
		osrv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = osrv.Serve(ol) }()
		t.Cleanup(func() { _ = osrv.Close() })
		ps = append(ps, &probe{name: opaRow, note: "opa run --server " + opaVersion + ", one REST query per request", fn: post(direct, "http://"+ol.Addr().String()+"/items")})
		opaURL = "http://" + ol.Addr().String() + "/items"
		opaPid = pid
	}

	stages := []struct {
		name, tool, args string
		o                gwOpts
		what             string
	}{
		{"sluice: pass-through", "bench.echo", `{"body":` + itemBody + `}`, gwOpts{Name: "stage1"},
			"pass-through: tool `bench.echo`, whose body schema is `{}` (validation accepts anything), one simple rule `*: allow`, no credential, audit on /dev/shm"},
		{"sluice: + schema validation", "bench.create_item", `{"body":` + itemBody + `}`, gwOpts{Name: "stage2"},
			"+ schema validation: tool `bench.create_item`, a strict body schema (types, pattern, nested array of objects, additionalProperties false)"},
		{"sluice: + Rego", "bench.create_item", `{"body":` + itemBody + `}`, gwOpts{Name: "stage3", Rego: benchRego},
			"+ Rego: plus a user module `sluice.policies.bench` with three rules over the arguments (the same rules the OPA sidecar evaluates)"},
		{"sluice: + cached credential", "bench.create_item", `{"body":` + itemBody + `}`, gwOpts{Name: "stage4", Rego: benchRego, Credential: true},
			"+ cached credential: plus the API key from the local secret store attached as X-Api-Key (cached after the warm-up) and the reply scrubbed for it"},
		{"sluice: + audit on disk", "bench.create_item", `{"body":` + itemBody + `}`, gwOpts{Name: "stage5", Rego: benchRego, Credential: true, AuditDisk: true},
			"+ audit: the full configuration, with the hash-chained audit log on the disk (each call waits for its fsync'd records)"},
		{"sluice: + audit on disk, sync interval", "bench.create_item", `{"body":` + itemBody + `}`, gwOpts{Name: "stage6", Rego: benchRego, Credential: true, AuditDisk: true, AuditSync: "interval"},
			"the same with audit.sync: interval (records written before the call proceeds, fsynced within 10 ms by a background loop: an operator's choice that trades the last 10 ms of the log on a host crash for not waiting on fsync)"},
	}
	// Every stage's gateway runs at once; the rows are sampled in turns.
	clients := map[*probe]*http.Client{}
	socks := map[string]string{} // stage → its gateway's sandbox socket
	pids := map[string]int{}     // stage → its gateway's process
	debug := map[string]string{} // stage → its debug listener (BENCH_PROFILE)
	for i, st := range stages {
		if profileDir() != "" && (st.o.Name == "stage4" || st.o.Name == "stage5") {
			st.o.Debug = fmt.Sprintf("127.0.0.1:%d", freePort())
			debug[st.o.Name] = st.o.Debug
		}
		s.Notes = append(s.Notes, fmt.Sprintf("row 1.%d, %s", 4+i, st.what))
		g, err := w.startGateway(t, st.o)
		if err != nil {
			ps = append(ps, &probe{name: st.name, err: err})
			continue
		}
		t.Cleanup(g.p.stop)
		socks[st.o.Name] = g.sock
		pids[st.o.Name] = g.p.cmd.Process.Pid
		c := sandboxClient(g.sock, benchAgent)
		p := &probe{name: st.name, fn: func() error { _, err := toolCall(c, st.tool, st.args, 200); return err }}
		clients[p] = c
		ps = append(ps, p)
	}
	// BENCH_AGAINST=REV: the pass-through and full-pipeline rows again,
	// from that revision's binary, in turns with this tree's.
	var againstRows []string
	if againstRev() != "" {
		bin, _, err := w.againstBin()
		for _, i := range []int{0, 3} {
			st := stages[i]
			againstRows = append(againstRows, st.name)
			name := againstName(st.name)
			if err != nil {
				ps = append(ps, &probe{name: name, err: err})
				continue
			}
			o := st.o
			o.Name, o.Bin = st.o.Name+"-against", bin
			g, err := w.startGateway(t, o)
			if err != nil {
				ps = append(ps, &probe{name: name, err: err})
				continue
			}
			t.Cleanup(g.p.stop)
			socks[o.Name], pids[o.Name] = g.sock, g.p.cmd.Process.Pid // the throughput table's row at REV
			c := sandboxClient(g.sock, benchAgent)
			p := &probe{name: name, fn: func() error { _, err := toolCall(c, st.tool, st.args, 200); return err }}
			clients[p] = c
			ps = append(ps, p)
		}
	}
	interleave(ps, n, warm)
	for _, p := range ps {
		if c := clients[p]; c != nil && p.err == nil {
			tool, args := "bench.create_item", `{"body":`+itemBody+`}`
			if p.name == stages[0].name || p.name == againstName(stages[0].name) {
				tool = "bench.echo"
			}
			p.note = connReuse(c, tool, args)
		}
	}
	s.addProbes(ps)
	s.Notes = append(s.Notes, "row 1.1, the baseline: the test client calls the upstream process directly (keep-alive), with the API key",
		"row 1.2, a bare `httputil.ReverseProxy` in front of the upstream: what any proxy costs",
		"row 1.3, the common do-it-yourself stack: the same reverse proxy that, before forwarding, POSTs the method, path and body to a separate `opa run --server` process (OPA "+opaVersion+" binary from the Go module proxy) and forwards only on `result: true`")
	// Notes were appended out of order; put the baseline and peers first.
	s.Notes = append(s.Notes[len(s.Notes)-3:], s.Notes[:len(s.Notes)-3]...)
	if len(againstRows) > 0 {
		s.Notes = append(s.Notes, againstNote(w, againstRows...))
		againstVerdicts(s, nil, againstRows...)
	}
	s.Verdicts = append(s.Verdicts, addedP50("issue 2: an allowed call adds ≤ 0.25 ms at p50 over a direct call (full pipeline, audit on tmpfs: row 1.7)", s.find("sluice: + cached credential"), s.find("direct call"), 250*time.Microsecond),
		addedP50("the same with the audit log on the disk (row 1.8; one fsync per call, not a goal)", s.find("sluice: + audit on disk"), s.find("direct call"), 0))
	return []*section{s, benchToolThroughput(w, post, direct, apiURL, throughputPeers{rpURL, opaURL, opaPid, socks, pids, debug})}
}

// toolConc are the concurrent callers of the tool-call throughput rows.
var toolConc = []int{8, 64}

// throughputPeers are section 1's processes the throughput rows call.
type throughputPeers struct {
	rpURL  string            // the bare reverse proxy (in the test process)
	opaURL string            // the do-it-yourself stack ("" when OPA did not start)
	opaPid int               // its OPA sidecar
	socks  map[string]string // stage → its gateway's sandbox socket
	pids   map[string]int    // stage → its gateway's process
	debug  map[string]string // stage → its debug listener, when BENCH_PROFILE is set
}

// benchToolThroughput is section 1's throughput table: the same calls as
// the latency rows from 8 and 64 concurrent callers, each on its own
// kept-alive connection, the rows taking turns. The do-it-yourself stack
// at the same number of callers is each sluice row's peer.
func benchToolThroughput(w *world, post func(*http.Client, string) func() error, direct *http.Client, apiURL string, pp throughputPeers) *section {
	opaURL, socks := pp.opaURL, pp.socks
	dur := 5 * time.Second
	if smoke() {
		dur = 500 * time.Millisecond
	}
	s := &section{Title: "Tool-call throughput: concurrent kept-alive callers", Baseline: fmt.Sprintf("direct call, %d callers", toolConc[0]), Rate: "calls/s",
		Intro: fmt.Sprintf("The calls of section 1 (the same body, upstream and configurations) from %d and from 64 concurrent callers, each on its own kept-alive connection (its own sandbox socket connection for sluice), for %s per row in %d turns. "+
			"Ratios are to the direct call at %d callers; compare a row with its peer at the same number of callers (the verdicts do). "+
			"The audit-on-disk row waits, as every call does with audit.sync: always, for the fsync that covers its records: concurrent calls share one fsync (group commit).",
			toolConc[0], dur, turns(), toolConc[0])}
	post1 := func(u string) func() (func() error, func()) {
		return func() (func() error, func()) {
			tr := peerTransport(w)
			c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			return post(c, u), tr.CloseIdleConnections
		}
	}
	gwCall := func(sock, tool string) func() (func() error, func()) {
		return func() (func() error, func()) {
			c := sandboxClient(sock, benchAgent)
			args := `{"body":` + itemBody + `}`
			return func() error { _, err := toolCall(c, tool, args, 200); return err }, c.CloseIdleConnections
		}
	}
	type rowDef struct {
		name string
		mk   func() (func() error, func())
		why  string      // not measured
		cpu  []*cpuMeter // the processes serving the row, beside the test process and the upstream
		at   bool        // served by the gateway at BENCH_AGAINST
	}
	// Each row's meters are its own: a meter adds up its row's turns.
	test := func() *cpuMeter { return &cpuMeter{name: "test process"} }
	up := func() *cpuMeter { return &cpuMeter{name: "upstream", pgid: w.apiPid} }
	for _, conc := range toolConc {
		defs := []rowDef{{name: "direct call", mk: post1(apiURL + "/items")}, {name: "Go httputil.ReverseProxy", mk: post1(pp.rpURL)}, {name: "ReverseProxy + OPA sidecar"}, {name: "sluice: full pipeline, audit on tmpfs"}, {name: "sluice: full pipeline, audit on disk (fsync per batch)"}}
		defs[0].cpu = []*cpuMeter{test(), up()}
		defs[1].cpu = []*cpuMeter{test(), up()}
		if opaURL != "" {
			defs[2].mk = post1(opaURL)
			defs[2].cpu = []*cpuMeter{{name: "OPA", pgid: pp.opaPid}, test(), up()}
		} else {
			defs[2].why = "the OPA sidecar did not start (see section 1)"
		}
		for i, stage := range []string{"stage4", "stage5"} {
			if sock := socks[stage]; sock != "" {
				defs[3+i].mk = gwCall(sock, "bench.create_item")
				defs[3+i].cpu = []*cpuMeter{{name: "sluice", pgid: pp.pids[stage]}, test(), up()}
			} else {
				defs[3+i].why = "the gateway did not start (see section 1)"
			}
		}
		if againstRev() != "" {
			d := rowDef{name: defs[3].name, at: true, why: "the gateway at " + againstRev() + " did not start (see section 1)"}
			if sock := socks["stage4-against"]; sock != "" {
				d.mk = gwCall(sock, "bench.create_item")
				d.cpu = []*cpuMeter{{name: "sluice", pgid: pp.pids["stage4-against"]}, test(), up()}
			}
			defs = append(defs, d)
		}
		var round []*tput
		for _, d := range defs {
			name := fmt.Sprintf("%s, %d callers", d.name, conc)
			if d.at {
				name = againstName(name)
			}
			if d.mk == nil {
				s.skip(name, d.why)
				continue
			}
			round = append(round, &tput{row: s.add(&row{Name: name}), mk: d.mk, cpu: d.cpu})
		}
		throughputRounds(round, conc, dur, turns())
		for _, tp := range round {
			if tp.err != nil && tp.row.QPS == 0 {
				tp.row.Reason = "not measured: " + oneLine(tp.err.Error())
			}
		}
		if n := cpuNote(round); n != "" {
			s.Notes = append(s.Notes, n)
		}
		if againstRev() != "" {
			againstVerdicts(s, sluiceCPU(round), fmt.Sprintf("sluice: full pipeline, audit on tmpfs, %d callers", conc))
		}
		if n := proxyCPU(conc, round); n != "" {
			s.Notes = append(s.Notes, n)
		}
		if conc == toolConc[0] {
			for _, stage := range []string{"stage4", "stage5"} {
				if addr := pp.debug[stage]; addr != "" {
					profileGateway(w, stage, addr, conc, gwCall(socks[stage], "bench.create_item"))
				}
			}
		}
	}
	for _, conc := range toolConc {
		peer := s.find(fmt.Sprintf("ReverseProxy + OPA sidecar, %d callers", conc))
		if conc == toolConc[0] {
			s.Verdicts = append(s.Verdicts,
				verdictRatio(fmt.Sprintf("issue 22: full pipeline (audit on tmpfs) calls/s ≥ 1.5× ReverseProxy + OPA sidecar at %d callers", conc), s.find(fmt.Sprintf("sluice: full pipeline, audit on tmpfs, %d callers", conc)), peer, 1.5),
				verdictRatio(fmt.Sprintf("issue 22: with the audit log on disk (fsync per batch) ≥ 1.0× ReverseProxy + OPA sidecar at %d callers", conc), s.find(fmt.Sprintf("sluice: full pipeline, audit on disk (fsync per batch), %d callers", conc)), peer, 1.0))
			continue
		}
		s.Verdicts = append(s.Verdicts,
			verdictRatio(fmt.Sprintf("at %d callers (not a goal): full pipeline, audit on tmpfs, against ReverseProxy + OPA sidecar", conc), s.find(fmt.Sprintf("sluice: full pipeline, audit on tmpfs, %d callers", conc)), peer, 1.0),
			verdictRatio(fmt.Sprintf("at %d callers (not a goal): audit on disk, against ReverseProxy + OPA sidecar", conc), s.find(fmt.Sprintf("sluice: full pipeline, audit on disk (fsync per batch), %d callers", conc)), peer, 1.0))
	}
	if againstRev() != "" {
		s.Notes = append(s.Notes, againstNote(w, "sluice: full pipeline, audit on tmpfs")+"; at each number of callers, in the same turns, with its process's CPU per call")
	}
	s.Notes = append(s.Notes, "the sluice rows are section 1's gateways for rows \"+ cached credential\" (audit on /dev/shm) and \"+ audit on disk\": Rego with the user module, the credential attached and scrubbed, two audit records per call",
		"the peers' HTTP clients keep up to 128 idle connections per host, so that no row opens connections under load that another keeps")
	return s
}

// proxyCPU compares, at conc callers, what each proxy row spends per call
// in its own processes: sluice's one process against the peer's OPA
// sidecar plus its reverse proxy, which runs in the test process beside the
// clients (the test process's CPU per call in the peer's row minus the
// direct row's, which is the clients' alone).
func proxyCPU(conc int, round []*tput) string {
	per := map[string]map[string]float64{} // row → process → CPU-µs per call
	for _, tp := range round {
		if tp.err != nil || tp.done == 0 {
			continue
		}
		m := map[string]float64{}
		for _, p := range tp.cpu {
			m[p.name] = float64(p.used.Microseconds()) / float64(tp.done)
		}
		per[strings.TrimSuffix(tp.row.Name, fmt.Sprintf(", %d callers", conc))] = m
	}
	d, peer := per["direct call"], per["ReverseProxy + OPA sidecar"]
	if d == nil || peer == nil {
		return ""
	}
	rp := peer["test process"] - d["test process"]
	out := fmt.Sprintf("the proxy's own CPU-µs per call at %d callers: ReverseProxy + OPA sidecar %.0f (OPA %.0f, reverse proxy %.0f: the test process's in its row less the direct row's)", conc, peer["OPA"]+rp, peer["OPA"], rp)
	if bare := per["Go httputil.ReverseProxy"]; bare != nil {
		out += fmt.Sprintf("; a bare Go httputil.ReverseProxy %.0f (the floor of any Go HTTP proxy)", bare["test process"]-d["test process"])
	}
	for _, name := range []string{"sluice: full pipeline, audit on tmpfs", "sluice: full pipeline, audit on disk (fsync per batch)"} {
		if m := per[name]; m != nil {
			out += fmt.Sprintf("; %s %.0f (%.2f× the peer's)", name, m["sluice"], m["sluice"]/(peer["OPA"]+rp))
		}
	}
	return out
}

// peerTransport is the test's HTTP transport in the namespace with room
// for every concurrent caller's idle connection.
func peerTransport(w *world) *http.Transport {
	tr := w.ns.transport()
	tr.MaxIdleConnsPerHost = 128
	return tr
}

// startOPA runs the OPA REST server in the namespace with the sidecar
// policy and returns its URL.
func startOPA(t *testing.T, w *world, bin string) (string, int, error) {
	pol := filepath.Join(w.dir, "opa-policy.rego")
	if err := os.WriteFile(pol, []byte(opaPolicy), 0o644); err != nil {
		return "", 0, err
	}
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(freePort()))
	p := start(t, w.ns, bin, "run", "--server", "--addr", addr, "--log-level", "error", "--disable-telemetry", pol)
	if err := waitTCP(w.ns, addr, p); err != nil {
		return "", 0, fmt.Errorf("opa: %w", err)
	}
	return "http://" + addr, p.cmd.Process.Pid, nil
}

// addedP50 reports row's median minus base's against a budget (0 = none).
func addedP50(goal string, row, base *row, budget time.Duration) string {
	if row == nil || base == nil || len(row.Lat) == 0 || len(base.Lat) == 0 {
		return goal + ": not measured"
	}
	add := pct(row.Lat, 50) - pct(base.Lat, 50)
	switch {
	case budget == 0:
		return fmt.Sprintf("%s: added %s", goal, fmtDur(add))
	case add <= budget:
		return fmt.Sprintf("%s: **met** (added %s)", goal, fmtDur(add))
	}
	return fmt.Sprintf("%s: **not met** (added %s)", goal, fmtDur(add))
}

// connReuse says whether the gateway kept the sandbox connection alive
// between calls (the rows are sequential calls on one client).
func connReuse(c *http.Client, tool, args string) string {
	var reused bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://sluice/v1/tools/"+tool, strings.NewReader(args))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return ""
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if reused {
		return "socket connection kept alive"
	}
	return "a new socket connection per call (the gateway closes it)"
}
