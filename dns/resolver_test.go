package dns_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
)

// upstream is a miekg/dns server on 127.0.0.1:0 that answers from table
// (name → address) and NXDOMAIN for any other name.
func upstream(t *testing.T, table map[string]string, ttl uint32) string {
	t.Helper()
	return serveUDP(t, func(w mdns.ResponseWriter, q *mdns.Msg) {
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
	})
}

// serveUDP runs a miekg/dns server with h on 127.0.0.1:0 until the test
// ends and returns its address once it serves.
func serveUDP(t *testing.T, h mdns.HandlerFunc) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &mdns.Server{PacketConn: pc, Handler: h}
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

// negUpstream is a real miekg/dns server on 127.0.0.1:0 whose answer to
// each name is set by the test: an A record, NXDOMAIN or NODATA (with or
// without the zone's SOA in the authority section), SERVFAIL, or no answer
// at all. It counts the questions it receives per name, and holds each
// answer until release is closed (nil: at once), so that concurrent
// lookups are all in flight at the same time.
type negUpstream struct {
	addr    string
	release chan struct{}

	mu sync.Mutex
	n  map[string]int
}

func newNegUpstream(t *testing.T, release chan struct{}) *negUpstream {
	t.Helper()
	u := &negUpstream{release: release, n: map[string]int{}}
	soa := func(ttl, minimum uint32) mdns.RR {
		return &mdns.SOA{Hdr: mdns.RR_Header{Name: "example.", Rrtype: mdns.TypeSOA, Class: mdns.ClassINET, Ttl: ttl},
			Ns: "ns.example.", Mbox: "host.example.", Serial: 1, Refresh: 7200, Retry: 900, Expire: 1209600, Minttl: minimum}
	}
	u.addr = serveUDP(t, func(w mdns.ResponseWriter, q *mdns.Msg) {
		name := q.Question[0].Name
		u.mu.Lock()
		u.n[name]++
		u.mu.Unlock()
		if u.release != nil {
			<-u.release
		}
		m := new(mdns.Msg)
		m.SetReply(q)
		switch name {
		case "a.example.":
			m.Answer = append(m.Answer, &mdns.A{Hdr: mdns.RR_Header{Name: name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 60}, A: net.ParseIP("192.0.2.7")})
		case "nx-soa.example.": // SOA TTL 60, MINIMUM 30: negative TTL 30
			m.Rcode = mdns.RcodeNameError
			m.Ns = append(m.Ns, soa(60, 30))
		case "nx-soa-short.example.": // SOA TTL 1, MINIMUM 3600: negative TTL 1
			m.Rcode = mdns.RcodeNameError
			m.Ns = append(m.Ns, soa(1, 3600))
		case "nx-bare.example.":
			m.Rcode = mdns.RcodeNameError
		case "nodata-soa.example.":
			m.Ns = append(m.Ns, soa(300, 30))
		case "nodata-bare.example.":
		case "servfail.example.":
			m.Rcode = mdns.RcodeServerFailure
		case "refused.example.":
			m.Rcode = mdns.RcodeRefused
		case "silent.example.":
			return // no answer: the client times out
		}
		_ = w.WriteMsg(m)
	})
	return u
}

// asked is how many questions for name (with its final dot) arrived.
func (u *negUpstream) asked(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[name]
}

// TestResolverNegativeCache: NXDOMAIN and NODATA are cached for the
// negative TTL of RFC 2308 section 5 — the smaller of the authority SOA's
// TTL and its MINIMUM — and answered from the cache as the upstream
// answered them (NXDOMAIN a *RcodeError, NODATA no address and no error);
// a negative answer without an SOA is not cached (RFC 2308 section 5), and
// neither is a failure: SERVFAIL, REFUSED or a timeout is asked again by
// the next lookup. Each case counts the questions at the upstream.
func TestResolverNegativeCache(t *testing.T) {
	u := newNegUpstream(t, nil)
	r := dns.NewResolver([]string{u.addr}, 300*time.Millisecond, 64)
	ctx := context.Background()
	isNX := func(err error) bool {
		var rc *dns.RcodeError
		return errors.As(err, &rc) && rc.Rcode == mdns.RcodeNameError
	}
	isRcode := func(rcode int) func(error) bool {
		return func(err error) bool {
			var rc *dns.RcodeError
			return errors.As(err, &rc) && rc.Rcode == rcode
		}
	}
	noErr := func(err error) bool { return err == nil }
	timedOut := func(err error) bool {
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	}
	cases := []struct {
		name    string
		qtype   uint16
		errOK   func(error) bool
		asked   int // questions at the upstream after three lookups
		cached  bool
		nodata  bool
		comment string
	}{
		{"nx-soa.example", mdns.TypeA, isNX, 1, true, false, "RFC 2308 §5: NXDOMAIN with SOA, negative TTL min(60, 30)"},
		{"nodata-soa.example", mdns.TypeAAAA, noErr, 1, true, true, "RFC 2308 §5: NODATA with SOA, negative TTL min(300, 30)"},
		{"nx-bare.example", mdns.TypeA, isNX, 3, false, false, "RFC 2308 §5: no SOA, not cached"},
		{"nodata-bare.example", mdns.TypeA, noErr, 3, false, true, "RFC 2308 §5: no SOA, not cached"},
		{"servfail.example", mdns.TypeA, isRcode(mdns.RcodeServerFailure), 3, false, false, "RFC 2308 §7.1: a server failure is not an answer"},
		{"refused.example", mdns.TypeA, isRcode(mdns.RcodeRefused), 3, false, false, "not an answer about the name"},
		{"silent.example", mdns.TypeA, timedOut, 3, false, false, "RFC 2308 §7.2: a timeout is not an answer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 3 {
				addrs, ttl, err := r.Lookup(ctx, tc.name, tc.qtype)
				if !tc.errOK(err) || len(addrs) != 0 || ttl != 0 {
					t.Fatalf("lookup %d (%s): %v, %d, %v", i, tc.comment, addrs, ttl, err)
				}
			}
			if n := u.asked(tc.name + "."); n != tc.asked {
				t.Fatalf("%s: 3 lookups asked the upstream %d times, want %d", tc.comment, n, tc.asked)
			}
			_, _, ok := r.Cached(tc.name, tc.qtype)
			if want := tc.cached && tc.nodata; ok != want {
				t.Errorf("Cached = %v, want %v (a cached NXDOMAIN is not an answer Cached gives)", ok, want)
			}
		})
	}

	// The negative TTL is the smaller of the SOA's TTL and MINIMUM: with
	// SOA TTL 1 the NXDOMAIN is asked again after a second, however large
	// MINIMUM is.
	for range 2 {
		if _, _, err := r.Lookup(ctx, "nx-soa-short.example", mdns.TypeA); !isNX(err) {
			t.Fatalf("nx-soa-short: %v, want NXDOMAIN", err)
		}
	}
	if n := u.asked("nx-soa-short.example."); n != 1 {
		t.Fatalf("nx-soa-short: %d questions within its negative TTL, want 1", n)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, _, err := r.Lookup(ctx, "nx-soa-short.example", mdns.TypeA); !isNX(err) {
		t.Fatalf("nx-soa-short after its TTL: %v, want NXDOMAIN", err)
	}
	if n := u.asked("nx-soa-short.example."); n != 2 {
		t.Fatalf("nx-soa-short: %d questions after its negative TTL of 1s, want 2", n)
	}
}

// TestResolverSharesConcurrentLookups: N concurrent lookups of one name
// and type that miss the cache send one question upstream, and all get
// its answer; a caller whose deadline passes returns DeadlineExceeded
// without failing the others or keeping the answer out of the cache, and
// a caller whose ctx is cancelled still gets the answer (as a miekg/dns
// exchange did: a question in flight at shutdown is answered).
func TestResolverSharesConcurrentLookups(t *testing.T) {
	release := make(chan struct{})
	u := newNegUpstream(t, release)
	r := dns.NewResolver([]string{u.addr}, 5*time.Second, 64)
	const n = 32
	type result struct {
		addrs []netip.Addr
		err   error
	}
	results := make(chan result, n)
	quitter, quit := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer quit()
	quitErr := make(chan error, 1)
	go func() {
		_, _, err := r.Lookup(quitter, "a.example", mdns.TypeA)
		quitErr <- err
	}()
	stopping, stop := context.WithCancel(context.Background())
	stoppingRes := make(chan result, 1)
	go func() {
		a, _, err := r.Lookup(stopping, "a.example", mdns.TypeA)
		stoppingRes <- result{a, err}
	}()
	for range n {
		go func() {
			a, _, err := r.Lookup(context.Background(), "a.example", mdns.TypeA)
			results <- result{a, err}
		}()
	}
	// Wait until the question is at the upstream, then give the others
	// time to join it before it is answered.
	deadline := time.Now().Add(5 * time.Second)
	for u.asked("a.example.") == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if err := <-quitErr; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the caller whose deadline passed got %v, want context.DeadlineExceeded", err)
	}
	stop()
	close(release)
	want := []netip.Addr{netip.MustParseAddr("192.0.2.7")}
	if res := <-stoppingRes; res.err != nil || !slices.Equal(res.addrs, want) {
		t.Fatalf("the cancelled caller got %v, %v; want the answer", res.addrs, res.err)
	}
	for range n {
		res := <-results
		if res.err != nil || !slices.Equal(res.addrs, want) {
			t.Fatalf("a concurrent lookup got %v, %v; want %v", res.addrs, res.err, want)
		}
	}
	if q, up := r.Queries(), u.asked("a.example."); q != 1 || up != 1 {
		t.Fatalf("%d concurrent lookups: resolver sent %d queries, upstream got %d questions; want 1 and 1", n+2, q, up)
	}
	if _, _, ok := r.Cached("a.example", mdns.TypeA); !ok {
		t.Fatal("the shared answer was not cached")
	}
}
