package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// recordsOf returns the audit records of request rid.
func recordsOf(t *testing.T, g *testGateway, rid string) []audit.Record {
	t.Helper()
	var out []audit.Record
	for _, r := range auditEvents(t, g) {
		if r.RequestID == rid {
			out = append(out, r)
		}
	}
	return out
}

// TestCallDecideOnly: in decide mode (the ext_authz door) an allowed call
// ends with the credential headers to attach, the gateway sends nothing,
// and the decision is in the audit log (transport envoy) before the
// outcome returns; a refusal attaches nothing.
func TestCallDecideOnly(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	ctx := context.Background()

	t.Run("tool and arguments", func(t *testing.T) {
		before := up.requests.Load()
		o := g.Call(ctx, call.Request{Identity: agentA, Tool: "tickets.list_tickets", Args: json.RawMessage(`{"query":{"limit":5}}`), Transport: call.Envoy, Mode: call.Decide})
		if o.Refusal != nil || o.Status != 200 || o.Reply != nil {
			t.Fatalf("outcome %+v, refusal %v; want 200 with headers to attach and no reply", o, o.Refusal)
		}
		if got := o.Attach.Get("X-Api-Key"); got != testSecret {
			t.Fatalf("attach X-Api-Key %q, want the connector's credential", got)
		}
		if o.Decision != "allow" || o.Rule != "policies[0]" {
			t.Errorf("decision %q rule %q, want allow by policies[0]", o.Decision, o.Rule)
		}
		if n := up.requests.Load() - before; n != 0 {
			t.Fatalf("the gateway sent %d requests in decide mode, want 0", n)
		}
		recs := recordsOf(t, g, o.RequestID)
		if len(recs) != 1 || recs[0].Event != call.EventDecision {
			t.Fatalf("audit records %+v, want exactly one decision record", recs)
		}
		f := recs[0].Fields
		if f["transport"] != "envoy" || f["decision"] != "allow" || f["credential"] != "header:X-Api-Key" || f["status"] != float64(200) {
			t.Errorf("decision record fields %v, want transport envoy, allow, credential header:X-Api-Key, status 200", f)
		}
	})

	t.Run("formed request", func(t *testing.T) {
		hr, _ := http.NewRequest("GET", up.URL+"/tickets/t-7", nil)
		hr.Header.Set("X-Request-Id", "envoy-1")
		o := g.Call(ctx, call.Request{Identity: agentA, Tool: "tickets.get_ticket", HTTP: hr, Transport: call.Envoy, Mode: call.Decide})
		if o.Refusal != nil || o.Attach.Get("X-Api-Key") != testSecret {
			t.Fatalf("outcome %+v, refusal %v; want the credential to attach", o, o.Refusal)
		}
		if _, ok := o.Attach["X-Request-Id"]; ok || hr.Header.Get("X-Api-Key") != "" {
			t.Errorf("attach %v carries a header the sender already had, or the door's request was changed", o.Attach)
		}
	})

	refusals := []struct {
		name string
		req  call.Request
		code refusal.Code
	}{
		{"formed request for another host", call.Request{Tool: "tickets.get_ticket", HTTP: mustRequest(t, "GET", "http://192.0.2.1/tickets/t-7")}, refusal.SchemaViolation},
		{"formed request with another method", call.Request{Tool: "tickets.get_ticket", HTTP: mustRequest(t, "DELETE", up.URL+"/tickets/t-7")}, refusal.SchemaViolation},
		{"formed request for another path", call.Request{Tool: "tickets.get_ticket", HTTP: mustRequest(t, "GET", up.URL+"/tickets/t-7/x")}, refusal.SchemaViolation},
		{"blocked tool", call.Request{Tool: "tickets.delete_ticket", Args: json.RawMessage(`{"path":{"id":"t-7"}}`)}, refusal.PolicyBlock},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.req
			r.Identity, r.Transport, r.Mode = agentA, call.Envoy, call.Decide
			o := g.Call(ctx, r)
			if o.Refusal == nil || o.Refusal.Code != tc.code || o.Attach != nil {
				t.Fatalf("outcome %+v refusal %v, want %s and nothing to attach", o, o.Refusal, tc.code)
			}
			recs := recordsOf(t, g, o.RequestID)
			if len(recs) != 1 || recs[0].Fields["code"] != string(tc.code) {
				t.Fatalf("audit records %+v, want one record with code %s", recs, tc.code)
			}
		})
	}
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCallIdentity (THREATS D17): identity is checked and canonicalised in
// the one pipeline, not only by the socket's listener, so a door that
// hands over a raw identity cannot reach an ended session by spelling it
// differently, nor call with an ambiguous or missing name. Each refusal is
// audited with its code and nothing is sent.
func TestCallIdentity(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	ctx := context.Background()
	args := json.RawMessage(`{"query":{"limit":5}}`)

	o := g.Call(ctx, call.Request{Identity: wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "S-1", User: "ALICE"}, Tool: "tickets.list_tickets", Args: args, Transport: call.MCP})
	if o.Refusal != nil || o.Reply == nil {
		t.Fatalf("outcome %+v refusal %v, want the reply", o, o.Refusal)
	}
	recs := recordsOf(t, g, o.RequestID)
	if len(recs) == 0 || recs[0].Fields["user"] != "alice" || recs[0].Fields["session"] != "s-1" || recs[0].Fields["transport"] != "mcp" {
		t.Fatalf("records %+v, want the canonical user alice and session s-1, transport mcp", recs)
	}

	if _, _, err := g.store.EndSession(ctx, "s-9", "test", time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		id   wire.Identity
		code refusal.Code
		why  string // in the agent's message
	}{
		{"ended session spelt in capitals", wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "S-9", User: "alice"}, refusal.SessionEnded, "has ended"},
		{"ended session in full-width letters", wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "Ｓ-9", User: "alice"}, refusal.SessionEnded, "has ended"},
		{"user mixing Latin and Cyrillic", wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "\u0430lice"}, refusal.IdentityRequired, "user is ambiguous"},
		{"user with a zero-width joiner", wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "al\u200dice"}, refusal.IdentityRequired, "field user contains non-printable character U+200D"},
		{"no identity at all", wire.Identity{}, refusal.IdentityRequired, "field sandbox is required"},
		// The approver of calls held until docs is connected is
		// "connection:docs": no person is named so (issue 25).
		{"user named as a connection approver", wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "Connection:docs"}, refusal.IdentityRequired, "may not begin with \"connection:\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := up.requests.Load()
			o := g.Call(ctx, call.Request{Identity: tc.id, Tool: "tickets.list_tickets", Args: args, Transport: call.MCP})
			if o.Refusal == nil || o.Refusal.Code != tc.code || o.Status != http.StatusForbidden || !strings.Contains(o.Refusal.Message, tc.why) {
				t.Fatalf("outcome %+v refusal %v, want 403 %s saying %q", o, o.Refusal, tc.code, tc.why)
			}
			if n := up.requests.Load() - before; n != 0 {
				t.Fatalf("%d requests reached the upstream, want 0", n)
			}
			recs := recordsOf(t, g, o.RequestID)
			if len(recs) != 1 || recs[0].Event != call.EventDecision || recs[0].Fields["code"] != string(tc.code) {
				t.Fatalf("audit records %+v, want one decision record with code %s", recs, tc.code)
			}
		})
	}
}

// TestCallHoldProgress: an ask through a door that waits with progress
// (the MCP door) reports the hold at once and while it waits, ends as the
// pending hold after its bound, and once approved is executed through the
// same pipeline: Poll answers with the stored reply, and the execution's
// records carry the hold's request ID and no transport.
func TestCallHoldProgress(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	ctx := context.Background()

	var mu sync.Mutex
	var reports []call.Progress
	start := time.Now()
	o := g.Call(ctx, call.Request{
		Identity: agentA, Tool: "tickets.create_refund", Args: json.RawMessage(`{"body":{"amount":12}}`), Transport: call.MCP,
		HoldWait: 350 * time.Millisecond, ProgressEvery: 100 * time.Millisecond,
		Progress: func(p call.Progress) { mu.Lock(); reports = append(reports, p); mu.Unlock() },
	})
	took := time.Since(start)
	if o.Refusal != nil || o.Status != http.StatusAccepted || o.Hold == nil || o.Hold.State != "pending" || o.Decision != "ask" {
		t.Fatalf("outcome %+v refusal %v, want 202 with the pending hold", o, o.Refusal)
	}
	if took < 300*time.Millisecond {
		t.Errorf("returned after %v, want about the 350ms hold wait", took)
	}
	mu.Lock()
	if len(reports) < 3 || reports[0].Waited != 0 || reports[0].Hold != o.Hold.ID || reports[len(reports)-1].Waited <= 0 || reports[0].Bound != 350*time.Millisecond {
		t.Errorf("progress %+v, want a report at once naming hold %s and more while waiting", reports, o.Hold.ID)
	}
	mu.Unlock()

	before := up.requests.Load()
	if r := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+o.Hold.ID+"/approve", `{"reason":"ok"}`); r.status != 200 {
		t.Fatalf("approve: %d %s", r.status, r.raw)
	}
	p := g.Poll(ctx, agentA, o.Hold.ID, 5*time.Second)
	if p.Answer == nil || p.Status != 200 || p.Hold == nil || p.Hold.State != "executed" {
		t.Fatalf("poll %+v, want the stored 200 answer of the executed hold", p)
	}
	if n := up.requests.Load() - before; n != 1 {
		t.Fatalf("%d upstream requests after approval, want 1", n)
	}
	var stored struct {
		Status    int    `json:"status"`
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(p.Answer, &stored); err != nil || stored.RequestID != o.RequestID {
		t.Fatalf("stored answer %s (%v), want the call's request ID %s", p.Answer, err, o.RequestID)
	}
	var events []string
	for _, r := range recordsOf(t, g, o.RequestID) {
		events = append(events, r.Event)
		if (r.Event == call.EventDecision || r.Event == call.EventResult) && r.Fields["transport"] != nil {
			t.Errorf("execution record %s names transport %v, want none (it came from an approval)", r.Event, r.Fields["transport"])
		}
	}
	if s := strings.Join(events, ","); !strings.Contains(s, "hold_created") || !strings.Contains(s, "hold_approved,decision,result") {
		t.Errorf("events %s, want the hold's records then the execution's decision and result", s)
	}

	// Someone else's poll finds nothing.
	other := agentA
	other.User = "bob"
	if q := g.Poll(ctx, other, o.Hold.ID, 0); q.Refusal == nil || q.Refusal.Code != refusal.NotFound {
		t.Errorf("another user's poll %+v, want not_found", q)
	}
}
