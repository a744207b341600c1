package gateway

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
)

const hostedMachineToken = "platform-token-0123456789"

// hostedGateway starts the in-process gateway with gateway.hosted on
// loopback and a machine token that may mint.
func hostedGateway(t *testing.T, upURL string) (*testGateway, *x509.CertPool) {
	t.Helper()
	return hostedGatewayKey(t, upURL, "", "")
}

// hostedGatewayKey is hostedGateway with extra YAML, the token key at
// keyFile ("": the gateway's own directory) and mods applied to the
// configuration once gateway.hosted is set.
func hostedGatewayKey(t *testing.T, upURL, extra, keyFile string, mods ...func(*config.Config)) (*testGateway, *x509.CertPool) {
	t.Helper()
	ca := newTestCA(t, "hosted CA")
	certFile, tlsKey := writePEM(t, t.TempDir(), ca.issue(t, x509.ExtKeyUsageServerAuth, "127.0.0.1"))
	sum := sha256.Sum256([]byte(hostedMachineToken))
	g := startGateway(t, upURL, extra, func(c *config.Config) {
		c.Gateway.SessionTokensSHA256 = []string{hex.EncodeToString(sum[:])}
		tk := keyFile
		if tk == "" {
			tk = c.Dir + "/hosted-token.key"
		}
		c.Gateway.Hosted = &config.Hosted{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: tlsKey,
			TokenKeyFile: tk, MaxTokenTTL: config.Duration(2 * time.Hour)}
		for _, m := range mods {
			m(c)
		}
	})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	return g, roots
}

// mint calls the admin API's mint route and returns the token.
func (g *testGateway) mint(t *testing.T, session, body string) (string, reply) {
	t.Helper()
	r := g.admin(t, hostedMachineToken, "POST", "/api/v1/sessions/"+session+"/tokens", body)
	tok, _ := r.body["token"].(map[string]any)
	s, _ := tok["token"].(string)
	return s, r
}

// hostedRaw opens a TLS connection to the hosted listener, writes req
// and returns the answer's status, its Proxy-Authenticate and body.
func hostedRaw(t *testing.T, addr string, roots *x509.CertPool, req string) (int, string, string) {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("dial hosted: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Proxy-Authenticate"), string(b)
}

func basic(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// TestHostedMintAndUse: a minted token lets a hosted sandbox call a tool
// over the TLS listener with its identity; a wrong, altered, expired,
// other-session or ended-session token is 407 with nothing sent upstream
// and an audit record without the token; ending the session closes the
// open connection.
func TestHostedMintAndUse(t *testing.T) {
	up := newUpstream(t)
	g, roots := hostedGateway(t, up.URL)
	addr := g.HostedAddr()
	if addr == "" {
		t.Fatal("HostedAddr empty with gateway.hosted set")
	}

	t.Run("minting: machine callers only, body checked by key", func(t *testing.T) {
		if r := g.admin(t, "carol-token", "POST", "/api/v1/sessions/h-1/tokens", `{"agent":"agent-a"}`); r.status != 401 {
			t.Fatalf("an approver-less caller minted: %d %s", r.status, r.raw)
		}
		for body, key := range map[string]string{
			`{"agent":"nobody"}`:                 "agent:",
			`{"agent":"agent-a","ttl":"3h"}`:     "ttl:",
			`{"agent":"agent-a","ttl":"banana"}`: "ttl:",
			`{"agent":"agent-a","extra":1}`:      "body:",
			`{"agent":"agent-a","user":"a b"}`:   "user:",
		} {
			_, r := g.mint(t, "h-1", body)
			if r.status != 400 || !strings.HasPrefix(r.message(), key) {
				t.Errorf("mint %s: %d %q, want 400 naming %s", body, r.status, r.message(), key)
			}
		}
	})

	tok, r := g.mint(t, "H-1", `{"agent":"agent-a","user":"Alice","ttl":"1h"}`)
	if r.status != 200 || !strings.HasPrefix(tok, "srt1.") {
		t.Fatalf("mint: %d %s", r.status, r.raw)
	}
	mv := r.body["token"].(map[string]any)
	if mv["session"] != "h-1" || mv["user"] != "alice" || mv["sandbox"] != "h-1" {
		t.Fatalf("mint answer not canonical: session %v user %v sandbox %v", mv["session"], mv["user"], mv["sandbox"])
	}

	t.Run("tool call with the token: served as the token's identity", func(t *testing.T) {
		before := up.requests.Load()
		body := `{"query":{"limit":5}}`
		st, _, out := hostedRaw(t, addr, roots, "POST /v1/tools/tickets.list_tickets HTTP/1.1\r\nHost: sluice\r\nAuthorization: "+basic("h-1", tok)+
			"\r\nContent-Type: application/json\r\nContent-Length: "+itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
		if st != 200 || up.requests.Load() != before+1 {
			t.Fatalf("status %d (%s), upstream requests %d→%d", st, out, before, up.requests.Load())
		}
		found := false
		for _, rec := range auditEvents(t, g) {
			if rec.Event == "decision" && rec.Fields["session"] == "h-1" && rec.Fields["sandbox"] == "h-1" && rec.Fields["user"] == "alice" {
				found = true
				// The listener the call came through, beside its door.
				if rec.Fields["listener"] != "hosted" || rec.Fields["transport"] != "http" {
					t.Errorf("decision record: listener %v transport %v, want hosted, http", rec.Fields["listener"], rec.Fields["transport"])
				}
			}
		}
		if !found {
			t.Fatal("no decision record carries the token's identity")
		}
		if !strings.Contains(g.logBuf.String(), `"listener":"hosted"`) {
			t.Error("the call's canonical log line does not name the hosted listener")
		}
	})

	t.Run("raw egress with the token: its record names the hosted listener", func(t *testing.T) {
		st, _, out := hostedRaw(t, addr, roots, "GET http://egress-h1.example/x HTTP/1.1\r\nHost: egress-h1.example\r\nProxy-Authorization: "+basic("h-1", tok)+"\r\nConnection: close\r\n\r\n")
		if st != http.StatusForbidden {
			t.Fatalf("status %d (%s), want 403 (not on the agent's egress allowlist)", st, out)
		}
		found := false
		for _, rec := range auditEvents(t, g) {
			if rec.Event == "decision" && rec.Fields["kind"] == "http" && rec.Fields["dest_host"] == "egress-h1.example" {
				found = true
				if rec.Fields["listener"] != "hosted" || rec.Fields["session"] != "h-1" {
					t.Errorf("egress record: listener %v session %v, want hosted, h-1", rec.Fields["listener"], rec.Fields["session"])
				}
			}
		}
		if !found {
			t.Fatal("no decision record of the proxied request")
		}
	})

	t.Run("a call over the sandbox socket names no listener", func(t *testing.T) {
		r := doCall(t, g.client(agentA), "tickets.list_tickets", `{"query":{"limit":5}}`)
		if r.status != 200 {
			t.Fatalf("socket call: %d %s", r.status, r.raw)
		}
		n := 0
		for _, rec := range auditEvents(t, g) {
			if rec.Event == "decision" && rec.Fields["session"] == agentA.Session {
				n++
				if l, ok := rec.Fields["listener"]; ok {
					t.Errorf("a socket call's record names listener %v", l)
				}
			}
		}
		if n == 0 {
			t.Fatal("no decision record of the socket call")
		}
	})

	other, _ := g.mint(t, "h-2", `{"agent":"agent-a"}`)
	flipped := []byte(tok)
	// One character changed to another of the base64url alphabet: a bit
	// flip can leave the alphabet ('A'^1 is '@'), which is malformed, not a bad MAC.
	if flipped[10] == 'A' {
		flipped[10] = 'B'
	} else {
		flipped[10] = 'A'
	}
	for _, tc := range []struct{ name, hdr, reason string }{
		{"no credential", "", "missing"},
		{"wrong password", basic("h-1", "hunter2"), "malformed"},
		{"altered token", basic("h-1", string(flipped)), "bad_mac"},
		{"another session's token under this session", basic("h-1", other), "session_mismatch"},
		{"bearer, not basic", "Bearer " + tok, "not_basic"},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			before := up.requests.Load()
			h := ""
			if tc.hdr != "" {
				h = "Proxy-Authorization: " + tc.hdr + "\r\n"
			}
			st, chal, out := hostedRaw(t, addr, roots, "GET "+up.URL+"/tickets HTTP/1.1\r\nHost: "+strings.TrimPrefix(up.URL, "http://")+"\r\n"+h+"\r\n")
			if st != 407 || !strings.Contains(chal, `Basic realm="sluice"`) || !strings.Contains(out, tc.reason) {
				t.Fatalf("status %d challenge %q body %s, want 407 %s", st, chal, out, tc.reason)
			}
			if up.requests.Load() != before {
				t.Fatal("a refused request reached the upstream")
			}
			found := false
			for _, rec := range auditEvents(t, g) {
				if rec.Event == "hosted_token_refused" && rec.Fields["reason"] == tc.reason {
					found = true
				}
			}
			if !found {
				t.Fatalf("no hosted_token_refused record with reason %s", tc.reason)
			}
		})
	}

	t.Run("a later request on the connection with another credential is 407 and closes it", func(t *testing.T) {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		send := func(cred string) *http.Response {
			io.WriteString(c, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nAuthorization: "+cred+"\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp
		}
		if r := send(basic("h-1", tok)); r.StatusCode != 200 {
			t.Fatalf("first request %d", r.StatusCode)
		}
		if r := send(basic("h-2", other)); r.StatusCode != 407 {
			t.Fatalf("second request with another token: %d, want 407", r.StatusCode)
		}
		if _, err := br.ReadByte(); err == nil {
			t.Fatal("the connection stayed open after a changed credential")
		}
	})

	t.Run("ending the session closes its open hosted connection and refuses the token", func(t *testing.T) {
		tok3, r := g.mint(t, "h-3", `{"agent":"agent-a"}`)
		if r.status != 200 {
			t.Fatal(r.raw)
		}
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		io.WriteString(c, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nAuthorization: "+basic("h-3", tok3)+"\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("before the end: %v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		if r := g.admin(t, hostedMachineToken, "POST", "/api/v1/sessions/h-3/end", ""); r.status != 200 {
			t.Fatalf("end: %d %s", r.status, r.raw)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := br.ReadByte(); err == nil || isTimeout(err) {
			t.Fatalf("the open connection survived the session's end: %v", err)
		}
		st, _, out := hostedRaw(t, addr, roots, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nAuthorization: "+basic("h-3", tok3)+"\r\n\r\n")
		if st != 407 || !strings.Contains(out, "session_ended") {
			t.Fatalf("after the end: %d %s", st, out)
		}
		if _, r := g.mint(t, "h-3", `{"agent":"agent-a"}`); r.status != 409 || r.code() != "session_ended" {
			t.Fatalf("minting for an ended session: %d %s", r.status, r.raw)
		}
	})

	t.Run("the token is in no log line and no audit record", func(t *testing.T) {
		data, err := os.ReadFile(g.cfg.Audit.Path)
		if err != nil {
			t.Fatal(err)
		}
		sig := tok[strings.LastIndexByte(tok, '.')+1:]
		for name, hay := range map[string]string{"audit log": string(data), "gateway log": g.logBuf.String(), "metrics": g.metrics(t)} {
			for _, needle := range []string{tok, sig, other[strings.LastIndexByte(other, '.')+1:], base64.StdEncoding.EncodeToString([]byte("h-1:" + tok))} {
				if strings.Contains(hay, needle) {
					t.Errorf("%s holds the token", name)
				}
			}
		}
		if !strings.Contains(string(data), `"session_token_minted"`) {
			t.Error("no session_token_minted record")
		}
	})
}

// TestHostedRefusalBudget: refused attempts that name no token are
// audited one by one only within their source address's budget per
// window; past it each is still answered 407 with nothing sent, counted
// in /metrics, and the window's are audited once as
// hosted_refusals_summarised when it ends. A real token's refusal is
// audited whatever the budget.
func TestHostedRefusalBudget(t *testing.T) {
	up := newUpstream(t)
	const budget, window = 2, 1500 * time.Millisecond
	g, roots := hostedGatewayKey(t, up.URL, "", "", func(c *config.Config) {
		c.Gateway.Hosted.RefusalBudget, c.Gateway.Hosted.RefusalWindow = budget, config.Duration(window)
	})
	addr := g.HostedAddr()
	other, _ := g.mint(t, "b-2", `{"agent":"agent-a"}`)
	anon := func() {
		t.Helper()
		st, chal, out := hostedRaw(t, addr, roots, "GET "+up.URL+"/tickets HTTP/1.1\r\nHost: x\r\nProxy-Authorization: "+basic("b-1", "hunter2")+"\r\n\r\n")
		if st != http.StatusProxyAuthRequired || !strings.Contains(chal, "Basic") || !strings.Contains(out, "malformed") {
			t.Fatalf("anonymous attempt: %d %q %s, want 407 malformed", st, chal, out)
		}
	}
	const first = 6
	for range first {
		anon()
	}
	// A real token's refusal, past the budget: audited all the same.
	if st, _, out := hostedRaw(t, addr, roots, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nAuthorization: "+basic("b-1", other)+"\r\n\r\n"); st != 407 || !strings.Contains(out, "session_mismatch") {
		t.Fatalf("another session's token: %d %s", st, out)
	}
	time.Sleep(window + 100*time.Millisecond) // every window so far has ended
	anon()                                    // opens a new window, and summarises the ended ones
	if up.requests.Load() != 0 {
		t.Fatal("a refused attempt reached the upstream")
	}

	audited, mismatch, summarised, summaries := 0, 0, 0, 0
	for _, rec := range auditEvents(t, g) {
		switch rec.Event {
		case "hosted_token_refused":
			switch rec.Fields["reason"] {
			case "malformed":
				audited++
			case "session_mismatch":
				mismatch++
			}
		case "hosted_refusals_summarised":
			summaries++
			n, _ := rec.Fields["unaudited"].(float64)
			summarised += int(n)
			if rec.Fields["remote"] != "127.0.0.1" || rec.Fields["listener"] != "hosted" || n < 1 {
				t.Errorf("summary record: %v", rec.Fields)
			}
		}
	}
	if mismatch != 1 {
		t.Errorf("the real token's refusal was audited %d times, want 1", mismatch)
	}
	// Every attempt is either audited or in a summary; the budget held.
	if audited+summarised != first+1 || summaries == 0 || audited > first-1 {
		t.Fatalf("%d attempts: %d audited one by one, %d in %d summaries (budget %d per %s)", first+1, audited, summarised, summaries, budget, window)
	}
	if want := fmt.Sprintf("\nsluice_hosted_refusals_unaudited_total %d\n", summarised); !strings.Contains(g.metrics(t), want) {
		t.Errorf("metrics do not count the %d refusals past the budget:\n%s", summarised, grepLines(g.metrics(t), "unaudited"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestHostedTokenExpires: a token past its expiry is 407 expired, and an
// open connection is closed when its token expires.
func TestHostedTokenExpires(t *testing.T) {
	up := newUpstream(t)
	g, roots := hostedGateway(t, up.URL)
	tok, r := g.mint(t, "x-1", `{"agent":"agent-a","ttl":"2s"}`)
	if r.status != 200 {
		t.Fatal(r.raw)
	}
	c, err := tls.Dial("tcp", g.HostedAddr(), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nAuthorization: "+basic("x-1", tok)+"\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("before expiry: %v %s", err, b)
	}
	io.Copy(io.Discard, resp.Body)
	_ = c.SetReadDeadline(time.Now().Add(6 * time.Second))
	if _, err := br.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("the connection outlived its token: %v", err)
	}
	st, _, out := hostedRaw(t, g.HostedAddr(), roots, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nAuthorization: "+basic("x-1", tok)+"\r\n\r\n")
	if st != 407 || !strings.Contains(out, `"expired"`) {
		t.Fatalf("after expiry: %d %s", st, out)
	}
	found := false
	for _, rec := range auditEvents(t, g) {
		if rec.Event == "hosted_token_refused" && rec.Fields["reason"] == "expired" && rec.Fields["session"] == "x-1" {
			found = true
		}
	}
	if !found {
		t.Fatal("no hosted_token_refused record naming the expired token's session")
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestHostedReplicasShareKey: a token minted on one replica is accepted
// by another that shares the key file (no table of tokens), and refused
// by a gateway with another key.
func TestHostedReplicasShareKey(t *testing.T) {
	up := newUpstream(t)
	key := t.TempDir() + "/shared-hosted.key"
	a, _ := hostedGatewayKey(t, up.URL, "", key)
	b, rootsB := hostedGatewayKey(t, up.URL, "", key)
	c, rootsC := hostedGateway(t, up.URL)
	tok, r := a.mint(t, "rep-1", `{"agent":"agent-a"}`)
	if r.status != 200 {
		t.Fatal(r.raw)
	}
	req := "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nAuthorization: " + basic("rep-1", tok) + "\r\nConnection: close\r\n\r\n"
	if st, _, out := hostedRaw(t, b.HostedAddr(), rootsB, req); st != 200 {
		t.Fatalf("replica b refused replica a's token: %d %s", st, out)
	}
	if st, _, out := hostedRaw(t, c.HostedAddr(), rootsC, req); st != 407 || !strings.Contains(out, "bad_mac") {
		t.Fatalf("a gateway with another key: %d %s, want 407 bad_mac", st, out)
	}
}

// TestHostedValidate: sluice validate (gateway.Check) reports a
// certificate that does not load, a token key readable by others, and a
// hosted listener nobody can mint for; it creates no key.
func TestHostedValidate(t *testing.T) {
	up := newUpstream(t)
	g, _ := hostedGateway(t, up.URL)
	problems := func(edit func(h *config.Hosted, c *config.Config)) string {
		c := *g.cfg
		h := *c.Gateway.Hosted
		c.Gateway.Hosted = &h
		edit(&h, &c)
		return errors.Join(Check(context.Background(), &c, CheckOptions{}).Errors...).Error()
	}
	if p := problems(func(*config.Hosted, *config.Config) {}); strings.Contains(p, "gateway.hosted") || strings.Contains(p, "session_tokens_sha256") {
		t.Fatalf("a good hosted config reported: %s", p)
	}
	if p := problems(func(h *config.Hosted, _ *config.Config) { h.CertFile = "/nonexistent.pem" }); !strings.Contains(p, "gateway.hosted: certificate") {
		t.Errorf("a missing certificate: %s", p)
	}
	if p := problems(func(_ *config.Hosted, c *config.Config) { c.Gateway.SessionTokensSHA256 = nil }); !strings.Contains(p, "nobody can mint") {
		t.Errorf("no session token: %s", p)
	}
	loose := t.TempDir() + "/loose.key"
	if err := os.WriteFile(loose, []byte(strings.Repeat("ab", 32)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := problems(func(h *config.Hosted, _ *config.Config) { h.TokenKeyFile = loose }); !strings.Contains(p, "gateway.hosted.token_key_file") || !strings.Contains(p, "readable by group or others") {
		t.Errorf("a group-readable key: %s", p)
	}
	missing := t.TempDir() + "/later.key"
	if p := problems(func(h *config.Hosted, _ *config.Config) { h.TokenKeyFile = missing }); strings.Contains(p, "token_key_file") {
		t.Errorf("a key made at first start reported: %s", p)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("validate created the token key")
	}
}
