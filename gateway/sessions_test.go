package gateway

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/ingress/ingresstest"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestEndSession ends a session that has a pending hold and an agent
// waiting on it: the hold expires and the agent gets 403 approval_expired,
// later tool calls and proxy requests of the session are 403 session_ended
// with nothing reaching the upstream, another session is unaffected, and a
// repeat end answers the same.
func TestEndSession(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", func(c *config.Config) {
		c.Gateway.SessionTokensSHA256 = []string{tokenHash("tok-sandboxd")}
	})
	c := g.client(agentA)
	otherID := agentA
	otherID.Session = "s-2"
	other := g.client(otherID)

	r := doCall(t, c, "tickets.create_refund", refund)
	id, st := holdOf(t, r)
	if r.status != 202 || st != "pending" {
		t.Fatalf("ask: %d %s, want 202 pending", r.status, r.raw)
	}
	ro := doCall(t, other, "tickets.create_refund", refund)
	otherHold, _ := holdOf(t, ro)
	if ro.status != 202 {
		t.Fatalf("control ask: %d %s", ro.status, ro.raw)
	}

	t.Run("unauthenticated is 401 and ends nothing", func(t *testing.T) {
		for _, tc := range []struct{ name, token string }{{"no token", ""}, {"wrong token", "wrong"}, {"hash as token", tokenHash("tok-sandboxd")}} {
			t.Run(tc.name, func(t *testing.T) {
				if r := g.admin(t, tc.token, "POST", "/api/v1/sessions/s-1/end", ""); r.status != 401 || r.code() != "unauthenticated" {
					t.Fatalf("%d %s, want 401 unauthenticated", r.status, r.raw)
				}
			})
		}
		if r := doCall(t, c, "tickets.list_tickets", `{}`); r.status != 200 {
			t.Fatalf("call after refused end: %d %s, want 200", r.status, r.raw)
		}
	})
	t.Run("a malformed session id is 400", func(t *testing.T) {
		if r := g.admin(t, "tok-sandboxd", "POST", "/api/v1/sessions/"+strings.Repeat("x", ident.MaxLen+1)+"/end", ""); r.status != 400 {
			t.Fatalf("%d %s, want 400", r.status, r.raw)
		}
	})
	before := up.requests.Load()

	// The agent long-polls its hold while the session is ended.
	got := make(chan reply, 1)
	go func() { got <- poll(t, c, id, "30s") }()
	time.Sleep(100 * time.Millisecond)
	er := g.admin(t, "tok-sandboxd", "POST", "/api/v1/sessions/s-1/end", "")
	end, _ := er.body["session"].(map[string]any)
	if er.status != 200 || end["ended_by"] != "session_token[0]" || end["session"] != "s-1" {
		t.Fatalf("end: %d %s, want 200 ended by session_token[0]", er.status, er.raw)
	}
	if hs, _ := end["holds_expired"].([]any); len(hs) != 1 || hs[0] != id {
		t.Fatalf("end expired %v, want [%s]", end["holds_expired"], id)
	}
	t.Run("the waiting agent gets 403 approval_expired", func(t *testing.T) {
		select {
		case pr := <-got:
			if pr.status != http.StatusForbidden || pr.code() != string(refusal.ApprovalExpired) {
				t.Fatalf("poll: %d %s, want 403 approval_expired", pr.status, pr.raw)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting agent was not answered")
		}
	})
	t.Run("the expired hold cannot be approved", func(t *testing.T) {
		if r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", `{"reason":"ok"}`); r.status != http.StatusGone {
			t.Fatalf("approve: %d %s, want 410", r.status, r.raw)
		}
	})
	t.Run("later calls of the session are refused", func(t *testing.T) {
		tests := []struct{ name, tool, args string }{
			{"allowed tool", "tickets.list_tickets", `{}`},
			{"ask tool", "tickets.create_refund", `{"body":{"amount":7,"reason":"new"}}`},
			{"unknown tool", "nope.nothing", `{}`},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				if r := doCall(t, c, tc.tool, tc.args); r.status != http.StatusForbidden || r.code() != string(refusal.SessionEnded) {
					t.Fatalf("%d %s, want 403 session_ended", r.status, r.raw)
				}
			})
		}
		t.Run("proxy request", func(t *testing.T) {
			resp, body, _, _ := exchange(t, g, "GET http://evil.example/x HTTP/1.1\r\nHost: evil.example\r\n\r\n")
			if resp.StatusCode != http.StatusForbidden || errCode(body) != string(refusal.SessionEnded) {
				t.Fatalf("%d %s, want 403 session_ended", resp.StatusCode, body)
			}
			if ps := resp.Header.Get("Proxy-Status"); !strings.Contains(ps, "error=") {
				t.Errorf("Proxy-Status = %q", ps)
			}
		})
		if n := up.requests.Load(); n != before {
			t.Fatalf("the upstream saw %d requests after the end", n-before)
		}
	})
	t.Run("a hold created while ending is never sent", func(t *testing.T) {
		// As if the call passed the check just before the end and was held
		// just after the holds were expired.
		h, _, err := g.Holds().Create(context.Background(), holds.Hold{
			Tool: "tickets.create_refund", Args: []byte(`{"body":{"amount":9}}`),
			Request:   holds.Request{Method: "POST", URL: up.URL + "/refunds", Headers: map[string][]string{}},
			Caller:    holds.Caller{Sandbox: agentA.Sandbox, Agent: agentA.Agent, Session: agentA.Session, User: agentA.User},
			Approvers: []string{"group:finance"}, Rule: "policies[3]", Expires: time.Now().Add(time.Hour), RequestID: "r-race",
		})
		if err != nil {
			t.Fatal(err)
		}
		r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+h.ID+"/approve", `{"reason":"ok"}`)
		res, _ := r.body["hold"].(map[string]any)["result"].(map[string]any)
		if _, st := holdOf(t, r); r.status != 200 || st != "failed" || !strings.Contains(r.raw, string(refusal.SessionEnded)) || res["http_status"] != float64(403) {
			t.Fatalf("approve: %d %s, want failed with 403 session_ended", r.status, r.raw)
		}
		if n := up.requests.Load(); n != before {
			t.Fatalf("the upstream saw %d requests", n-before)
		}
	})
	t.Run("another session is unaffected", func(t *testing.T) {
		if r := doCall(t, other, "tickets.list_tickets", `{}`); r.status != 200 {
			t.Fatalf("other session call: %d %s, want 200", r.status, r.raw)
		}
		if r := poll(t, other, otherHold, "0s"); r.status != http.StatusAccepted {
			t.Fatalf("other session's hold: %d %s, want 202 pending", r.status, r.raw)
		}
	})
	t.Run("ending again answers the same", func(t *testing.T) {
		for _, tok := range []string{"tok-sandboxd", "tok-carol"} {
			r := g.admin(t, tok, "POST", "/api/v1/sessions/s-1/end", "")
			again, _ := r.body["session"].(map[string]any)
			if r.status != 200 || again["ended"] != end["ended"] || again["ended_by"] != end["ended_by"] ||
				len(again["holds_expired"].([]any)) != 1 {
				t.Fatalf("repeat by %s: %d %s, want %v", tok, r.status, r.raw, end)
			}
		}
	})
	t.Run("the ends are audited with who ended", func(t *testing.T) {
		var by []string
		expired, refusals := false, 0
		for _, rec := range auditEvents(t, g) {
			switch {
			case rec.Event == "session_ended" && rec.Fields["session"] == "s-1":
				by = append(by, rec.Fields["by"].(string))
			case rec.Event == "hold_expired" && rec.Fields["hold"] == id:
				expired = true
			case rec.Event == "decision" && rec.Fields["session"] == "s-1" && rec.Fields["code"] == string(refusal.SessionEnded):
				refusals++
			}
		}
		if !slices.Equal(by, []string{"session_token[0]", "session_token[0]", "carol"}) || !expired {
			t.Fatalf("session_ended by %v, hold_expired %v", by, expired)
		}
		// Three tool calls and one proxy request were refused.
		if refusals != 4 {
			t.Fatalf("%d audited session_ended refusals, want 4", refusals)
		}
	})
}

// TestSessionStateUnreadable: when the store cannot say whether a session
// has ended, nothing is sent for it (fail closed). An answer the store gave
// earlier stands while it cannot be read — a session ends only through the
// store, so it cannot end meanwhile — until an end is attempted.
func TestSessionStateUnreadable(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	c := g.client(agentA)
	if r := doCall(t, c, "tickets.list_tickets", `{}`); r.status != 200 {
		t.Fatalf("before: %d %s", r.status, r.raw)
	}
	before := up.requests.Load()
	g.store.Close()
	fresh := agentA
	fresh.Session = "s-fresh" // never looked up before the store closed
	cf := g.client(fresh)
	tests := []struct {
		name, tool, args string
		status           int
		code             refusal.Code
	}{
		{"allowed call", "tickets.list_tickets", `{}`, http.StatusServiceUnavailable, refusal.SessionUnavailable},
		// An ask cannot be held without the store either.
		{"ask call", "tickets.create_refund", refund, http.StatusServiceUnavailable, refusal.ApprovalUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if r := doCall(t, cf, tc.tool, tc.args); r.status != tc.status || r.code() != string(tc.code) {
				t.Fatalf("%d %s, want %d %s", r.status, r.raw, tc.status, tc.code)
			}
		})
	}
	t.Run("proxy request", func(t *testing.T) {
		conn := rawConn(t, g, fresh)
		if _, err := io.WriteString(conn, "GET http://evil.example/x HTTP/1.1\r\nHost: evil.example\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || errCode(body) != string(refusal.SessionUnavailable) {
			t.Fatalf("%d %s, want 503 session_unavailable", resp.StatusCode, body)
		}
	})
	t.Run("an answer already read stands", func(t *testing.T) {
		if r := doCall(t, c, "tickets.list_tickets", `{}`); r.status != 200 {
			t.Fatalf("%d %s, want 200", r.status, r.raw)
		}
	})
	t.Run("ending is 503", func(t *testing.T) {
		if r := g.admin(t, "tok-bob", "POST", "/api/v1/sessions/s-1/end", ""); r.status != http.StatusServiceUnavailable || r.code() != string(refusal.SessionUnavailable) {
			t.Fatalf("%d %s, want 503 session_unavailable", r.status, r.raw)
		}
	})
	t.Run("after a failed end the session is refused", func(t *testing.T) {
		if r := doCall(t, c, "tickets.list_tickets", `{}`); r.status != http.StatusServiceUnavailable || r.code() != string(refusal.SessionUnavailable) {
			t.Fatalf("%d %s, want 503 session_unavailable", r.status, r.raw)
		}
	})
	if n := up.requests.Load(); n != before+1 {
		t.Fatalf("%d upstream requests with the store closed, want 1 (the session whose answer was read before)", n-before)
	}
}

// TestEndSessionClosesHandoffs: ending a session closes its handed-off
// connections at once (the sandbox's socket and the relay's lease), and
// leaves another session's open (THREATS C12).
func TestEndSessionClosesHandoffs(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", func(c *config.Config) {
		c.Gateway.SessionTokensSHA256 = []string{tokenHash("tok-sandboxd")}
	})
	otherID := agentA
	otherID.Session = "s-2"
	open := func(id wire.Identity) (net.Conn, *bufio.Reader) {
		c, err := ingresstest.NewHandoffDialer(t, g.cfg.Gateway.SandboxSocket, id, "tcp").DialContext(context.Background(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		br := bufio.NewReader(c)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request over the handoff: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return c, br
	}
	mine, _ := open(agentA)
	other, otherR := open(otherID)
	if n := g.Server.sessConns.Count(agentA.Session); n != 1 {
		t.Fatalf("%d connections registered for %s, want 1", n, agentA.Session)
	}
	r := g.admin(t, "tok-sandboxd", "POST", "/api/v1/sessions/"+agentA.Session+"/end", "")
	if r.status != http.StatusOK {
		t.Fatalf("end: %d %s", r.status, r.raw)
	}
	start := time.Now()
	_ = mine.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, err := mine.Read(make([]byte, 1)); n != 0 || err == nil || os.IsTimeout(err) {
		t.Fatalf("read on the ended session's handoff after %v = %d, %v; want EOF or reset", time.Since(start), n, err)
	}
	if n := g.Server.sessConns.Count(agentA.Session); n != 0 {
		t.Fatalf("%d connections still registered for the ended session", n)
	}
	closed := "none"
	for _, rec := range auditEvents(t, g) {
		if rec.Event == "session_ended" {
			closed = fmt.Sprint(rec.Fields["connections_closed"])
		}
	}
	if closed != "1" {
		t.Fatalf("session_ended record: connections_closed %s, want 1", closed)
	}
	_ = other.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(other, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n")
	if resp, err := http.ReadResponse(otherR, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the other session's handoff after the end: %v %v", resp, err)
	}
}

// TestSessionGateOnOpenConnection: the session check sits where every
// egress is decided, not only at the connection's start. With the end
// stored but the caller's connection left open (as in the moment between
// the store's commit and the connections being closed), the next proxied
// request on that keep-alive connection is 403 session_ended before any
// dial, and a DNS question whose allow decision is cached is REFUSED,
// both audited with code session_ended (THREATS C12).
func TestSessionGateOnOpenConnection(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{"a.allowed.test": "93.184.216.34"})
	g := startEgressGateway(t, up, nil)
	question := func(qtype uint16) []byte {
		m := new(mdns.Msg)
		m.SetQuestion("a.allowed.test.", qtype)
		b, _ := m.Pack()
		return b
	}
	ask := func(c net.Conn, br *bufio.Reader) int {
		q := question(mdns.TypeA)
		fmt.Fprintf(c, "POST /v1/dns HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/dns-message\r\nContent-Length: %d\r\n\r\n%s", len(q), q)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		m := new(mdns.Msg)
		if resp.StatusCode != 200 || m.Unpack(b) != nil {
			t.Fatalf("POST /v1/dns: %d %q", resp.StatusCode, b)
		}
		return m.Rcode
	}
	c := rawConn(t, g, agentA)
	br := bufio.NewReader(c)
	if rc := ask(c, br); rc != mdns.RcodeSuccess {
		t.Fatalf("before the end: %s", mdns.RcodeToString[rc])
	}
	if _, _, err := g.Server.store.EndSession(context.Background(), agentA.Session, "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	if rc := ask(c, br); rc != mdns.RcodeRefused {
		t.Fatalf("cached name on the open connection after the end: %s, want REFUSED", mdns.RcodeToString[rc])
	}
	// A stream's reader answers cached allowed names inline (answerFast;
	// an MX question needs only the cached decision, the upstream's TTL 0
	// keeps no address): it must leave an ended session's question to the
	// full path.
	sc := rawConn(t, g, agentA)
	q := question(mdns.TypeMX)
	frame := append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)
	fmt.Fprintf(sc, "POST /v1/dns HTTP/1.1\r\nHost: sluice\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", egress.DNSStreamType, len(frame), frame)
	sresp, err := http.ReadResponse(bufio.NewReader(sc), nil)
	if err != nil || sresp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", sresp, err)
	}
	out, _ := io.ReadAll(sresp.Body)
	sm := new(mdns.Msg)
	if len(out) < 2 || sm.Unpack(out[2:]) != nil || sm.Rcode != mdns.RcodeRefused {
		t.Fatalf("stream answer after the end: %x, want one REFUSED frame", out)
	}
	io.WriteString(c, "GET http://pkg.example/x HTTP/1.1\r\nHost: pkg.example\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusForbidden || errCode(body) != string(refusal.SessionEnded) {
		t.Fatalf("proxied request on the open connection after the end: %d %s", resp.StatusCode, body)
	}
	var dns, proxy bool
	for _, r := range auditEvents(t, g) {
		dns = dns || r.Event == "dns_refused" && r.Fields["code"] == "session_ended" && r.Fields["dest_host"] == "a.allowed.test"
		proxy = proxy || r.Event == "decision" && r.Fields["code"] == "session_ended" && r.Fields["dest_host"] == "pkg.example"
	}
	if !dns || !proxy {
		t.Fatalf("audit: dns_refused session_ended %v, proxy decision session_ended %v; want both", dns, proxy)
	}
}
