package dns

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// answerWith answers a plain query with rcode and addrs at ttl, in the
// gateway's fast-path shape, counting the questions it saw.
func answerWith(rcode int, ttl uint32, addrs ...string) func(context.Context, []byte) ([]byte, error) {
	return func(_ context.Context, query []byte) ([]byte, error) {
		q, ok := ParseQuery(query)
		if !ok {
			return nil, nil
		}
		var as []netip.Addr
		for _, a := range addrs {
			as = append(as, netip.MustParseAddr(a))
		}
		return AppendAnswer(nil, &q, rcode, as, ttl), nil
	}
}

// TestStubUDPCache: with CacheFor, a positive A or AAAA answer is reused
// for the same question (any case, any ID, any RD) until CacheFor or its
// TTL ends, whichever is first; refusals, NXDOMAIN, empty answers and
// TTL-0 answers reach the gateway every time, and without CacheFor
// nothing is reused.
func TestStubUDPCache(t *testing.T) {
	start := func(t *testing.T, answer func(context.Context, []byte) ([]byte, error), cacheFor time.Duration) (string, *streamPeer) {
		p := startStreamPeer(t, &streamPeer{answer: answer})
		f := &StreamForwarder{Dial: p.dial}
		t.Cleanup(func() { f.Close() })
		udp, _ := startStub(t, &Stub{Forward: f.Forward, Stream: f, Timeout: time.Second, CacheFor: cacheFor})
		return udp, p
	}
	asked := func(t *testing.T, p *streamPeer, want int64) {
		t.Helper()
		if n := p.asked.Load(); n != want {
			t.Fatalf("the gateway saw %d questions, want %d", n, want)
		}
	}

	t.Run("reused for the same question, as asked", func(t *testing.T) {
		udp, p := start(t, answerWith(mdns.RcodeSuccess, 60, "192.0.2.7", "192.0.2.8"), time.Hour)
		first := udpAsk(t, udp, query("pkg.Example", mdns.TypeA))
		asked(t, p, 1)
		q := query("PKG.example", mdns.TypeA)
		q.Id, q.RecursionDesired, q.CheckingDisabled = 0xbeef, false, true
		r := udpAsk(t, udp, q)
		asked(t, p, 1)
		if r.Id != 0xbeef || r.RecursionDesired || !r.CheckingDisabled || !r.RecursionAvailable || r.Rcode != mdns.RcodeSuccess {
			t.Fatalf("reply id %#x RD %v CD %v RA %v rcode %d; want the query's id, RD and CD, RA, NOERROR", r.Id, r.RecursionDesired, r.CheckingDisabled, r.RecursionAvailable, r.Rcode)
		}
		if len(r.Question) != 1 || r.Question[0].Name != "PKG.example." {
			t.Fatalf("question %v, want PKG.example. exactly as asked", r.Question)
		}
		if len(r.Answer) != 2 || len(first.Answer) != 2 {
			t.Fatalf("answers %v, first reply's %v; want two each", r.Answer, first.Answer)
		}
		for i, rr := range r.Answer {
			a, ok := rr.(*mdns.A)
			if !ok || a.Hdr.Name != "PKG.example." || a.Hdr.Ttl != 60 || !a.A.Equal(first.Answer[i].(*mdns.A).A) {
				t.Fatalf("answer %d: %v, want the first reply's %v owned by the name as asked", i, rr, first.Answer[i])
			}
		}
		// Another type, another name: asked.
		udpAsk(t, udp, query("pkg.example", mdns.TypeAAAA))
		udpAsk(t, udp, query("other.example", mdns.TypeA))
		asked(t, p, 3)
	})
	for _, tc := range []struct {
		name     string
		ttl      uint32
		cacheFor time.Duration
		wait     time.Duration
	}{
		{"kept for CacheFor only", 60, 100 * time.Millisecond, 150 * time.Millisecond},
		{"kept no longer than the TTL", 1, time.Hour, 1100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			udp, p := start(t, answerWith(mdns.RcodeSuccess, tc.ttl, "192.0.2.7"), tc.cacheFor)
			udpAsk(t, udp, query("pkg.example", mdns.TypeA))
			udpAsk(t, udp, query("pkg.example", mdns.TypeA))
			asked(t, p, 1)
			time.Sleep(tc.wait)
			udpAsk(t, udp, query("pkg.example", mdns.TypeA))
			asked(t, p, 2)
		})
	}
	for _, tc := range []struct {
		name   string
		answer func(context.Context, []byte) ([]byte, error)
		rcode  int
	}{
		{"REFUSED is asked every time", answerWith(mdns.RcodeRefused, 60), mdns.RcodeRefused},
		{"NXDOMAIN is asked every time", answerWith(mdns.RcodeNameError, 60), mdns.RcodeNameError},
		{"an empty answer is asked every time", answerWith(mdns.RcodeSuccess, 60), mdns.RcodeSuccess},
		{"a TTL-0 answer is asked every time", answerWith(mdns.RcodeSuccess, 0, "192.0.2.7"), mdns.RcodeSuccess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			udp, p := start(t, tc.answer, time.Hour)
			for i := range 3 {
				if r := udpAsk(t, udp, query("pkg.example", mdns.TypeA)); r.Rcode != tc.rcode {
					t.Fatalf("reply %d: rcode %s, want %s", i, mdns.RcodeToString[r.Rcode], mdns.RcodeToString[tc.rcode])
				}
			}
			asked(t, p, 3)
		})
	}
	t.Run("off without CacheFor", func(t *testing.T) {
		udp, p := start(t, answerWith(mdns.RcodeSuccess, 60, "192.0.2.7"), 0)
		for range 3 {
			udpAsk(t, udp, query("pkg.example", mdns.TypeA))
		}
		asked(t, p, 3)
	})
}

// The cache stays bounded: past maxCached names it forgets.
func TestAnswerCacheBounded(t *testing.T) {
	c := &answerCache{ttl: time.Hour}
	now := time.Now()
	for i := range maxCached + 10 {
		m := query(fmt.Sprintf("n%d.example", i), mdns.TypeA)
		b, _ := m.Pack()
		q, ok := ParseQuery(b)
		if !ok {
			t.Fatal("not a plain query")
		}
		ans := AppendAnswer(nil, &q, mdns.RcodeSuccess, []netip.Addr{netip.MustParseAddr("192.0.2.1")}, 60)
		c.store(&q, ans, now)
	}
	if len(c.m) > maxCached {
		t.Fatalf("%d answers kept, bound %d", len(c.m), maxCached)
	}
}
