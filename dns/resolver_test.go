package dns_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
)

// upstream is a miekg/dns server on 127.0.0.1:0 that answers from table
// (name → address) and NXDOMAIN for any other name.
func upstream(t *testing.T, table map[string]string, ttl uint32) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, q *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetReply(q)
		a, ok := table[q.Question[0].Name]
		switch {
		case !ok:
			m.Rcode = mdns.RcodeNameError
		case q.Question[0].Qtype == mdns.TypeA:
			m.Answer = append(m.Answer, &mdns.A{Hdr: mdns.RR_Header{Name: q.Question[0].Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: ttl}, A: net.ParseIP(a)})
		}
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}

func TestResolver(t *testing.T) {
	up := upstream(t, map[string]string{"a.example.": "192.0.2.7"}, 60)
	r := dns.NewResolver([]string{up}, 2*time.Second, 16)
	ctx := context.Background()

	addrs, ttl, err := r.Lookup(ctx, "a.example", mdns.TypeA)
	if err != nil || !slices.Equal(addrs, []netip.Addr{netip.MustParseAddr("192.0.2.7")}) || ttl != 60 {
		t.Fatalf("Lookup = %v, %d, %v; want [192.0.2.7], 60", addrs, ttl, err)
	}
	if n := r.Queries(); n != 1 {
		t.Fatalf("%d upstream queries, want 1", n)
	}
	// The second lookup is answered from the cache.
	if _, _, ok := r.Cached("a.example", mdns.TypeA); !ok {
		t.Fatal("the answer was not cached")
	}
	if _, _, err := r.Lookup(ctx, "a.example", mdns.TypeA); err != nil || r.Queries() != 1 {
		t.Fatalf("cached Lookup: %v, %d upstream queries; want the cache and 1", err, r.Queries())
	}
	// NODATA (no AAAA) is not cached: a later answer may exist.
	if addrs, _, err := r.Lookup(ctx, "a.example", mdns.TypeAAAA); err != nil || len(addrs) != 0 {
		t.Fatalf("AAAA: %v, %v; want no address and no error", addrs, err)
	}
	if _, _, ok := r.Cached("a.example", mdns.TypeAAAA); ok {
		t.Error("NODATA was cached")
	}
	// NXDOMAIN is a *RcodeError naming the rcode.
	_, _, err = r.Lookup(ctx, "missing.example", mdns.TypeA)
	var rc *dns.RcodeError
	if !errors.As(err, &rc) || rc.Rcode != mdns.RcodeNameError {
		t.Fatalf("NXDOMAIN: %v, want *RcodeError NXDOMAIN", err)
	}
	// The guarded dialer's entry: both families for "ip".
	ips, err := r.LookupNetIP(ctx, "ip", "a.example")
	if err != nil || len(ips) != 1 {
		t.Fatalf("LookupNetIP = %v, %v", ips, err)
	}
	if _, err := r.LookupNetIP(ctx, "tcp", "a.example"); err == nil {
		t.Error("LookupNetIP accepted network tcp")
	}
}

func TestResolverWithoutUpstreams(t *testing.T) {
	r := dns.NewResolver(nil, time.Second, 16)
	if _, _, err := r.Lookup(context.Background(), "a.example", mdns.TypeA); !errors.Is(err, dns.ErrNoUpstream) {
		t.Fatalf("Lookup without upstreams: %v, want ErrNoUpstream", err)
	}
	if r.Queries() != 0 {
		t.Fatalf("%d upstream queries, want 0", r.Queries())
	}
}
