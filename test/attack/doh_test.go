//go:build linux

package attack

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestGatewayDoHRefused is THREATS C10 through the real binary: CONNECT to
// a DNS-over-HTTPS endpoint (dns.google:443) or to DNS over TLS
// (1.1.1.1:853) is 403 egress_denied with an audit record whose reason is
// doh_refused, before any DNS query or connection, although agent-a's
// egress allowlist names both and both would answer: dns.google resolves
// (in the test's DNS) to a listener, and 1.1.1.1 is an address of the
// namespace with listeners on 443 and 853. The control, pkg.test on the
// same allowlist, is tunnelled. `sluice validate` on that configuration
// fails naming the agents[].egress key.
func TestGatewayDoHRefused(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	e.NS.AddAddr(t, egressIP+"/32")
	e.NS.AddAddr(t, "1.1.1.1/32")
	var conns, dnsQ atomic.Int64
	e.NS.AddAddr(t, "2606:4700:4700::1111/128")
	for _, a := range []string{egressIP + ":443", "1.1.1.1:443", "1.1.1.1:853", "[2606:4700:4700::1111]:443"} {
		ln := e.NS.Listen(t, a)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				conns.Add(1)
				c.Close()
			}
		}()
	}
	e.NS.ServeDNS(t, func(rw mdns.ResponseWriter, q *mdns.Msg) {
		dnsQ.Add(1)
		m := new(mdns.Msg)
		m.SetReply(q)
		if q.Question[0].Qtype == mdns.TypeA {
			rr, _ := mdns.NewRR(fmt.Sprintf("%s 0 IN A %s", q.Question[0].Name, egressIP))
			m.Answer = []mdns.RR{rr}
		}
		_ = rw.WriteMsg(m)
	})

	d := e.BaseConfig("doh")
	d["agents"] = []map[string]any{
		{"name": "agent-a", "connectors": []string{"tickets"}, "egress": []string{"pkg.test", "dns.google", "1.1.1.1"}},
		{"name": "agent-b", "connectors": []string{}},
	}
	d["egress"] = map[string]any{"connect_ports": []int{853}}
	d["dns"] = map[string]any{"upstreams": []string{gwenv.DNSAddr}}
	path := e.Write(d)
	g := e.Start(d, path)

	connect := func(a string) string { return "CONNECT " + a + " HTTP/1.1\r\nHost: " + a + "\r\n\r\n" }
	for _, tc := range []struct{ name, req, host, kind string }{
		{"DoH: CONNECT dns.google:443 (RFC 8484)", connect("dns.google:443"), "dns.google", "connect"},
		{"DoT: CONNECT 1.1.1.1:853 (RFC 7858)", connect("1.1.1.1:853"), "1.1.1.1", "connect"},
		{"DoH by address: CONNECT 1.1.1.1:443", connect("1.1.1.1:443"), "1.1.1.1", "connect"},
		{"DoH by IPv6 address, not on the allowlist: CONNECT [2606:4700:4700::1111]:443", connect("[2606:4700:4700::1111]:443"), "2606:4700:4700::1111", "connect"},
		{"DoH by IPv4-mapped address: CONNECT [::ffff:1.1.1.1]:443", connect("[::ffff:1.1.1.1]:443"), "::ffff:1.1.1.1", "connect"},
		{"DoH in plain HTTP: GET http://dns.google/dns-query", "GET http://dns.google/dns-query?dns=AAABAAABAAAAAAAAA3d3dwdleGFtcGxlA2NvbQAAAQAB HTTP/1.1\r\nHost: dns.google\r\n\r\n", "dns.google", "http"},
		{"the DoT port in plain HTTP: GET http://1.1.1.1:853/", "GET http://1.1.1.1:853/ HTTP/1.1\r\nHost: 1.1.1.1:853\r\n\r\n", "1.1.1.1", "http"},
	} {
		t.Run("C10 "+tc.name, func(t *testing.T) {
			g := g.For(t)
			c := casebook.Expect(t, "C10", tc.name+" through the sandbox proxy, with the host on the agent's egress allowlist",
				"403 egress_denied, audit decision with reason doh_refused, 0 DNS queries, 0 upstream connections")
			q, n := dnsQ.Load(), conns.Load()
			raw, _ := g.Raw(agentA, []byte(tc.req), 5*time.Second)
			st, code, hdr := gwenv.StatusOf(raw)
			var rec map[string]any
			for _, r := range g.AuditEvent("decision", "doh_refused") {
				if f := fieldsOf(r); f["dest_host"] == tc.host && f["reason"] == "doh_refused" && f["kind"] == tc.kind {
					rec = r
				}
			}
			time.Sleep(100 * time.Millisecond) // a connection, had one been made, is counted by now
			dq, uc := dnsQ.Load()-q, conns.Load()-n
			c.Observef("%d %s, Proxy-Status %q, doh_refused audited %v, DNS queries %d, upstream connections %d",
				st, code, hdr.Get("Proxy-Status"), rec != nil, dq, uc)
			if st != http.StatusForbidden || code != "egress_denied" || rec == nil || dq != 0 || uc != 0 {
				t.Errorf("%d %s (%q); audit %v; DNS %d; connections %d", st, code, raw, rec, dq, uc)
			}
		})
	}
	t.Run("C10 control: CONNECT pkg.test:443 on the same allowlist", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "C10", "control: CONNECT pkg.test:443 (same allowlist, same resolver)",
			"200 and, after the ClientHello, one upstream connection (the refusals above are the DoH list's)")
		q, n := dnsQ.Load(), conns.Load()
		conn, err := g.Dial(agentA)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
		fmt.Fprintf(conn, "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\n\r\n")
		buf := make([]byte, 12)
		_, err = io.ReadFull(conn, buf)
		ok := err == nil && strings.HasPrefix(string(buf), "HTTP/1.1 200")
		// The listener closes at once: the handshake fails, but only after
		// the gateway dialled it.
		hctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = tls.Client(conn, &tls.Config{ServerName: "pkg.test", InsecureSkipVerify: true}).HandshakeContext(hctx) //nolint:gosec // the listener is not TLS; only the dial is counted
		cancel()
		deadline := time.Now().Add(5 * time.Second)
		for conns.Load() == n && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		c.Observef("200 %v (%q), DNS queries %d, upstream connections %d", ok, buf, dnsQ.Load()-q, conns.Load()-n)
		if !ok || dnsQ.Load() == q || conns.Load()-n != 1 {
			t.Errorf("control: %q %v, DNS %d, connections %d", buf, err, dnsQ.Load()-q, conns.Load()-n)
		}
	})
	t.Run("C10 sluice validate names the allowlist key", func(t *testing.T) {
		c := casebook.Expect(t, "C10", "sluice validate on a config whose agents[0].egress names dns.google and 1.1.1.1",
			"exit status non-zero; the error names agents[0].egress[1] (dns.google) and agents[0].egress[2] (1.1.1.1) and doh_refused; control: without them it passes")
		validate := func(p string) (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, e.Bin, "validate", "--config", p).CombinedOutput()
			return string(out), err
		}
		out, err := validate(path)
		clean := e.BaseConfig("doh-ok")
		clean["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{"tickets"}, "egress": []string{"pkg.test"}}}
		ctlOut, ctlErr := validate(e.Write(clean))
		named := strings.Contains(out, `agents[0].egress[1]: "dns.google"`) && strings.Contains(out, `agents[0].egress[2]: "1.1.1.1"`) && strings.Contains(out, "doh_refused")
		c.Observef("exit %v, names both keys %v; control exit %v", err, named, ctlErr)
		if err == nil || !named {
			t.Errorf("validate: %v\n%s", err, out)
		}
		if ctlErr != nil {
			t.Errorf("control validate: %v\n%s", ctlErr, ctlOut)
		}
	})
}
