package gateway

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
)

// TestHostedRecordsNameListener: an ask call's hold_created record, a
// POST /v1/dns answer's dns_answered record and the record of a request
// inside an intercepted CONNECT tunnel carry listener: hosted when their
// connection came through the hosted listener, and no listener when it
// came through the sandbox socket. The value is the connection's: the
// socket's requests are byte for byte the hosted ones' but for the
// credential header, which the hosted gate removes.
func TestHostedRecordsNameListener(t *testing.T) {
	up := newUpstream(t)
	dns := egresstest.NewDNSUpstream(t, map[string]string{"a.allowed.test": "93.184.216.34"})
	g, roots := hostedGatewayKey(t, up.URL, approversYAML, "", func(c *config.Config) {
		egresstest.Configure(c, dns)
		c.Egress.Intercept = config.Intercept{Hosts: []string{"a.allowed.test"}, CADir: t.TempDir()}
		c.Gateway.HoldWait = config.Duration(50 * time.Millisecond)
	})
	icptRoots := x509.NewCertPool()
	if !icptRoots.AppendCertsFromPEM(g.icpt.CACertPEM()) {
		t.Fatal("bug: no interception CA")
	}
	tok, r := g.mint(t, "rec-1", `{"agent":"agent-a"}`)
	if r.status != 200 {
		t.Fatalf("mint: %d %s", r.status, r.raw)
	}

	// Each way in: a fresh connection per exchange, and the header that
	// admits it (none on the socket: the relay's preamble did).
	ways := []struct {
		name, session, auth, want string
		dial                      func(t *testing.T) net.Conn
	}{
		{"hosted listener", "rec-1", "Proxy-Authorization: " + basic("rec-1", tok) + "\r\n", call.ListenerHosted, func(t *testing.T) net.Conn {
			c, err := tls.Dial("tcp", g.HostedAddr(), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
			if err != nil {
				t.Fatalf("dial hosted: %v", err)
			}
			return c
		}},
		{"sandbox socket", agentA.Session, "", "", func(t *testing.T) net.Conn { return rawConn(t, g, agentA) }},
	}
	signals := []string{"hold_created", call.EventDNSAnswered, "dns_high_entropy", "dns_exfiltration_signal"}
	for _, w := range ways {
		t.Run(w.name, func(t *testing.T) {
			exchange := func(c net.Conn, br *bufio.Reader, req string) (int, string) {
				t.Helper()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("read answer: %v", err)
				}
				if resp.StatusCode == 200 && strings.HasPrefix(req, "CONNECT") {
					return 200, "" // the tunnel follows: no body to read
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			open := func() (net.Conn, *bufio.Reader) {
				c := w.dial(t)
				t.Cleanup(func() { c.Close() })
				return c, bufio.NewReader(c)
			}

			// An ask call: held, not sent.
			body := `{"body":{"amount":70}}`
			c, br := open()
			if st, out := exchange(c, br, "POST /v1/tools/tickets.create_refund HTTP/1.1\r\nHost: sluice\r\n"+w.auth+
				"Content-Type: application/json\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body); st != http.StatusAccepted {
				t.Fatalf("ask call: %d %s, want 202 held", st, out)
			}

			// DNS questions over POST /v1/dns on one connection: each
			// name's first, then names with high-entropy labels, more
			// than dns.subdomain_threshold under one base domain.
			c, br = open()
			for i := range 7 {
				name := "a.allowed.test."
				if i > 0 {
					name = fmt.Sprintf("q7x9k2mz4w8p1v6r3t5y%d.allowed.test.", i)
				}
				m := new(mdns.Msg)
				m.SetQuestion(name, mdns.TypeA)
				q, _ := m.Pack()
				if st, out := exchange(c, br, fmt.Sprintf("POST /v1/dns HTTP/1.1\r\nHost: sluice\r\n%sContent-Type: application/dns-message\r\nContent-Length: %d\r\n\r\n%s", w.auth, len(q), q)); st != 200 {
					t.Fatalf("POST /v1/dns %s: %d %q", name, st, out)
				}
			}

			// A request inside an intercepted tunnel, refused before any
			// upstream dial (its Host is not the CONNECT host): the test
			// reaches nothing off loopback.
			c, br = open()
			if st, out := exchange(c, br, "CONNECT a.allowed.test:8443 HTTP/1.1\r\nHost: a.allowed.test:8443\r\n"+w.auth+"\r\n"); st != 200 {
				t.Fatalf("CONNECT: %d %s", st, out)
			}
			inner := tls.Client(c, &tls.Config{RootCAs: icptRoots, ServerName: "a.allowed.test"})
			if st, out := exchange(inner, bufio.NewReader(inner), "GET /x HTTP/1.1\r\nHost: b.allowed.test:8443\r\n\r\n"); st != http.StatusForbidden {
				t.Fatalf("request in the intercepted tunnel: %d %s, want 403 host mismatch", st, out)
			}

			seen := map[string]bool{}
			for _, rec := range auditEvents(t, g) {
				kind := rec.Event // what the record stands for
				switch {
				case rec.Fields["session"] != w.session:
					continue
				case rec.Event == call.EventDecision && rec.Fields["dest_host"] == "a.allowed.test":
					kind += " " + fmt.Sprint(rec.Fields["kind"]) // the tunnel's, or the request's in it
				case !slices.Contains(signals, rec.Event):
					continue
				}
				seen[kind] = true
				l, ok := rec.Fields[call.KeyListener]
				if w.want == "" && ok {
					t.Errorf("%s record through the %s names listener %v", kind, w.name, l)
				}
				if w.want != "" && l != w.want {
					t.Errorf("%s record through the %s: listener %v, want %s", kind, w.name, l, w.want)
				}
			}
			for _, ev := range slices.Concat(signals, []string{"decision connect", "decision http"}) {
				if !seen[ev] {
					t.Errorf("no %s record of session %s", ev, w.session)
				}
			}
		})
	}
}
