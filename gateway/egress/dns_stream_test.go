package egress

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

var agentB = wire.Identity{Sandbox: "sb-2", Agent: "agent-b", Session: "s-2", User: "bob", Host: "h1"}

// TestDNSStream: the stub's streaming transport answers every case exactly
// as a single POST /v1/dns does (THREATS C6, C7, C9), for the caller the
// stream's preamble named.
func TestDNSStream(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{
		"a.allowed.test": "93.184.216.34", "rebind.test": "127.0.0.1", "meta.test": "169.254.169.254",
	})
	g := startEgressGateway(t, up, nil)
	fa, fb := egresstest.StreamForwarder(g.cfg.Gateway.SandboxSocket, agentA), egresstest.StreamForwarder(g.cfg.Gateway.SandboxSocket, agentB)
	t.Cleanup(func() { fa.Close(); fb.Close() })
	stubA, stubB := &dns.Stub{Forward: fa.Forward}, &dns.Stub{Forward: fb.Forward}
	tests := []struct {
		name    string
		stub    *dns.Stub
		qname   string
		qtype   uint16
		rcode   int
		queries int64
		answers int
	}{
		{"allowed A", stubA, "a.allowed.test.", mdns.TypeA, mdns.RcodeSuccess, 1, 1},
		{"allowed A, mixed case (RFC 4343)", stubA, "A.Allowed.TEST.", mdns.TypeA, mdns.RcodeSuccess, 1, 1},
		{"unlisted name: refused, zero upstream queries", stubA, "evil.example.", mdns.TypeA, mdns.RcodeRefused, 0, 0},
		{"C9 exfiltration-shaped unlisted name", stubA, "c2VjcmV0.evil.example.", mdns.TypeAAAA, mdns.RcodeRefused, 0, 0},
		{"allowed for agent-a, not for agent-b's stream", stubB, "a.allowed.test.", mdns.TypeA, mdns.RcodeRefused, 0, 0},
		{"C6 allowed name answering loopback (rebinding)", stubA, "rebind.test.", mdns.TypeA, mdns.RcodeRefused, 1, 0},
		{"allowed name answering metadata", stubA, "meta.test.", mdns.TypeA, mdns.RcodeRefused, 1, 0},
		{"upstream SERVFAIL", stubA, "servfail.test.", mdns.TypeA, mdns.RcodeServerFailure, 1, 0},
		{"NXDOMAIN passes through", stubA, "nx.test.", mdns.TypeA, mdns.RcodeNameError, 1, 0},
		{"C7 TXT is not implemented", stubA, "a.allowed.test.", mdns.TypeTXT, mdns.RcodeNotImplemented, 0, 0},
		{"MX of an allowed name: empty answer", stubA, "a.allowed.test.", mdns.TypeMX, mdns.RcodeSuccess, 0, 0},
		{"localhost is refused whatever policy says", stubA, "localhost.", mdns.TypeA, mdns.RcodeRefused, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := up.Queries.Load()
			m := egresstest.StubAsk(t, tc.stub, tc.qname, tc.qtype)
			if m.Rcode != tc.rcode {
				t.Errorf("rcode %s, want %s", mdns.RcodeToString[m.Rcode], mdns.RcodeToString[tc.rcode])
			}
			if n := up.Queries.Load() - before; n != tc.queries {
				t.Errorf("upstream saw %d queries, want %d", n, tc.queries)
			}
			if len(m.Answer) != tc.answers {
				t.Errorf("%d answers, want %d", len(m.Answer), tc.answers)
			}
		})
	}
	// Every refusal is audited for the stream's caller.
	var refusedA, refusedB, internal bool
	for _, r := range auditEvents(t, g) {
		switch {
		case r.Event == "dns_refused" && r.Fields["dest_host"] == "evil.example" && r.Fields["agent"] == "agent-a":
			refusedA = true
		case r.Event == "dns_refused" && r.Fields["dest_host"] == "a.allowed.test" && r.Fields["agent"] == "agent-b" && r.Fields["sandbox"] == "sb-2":
			refusedB = true
		case r.Event == "dns_internal_answer" && r.Fields["dest_host"] == "rebind.test":
			internal = true
		}
	}
	if !refusedA || !refusedB || !internal {
		t.Errorf("audit: refused agent-a %v, refused agent-b %v, internal answer %v; want all", refusedA, refusedB, internal)
	}
}

// TestDNSStreamConcurrent: many questions in flight on the streams at once,
// from clients that all use the same DNS ID, each get their own answer.
func TestDNSStreamConcurrent(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{"a.allowed.test": "93.184.216.34", "b.allowed.test": "93.184.216.35"})
	g := startEgressGateway(t, up, nil)
	fa := egresstest.StreamForwarder(g.cfg.Gateway.SandboxSocket, agentA)
	t.Cleanup(func() { fa.Close() })
	st := &dns.Stub{Forward: fa.Forward}
	var wg sync.WaitGroup
	errs := make(chan string, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name, want, rcode := "a.allowed.test.", "93.184.216.34", mdns.RcodeSuccess
			switch i % 3 {
			case 1:
				name, want = "b.allowed.test.", "93.184.216.35"
			case 2:
				name, want, rcode = "evil.example.", "", mdns.RcodeRefused
			}
			q := new(mdns.Msg)
			q.SetQuestion(name, mdns.TypeA)
			q.Id = 7 // the same ID from every client
			raw, _ := q.Pack()
			m := new(mdns.Msg)
			if err := m.Unpack(st.Answer(context.Background(), raw, 0)); err != nil {
				errs <- err.Error()
				return
			}
			got := ""
			if len(m.Answer) == 1 {
				if a, ok := m.Answer[0].(*mdns.A); ok {
					got = a.A.String()
				}
			}
			if m.Id != 7 || m.Rcode != rcode || got != want || m.Question[0].Name != name {
				errs <- name + ": id " + mdns.RcodeToString[m.Rcode] + " " + got
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestDNSStreamFraming: a frame that cannot be a DNS message ends the
// stream (nothing is answered for it); a good frame holding garbage is
// answered FORMERR; the wrong Content-Type is still 415.
func TestDNSStreamFraming(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{})
	g := startEgressGateway(t, up, nil)
	c := g.client(agentA)
	resp, err := c.Post("http://sluice/v1/dns", "application/octet-stream", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("wrong content type: %d, want 415", resp.StatusCode)
	}
	frame := func(b []byte) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...) }
	tests := []struct {
		name  string
		body  []byte
		rcode []int // the answers, in order
	}{
		{"garbage in a good frame: FORMERR", frame([]byte{0x12, 0x34, 0xff}), []int{mdns.RcodeFormatError}},
		{"zero-length frame ends the stream", append(frame([]byte{0x12, 0x34, 0xff}), 0, 0, 0, 3, 1, 2, 3), []int{mdns.RcodeFormatError}},
		{"oversized frame ends the stream", append([]byte{0xff, 0xff}, bytes.Repeat([]byte{0}, 100)...), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, "http://sluice/v1/dns", io.NopCloser(bytes.NewReader(tc.body)))
			req.Header.Set("Content-Type", DNSStreamType)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != DNSStreamType {
				t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			out, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for len(out) >= 2 {
				n := int(binary.BigEndian.Uint16(out))
				m := new(mdns.Msg)
				if err := m.Unpack(out[2 : 2+n]); err != nil {
					t.Fatalf("answer does not parse: %v", err)
				}
				got = append(got, m.Rcode)
				out = out[2+n:]
			}
			if len(got) != len(tc.rcode) {
				t.Fatalf("answers %v, want %v", got, tc.rcode)
			}
			for i := range got {
				if got[i] != tc.rcode[i] {
					t.Errorf("answer %d: %s, want %s", i, mdns.RcodeToString[got[i]], mdns.RcodeToString[tc.rcode[i]])
				}
			}
		})
	}
	if up.Queries.Load() != 0 {
		t.Errorf("upstream saw %d queries, want 0", up.Queries.Load())
	}
}

// TestDNSDecisionCacheReload: a policy reload takes effect on the very
// next question, well within the decision cache's TTL.
func TestDNSDecisionCacheReload(t *testing.T) {
	dir := t.TempDir()
	mod := filepath.Join(dir, "team.rego")
	rule := func(host string) []byte {
		return []byte("package sluice.policies.team\n\nimport rego.v1\n\n" +
			`decisions contains {"action": "block", "reason": "frozen", "rule": "team.dns_freeze"} if {` + "\n" +
			`	input.kind == "dns"` + "\n" + `	input.request.host == "` + host + `"` + "\n}\n")
	}
	if err := os.WriteFile(mod, rule("nothing.test"), 0o644); err != nil {
		t.Fatal(err)
	}
	up := egresstest.NewDNSUpstream(t, map[string]string{"a.allowed.test": "93.184.216.34"})
	g := startEgressGateway(t, up, func(c *config.Config) { c.Rego = []string{dir} })
	fa := egresstest.StreamForwarder(g.cfg.Gateway.SandboxSocket, agentA)
	t.Cleanup(func() { fa.Close() })
	st := &dns.Stub{Forward: fa.Forward}
	if m := egresstest.StubAsk(t, st, "a.allowed.test.", mdns.TypeA); m.Rcode != mdns.RcodeSuccess {
		t.Fatalf("before the reload: %s, want NOERROR", mdns.RcodeToString[m.Rcode])
	}
	if err := os.WriteFile(mod, rule("a.allowed.test"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := g.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := up.Queries.Load()
	m := egresstest.StubAsk(t, st, "a.allowed.test.", mdns.TypeA)
	if time.Since(start) >= decisionTTL {
		t.Skip("too slow to tell the reload from the cache's TTL")
	}
	if m.Rcode != mdns.RcodeRefused || up.Queries.Load() != before {
		t.Errorf("after the reload: %s with %d upstream queries, want REFUSED and none", mdns.RcodeToString[m.Rcode], up.Queries.Load()-before)
	}
	if !hasEvent(t, g, "dns_refused", "a.allowed.test") {
		t.Error("the refusal was not audited")
	}
}

// TestDNSDecisions covers the cache itself: keyed by engine, version,
// caller and name; policy errors are never cached; entries expire.
func TestDNSDecisions(t *testing.T) {
	e1, e2 := policy.BlockAll("a"), policy.BlockAll("b")
	allow := policy.Decision{Action: policy.Allow, Rule: "egress"}
	k := dnsDecisionKey{caller: policy.Caller{Sandbox: "sb-1", Agent: "agent-a"}, host: "a.test"}
	now := time.Now()
	tests := []struct {
		name string
		put  func(dc *dnsDecisions)
		get  func(dc *dnsDecisions) bool
		want bool
	}{
		{"hit", func(dc *dnsDecisions) { dc.put(e1, 1, k, allow, now) },
			func(dc *dnsDecisions) bool { _, ok := dc.get(e1, 1, k, now); return ok }, true},
		{"another engine", func(dc *dnsDecisions) { dc.put(e1, 1, k, allow, now) },
			func(dc *dnsDecisions) bool { _, ok := dc.get(e2, 1, k, now); return ok }, false},
		{"another version", func(dc *dnsDecisions) { dc.put(e1, 1, k, allow, now) },
			func(dc *dnsDecisions) bool { _, ok := dc.get(e1, 2, k, now); return ok }, false},
		{"another caller", func(dc *dnsDecisions) { dc.put(e1, 1, k, allow, now) },
			func(dc *dnsDecisions) bool {
				k2 := k
				k2.caller.Session = "s-2"
				_, ok := dc.get(e1, 1, k2, now)
				return ok
			}, false},
		{"expired", func(dc *dnsDecisions) { dc.put(e1, 1, k, allow, now) },
			func(dc *dnsDecisions) bool { _, ok := dc.get(e1, 1, k, now.Add(decisionTTL)); return ok }, false},
		{"policy error is not cached", func(dc *dnsDecisions) {
			dc.put(e1, 1, k, policy.Decision{Action: policy.Block, Rule: policy.RulePolicyError}, now)
		}, func(dc *dnsDecisions) bool { _, ok := dc.get(e1, 1, k, now); return ok }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dc := &dnsDecisions{}
			tc.put(dc)
			if got := tc.get(dc); got != tc.want {
				t.Errorf("cached = %v, want %v", got, tc.want)
			}
		})
	}
	dc := &dnsDecisions{}
	for i := range maxCachedDecisions + 10 {
		k2 := k
		k2.host = strings.Repeat("x", i%50) + string(rune('a'+i%26)) + net.IPv4(0, 0, byte(i>>8), byte(i)).String()
		dc.put(e1, 1, k2, allow, now)
	}
	if len(dc.m) > maxCachedDecisions {
		t.Errorf("%d cached decisions, want at most %d", len(dc.m), maxCachedDecisions)
	}
}

// TestDNSStreamWorkerBudget: one sandbox's streams share dnsSandboxInflight
// workers (THREATS B); every stream still gets its first worker, and
// another sandbox's budget is its own.
func TestDNSStreamWorkerBudget(t *testing.T) {
	st := newDNSState()
	for i := range dnsSandboxInflight {
		if !st.takeWorker("sb-1", false) {
			t.Fatalf("worker %d refused under the budget", i)
		}
	}
	tests := []struct {
		name    string
		sandbox string
		first   bool
		want    bool
	}{
		{"over the budget", "sb-1", false, false},
		{"a stream's first worker beyond the budget", "sb-1", true, true},
		{"another sandbox", "sb-2", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := st.takeWorker(tc.sandbox, tc.first); got != tc.want {
				t.Errorf("takeWorker = %v, want %v", got, tc.want)
			}
		})
	}
	st.putWorker("sb-1")
	st.putWorker("sb-1")
	if !st.takeWorker("sb-1", false) {
		t.Error("a worker given back was not available again")
	}
	for range dnsSandboxInflight + 1 {
		st.putWorker("sb-1")
	}
	st.putWorker("sb-2")
	if len(st.workers) != 0 {
		t.Errorf("budgets left after every worker was given back: %v", st.workers)
	}
}
