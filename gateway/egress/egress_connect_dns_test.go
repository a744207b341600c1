package egress

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/gateway/config"
)

// ttlUpstream is a real miekg/dns server on loopback answering pkg.example
// with an A record of the given TTL and NODATA for AAAA, counting the
// questions of each type it receives; any other name is NXDOMAIN. Its
// NODATA and NXDOMAIN carry the zone's SOA
// with the same TTL and MINIMUM, as an authoritative server's does, which
// is what lets a resolver cache it (RFC 2308 section 5).
type ttlUpstream struct {
	addr     string
	a, aaaa  atomic.Int64
	nx       atomic.Int64 // questions for any other name (NXDOMAIN, with the test. zone's SOA)
	ttl      atomic.Uint32
	answerIP atomic.Pointer[string]
}

func newTTLUpstream(t *testing.T, ttl uint32) *ttlUpstream {
	t.Helper()
	u := &ttlUpstream{}
	u.ttl.Store(ttl)
	ip := "93.184.216.34"
	u.answerIP.Store(&ip)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, q *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetReply(q)
		name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
		switch {
		case name != "pkg.example":
			u.nx.Add(1)
			m.Rcode = mdns.RcodeNameError
			rr, _ := mdns.NewRR("test. 60 IN SOA ns.test. host.test. 1 7200 900 1209600 60")
			m.Ns = append(m.Ns, rr)
		case q.Question[0].Qtype == mdns.TypeA:
			u.a.Add(1)
			rr, _ := mdns.NewRR(fmt.Sprintf("%s %d IN A %s", q.Question[0].Name, u.ttl.Load(), *u.answerIP.Load()))
			m.Answer = append(m.Answer, rr)
		case q.Question[0].Qtype == mdns.TypeAAAA:
			u.aaaa.Add(1)
			ttl := u.ttl.Load()
			rr, _ := mdns.NewRR(fmt.Sprintf("example. %d IN SOA ns.example. host.example. 1 7200 900 1209600 %d", ttl, ttl))
			m.Ns = append(m.Ns, rr)
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u
}

// TestConnectResolvesOncePerTTL: tunnels to one host within its answer's
// TTL resolve it once (one A and one AAAA question at the loopback
// upstream, issue 22 measured a lookup per tunnel), concurrent ones
// included; every tunnel still gets its own decision record naming the
// address it dialled; after the TTL the next tunnel asks again. An answer
// with TTL 0 is never reused.
func TestConnectResolvesOncePerTTL(t *testing.T) {
	up := newTTLUpstream(t, 2)
	be := startBenchEgress(t, "", func(c *config.Config) { c.DNS.Upstreams = []string{up.addr} })
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := openSpliceTunnel(t, be)
			if body, err := st.get("/x"); err != nil || body != "hello /x" {
				errs <- fmt.Errorf("GET in the tunnel: %q %v", body, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if a, aaaa := up.a.Load(), up.aaaa.Load(); a != 1 || aaaa != 1 {
		t.Fatalf("%d tunnels within the TTL asked the upstream %d A and %d AAAA questions, want 1 and 1", n, a, aaaa)
	}
	decisions := 0
	for _, r := range auditEvents(t, be.g) {
		if r.Event == "decision" && r.Fields["kind"] == "connect" {
			decisions++
			if ip := r.Fields["resolved_ip"]; ip != "93.184.216.34" {
				t.Fatalf("decision record resolved_ip %v, want the cached answer 93.184.216.34", ip)
			}
		}
	}
	if decisions != n {
		t.Fatalf("%d CONNECT decision records, want one per tunnel (%d)", decisions, n)
	}

	// After the TTL the answer is asked again, and a new address is what
	// the next tunnel is classified and dialled with.
	time.Sleep(2100 * time.Millisecond)
	ip2 := "93.184.216.35"
	up.answerIP.Store(&ip2)
	up.ttl.Store(0)
	for i := range 2 {
		st := openSpliceTunnel(t, be)
		if _, err := st.get("/y"); err != nil {
			t.Fatal(err)
		}
		if a := up.a.Load(); a != int64(2+i) {
			t.Fatalf("tunnel %d after the TTL: %d A questions in all, want %d (TTL 0 is not reused)", i, a, 2+i)
		}
	}
	var last any
	for _, r := range auditEvents(t, be.g) {
		if r.Event == "decision" && r.Fields["kind"] == "connect" {
			last = r.Fields["resolved_ip"]
		}
	}
	if last != ip2 {
		t.Fatalf("last decision record resolved_ip %v, want the new answer %s", last, ip2)
	}
}

// TestConnectCachesNXDOMAIN: CONNECT gets the resolver's negative cache
// like every other entrance (RFC 2308): tunnels to an allowed name that
// does not exist ask the upstream once for A and once for AAAA within the
// SOA's negative TTL, and each is still refused for the designed reason —
// 502 upstream_error, Proxy-Status dns_error, a decision record — with no
// dial.
func TestConnectCachesNXDOMAIN(t *testing.T) {
	up := newTTLUpstream(t, 60)
	be := startBenchEgress(t, "", func(c *config.Config) { c.DNS.Upstreams = []string{up.addr} })
	const n = 4
	for i := range n {
		resp, body, conn, _ := exchange(t, be.g, "CONNECT nx.test:443 HTTP/1.1\r\nHost: nx.test:443\r\n\r\n")
		conn.Close()
		if resp.StatusCode != http.StatusBadGateway || errCode(body) != "upstream_error" || !strings.Contains(resp.Header.Get("Proxy-Status"), "dns_error") {
			t.Fatalf("tunnel %d: %d %s Proxy-Status %q, want 502 upstream_error with dns_error", i, resp.StatusCode, body, resp.Header.Get("Proxy-Status"))
		}
	}
	if q := up.nx.Load(); q != 2 {
		t.Fatalf("%d tunnels to an NXDOMAIN name asked the upstream %d questions, want 2 (A and AAAA, once each)", n, q)
	}
	refused := 0
	for _, r := range auditEvents(t, be.g) {
		if r.Fields["dest_host"] == "nx.test" && r.Fields["kind"] == "connect" {
			refused++
		}
	}
	if refused != n {
		t.Fatalf("%d audit records for nx.test, want one per tunnel (%d)", refused, n)
	}
	if be.requests.Load() != 0 {
		t.Fatalf("the upstream got %d requests", be.requests.Load())
	}
}
