//go:build linux

package attack

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// The hosted sandbox's world: the gateway's namespace (the world's) and
// the sandbox's own, joined by one veth pair. The sandbox's namespace
// has lo and its end of the veth only, with no route beyond the /30: the
// one thing it reaches is the gateway's hosted TLS listener (the
// provider's egress allowlist naming only sluice). The admin listener,
// the connector upstream and the world's "public" upstreams all listen
// on addresses of the gateway's namespace the sandbox cannot reach.
const (
	hostedGWAddr  = "10.201.0.1"
	hostedSBAddr  = "10.201.0.2"
	hostedName    = "sluice.hosted.test"
	hostedPort    = "3129"
	platformToken = "platform-token-0123456789"
)

type hostedWorld struct {
	*world
	sb     *gwenv.NetNS
	roots  *x509.CertPool // the hosted listener's CA, the interception CA and the upstreams' CA
	caFile string         // the hosted listener's CA (PEM), for curl
	upCA   string         // the upstreams' CA (PEM), for curl
}

func newHostedWorld(t *testing.T) *hostedWorld {
	t.Helper()
	h := &hostedWorld{}
	w := newWorldWith(t, func(e *gwenv.Env, d gwenv.Doc) {
		h.sb = gwenv.NewNetNS(t)
		for _, args := range [][]string{
			{"-n", e.NS.Name, "link", "add", "hg0", "type", "veth", "peer", "name", "hs0", "netns", h.sb.Name},
			{"-n", e.NS.Name, "addr", "add", hostedGWAddr + "/30", "dev", "hg0"},
			{"-n", e.NS.Name, "link", "set", "hg0", "up"},
			{"-n", h.sb.Name, "addr", "add", hostedSBAddr + "/30", "dev", "hs0"},
			{"-n", h.sb.Name, "link", "set", "hs0", "up"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v: %s", args, err, out)
			}
		}
		cert, caPEM, pool := gwenv.UpstreamPKI(t, hostedName)
		h.roots = pool
		h.caFile = filepath.Join(e.Dir, "hosted-ca.pem")
		certFile, keyFile := filepath.Join(e.Dir, "hosted.pem"), filepath.Join(e.Dir, "hosted.key")
		kb, err := x509.MarshalECPrivateKey(cert.PrivateKey.(*ecdsa.PrivateKey))
		if err != nil {
			t.Fatal(err)
		}
		for f, b := range map[string][]byte{h.caFile: caPEM, certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}),
			keyFile: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})} {
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		sum := sha256.Sum256([]byte(platformToken))
		d.Gateway()["session_tokens_sha256"] = []string{hex.EncodeToString(sum[:])}
		d.Gateway()["hosted"] = map[string]any{"listen": hostedGWAddr + ":" + hostedPort, "cert_file": certFile, "key_file": keyFile, "max_token_ttl": "2h"}
	})
	h.world = w
	h.sb.AddHosts(t, hostedGWAddr+" "+hostedName+"\n") // for curl, run with ip netns exec
	h.upCA = filepath.Join(w.e.Dir, "upstream-ca.pem")
	pemUp, err := os.ReadFile(h.upCA)
	if err != nil {
		t.Fatal(err)
	}
	gwCA, err := os.ReadFile(filepath.Join(w.e.Dir, "ca", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	h.roots.AppendCertsFromPEM(pemUp)
	h.roots.AppendCertsFromPEM(gwCA)
	return h
}

// mint asks the admin API for a per-run token, as the platform would.
func (h *hostedWorld) mint(t *testing.T, session, body string) string {
	t.Helper()
	st, code, m := h.g.For(t).AdminDo(http.MethodPost, "/api/v1/sessions/"+session+"/tokens", platformToken, body)
	tok, _ := m["token"].(map[string]any)
	s, _ := tok["token"].(string)
	if st != http.StatusOK || !strings.HasPrefix(s, "srt1.") {
		t.Fatalf("mint for %s: %d %s", session, st, code)
	}
	return s
}

// dial opens a TCP connection from inside the sandbox's namespace; the
// listener's name is the sandbox's /etc/hosts entry.
func (h *hostedWorld) dial(ctx context.Context, addr string) (net.Conn, error) {
	host, port, _ := net.SplitHostPort(addr)
	if host == hostedName {
		addr = net.JoinHostPort(hostedGWAddr, port)
	}
	var c net.Conn
	err := h.sb.Do(func() (err error) {
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// client is the sandbox's HTTP client with HTTPS_PROXY=https://session:token@host:port.
func (h *hostedWorld) client(session, token string) *http.Client {
	pu := &url.URL{Scheme: "https", User: url.UserPassword(session, token), Host: net.JoinHostPort(hostedName, hostedPort)}
	return &http.Client{
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{
			Proxy: http.ProxyURL(pu), DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: h.roots},
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return h.dial(ctx, addr) },
		},
	}
}

// raw writes req on a fresh TLS connection to the hosted listener and
// reads one answer; for a CONNECT answered 200 the connection is the tunnel.
func (h *hostedWorld) raw(t *testing.T, req string) (*http.Response, string, *tls.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := h.dial(context.Background(), net.JoinHostPort(hostedName, hostedPort))
	if err != nil {
		t.Fatalf("dial the hosted listener: %v", err)
	}
	c := tls.Client(nc, &tls.Config{RootCAs: h.roots, ServerName: hostedName})
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("write: %v", err)
	}
	br := bufio.NewReader(c)
	method := strings.SplitN(req, " ", 2)[0]
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("read the answer to %s: %v", method, err)
	}
	if method == http.MethodConnect && resp.StatusCode == http.StatusOK {
		return resp, "", c, br
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), c, br
}

func basicAuth(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// toolCall calls a tool on the hosted listener directly (NO_PROXY for
// the gateway), with the token as Basic credentials.
func (h *hostedWorld) toolCall(t *testing.T, session, token, tool, args string, hdr http.Header) (int, string) {
	t.Helper()
	c := h.client(session, token)
	c.Transport.(*http.Transport).Proxy = nil
	req, _ := http.NewRequest(http.MethodPost, "https://"+net.JoinHostPort(hostedName, hostedPort)+"/v1/tools/"+tool, strings.NewReader(args))
	req.SetBasicAuth(session, token)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("tool call: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHostedSandbox is issue 21's hosted mode end to end: a process in its
// own network namespace that reaches only the gateway's TLS listener
// makes tool calls, plain and CONNECT requests with its per-run token,
// through the same pipeline, placeholders and audit as the sandbox
// socket; THREATS A10, C5, D2 through the hosted listener, and E15–E17
// (the token's own classes).
func TestHostedSandbox(t *testing.T) {
	h := newHostedWorld(t)
	g := h.g.For(t)
	tok := h.mint(t, "run-1", `{"agent":"agent-a","user":"alice","ttl":"1h"}`)
	c := h.client("run-1", tok)

	t.Run("only the hosted listener is reachable from the sandbox", func(t *testing.T) {
		_, adminPort, _ := net.SplitHostPort(h.g.Admin)
		for _, addr := range []string{
			net.JoinHostPort(hostedGWAddr, adminPort),                           // the admin listener's port, on the veth address
			net.JoinHostPort(hostedGWAddr, fmt.Sprint(h.e.Up.Port)),             // the connector upstream's port
			net.JoinHostPort(egressIP, "80"), net.JoinHostPort(egressIP, "443"), // the "public" upstreams
		} {
			before := h.httpConn.Load() + h.tlsConn.Load()
			_, err := h.dial(context.Background(), addr)
			if err == nil || !(errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENETUNREACH)) {
				t.Errorf("dial %s from the sandbox: %v, want ECONNREFUSED or ENETUNREACH", addr, err)
			}
			if h.httpConn.Load()+h.tlsConn.Load() != before {
				t.Errorf("an upstream accepted a connection from the sandbox (%s)", addr)
			}
		}
	})

	t.Run("E15 control: tool call, plain and CONNECT requests with the token", func(t *testing.T) {
		cb := casebook.Expect(t, "E15", "control: a hosted sandbox with its per-run token (tool call, http:// proxy, CONNECT pass-through)",
			"200 each, served with the token's identity (audit records name session and sandbox run-1)")
		st, body := h.toolCall(t, "run-1", tok, "tickets.list_tickets", `{}`, nil)
		pst, pbody, _ := h.fetch(t, c, http.MethodGet, "http://pkg.test/plain", "", nil)
		cst, cbody, _ := h.fetch(t, c, http.MethodGet, "https://pkg.test/tunnel", "", nil)
		rec := h.awaitAudit(t, "decision", `"session":"run-1"`, `"sandbox":"run-1"`, "tickets.list_tickets")
		cb.Observef("tool %d, http %d, CONNECT %d, decision record with the token's identity %v", st, pst, cst, rec)
		if st != 200 || pst != 200 || cst != 200 || !strings.Contains(pbody, "hello from pkg.test /plain") || !strings.Contains(cbody, "/tunnel") || !rec {
			t.Fatalf("tool %d %s; http %d %s; CONNECT %d %s; record %v", st, body, pst, pbody, cst, cbody, rec)
		}
	})

	t.Run("A10 identity headers on a hosted request are ignored; admin routes are not there", func(t *testing.T) {
		cb := casebook.Expect(t, "A10", "hosted listener: X-Sluice-Identity/Session/Agent/User naming agent-b's session on a tool call; GET /api/v1/holds",
			"the call is agent-a's (the token's): 200 with run-1 in its record, no record for the spoofed session; admin route 404")
		spoof := http.Header{"X-Sluice-Identity": {`{"sandbox":"sb-2","agent":"agent-b","session":"s2","user":"bob"}`},
			"X-Sluice-Session": {"s2"}, "X-Sluice-Agent": {"agent-b"}, "X-Sluice-User": {"bob"}, "X-Forwarded-User": {"bob"}}
		st, _ := h.toolCall(t, "run-1", tok, "tickets.list_tickets", `{}`, spoof)
		spoofed := len(g.AuditEvent("decision", `"session":"s2"`))
		resp, _, _, _ := h.raw(t, "GET /api/v1/holds HTTP/1.1\r\nHost: sluice\r\nAuthorization: "+basicAuth("run-1", tok)+"\r\nConnection: close\r\n\r\n")
		cb.Observef("tool call %d, records of the spoofed session %d, admin route %d", st, spoofed, resp.StatusCode)
		if st != 200 || spoofed != 0 || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("tool %d, spoofed records %d, admin %d", st, spoofed, resp.StatusCode)
		}
	})

	t.Run("D2 placeholder sent to another host over the hosted listener", func(t *testing.T) {
		cb := casebook.Expect(t, "D2", "hosted listener: placeholder for api.test in Authorization to other.test (intercepted); control api.test",
			"api.test gets the secret, other.test the placeholder; audit placeholder_host_mismatch; the sandbox never sees the secret")
		bearer := http.Header{"Authorization": {"Bearer " + h.placeholder}}
		st1, body1, _ := h.fetch(t, c, http.MethodGet, "https://api.test/user", "", bearer)
		rs := h.tlsRequests()
		okAPI := len(rs) > 0 && rs[len(rs)-1].host == "api.test" && rs[len(rs)-1].auth == "Bearer "+h.ghSecret
		st2, body2, _ := h.fetch(t, c, http.MethodGet, "https://other.test/x", "", bearer)
		rs = h.tlsRequests()
		l := rs[len(rs)-1]
		audited := h.awaitAudit(t, "placeholder_host_mismatch", "other.test", "run-1")
		cb.Observef("api.test %d (got the secret %v); other.test %d saw the placeholder %v; audited %v", st1, okAPI, st2, l.auth == "Bearer "+h.placeholder, audited)
		if !okAPI || l.host != "other.test" || l.auth != "Bearer "+h.placeholder || !audited || strings.Contains(body1+body2, h.ghSecret) {
			t.Fatalf("api.test %d ok %v; other.test %d auth %q; audited %v", st1, okAPI, st2, l.auth, audited)
		}
	})

	t.Run("C5 CONNECT to a port or host the agent may not reach", func(t *testing.T) {
		for _, target := range []string{"pkg.test:22", "blocked.test:443"} {
			cb := casebook.Expect(t, "C5", "hosted listener: CONNECT "+target, "403 egress_denied, no upstream connection, audited")
			before := h.httpConn.Load() + h.tlsConn.Load()
			resp, body, _, _ := h.raw(t, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\nProxy-Authorization: "+basicAuth("run-1", tok)+"\r\n\r\n")
			host, _, _ := net.SplitHostPort(target)
			audited := h.awaitAudit(t, "decision", host, "run-1")
			cb.Observef("%d %s, upstream connections +%d, audited %v", resp.StatusCode, errCode(body), h.httpConn.Load()+h.tlsConn.Load()-before, audited)
			if resp.StatusCode != http.StatusForbidden || errCode(body) != "egress_denied" || h.httpConn.Load()+h.tlsConn.Load() != before || !audited {
				t.Errorf("CONNECT %s: %d %s, audited %v", target, resp.StatusCode, body, audited)
			}
		}
	})

	t.Run("C19 a run's egress narrowing holds over the hosted listener", func(t *testing.T) {
		cb := casebook.Expect(t, "C19", "hosted listener: a token minted with egress [pkg.test] CONNECTs api.test (on agent-a's allowlist); control pkg.test",
			"403 egress_denied by rule sandbox_egress, nothing reaches api.test, audited with the egress; pkg.test 200")
		narrow := h.mint(t, "run-5", `{"agent":"agent-a","egress":["pkg.test"]}`)
		nc := h.client("run-5", narrow)
		before := len(h.tlsRequests())
		resp, body, _, _ := h.raw(t, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\nProxy-Authorization: "+basicAuth("run-5", narrow)+"\r\n\r\n")
		audited := h.awaitAudit(t, "decision", "api.test", "sandbox_egress", "run-5")
		cst, _, _ := h.fetch(t, nc, http.MethodGet, "https://pkg.test/narrow", "", nil)
		apiHits := 0
		for _, r := range h.tlsRequests()[before:] {
			if r.host == "api.test" {
				apiHits++
			}
		}
		cb.Observef("api.test %d %s, api.test requests +%d, audited %v; pkg.test %d", resp.StatusCode, errCode(body), apiHits, audited, cst)
		if apiHits != 0 || resp.StatusCode != http.StatusForbidden || errCode(body) != "egress_denied" || !audited || cst != 200 {
			t.Fatalf("api.test %d %s, audited %v; pkg.test %d", resp.StatusCode, body, audited, cst)
		}
	})

	t.Run("A14 a mint whose narrowing would widen the agent's allowlist", func(t *testing.T) {
		cb := casebook.Expect(t, "A14", "POST /api/v1/sessions/run-6/tokens with egress [pkg.test, evil.test] (evil.test not on agent-a's allowlist)",
			"403 egress_not_granted naming evil.test, audited egress_not_granted; no token minted")
		st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/sessions/run-6/tokens", platformToken, `{"agent":"agent-a","egress":["pkg.test","evil.test"]}`)
		audited := h.awaitAudit(t, "egress_not_granted", "evil.test", "run-6")
		minted := len(g.AuditEvent("session_token_minted", "run-6"))
		cb.Observef("%d %s, audited %v, minted records %d", st, code, audited, minted)
		if st != http.StatusForbidden || code != "egress_not_granted" || !audited || minted != 0 {
			t.Fatalf("%d %s, audited %v, minted %d", st, code, audited, minted)
		}
	})

	other := h.mint(t, "run-2", `{"agent":"agent-a","user":"alice"}`)
	short := h.mint(t, "run-3", `{"agent":"agent-a","ttl":"1s"}`)
	time.Sleep(1500 * time.Millisecond)
	flipped := []byte(tok)
	// One character changed to another of the base64url alphabet: a bit
	// flip can leave the alphabet ('A'^1 is '@'), which is malformed, not a bad MAC.
	if flipped[len(flipped)-3] == 'A' {
		flipped[len(flipped)-3] = 'B'
	} else {
		flipped[len(flipped)-3] = 'A'
	}
	for _, tc := range []struct {
		name, cred, reason string
	}{
		{"no Proxy-Authorization", "", "missing"},
		{"a password that is no token", basicAuth("run-1", "hunter2"), "malformed"},
		{"the token with one character changed", basicAuth("run-1", string(flipped)), "bad_mac"},
		{"run-2's token presented as run-1", basicAuth("run-1", other), "session_mismatch"},
		{"an expired token (ttl 1s)", basicAuth("run-3", short), "expired"},
	} {
		for _, req := range []string{"GET http://pkg.test/refused HTTP/1.1\r\nHost: pkg.test\r\n", "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\n"} {
			method := strings.SplitN(req, " ", 2)[0]
			t.Run("E15 "+tc.name+" "+method, func(t *testing.T) {
				cb := casebook.Expect(t, "E15", "hosted listener, "+method+": "+tc.name,
					"407 with Proxy-Authenticate Basic, reason "+tc.reason+"; nothing decided or sent upstream; audited hosted_token_refused")
				before := h.httpConn.Load() + h.tlsConn.Load()
				decisions := len(g.AuditEvent("decision", "/refused"))
				hdr := ""
				if tc.cred != "" {
					hdr = "Proxy-Authorization: " + tc.cred + "\r\n"
				}
				resp, body, _, _ := h.raw(t, req+hdr+"\r\n")
				audited := h.awaitAudit(t, "hosted_token_refused", `"reason":"`+tc.reason+`"`, `"method":"`+method+`"`)
				cb.Observef("%d %s challenge %q reason in body %v, upstream connections +%d, audited %v", resp.StatusCode, errCode(body),
					resp.Header.Get("Proxy-Authenticate"), strings.Contains(body, tc.reason), h.httpConn.Load()+h.tlsConn.Load()-before, audited)
				if resp.StatusCode != http.StatusProxyAuthRequired || resp.Header.Get("Proxy-Authenticate") != `Basic realm="sluice"` ||
					!strings.Contains(body, tc.reason) || h.httpConn.Load()+h.tlsConn.Load() != before || !audited ||
					len(g.AuditEvent("decision", "/refused")) != decisions {
					t.Fatalf("%d %s; audited %v", resp.StatusCode, body, audited)
				}
			})
		}
	}

	t.Run("B11 a flood of attempts naming no token does not grow the audit log one record each", func(t *testing.T) {
		cb := casebook.Expect(t, "B11", "hosted listener: 50 requests without Proxy-Authorization from the sandbox's address (budget: 20 audited per address per minute)",
			"each 407, nothing sent upstream; past the budget not audited one by one but counted in sluice_hosted_refusals_unaudited_total (audited once per window as hosted_refusals_summarised)")
		anon := func() int { // refusals audited one by one that name no token's session
			n := 0
			for _, r := range g.AuditEvent("hosted_token_refused", `"remote":"`+hostedSBAddr+`:`) {
				if f, _ := r["fields"].(map[string]any); f["session"] == nil {
					n++
				}
			}
			return n
		}
		unaudited := func() int {
			_, m, _ := h.g.AdminGet("/metrics")
			for _, l := range strings.Split(string(m), "\n") {
				if v, ok := strings.CutPrefix(l, "sluice_hosted_refusals_unaudited_total "); ok {
					n, _ := strconv.Atoi(strings.TrimSpace(v))
					return n
				}
			}
			return 0
		}
		const attempts = 50
		recs, ctr, conns := anon(), unaudited(), h.httpConn.Load()+h.tlsConn.Load()
		refused := 0
		for range attempts {
			resp, body, _, _ := h.raw(t, "GET http://pkg.test/flood HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
			if resp.StatusCode == http.StatusProxyAuthRequired && strings.Contains(body, "missing") {
				refused++
			}
		}
		audited, counted := anon()-recs, unaudited()-ctr
		cb.Observef("%d of %d answered 407 missing, %d audited one by one, %d counted unaudited, upstream connections +%d", refused, attempts, audited, counted,
			h.httpConn.Load()+h.tlsConn.Load()-conns)
		// At most two windows (20 each) can hold the burst: at least 10 are
		// past the budget; every attempt is either audited or counted.
		if refused != attempts || audited+counted != attempts || counted < attempts-40 || h.httpConn.Load()+h.tlsConn.Load() != conns {
			t.Fatalf("%d 407s, %d audited, %d counted", refused, audited, counted)
		}
	})

	t.Run("E17 a connection switching to another token mid-stream", func(t *testing.T) {
		cb := casebook.Expect(t, "E17", "hosted listener: a second request on a connection admitted with run-1's token carries run-2's",
			"407 credential_changed and the connection closed; nothing sent for the second request")
		resp, _, conn, br := h.raw(t, "GET http://pkg.test/first HTTP/1.1\r\nHost: pkg.test\r\nProxy-Authorization: "+basicAuth("run-1", tok)+"\r\n\r\n")
		before := h.httpConn.Load()
		io.WriteString(conn, "GET http://pkg.test/second HTTP/1.1\r\nHost: pkg.test\r\nProxy-Authorization: "+basicAuth("run-2", other)+"\r\n\r\n")
		resp2, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp2.Body)
		_, rerr := br.ReadByte()
		cb.Observef("first %d; second %d %s, connection closed %v, upstream connections +%d", resp.StatusCode, resp2.StatusCode, errCode(string(b)), rerr != nil, h.httpConn.Load()-before)
		if resp.StatusCode != 200 || resp2.StatusCode != http.StatusProxyAuthRequired || !strings.Contains(string(b), "credential_changed") || rerr == nil || h.httpConn.Load() != before {
			t.Fatalf("first %d, second %d %s, read after: %v", resp.StatusCode, resp2.StatusCode, b, rerr)
		}
	})

	t.Run("E17 an approver may not mint a token (it names the user a call acts for)", func(t *testing.T) {
		cb := casebook.Expect(t, "E17", "POST /api/v1/sessions/run-9/tokens with an approver's token, user bob",
			"401 unauthenticated: only a machine caller (gateway.session_tokens_sha256) mints; nothing audited as minted")
		st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/sessions/run-9/tokens", gwenv.CarolToken, `{"agent":"agent-a","user":"bob"}`)
		minted := len(g.AuditEvent("session_token_minted", "run-9"))
		cb.Observef("%d %s, minted records %d", st, code, minted)
		if st != http.StatusUnauthorized || minted != 0 {
			t.Fatalf("%d %s, minted %d", st, code, minted)
		}
	})

	t.Run("E16 ending the session ends the token and its open tunnel", func(t *testing.T) {
		cb := casebook.Expect(t, "E16", "POST /api/v1/sessions/run-4/end (sluice sessions end) while its hosted CONNECT tunnel is open; the token used again; a new mint",
			"the tunnel closed at once; the token 407 session_ended, audited; mint 409 session_ended")
		tok4 := h.mint(t, "run-4", `{"agent":"agent-a"}`)
		resp, _, conn, br := h.raw(t, "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\nProxy-Authorization: "+basicAuth("run-4", tok4)+"\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %d", resp.StatusCode)
		}
		tunnel := tls.Client(&bufConn{Conn: conn, r: br}, &tls.Config{RootCAs: h.roots, ServerName: "pkg.test"})
		if err := tunnel.Handshake(); err != nil {
			t.Fatalf("TLS through the tunnel: %v", err)
		}
		if st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/sessions/run-4/end", platformToken, ""); st != 200 {
			t.Fatalf("end: %d %s", st, code)
		}
		_ = tunnel.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, rerr := tunnel.Read(make([]byte, 1))
		closed := rerr != nil && !isTimeoutErr(rerr)
		resp2, body, _, _ := h.raw(t, "GET http://pkg.test/after HTTP/1.1\r\nHost: pkg.test\r\nProxy-Authorization: "+basicAuth("run-4", tok4)+"\r\n\r\n")
		audited := h.awaitAudit(t, "hosted_token_refused", `"reason":"session_ended"`, "run-4")
		st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/sessions/run-4/tokens", platformToken, `{"agent":"agent-a"}`)
		cb.Observef("tunnel closed %v (%v); token after the end %d %v; audited %v; mint %d %s", closed, rerr, resp2.StatusCode, strings.Contains(body, "session_ended"), audited, st, code)
		if !closed || resp2.StatusCode != http.StatusProxyAuthRequired || !strings.Contains(body, "session_ended") || !audited || st != http.StatusConflict || code != "session_ended" {
			t.Fatalf("tunnel closed %v; after %d %s; audited %v; mint %d %s", closed, resp2.StatusCode, body, audited, st, code)
		}
	})

	t.Run("a real process: curl with HTTPS_PROXY in the sandbox's namespace", func(t *testing.T) {
		if _, err := exec.LookPath("curl"); err != nil {
			t.Skip("curl is not installed")
		}
		proxy := (&url.URL{Scheme: "https", User: url.UserPassword("run-1", tok), Host: net.JoinHostPort(hostedName, hostedPort)}).String()
		run := func(args ...string) (string, error) {
			cmd := exec.Command("ip", append([]string{"netns", "exec", h.sb.Name, "curl", "-sS", "--max-time", "20", "--proxy-cacert", h.caFile, "--cacert", h.upCA}, args...)...)
			cmd.Env = append(os.Environ(), "HTTPS_PROXY="+proxy, "HTTP_PROXY="+proxy, "https_proxy="+proxy, "http_proxy="+proxy)
			out, err := cmd.CombinedOutput()
			return strings.ReplaceAll(string(out), tok, "[TOKEN]"), err
		}
		if out, err := run("http://pkg.test/curl-plain"); err != nil || !strings.Contains(out, "hello from pkg.test /curl-plain") {
			t.Errorf("curl http:// through the hosted proxy: %v %s", err, out)
		}
		if out, err := run("https://pkg.test/curl-tls"); err != nil || !strings.Contains(out, "hello from pkg.test /curl-tls") {
			t.Errorf("curl https:// (CONNECT) through the hosted proxy: %v %s", err, out)
		}
		if out, err := run("--noproxy", "*", "--connect-timeout", "3", "http://"+egressIP+"/direct"); err == nil {
			t.Errorf("curl reached %s without the proxy: %s", egressIP, out)
		}
	})

	t.Run("the tokens are in no log line, audit record or metric", func(t *testing.T) {
		audit, err := os.ReadFile(h.g.Audit)
		if err != nil {
			t.Fatal(err)
		}
		_, metrics, _ := h.g.AdminGet("/metrics")
		for _, s := range []string{tok, other, short} {
			mac := s[strings.LastIndexByte(s, '.')+1:]
			for name, hay := range map[string][]byte{"audit log": audit, "gateway log": h.g.Stderr(), "metrics": metrics} {
				if strings.Contains(string(hay), mac) || strings.Contains(string(hay), base64.StdEncoding.EncodeToString([]byte("run-1:"+s))) {
					t.Errorf("%s holds a token", name)
				}
			}
		}
		if n := len(g.AuditEvent("session_token_minted", "")); n < 4 {
			t.Errorf("%d session_token_minted records, want one per mint", n)
		}
	})
}

// bufConn reads through the reader that read the CONNECT answer.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
