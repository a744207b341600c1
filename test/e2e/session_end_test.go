//go:build linux

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// openTunnel sends CONNECT host:443 as id over the sandbox socket, expects
// 200 and returns a TLS client over the tunnel trusting roots, with its
// reader. It is the caller's to close.
func openTunnel(t *testing.T, w *interceptWorld, id wire.Identity, host string, roots *x509.CertPool) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := wire.Dial(ctx, w.g.Sock, id)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", host, host)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 || br.Buffered() != 0 {
		t.Fatalf("CONNECT %s: %v %v", host, err, resp)
	}
	tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS in the tunnel to %s: %v", host, err)
	}
	_ = c.SetDeadline(time.Time{})
	return tc, bufio.NewReader(tc)
}

// tunnelGet sends one keep-alive GET in an open tunnel and reads its answer.
func tunnelGet(c net.Conn, br *bufio.Reader, host, path, auth string) (*http.Response, string, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\n\r\n", path, host, auth); err != nil {
		return nil, "", err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

// closedWithin reads from c until it reports the connection ended (EOF or
// reset: not a timeout) or within passes; it returns what ended it and
// after how long.
func closedWithin(c net.Conn, within time.Duration) (error, time.Duration) {
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(within))
	_, err := io.Copy(io.Discard, c)
	if err == nil {
		err = io.EOF
	}
	return err, time.Since(start)
}

// dnsAsk sends one A question for name as id on POST /v1/dns and returns
// the rcode.
func dnsAsk(t *testing.T, w *interceptWorld, id wire.Identity, name string) int {
	t.Helper()
	q := new(mdns.Msg)
	q.SetQuestion(mdns.Fqdn(name), mdns.TypeA)
	raw, _ := q.Pack()
	resp, err := w.g.Client(id).Post("http://sluice/v1/dns", "application/dns-message", strings.NewReader(string(raw)))
	if err != nil {
		t.Fatalf("POST /v1/dns: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := new(mdns.Msg)
	if resp.StatusCode != 200 || a.Unpack(b) != nil {
		t.Fatalf("POST /v1/dns: %d %q", resp.StatusCode, b)
	}
	return a.Rcode
}

// TestSessionEndEndsTraffic is THREATS C12: ending a session closes its
// open tunnels at once (an intercepted one, whose next request would have
// had the real secret attached, and a pass-through one), and every later
// CONNECT, absolute-form request and DNS question of the session is refused
// session_ended (REFUSED for DNS) with an audit record; another session of
// the same agent is untouched.
func TestSessionEndEndsTraffic(t *testing.T) {
	requireHost(t)
	w := newInterceptWorld(t)
	id := wire.Identity{Sandbox: "sb-end", Agent: "agent-a", Session: "s-end", User: "alice"}
	auth := "Bearer " + w.placeholder

	icpt, icptR := openTunnel(t, w, id, "api.test", w.gatewayCA)
	defer icpt.Close()
	if resp, body, err := tunnelGet(icpt, icptR, "api.test", "/before", auth); err != nil || resp.StatusCode != 200 {
		t.Fatalf("request in the intercepted tunnel before the end: %v %v %q", err, resp, body)
	}
	pass, passR := openTunnel(t, w, id, "plain.test", w.upstreamCA)
	defer pass.Close()
	if resp, body, err := tunnelGet(pass, passR, "plain.test", "/before", "x"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("request in the pass-through tunnel before the end: %v %v %q", err, resp, body)
	}
	if rc := dnsAsk(t, w, id, "api.test"); rc != mdns.RcodeSuccess {
		t.Fatalf("DNS before the end: %s", mdns.RcodeToString[rc])
	}
	// Another session of the same agent keeps its tunnel.
	other, otherR := openTunnel(t, w, agentA, "api.test", w.gatewayCA)
	defer other.Close()

	st, _, m := w.g.AdminDo(http.MethodPost, "/api/v1/sessions/"+id.Session+"/end", icptSessionToken, "")
	if st != http.StatusOK {
		t.Fatalf("session end: %d %v", st, m)
	}
	endRec := w.g.For(t).AwaitAuditFields("session_ended", map[string]any{"session": id.Session})
	f, _ := endRec["fields"].(map[string]any)
	if n, _ := f["connections_closed"].(float64); n < 2 {
		t.Errorf("session_ended record: connections_closed %v, want at least the two tunnels", f["connections_closed"])
	}
	// At once, before the interception's idle timeouts could close it.
	if resp, body, err := tunnelGet(other, otherR, "api.test", "/other", auth); err != nil || resp.StatusCode != 200 {
		t.Fatalf("another session's tunnel after the end: %v %v %q", err, resp, body)
	}
	if rc := dnsAsk(t, w, agentA, "api.test"); rc != mdns.RcodeSuccess {
		t.Fatalf("another session's DNS after the end: %s", mdns.RcodeToString[rc])
	}

	t.Run("open intercepted tunnel is closed, no secret attached after the end", func(t *testing.T) {
		cb := casebook.Expect(t, "C12", "session ended while an intercepted tunnel (secret bound to its host) is open; the sandbox sends another request in it",
			"the tunnel is closed at the end; the request reaches no upstream and no credential is attached; result record session_ended")
		before := len(w.requests())
		err, took := closedWithin(icpt, 5*time.Second)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the intercepted tunnel is still open %v after the end", took)
		}
		resp, _, rerr := tunnelGet(icpt, icptR, "api.test", "/after", auth)
		if rerr == nil {
			t.Fatalf("a request in the ended session's tunnel was answered %d", resp.StatusCode)
		}
		time.Sleep(200 * time.Millisecond)
		for _, r := range w.requests()[before:] {
			t.Errorf("upstream saw %s after the end (secret attached: %v)", r.path, strings.Contains(r.auth, w.e.Secret))
		}
		w.g.For(t).AwaitAuditFields("result", map[string]any{"session": id.Session, "kind": "connect", "dest_host": "api.test", "code": "session_ended"})
		cb.Observef("tunnel ended after %v (%v); request after the end: %v; 0 upstream requests; result record code session_ended", took.Round(time.Millisecond), err, rerr)
	})
	t.Run("open pass-through tunnel is closed", func(t *testing.T) {
		cb := casebook.Expect(t, "C12", "session ended while a pass-through CONNECT tunnel is open",
			"the tunnel and its upstream are closed at the end; result record session_ended")
		err, took := closedWithin(pass, 5*time.Second)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the pass-through tunnel is still open %v after the end", took)
		}
		w.g.For(t).AwaitAuditFields("result", map[string]any{"session": id.Session, "kind": "connect", "dest_host": "plain.test", "code": "session_ended"})
		cb.Observef("tunnel ended after %v (%v); result record code session_ended", took.Round(time.Millisecond), err)
	})
	t.Run("new CONNECT and absolute-form request are 403 session_ended", func(t *testing.T) {
		cb := casebook.Expect(t, "C12", "after the end the sandbox opens a new CONNECT api.test:443 and sends GET http://plain.test/",
			"403 session_ended for both, audited, nothing dialled")
		for _, tc := range []struct{ kind, req, host string }{
			{"connect", "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n", "api.test"},
			{"http", "GET http://plain.test/x HTTP/1.1\r\nHost: plain.test\r\n\r\n", "plain.test"},
		} {
			c, err := w.g.Dial(id)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, tc.req)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("%s: %v", tc.kind, err)
			}
			b, _ := io.ReadAll(resp.Body)
			c.Close()
			var e struct {
				Error struct{ Code string } `json:"error"`
			}
			_ = json.Unmarshal(b, &e)
			if resp.StatusCode != 403 || e.Error.Code != "session_ended" {
				t.Fatalf("%s after the end: %d %s, want 403 session_ended", tc.kind, resp.StatusCode, b)
			}
			w.g.For(t).AwaitAuditFields("decision", map[string]any{"session": id.Session, "kind": tc.kind, "dest_host": tc.host, "code": "session_ended"})
		}
		cb.Observe("403 session_ended for CONNECT and absolute-form GET; decision records code session_ended")
	})
	t.Run("DNS for a name is REFUSED", func(t *testing.T) {
		cb := casebook.Expect(t, "C12", "after the end the sandbox asks DNS for an allowed name (once answered from the cache) and a new one",
			"REFUSED, audited dns_refused code session_ended")
		for _, name := range []string{"api.test", "other.test"} {
			if rc := dnsAsk(t, w, id, name); rc != mdns.RcodeRefused {
				t.Fatalf("DNS %s after the end: %s, want REFUSED", name, mdns.RcodeToString[rc])
			}
			w.g.For(t).AwaitAuditFields("dns_refused", map[string]any{"session": id.Session, "dest_host": name, "code": "session_ended"})
		}
		cb.Observe("REFUSED for both names; dns_refused records code session_ended")
	})
}
