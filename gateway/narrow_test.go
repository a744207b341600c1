package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestEgressNarrowing feeds the gateway identities whose preamble carries
// a narrowing (sandboxd --egress) of agent-a's allowlist (*.allowed.test,
// pkg.example, …): a narrowing wider than the list is refused at the tool
// list (403 egress_not_granted, audited); inside it, a host the agent may
// reach but the narrowing leaves out is refused on plain http, CONNECT and
// DNS by rule sandbox_egress before policy, also right after the same
// sandbox, unnarrowed, had the name answered (the DNS cache is per
// caller, narrowing included); every record of the narrowed caller
// carries its egress.
func TestEgressNarrowing(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{"a.allowed.test": "93.184.216.34", "pkg.example": "93.184.216.34"})
	g := startEgressGateway(t, up, nil)
	withEgress := func(sandbox, egress string) wire.Identity {
		id := agentA
		id.Sandbox, id.Egress = sandbox, egress
		return id
	}
	tools := func(id wire.Identity) (int, string) {
		resp, err := g.client(id).Get("http://sluice/v1/tools")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	t.Run("wider than the agent's list is refused at the tool list", func(t *testing.T) {
		for _, egress := range []string{"evil.test,pkg.example", "*.example", "allowed.test,x.pkg.example", "*.test"} {
			st, body := tools(withEgress("sb-wide", egress))
			if st != 403 || !strings.Contains(body, `"code":"egress_not_granted"`) || !strings.Contains(body, "a sandbox's --egress may only narrow it") {
				t.Errorf("egress %q: %d %s, want 403 egress_not_granted", egress, st, body)
			}
		}
		n := 0
		for _, r := range auditEvents(t, g) {
			if r.Event == "egress_not_granted" && r.Fields["sandbox"] == "sb-wide" {
				n++
			}
		}
		if n != 4 {
			t.Errorf("egress_not_granted records: %d, want 4", n)
		}
		for _, egress := range []string{"pkg.example", "a.allowed.test,pkg.example", "*.x.allowed.test", "allowed.test"} {
			if st, body := tools(withEgress("sb-in", egress)); st != 200 {
				t.Errorf("egress %q inside the list: %d %s, want 200", egress, st, body)
			}
		}
	})

	narrow := withEgress("sb-1", "pkg.example")
	t.Run("http and CONNECT outside the narrowing are refused before policy", func(t *testing.T) {
		for _, req := range []string{
			"GET http://a.allowed.test/ HTTP/1.1\r\nHost: a.allowed.test\r\n\r\n",
			"CONNECT a.allowed.test:8443 HTTP/1.1\r\nHost: a.allowed.test:8443\r\n\r\n",
		} {
			c := rawConn(t, g, narrow)
			fmt.Fprint(c, req)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 403 || !strings.Contains(string(b), `"code":"egress_denied"`) || !strings.Contains(string(b), `not on sandbox \"sb-1\"'s egress list`) {
				t.Errorf("%q: %d %s, want 403 egress_denied by the narrowing", strings.Fields(req)[0], resp.StatusCode, b)
			}
		}
	})

	t.Run("DNS: a name answered to the unnarrowed caller is refused to the narrowed one", func(t *testing.T) {
		ask := func(id wire.Identity, name string) int {
			m := new(mdns.Msg)
			m.SetQuestion(mdns.Fqdn(name), mdns.TypeA)
			raw, _ := m.Pack()
			resp, err := g.client(id).Post("http://sluice/v1/dns", "application/dns-message", bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			a := new(mdns.Msg)
			if resp.StatusCode != 200 || a.Unpack(b) != nil {
				t.Fatalf("POST /v1/dns: %d %q", resp.StatusCode, b)
			}
			return a.Rcode
		}
		for range 2 { // the second from the decision and answer caches
			if rc := ask(agentA, "a.allowed.test"); rc != mdns.RcodeSuccess {
				t.Fatalf("unnarrowed: %s", mdns.RcodeToString[rc])
			}
		}
		for range 2 {
			if rc := ask(narrow, "a.allowed.test"); rc != mdns.RcodeRefused {
				t.Errorf("narrowed to pkg.example, a.allowed.test: %s, want REFUSED", mdns.RcodeToString[rc])
			}
		}
		if rc := ask(narrow, "pkg.example"); rc != mdns.RcodeSuccess {
			t.Errorf("narrowed, pkg.example (in both): %s, want NOERROR", mdns.RcodeToString[rc])
		}
	})

	t.Run("every record of the narrowed caller carries its egress", func(t *testing.T) {
		_ = doCall(t, g.client(narrow), "tickets.list_tickets", `{}`)
		var narrowed []audit.Record
		refusals := map[string]bool{}
		unnarrowed := 0
		for _, r := range auditEvents(t, g) {
			if r.Fields["sandbox"] != "sb-1" {
				continue
			}
			// The unnarrowed caller wrote one record for sb-1: the
			// dns_answered of its first question of a.allowed.test (the
			// narrowed caller was refused that name). Every other
			// record is the narrowed caller's.
			if r.Event == "dns_answered" && r.Fields["dest_host"] == "a.allowed.test" {
				unnarrowed++
				continue
			}
			narrowed = append(narrowed, r)
			if r.Fields["rule"] == "sandbox_egress" {
				refusals[fmt.Sprint(r.Event, " ", r.Fields["kind"], " ", r.Fields["code"])] = true
			}
		}
		tool := false
		for _, r := range narrowed {
			if r.Fields["egress"] != "pkg.example" {
				t.Errorf("record %s %v of the narrowed caller: egress %v", r.Event, r.Fields, r.Fields["egress"])
			}
			tool = tool || r.Fields["tool"] == "tickets.list_tickets"
		}
		if unnarrowed != 1 {
			t.Errorf("%d dns_answered records of a.allowed.test in sb-1, want 1 (the unnarrowed caller's)", unnarrowed)
		}
		for _, want := range []string{"decision http egress_denied", "decision connect egress_denied", "dns_refused dns egress_denied"} {
			if !refusals[want] {
				t.Errorf("no refusal record %q by rule sandbox_egress (have %v)", want, refusals)
			}
		}
		if !tool {
			t.Error("no tool call record of the narrowed caller")
		}
	})
}
