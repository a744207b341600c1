package egress

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// dnsAnsweredRecords are the gateway's dns_answered records so far.
func dnsAnsweredRecords(t *testing.T, g *testGateway) []audit.Record {
	t.Helper()
	var out []audit.Record
	for _, r := range auditEvents(t, g) {
		if r.Event == "dns_answered" {
			out = append(out, r)
		}
	}
	return out
}

// askDNS asks name (no trailing dot) of type qtype with one POST /v1/dns
// through c and returns the answer's rcode.
func askDNS(t *testing.T, c *http.Client, name string, qtype uint16) int {
	t.Helper()
	resp, err := c.Post("http://sluice/v1/dns", "application/dns-message", bytes.NewReader(packQuestion(t, name+".", qtype)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := new(mdns.Msg)
	if err := m.Unpack(b); err != nil {
		t.Fatalf("answer: %v", err)
	}
	return m.Rcode
}

// TestDNSAnsweredRecords: through the real sandbox socket, a session's
// first question of each name in the window writes one dns_answered record
// (name, type, rcode, answers, the caller, a request id); its repeats write
// none; another session of the same sandbox asking the same name gets its
// own record; a refused name gets dns_refused and no dns_answered. The
// records read as "DNS question" in a timeline (audit.Briefly).
func TestDNSAnsweredRecords(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{"www.allowed.test": "93.184.216.34", "a.allowed.test": "93.184.216.35"})
	g := startEgressGateway(t, up, nil)
	ask := func(t *testing.T, id wire.Identity, name string, qtype uint16) int {
		t.Helper()
		return askDNS(t, g.client(id), name, qtype)
	}
	for i := range 50 {
		qtype := mdns.TypeA
		if i%2 == 1 {
			qtype = mdns.TypeAAAA // any type: still the same name
		}
		ask(t, agentA, "www.allowed.test", qtype)
	}
	if rc := ask(t, agentA, "a.allowed.test", mdns.TypeA); rc != mdns.RcodeSuccess {
		t.Fatalf("a.allowed.test: rcode %d", rc)
	}
	if rc := ask(t, agentA, "nx.allowed.test", mdns.TypeA); rc != mdns.RcodeNameError {
		t.Fatalf("nx.allowed.test: rcode %d, want NXDOMAIN", rc)
	}
	for range 5 {
		ask(t, agentA, "a.allowed.test", mdns.TypeA)
		ask(t, agentA, "nx.allowed.test", mdns.TypeA)
	}
	if rc := ask(t, agentA, "evil.example", mdns.TypeA); rc != mdns.RcodeRefused {
		t.Fatalf("evil.example: rcode %d, want REFUSED", rc)
	}

	recs := dnsAnsweredRecords(t, g)
	type want struct{ name, qtype, rcode, answers string }
	wants := []want{{"www.allowed.test", "A", "NOERROR", "1"}, {"a.allowed.test", "A", "NOERROR", "1"}, {"nx.allowed.test", "A", "NXDOMAIN", "0"}}
	if len(recs) != len(wants) {
		t.Fatalf("%d dns_answered records, want %d (one per name)", len(recs), len(wants))
	}
	rids := map[string]bool{}
	for i, r := range recs {
		w := wants[i]
		got := want{r.Field("dest_host"), r.Field("qtype"), r.Field("rcode"), r.Field("answers")}
		if got != w {
			t.Errorf("record %d: %+v, want %+v", i, got, w)
		}
		for k, v := range map[string]string{"kind": "dns", "session": "s-1", "sandbox": agentA.Sandbox, "agent": agentA.Agent, "user": agentA.User, "decision": "allow"} {
			if r.Field(k) != v {
				t.Errorf("record %d: %s = %q, want %q", i, k, r.Field(k), v)
			}
		}
		if r.RequestID == "" || rids[r.RequestID] {
			t.Errorf("record %d: request id %q (empty or repeated)", i, r.RequestID)
		}
		rids[r.RequestID] = true
		if b := audit.Briefly(r); b.Kind != "DNS question" || b.What != w.name || b.Session != "s-1" ||
			b.Result != w.qtype+" "+w.rcode+" · "+w.answers+" answers" {
			t.Errorf("record %d reads %+v", i, b)
		}
	}
	refused := 0
	for _, r := range auditEvents(t, g) {
		if r.Event == "dns_refused" && r.Field("dest_host") == "evil.example" {
			refused++
		}
	}
	if refused != 1 {
		t.Errorf("%d dns_refused records for evil.example, want 1", refused)
	}

	// Another session of the same sandbox: its own first question.
	s2 := agentA
	s2.Session = "s-other"
	for range 3 {
		ask(t, s2, "www.allowed.test", mdns.TypeA)
	}
	ask(t, agentA, "www.allowed.test", mdns.TypeA)
	recs = dnsAnsweredRecords(t, g)
	if len(recs) != 4 || recs[3].Field("session") != "s-other" || recs[3].Field("dest_host") != "www.allowed.test" {
		t.Fatalf("after session s-other asked www.allowed.test 3 times: %d records, last %v", len(recs), recs[len(recs)-1].Fields)
	}
}

// TestDNSAnsweredFastPath: the stream's inline answerer (warm caches)
// records a session's first question of a name in a new window through the
// same function, with a request id of its own, and not its repeats.
func TestDNSAnsweredFastPath(t *testing.T) {
	addr, upstreamQueries := newCachingDNSUpstream(t, map[string]string{"a.allowed.test": "93.184.216.34"})
	g := startEgressGateway(t, &egresstest.DNSUpstream{Addr: addr}, nil)
	eg := g.newProxy()
	ctx := context.Background()
	raw := packQuestion(t, "a.allowed.test.", mdns.TypeA)
	// The full path fills the decision and address caches (and records
	// session s-1's first question).
	if m := new(mdns.Msg); m.Unpack((answerer{eg}).answer(ctx, "warm", agentA, raw)) != nil || m.Rcode != mdns.RcodeSuccess {
		t.Fatal("warm-up question not answered NOERROR")
	}
	if n := len(dnsAnsweredRecords(t, g)); n != 1 {
		t.Fatalf("%d dns_answered records after the warm-up, want 1", n)
	}
	// A new window: the decision and the addresses are still cached for
	// s-1 (decisions are per caller), but the name is new to the session.
	eg.subs.mu.Lock()
	delete(eg.subs.m, [2]string{agentA.Sandbox, "allowed.test"})
	eg.subs.mu.Unlock()
	before := upstreamQueries.Load()
	for i := range 20 {
		if _, ok := (answerer{eg}).answerFast(ctx, agentA, raw, nil, nil); !ok {
			t.Fatalf("question %d not answered inline", i)
		}
	}
	if n := upstreamQueries.Load() - before; n != 0 {
		t.Fatalf("the inline answerer asked upstream %d times", n)
	}
	recs := dnsAnsweredRecords(t, g)
	if len(recs) != 2 {
		t.Fatalf("%d dns_answered records, want 2 (the full path, then inline once in the new window)", len(recs))
	}
	r := recs[1]
	if r.Field("session") != "s-1" || r.RequestID == recs[0].RequestID || r.Field("dest_host") != "a.allowed.test" || r.Field("rcode") != "NOERROR" ||
		r.Field("answers") != "1" || r.Field("qtype") != "A" || r.RequestID == "" || r.Field("decision") != "allow" {
		t.Errorf("inline record %s %v", r.RequestID, r.Fields)
	}
}
