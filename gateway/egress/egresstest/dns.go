// Package egresstest holds what the tests of raw egress share with the
// gateway's own tests: a real DNS upstream on loopback.
package egresstest

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/sluice-gw/sluice/gateway/config"
)

// DNSUpstream is a real miekg/dns server on 127.0.0.1:0 answering A
// questions from a table and counting every query it receives.
type DNSUpstream struct {
	Addr    string       // host:port of its UDP socket
	Queries atomic.Int64 // every query received
}

// NewDNSUpstream serves table (name → IPv4 address) until t ends;
// servfail.test answers SERVFAIL and a name not in table NXDOMAIN.
func NewDNSUpstream(t testing.TB, table map[string]string) *DNSUpstream {
	t.Helper()
	u := &DNSUpstream{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.Addr = pc.LocalAddr().String()
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, q *mdns.Msg) {
		u.Queries.Add(1)
		m := new(mdns.Msg)
		m.SetReply(q)
		name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
		ip, ok := table[name]
		switch {
		case name == "servfail.test":
			m.Rcode = mdns.RcodeServerFailure
		case !ok:
			m.Rcode = mdns.RcodeNameError
		case q.Question[0].Qtype == mdns.TypeA:
			rr, _ := mdns.NewRR(fmt.Sprintf("%s 0 IN A %s", q.Question[0].Name, ip))
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u
}

// Configure makes c the egress tests' gateway: agent-a (c.Agents[0]) may
// reach *.allowed.test, pkg.example, rebind.test and a few names the
// upstream answers oddly; names resolve with up; five unique subdomains
// are an exfiltration signal; CONNECT may also use port 8443.
func Configure(c *config.Config, up *DNSUpstream) {
	c.Agents[0].Egress = []string{"*.allowed.test", "pkg.example", "rebind.test", "meta.test", "servfail.test", "nx.test", "allowed.test"}
	c.DNS.Upstreams = []string{up.Addr}
	c.DNS.SubdomainThreshold = 5
	c.Egress.ConnectPorts = []int{8443}
	c.Egress.HandshakeTimeout = config.Duration(3 * time.Second)
}
