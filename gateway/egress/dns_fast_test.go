package egress

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// sameAnswer fails unless fast and full say the same: ID, flags, rcode,
// the question exactly as asked, and the same address records (the TTL
// may have ticked down by a second between the two).
func sameAnswer(t testing.TB, fast, full []byte) {
	t.Helper()
	a, b := new(mdns.Msg), new(mdns.Msg)
	if err := a.Unpack(fast); err != nil {
		t.Fatalf("fast answer does not parse: %v", err)
	}
	if err := b.Unpack(full); err != nil {
		t.Fatalf("full answer does not parse: %v", err)
	}
	if a.MsgHdr != b.MsgHdr || !slices.Equal(a.Question, b.Question) || len(a.Answer) != len(b.Answer) || len(a.Ns)+len(a.Extra) != 0 {
		t.Fatalf("fast answer\n%v\nfull answer\n%v", a, b)
	}
	for i := range a.Answer {
		ha, hb := a.Answer[i].Header(), b.Answer[i].Header()
		if ha.Name != hb.Name || ha.Rrtype != hb.Rrtype || ha.Class != hb.Class || ha.Ttl > hb.Ttl+1 || hb.Ttl > ha.Ttl+1 ||
			ha.Ttl > answerTTL || !mdns.IsDuplicate(stripTTL(a.Answer[i]), stripTTL(b.Answer[i])) {
			t.Fatalf("record %d: fast %v, full %v", i, a.Answer[i], b.Answer[i])
		}
	}
}

func stripTTL(rr mdns.RR) mdns.RR {
	rr = mdns.Copy(rr)
	rr.Header().Ttl = 0
	return rr
}

// TestDNSAnswerFast: the stream's inline answerer answers only what it can
// answer from the caches for this caller — and then exactly as answer
// does — and leaves everything else (refusals, NOTIMP, EDNS, names not
// decided yet for this caller, a reloaded policy) to answer.
func TestDNSAnswerFast(t *testing.T) {
	addr, upstreamQueries := newCachingDNSUpstream(t, map[string]string{"a.allowed.test": "93.184.216.34", "rebind.test": "127.0.0.1"})
	g := startEgressGateway(t, &egresstest.DNSUpstream{Addr: addr}, nil)
	eg := g.newProxy()
	ctx := context.Background()
	q := func(name string, qtype uint16, edit func(*mdns.Msg)) []byte {
		m := new(mdns.Msg)
		m.SetQuestion(name, qtype)
		m.Id = 0x5151
		m.CheckingDisabled = true
		if edit != nil {
			edit(m)
		}
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name  string
		id    wire.Identity
		raw   []byte
		warm  bool // asked through answer first, which fills the caches
		fast  bool
		rcode int
	}{
		{"allowed A, cached", agentA, q("a.allowed.test.", mdns.TypeA, nil), true, true, mdns.RcodeSuccess},
		{"allowed A, mixed case: question echoed as asked (0x20)", agentA, q("A.aLLowed.Test.", mdns.TypeA, nil), true, true, mdns.RcodeSuccess},
		{"MX of an allowed name: empty NOERROR", agentA, q("a.allowed.test.", mdns.TypeMX, nil), true, true, mdns.RcodeSuccess},
		{"not decided yet for this caller", agentA, q("b.allowed.test.", mdns.TypeMX, nil), false, false, 0},
		{"allowed for agent-a, asked by agent-b", agentB, q("a.allowed.test.", mdns.TypeA, nil), true, false, mdns.RcodeRefused},
		{"unlisted name: refused on the full path (audited)", agentA, q("evil.example.", mdns.TypeA, nil), true, false, mdns.RcodeRefused},
		{"C6 rebinding answer: refused on the full path", agentA, q("rebind.test.", mdns.TypeA, nil), true, false, mdns.RcodeRefused},
		{"C7 TXT: NOTIMP on the full path", agentA, q("a.allowed.test.", mdns.TypeTXT, nil), true, false, mdns.RcodeNotImplemented},
		{"EDNS: full path", agentA, q("a.allowed.test.", mdns.TypeA, func(m *mdns.Msg) { m.SetEdns0(1232, false) }), true, false, mdns.RcodeSuccess},
		{"NXDOMAIN is never cached", agentA, q("nx.test.", mdns.TypeA, nil), true, false, mdns.RcodeNameError},
		{"localhost: refused by name", agentA, q("localhost.", mdns.TypeA, nil), true, false, mdns.RcodeRefused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var full []byte
			if tc.warm {
				full = (answerer{eg}).answer(ctx, "warm", tc.id, tc.raw)
				if m := new(mdns.Msg); m.Unpack(full) != nil || m.Rcode != tc.rcode {
					t.Fatalf("full path: rcode %v, want %s", m.Rcode, mdns.RcodeToString[tc.rcode])
				}
			}
			before := upstreamQueries.Load()
			out, ok := (answerer{eg}).answerFast(ctx, tc.id, tc.raw, nil, nil)
			if ok != tc.fast {
				t.Fatalf("answered inline = %v, want %v", ok, tc.fast)
			}
			if n := upstreamQueries.Load() - before; n != 0 {
				t.Errorf("the inline answerer asked upstream %d times", n)
			}
			if ok {
				sameAnswer(t, out, full)
			}
		})
	}

	t.Run("counts the name for the exfiltration signal, per caller", func(t *testing.T) {
		eg.subs.mu.Lock()
		delete(eg.subs.m, [2]string{agentA.Sandbox, "allowed.test"})
		eg.subs.mu.Unlock()
		if _, ok := (answerer{eg}).answerFast(ctx, agentA, q("a.allowed.test.", mdns.TypeA, nil), nil, nil); !ok {
			t.Fatal("not answered inline")
		}
		eg.subs.mu.Lock()
		ns := eg.subs.m[[2]string{agentA.Sandbox, "allowed.test"}]
		eg.subs.mu.Unlock()
		if ns == nil {
			t.Fatal("no name set for agent-a's sandbox and allowed.test")
		}
		if _, ok := ns.names["a.allowed.test"]; !ok {
			t.Errorf("names %v, want a.allowed.test counted", ns.names)
		}
	})

	t.Run("a policy reload applies to the next question", func(t *testing.T) {
		raw := q("a.allowed.test.", mdns.TypeA, nil)
		if _, ok := (answerer{eg}).answerFast(ctx, agentA, raw, nil, nil); !ok {
			t.Fatal("not answered inline before the reload")
		}
		if err := g.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := (answerer{eg}).answerFast(ctx, agentA, raw, nil, nil); ok {
			t.Error("answered inline from a decision of the engine before the reload")
		}
	})
}

// TestDNSStreamUDP runs the sandbox's whole path over UDP — the stub's
// batched fast path (dns.Stub with Stream), the stream, the gateway's
// inline answerer or its workers — asking each question twice, so the
// second is answered from the caches: every rcode rule holds both times,
// cached answers ask no upstream, and refusals are audited each time.
func TestDNSStreamUDP(t *testing.T) {
	addr, upstreamQueries := newCachingDNSUpstream(t, map[string]string{"a.allowed.test": "93.184.216.34", "rebind.test": "127.0.0.1"})
	g := startEgressGateway(t, &egresstest.DNSUpstream{Addr: addr}, nil)
	fa, fb := egresstest.StreamForwarder(g.cfg.Gateway.SandboxSocket, agentA), egresstest.StreamForwarder(g.cfg.Gateway.SandboxSocket, agentB)
	t.Cleanup(func() { fa.Close(); fb.Close() })
	udpA, udpB := serveStubUDP(t, &dns.Stub{Forward: fa.Forward, Stream: fa}), serveStubUDP(t, &dns.Stub{Forward: fb.Forward, Stream: fb})
	tests := []struct {
		name    string
		addr    string
		qname   string
		qtype   uint16
		rcode   int
		queries int64 // upstream queries for both questions
		answers int
	}{
		{"allowed A, case as asked (0x20)", udpA, "A.Allowed.TEST.", mdns.TypeA, mdns.RcodeSuccess, 1, 1},
		{"unlisted name: refused, zero upstream queries", udpA, "evil.example.", mdns.TypeA, mdns.RcodeRefused, 0, 0},
		{"allowed for agent-a, not for agent-b's stream", udpB, "a.allowed.test.", mdns.TypeAAAA, mdns.RcodeRefused, 0, 0},
		{"C6 allowed name answering loopback (rebinding)", udpA, "rebind.test.", mdns.TypeA, mdns.RcodeRefused, 1, 0},
		{"NXDOMAIN passes through", udpA, "nx.test.", mdns.TypeA, mdns.RcodeNameError, 2, 0},
		{"C7 TXT is not implemented", udpA, "a.allowed.test.", mdns.TypeTXT, mdns.RcodeNotImplemented, 0, 0},
		{"MX of an allowed name: empty answer", udpA, "a.allowed.test.", mdns.TypeMX, mdns.RcodeSuccess, 0, 0},
		{"a byte outside letters, digits, '-' and '_': FORMERR", udpA, "a*b.allowed.test.", mdns.TypeA, mdns.RcodeFormatError, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := upstreamQueries.Load()
			for i := range 2 {
				m := new(mdns.Msg).SetQuestion(tc.qname, tc.qtype)
				r := udpExchange(t, tc.addr, m)
				if r.Rcode != tc.rcode || len(r.Answer) != tc.answers || r.Id != m.Id {
					t.Fatalf("question %d: %s with %d answers (id %#x), want %s with %d (id %#x)", i+1,
						mdns.RcodeToString[r.Rcode], len(r.Answer), r.Id, mdns.RcodeToString[tc.rcode], tc.answers, m.Id)
				}
				if len(r.Question) != 1 || r.Question[0].Name != tc.qname {
					t.Fatalf("question %v, want %q as asked", r.Question, tc.qname)
				}
				for _, rr := range r.Answer {
					if rr.Header().Name != tc.qname || rr.Header().Ttl > answerTTL || rr.Header().Ttl == 0 {
						t.Errorf("record %v: want owner %q and a TTL in 1..%d", rr, tc.qname, answerTTL)
					}
				}
			}
			if n := upstreamQueries.Load() - before; n != tc.queries {
				t.Errorf("upstream saw %d queries, want %d", n, tc.queries)
			}
		})
	}
	refused := 0
	for _, r := range auditEvents(t, g) {
		if r.Event == "dns_refused" && r.Fields["dest_host"] == "evil.example" && r.Fields["agent"] == "agent-a" {
			refused++
		}
	}
	if refused != 2 {
		t.Errorf("%d dns_refused records for evil.example, want one per question (2)", refused)
	}
}

// serveStubUDP serves st on a loopback UDP socket until the test ends.
func serveStubUDP(t *testing.T, st *dns.Stub) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- st.ServeUDP(pc) }()
	t.Cleanup(func() {
		pc.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeUDP: %v", err)
		}
	})
	return pc.LocalAddr().String()
}

func udpExchange(t *testing.T, addr string, m *mdns.Msg) *mdns.Msg {
	t.Helper()
	c := &mdns.Client{Net: "udp", Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	return r
}

// FuzzDNSAnswerFast: whatever the inline answerer answers, it answers as
// answer does for the same question (differential, after answer has
// filled the caches).
func FuzzDNSAnswerFast(f *testing.F) {
	addr, _ := newCachingDNSUpstream(f, map[string]string{"a.allowed.test": "93.184.216.34", "pkg.example": "93.184.216.35"})
	g := startEgressGateway(f, &egresstest.DNSUpstream{Addr: addr}, nil)
	eg := g.newProxy()
	seed := func(name string, qtype uint16) []byte {
		m := new(mdns.Msg)
		m.SetQuestion(name, qtype)
		b, _ := m.Pack()
		return b
	}
	f.Add(seed("a.allowed.test.", mdns.TypeA))    // allowed, cached
	f.Add(seed("PKG.example.", mdns.TypeA))       // allowed, mixed case
	f.Add(seed("a.allowed.test.", mdns.TypeAAAA)) // allowed, no AAAA record (NODATA, not cached)
	f.Add(seed("evil.example.", mdns.TypeA))      // refused
	f.Add(seed("a.allowed.test.", mdns.TypeSRV))  // empty NOERROR
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) > maxDNSMessage {
			return
		}
		full := (answerer{eg}).answer(context.Background(), "fuzz", agentA, raw)
		if fast, ok := (answerer{eg}).answerFast(context.Background(), agentA, raw, nil, nil); ok {
			sameAnswer(t, fast, full)
		}
	})
}
