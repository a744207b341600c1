package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// startEgressGateway runs a gateway whose agent-a may reach *.allowed.test,
// pkg.example and rebind.test, resolving with up.
func startEgressGateway(t testing.TB, up *egresstest.DNSUpstream, edit func(*config.Config)) *testGateway {
	t.Helper()
	return startGateway(t, func(c *config.Config) {
		egresstest.Configure(c, up)
		if edit != nil {
			edit(c)
		}
	})
}

// rawConn opens the sandbox socket as a relay would, preamble sent.
func rawConn(t *testing.T, g *testGateway, id wire.Identity) net.Conn {
	return egresstest.RawConn(t, g.cfg.Gateway.SandboxSocket, id)
}

// exchange sends raw request bytes as agentA and reads one response.
func exchange(t *testing.T, g *testGateway, req string) (*http.Response, []byte, net.Conn, *bufio.Reader) {
	return egresstest.Exchange(t, g.cfg.Gateway.SandboxSocket, agentA, req)
}

// errCode is the refusal code of a JSON error body.
func errCode(body []byte) string { return egresstest.ErrCode(body) }

func hasEvent(t *testing.T, g *testGateway, event, host string) bool {
	t.Helper()
	for _, r := range auditEvents(t, g) {
		if r.Event == event && (host == "" || r.Fields["dest_host"] == host) {
			return true
		}
	}
	return false
}

// TestProxyRefusals covers the refusals of the forward proxy and CONNECT
// through the real sandbox socket: nothing unlisted, internal or odd gets
// a dial, and every refusal is 403/400/429 with the designed code, a
// Proxy-Status header and an audit record. No case here dials anything:
// every refused name stops before a connection is attempted.
func TestProxyRefusals(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{
		"rebind.test": "127.0.0.1", "meta.test": "169.254.169.254",
		"pkg.example": "93.184.216.34", "a.allowed.test": "93.184.216.34",
	})
	g := startEgressGateway(t, up, nil)
	tests := []struct {
		name, req, code, ps string
		status              int
		host                string
	}{
		{"unlisted host, http", "GET http://evil.example/x HTTP/1.1\r\nHost: evil.example\r\n\r\n", "egress_denied", "http_request_denied", 403, "evil.example"},
		{"unlisted host, CONNECT", "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n", "egress_denied", "http_request_denied", 403, "evil.example"},
		{"CONNECT to :22", "CONNECT pkg.example:22 HTTP/1.1\r\nHost: pkg.example:22\r\n\r\n", "egress_denied", "http_request_denied", 403, "pkg.example"},
		{"http to a port not 80/443", "GET http://pkg.example:8080/ HTTP/1.1\r\nHost: pkg.example:8080\r\n\r\n", "egress_denied", "http_request_denied", 403, "pkg.example"},
		// C1: loopback and private literals, in every spelling (THREATS C1-C3).
		{"C1 loopback literal", "CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n", "egress_denied", "http_request_denied", 403, "127.0.0.1"},
		{"C2 decimal loopback", "GET http://2130706433/ HTTP/1.1\r\nHost: 2130706433\r\n\r\n", "egress_denied", "http_request_denied", 403, "127.0.0.1"},
		{"C2 octal loopback", "CONNECT 0177.0.0.1:443 HTTP/1.1\r\nHost: 0177.0.0.1:443\r\n\r\n", "egress_denied", "http_request_denied", 403, "127.0.0.1"},
		{"C2 mapped IPv6 metadata", "CONNECT [::ffff:169.254.169.254]:443 HTTP/1.1\r\nHost: x\r\n\r\n", "egress_denied", "http_request_denied", 403, "::ffff:169.254.169.254"},
		{"C3 localhost", "CONNECT localhost:443 HTTP/1.1\r\nHost: localhost:443\r\n\r\n", "egress_denied", "http_request_denied", 403, "localhost"},
		// Rebinding: an allowed name whose DNS answer is internal (THREATS C5).
		{"allowed name resolving to loopback", "CONNECT rebind.test:443 HTTP/1.1\r\nHost: rebind.test:443\r\n\r\n", "egress_denied", "destination_ip_prohibited", 403, "rebind.test"},
		{"allowed name resolving to loopback, http", "GET http://rebind.test/ HTTP/1.1\r\nHost: rebind.test\r\n\r\n", "egress_denied", "destination_ip_prohibited", 403, "rebind.test"},
		{"allowed name resolving to metadata", "CONNECT meta.test:443 HTTP/1.1\r\nHost: meta.test:443\r\n\r\n", "egress_denied", "destination_ip_prohibited", 403, "meta.test"},
		{"https in absolute form", "GET https://pkg.example/ HTTP/1.1\r\nHost: pkg.example\r\n\r\n", "schema_violation", "http_request_error", 400, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body, _, _ := exchange(t, g, tc.req)
			if resp.StatusCode != tc.status || errCode(body) != tc.code {
				t.Fatalf("got %d %s, want %d %s: %s", resp.StatusCode, errCode(body), tc.status, tc.code, body)
			}
			if ps := resp.Header.Get("Proxy-Status"); ps != "sluice; error="+tc.ps {
				t.Errorf("Proxy-Status = %q, want sluice; error=%s", ps, tc.ps)
			}
			if tc.host != "" && !hasEvent(t, g, "decision", tc.host) {
				t.Errorf("no audit record for %s", tc.host)
			}
		})
	}
}

// clientHello returns the first TLS records a real crypto/tls client sends
// for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	a, b := net.Pipe()
	go func() {
		_ = tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""}).Handshake()
		a.Close()
	}()
	defer b.Close()
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	hello, _, err := readClientHello(bufio.NewReader(b))
	if err != nil && serverName != "" {
		t.Fatalf("read a real ClientHello: %v", err)
	}
	if err != nil {
		// No SNI: return the records anyway by reading them again.
		a2, b2 := net.Pipe()
		go func() {
			_ = tls.Client(a2, &tls.Config{InsecureSkipVerify: true}).Handshake()
			a2.Close()
		}()
		defer b2.Close()
		hdr := make([]byte, 5)
		_, _ = io.ReadFull(b2, hdr)
		body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
		_, _ = io.ReadFull(b2, body)
		return append(hdr, body...)
	}
	return hello
}

// TestDNSAnswerer covers POST /v1/dns through the socket (THREATS C7, C9):
// rcodes and the number of queries the real upstream server received.
func TestDNSAnswerer(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{
		"a.allowed.test": "93.184.216.34", "rebind.test": "127.0.0.1", "meta.test": "169.254.169.254",
	})
	g := startEgressGateway(t, up, nil)
	c := g.client(agentA)
	ask := func(t *testing.T, raw []byte) *mdns.Msg {
		t.Helper()
		resp, err := c.Post("http://sluice/v1/dns", "application/dns-message", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /v1/dns: %d %s", resp.StatusCode, b)
		}
		m := new(mdns.Msg)
		if err := m.Unpack(b); err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		return m
	}
	q := func(name string, qtype uint16) []byte {
		m := new(mdns.Msg)
		m.SetQuestion(name, qtype)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	two := new(mdns.Msg)
	two.SetQuestion("a.allowed.test.", mdns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	twoRaw, _ := two.Pack()
	long := strings.Repeat("a", 63)
	tests := []struct {
		name    string
		raw     []byte
		rcode   int
		queries int64 // upstream queries this question may cause
		answers int
	}{
		{"allowed A", q("a.allowed.test.", mdns.TypeA), mdns.RcodeSuccess, 1, 1},
		{"allowed A, cached? TTL 0 is not cached", q("a.allowed.test.", mdns.TypeA), mdns.RcodeSuccess, 1, 1},
		{"unlisted name: refused, zero upstream queries", q("evil.example.", mdns.TypeA), mdns.RcodeRefused, 0, 0},
		{"C9 exfiltration-shaped unlisted name", q("c2VjcmV0.evil.example.", mdns.TypeAAAA), mdns.RcodeRefused, 0, 0},
		{"allowed name answering loopback (rebinding)", q("rebind.test.", mdns.TypeA), mdns.RcodeRefused, 1, 0},
		{"allowed name answering metadata", q("meta.test.", mdns.TypeA), mdns.RcodeRefused, 1, 0},
		{"upstream SERVFAIL", q("servfail.test.", mdns.TypeA), mdns.RcodeServerFailure, 1, 0},
		{"NXDOMAIN passes through", q("nx.test.", mdns.TypeA), mdns.RcodeNameError, 1, 0},
		{"TXT is not implemented", q("a.allowed.test.", mdns.TypeTXT), mdns.RcodeNotImplemented, 0, 0},
		{"NULL", q("a.allowed.test.", mdns.TypeNULL), mdns.RcodeNotImplemented, 0, 0},
		{"ANY", q("a.allowed.test.", mdns.TypeANY), mdns.RcodeNotImplemented, 0, 0},
		{"AXFR", q("allowed.test.", mdns.TypeAXFR), mdns.RcodeNotImplemented, 0, 0},
		{"IXFR", q("allowed.test.", mdns.TypeIXFR), mdns.RcodeNotImplemented, 0, 0},
		{"two questions", twoRaw, mdns.RcodeFormatError, 0, 0},
		{"garbage", []byte{0x12, 0x34, 0xff}, mdns.RcodeFormatError, 0, 0},
		{"name over 253 bytes", q(strings.Repeat(long+".", 4)[:254]+".", mdns.TypeA), mdns.RcodeFormatError, 0, 0},
		{"escaped dot in a label", q(`a\.b.allowed.test.`, mdns.TypeA), mdns.RcodeFormatError, 0, 0},
		{"MX of an allowed name: empty answer", q("a.allowed.test.", mdns.TypeMX), mdns.RcodeSuccess, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := up.Queries.Load()
			m := ask(t, tc.raw)
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
	if !hasEvent(t, g, "dns_refused", "evil.example") || !hasEvent(t, g, "dns_internal_answer", "rebind.test") {
		t.Error("refusals were not audited")
	}
	// Exfiltration signal: more unique names under one base domain than the
	// threshold (5) is audited once.
	for i := range 7 {
		ask(t, q(fmt.Sprintf("x%d.exfil.example.", i), mdns.TypeA))
	}
	n := 0
	for _, r := range auditEvents(t, g) {
		if r.Event == "dns_exfiltration_signal" && r.Fields["base_domain"] == "exfil.example" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d exfiltration signals, want 1", n)
	}
	_ = context.Background
}

// FuzzClientHelloSNI feeds the SNI parser arbitrary handshake bytes.
func FuzzClientHelloSNI(f *testing.F) {
	f.Add(realHello("pkg.example"))          // a real crypto/tls ClientHello
	f.Add(realHello(""))                     // a real ClientHello without SNI
	f.Add([]byte{1, 0, 0, 0})                // an empty ClientHello
	f.Add([]byte{1, 0xff, 0xff, 0xff, 3, 3}) // a length beyond the data
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := parseClientHelloSNI(b)
		if err == nil && (name == "" || strings.ContainsAny(name, ":@ \x00")) {
			t.Fatalf("accepted bad server name %q", name)
		}
		rec := append([]byte{0x16, 3, 1, byte(len(b) >> 8), byte(len(b))}, b...)
		if len(b) <= 1<<14 {
			_, _, _ = readClientHello(bufio.NewReader(bytes.NewReader(rec)))
		}
	})
}

// FuzzDNSName feeds question-name canonicalisation.
func FuzzDNSName(f *testing.F) {
	f.Add("a.allowed.test.")         // ordinary
	f.Add(`a\.b.test.`)              // escaped dot
	f.Add(strings.Repeat("a.", 130)) // over 253 bytes
	f.Add("xn--bcher-kva.example.")  // punycode
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := dnsName(s)
		if ok && (len(n) > 253 || strings.HasSuffix(n, ".") || n != strings.ToLower(n)) {
			t.Fatalf("dnsName(%q) = %q", s, n)
		}
	})
}

// FuzzDNSAnswer feeds the answerer arbitrary messages: it must always
// answer with a DNS message that parses and carries the question's ID.
func FuzzDNSAnswer(f *testing.F) {
	up := egresstest.NewDNSUpstream(f, map[string]string{"a.allowed.test": "93.184.216.34", "rebind.test": "127.0.0.1"})
	g := startEgressGateway(f, up, nil)
	eg := g.newProxy()
	seed := func(name string, qtype uint16) []byte {
		m := new(mdns.Msg)
		m.SetQuestion(name, qtype)
		b, _ := m.Pack()
		return b
	}
	f.Add(seed("a.allowed.test.", mdns.TypeA))              // allowed, resolved
	f.Add(seed("rebind.test.", mdns.TypeA))                 // allowed, internal answer
	f.Add(seed("evil.example.", mdns.TypeAAAA))             // refused
	f.Add(seed("a.allowed.test.", mdns.TypeTXT))            // not implemented
	f.Add([]byte{0xab, 0xcd})                               // header cut short
	f.Add([]byte{0, 1, 0x81, 0x80, 0, 2, 0, 0, 0, 0, 0, 0}) // a response claiming two questions
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) > maxDNSMessage {
			return
		}
		out := (answerer{eg}).answer(context.Background(), "fuzz", agentA, raw)
		m := new(mdns.Msg)
		if err := m.Unpack(out); err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		if len(raw) >= 2 && m.Id != uint16(raw[0])<<8|uint16(raw[1]) {
			t.Fatalf("answer ID %d, question ID %d", m.Id, uint16(raw[0])<<8|uint16(raw[1]))
		}
		if !m.Response {
			t.Fatal("answer is not a response")
		}
	})
}

// realHello is the handshake message (no record header) of a crypto/tls
// client's ClientHello for serverName, captured with GetConfigForClient's
// sibling: a server that records the raw bytes and aborts.
func realHello(serverName string) []byte {
	a, b := net.Pipe()
	go func() {
		_ = tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
	}()
	defer a.Close()
	defer b.Close()
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		return nil
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		return nil
	}
	return body
}

// TestSpliceIdleTimeout: a tunnel with no traffic closes after the idle
// timeout; traffic in one direction keeps both open.
func TestSpliceIdleTimeout(t *testing.T) {
	const idle = 200 * time.Millisecond
	t.Run("idle tunnel closes", func(t *testing.T) {
		cl, clPeer := net.Pipe()
		up, upPeer := net.Pipe()
		defer clPeer.Close()
		defer upPeer.Close()
		start := time.Now()
		var n1, n2 atomic.Int64
		splice(cl, cl, up, idle, &n1, &n2)
		if d := time.Since(start); d < idle || d > 5*idle {
			t.Fatalf("splice returned after %v, want about %v", d, idle)
		}
	})
	t.Run("one busy direction keeps it open", func(t *testing.T) {
		cl, clPeer := net.Pipe()
		up, upPeer := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, clPeer) }()
		go func() {
			// The upstream sends a byte every idle/4 for 4 idle periods, then closes.
			for range 16 {
				if _, err := upPeer.Write([]byte{1}); err != nil {
					return
				}
				time.Sleep(idle / 4)
			}
			upPeer.Close()
		}()
		start := time.Now()
		var n1, n2 atomic.Int64
		splice(cl, cl, up, idle, &n1, &n2)
		clPeer.Close()
		if d := time.Since(start); d < 3*idle || n2.Load() != 16 {
			t.Fatalf("splice returned after %v with %d bytes down, want ≥ %v and 16", d, n2.Load(), 3*idle)
		}
	})
}
