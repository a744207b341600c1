package egress

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
)

// newCachingDNSUpstream is a miekg/dns server on 127.0.0.1:0 answering A
// questions from table with a TTL of 300 s, so the gateway's cache holds
// its answers (newDNSUpstream answers TTL 0, which is never cached).
func newCachingDNSUpstream(tb testing.TB, table map[string]string) (string, *atomic.Int64) {
	tb.Helper()
	var n atomic.Int64
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, q *mdns.Msg) {
		n.Add(1)
		m := new(mdns.Msg)
		m.SetReply(q)
		name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
		ip, ok := table[name]
		switch {
		case !ok:
			m.Rcode = mdns.RcodeNameError
		case q.Question[0].Qtype == mdns.TypeA:
			rr, _ := mdns.NewRR(fmt.Sprintf("%s 300 IN A %s", q.Question[0].Name, ip))
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String(), &n
}

func packQuestion(tb testing.TB, name string, qtype uint16) []byte {
	tb.Helper()
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	b, err := m.Pack()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// BenchmarkDNSAnswer measures the gateway's DNS answerer for one caller
// asking an allowed name whose answer is cached, and an unlisted name
// (REFUSED and audited):
//
//   - answer: the answerer in process (policy, cache, guard, pack);
//   - answer/fast: the stream's inline answerer for the same question;
//   - http: POST /v1/dns over the real sandbox socket, kept alive, from
//     GOMAXPROCS parallel clients, as the relay's stub did per query;
//   - stream: the same questions over the stub's StreamForwarder (see
//     dns_stream.go), from many goroutines at once;
//   - stub/udp: UDP questions to a dns.Stub that forwards over the stream,
//     the whole path a sandbox's resolver takes (without the netns).
//
// Run with: go test -run '^$' -bench BenchmarkDNSAnswer ./gateway
func BenchmarkDNSAnswer(b *testing.B) {
	addr, upstreamQueries := newCachingDNSUpstream(b, map[string]string{"pkg.allowed.test": "93.184.216.34"})
	up := &egresstest.DNSUpstream{Addr: addr}
	g := startEgressGateway(b, up, nil)
	eg := g.newProxy()
	allowed := packQuestion(b, "pkg.allowed.test.", mdns.TypeA)
	refused := packQuestion(b, "evil.example.", mdns.TypeA)
	check := func(b *testing.B, out []byte, rcode int) {
		m := new(mdns.Msg)
		if err := m.Unpack(out); err != nil {
			b.Fatalf("answer does not parse: %v", err)
		}
		if m.Rcode != rcode {
			b.Fatalf("rcode %s, want %s", mdns.RcodeToString[m.Rcode], mdns.RcodeToString[rcode])
		}
	}
	check(b, (answerer{eg}).answer(context.Background(), "warm", agentA, allowed), mdns.RcodeSuccess)

	b.Run("answer/allowed", func(b *testing.B) {
		b.ReportAllocs()
		before := upstreamQueries.Load()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if out := (answerer{eg}).answer(context.Background(), "bench", agentA, allowed); len(out) == 0 {
					b.Error("no answer")
					return
				}
			}
		})
		if n := upstreamQueries.Load() - before; n != 0 {
			b.Errorf("%d upstream queries for a cached name, want 0", n)
		}
	})
	b.Run("answer/fast", func(b *testing.B) {
		// The stream's inline answerer on the same question (dns_fast.go).
		b.ReportAllocs()
		var tally dnsTally
		buf := make([]byte, 0, 512)
		slow := 0
		for b.Loop() {
			if _, ok := (answerer{eg}).answerFast(context.Background(), agentA, allowed, buf[:0], &tally); !ok {
				// The cached decision expired (decisionTTL): the
				// full path decides again, as on the stream.
				slow++
				(answerer{eg}).answer(context.Background(), "bench", agentA, allowed)
			}
		}
		tally.flush(eg)
		if slow > int(b.Elapsed()/decisionTTL)+1 {
			b.Errorf("%d questions took the full path in %v, want about one per %v", slow, b.Elapsed(), decisionTTL)
		}
	})
	b.Run("answer/refused", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			(answerer{eg}).answer(context.Background(), "bench", agentA, refused)
		}
	})
	b.Run("http/allowed", func(b *testing.B) {
		c := g.client(agentA)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := c.Post("http://sluice/v1/dns", "application/dns-message", bytes.NewReader(allowed))
				if err != nil {
					b.Error(err)
					return
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || len(out) == 0 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	})
	b.Run("stream/allowed", func(b *testing.B) {
		fwd := egresstest.StreamForwarder(g.cfg.Gateway.SandboxSocket, agentA)
		defer fwd.Close()
		b.ReportAllocs()
		b.SetParallelism(32) // the stub answers up to 64 questions at once
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				out, err := fwd.Forward(context.Background(), allowed)
				if err != nil || len(out) == 0 {
					b.Errorf("forward: %v", err)
					return
				}
			}
		})
	})
	b.Run("stub/udp", func(b *testing.B) {
		// The sandbox's path: UDP to the stub, the stream to the gateway.
		fwd := egresstest.StreamForwarder(g.cfg.Gateway.SandboxSocket, agentA)
		defer fwd.Close()
		st := &dns.Stub{Forward: fwd.Forward, Stream: fwd}
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- st.ServeUDP(pc) }()
		defer func() { pc.Close(); <-done }()
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			c, err := net.Dial("udp", pc.LocalAddr().String())
			if err != nil {
				b.Error(err)
				return
			}
			defer c.Close()
			buf := make([]byte, 512)
			for pb.Next() {
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write(allowed); err != nil {
					b.Error(err)
					return
				}
				if _, err := c.Read(buf); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
