package call

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"
)

func keys(fs []Field) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Key
	}
	return out
}

// TestFields: every record's fields are in increasing key order with no
// key twice (what audit.Record.Sorted requires, or the line is not the
// one the map would give), and each kind writes exactly the keys its
// records carried before the two record types became one: a tool call's
// (toolcall.go's map) and raw egress's (proxy.go's auditFields).
func TestFields(t *testing.T) {
	full := func(k Kind) *Record {
		r := &Record{RequestID: "r1", Start: time.Now(), Kind: k, Transport: MCP, Sandbox: "sb", Agent: "a", Session: "s", User: "u",
			Tool: "t.x", Decision: Decision{Action: "allow", Rule: "policies[0]", Reason: "ok", Revision: "rev-7"}, Decided: true, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
			DestHost: "h.example", Port: 443, Credential: "header:X-Api-Key", Status: 200, UpstreamStatus: 201,
			UpstreamErr: "encoded_reply", Event: "sni_mismatch", Reflected: true}
		if k == KindToolCall {
			r.Port = 0 // a tool call has none
		}
		r.Egress = "pypi.org"
		r.SetResolvedIP("192.0.2.1")
		r.BytesUp.Store(3)
		r.BytesDown.Store(4)
		return r
	}
	cases := []struct {
		name  string
		rec   *Record
		event string
		code  refusal.Code
		want  string
	}{
		{"tool call decision", full(KindToolCall), EventDecision, "",
			"agent credential decision dest_host egress policy_revision reason resolved_ip rule sandbox session status tool trace_id transport upstream_error upstream_status user"},
		{"tool call result refused", full(KindToolCall), EventResult, refusal.UpstreamError,
			"agent code credential decision dest_host duration_ms egress policy_revision reason resolved_ip rule sandbox secret_reflected session status tool trace_id transport upstream_error upstream_status user"},
		{"tool call secret_reflected", full(KindToolCall), EventSecretReflected, "",
			"agent credential decision dest_host duration_ms egress policy_revision reason resolved_ip rule sandbox secret_reflected session status tool trace_id transport upstream_error upstream_status user"},
		{"tool call refused before anything", &Record{Kind: KindToolCall, Agent: "a", Sandbox: "sb"}, EventDecision, refusal.RateLimited,
			"agent code sandbox session tool user"},
		// Raw egress names its door only when it has one (Envoy's ext_authz).
		{"egress result", full(KindConnect), EventResult, "",
			"agent bytes_down bytes_up credential decision dest_host duration_ms egress kind policy_revision port reason resolved_ip rule sandbox session status trace_id transport upstream_error upstream_status user"},
		{"egress refused before policy", &Record{Kind: KindHTTP, Event: "doh_refused"}, EventDecision, refusal.EgressDenied,
			"agent code dest_host kind reason sandbox session user"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := keys(tc.rec.Fields(tc.event, tc.code))
			if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
				t.Errorf("keys %v are not strictly increasing", got)
			}
			if strings.Join(got, " ") != tc.want {
				t.Errorf("keys\n got %s\nwant %s", strings.Join(got, " "), tc.want)
			}
		})
	}
	// An egress record's reason is its pre-policy event only without a
	// decision; a tool call's never is.
	for _, f := range (&Record{Kind: KindHTTP, Event: "doh_refused"}).Fields(EventDecision, "") {
		if f.Key == KeyReason && f.Value != "doh_refused" {
			t.Errorf("egress reason %v, want doh_refused", f.Value)
		}
	}
}

// TestLine: the tool-call and egress lines carry their constant keys in
// a fixed order, the reason names the refusal and its cause (for the log
// only), and a 5xx refusal is a warning.
func TestLine(t *testing.T) {
	r := &Record{RequestID: "r1", Start: time.Now(), Kind: KindToolCall, Transport: HTTP, Decision: Decision{Action: "allow", Reason: "fine"}, Decided: true}
	e := refusal.New(503, refusal.AuditUnavailable, "agent text").Wrap(errors.New("disk full"))
	reason := r.Reason(e)
	if reason != "audit_unavailable: disk full" {
		t.Errorf("reason %q, want the code and the cause", reason)
	}
	msg, level, attrs := r.Line(e, reason)
	if msg != LineToolCall || level != slog.LevelWarn {
		t.Errorf("line %q at %v, want tool_call at WARN", msg, level)
	}
	var got []string
	for _, a := range attrs {
		got = append(got, a.Key)
	}
	want := "request_id decision reason rule agent session user sandbox tool transport dest_host resolved_ip status upstream_status duration_ms"
	if strings.Join(got, " ") != want {
		t.Errorf("tool_call keys\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if r.Reason(nil) != "fine" {
		t.Errorf("reason without refusal %q, want the decision's", r.Reason(nil))
	}
	r.Reflected = true
	if r.Reason(nil) != EventSecretReflected {
		t.Errorf("reason of a reflected reply %q, want secret_reflected", r.Reason(nil))
	}

	eg := &Record{Kind: KindConnect, Event: "sni_mismatch"}
	deny := refusal.New(403, refusal.EgressDenied, "no")
	msg, level, attrs = eg.Line(deny, eg.Reason(deny))
	got = got[:0]
	for _, a := range attrs {
		got = append(got, a.Key)
	}
	want = "request_id kind decision reason rule agent session user sandbox dest_host port resolved_ip status upstream_status bytes_up bytes_down duration_ms"
	if msg != LineEgress || level != slog.LevelInfo || strings.Join(got, " ") != want {
		t.Errorf("egress line %q at %v keys %s, want egress at INFO with %s", msg, level, strings.Join(got, " "), want)
	}
	if eg.Reason(deny) != "sni_mismatch" {
		t.Errorf("egress reason %q, want its event", eg.Reason(deny))
	}
}

// shape is a field type of the same shape declared elsewhere, as the
// audit log's is.
type shape struct {
	Key   string
	Value any
}

// TestAppendFields: a writer's own field type gets the same keys and
// values as Fields, appended after what it already holds.
func TestAppendFields(t *testing.T) {
	r := &Record{Kind: KindDNS, Agent: "a", DestHost: "h.example", Event: "doh_refused"}
	r.SetResolvedIP("192.0.2.1")
	want := r.Fields(EventDecision, refusal.EgressDenied)
	got := AppendFields([]shape{{"first", 1}}, r, EventDecision, refusal.EgressDenied)
	if len(got) != len(want)+1 || got[0] != (shape{"first", 1}) {
		t.Fatalf("got %v, want the first field then %v", got, want)
	}
	for i, f := range want {
		if got[i+1] != shape(f) {
			t.Errorf("field %d: got %v, want %v", i, got[i+1], f)
		}
	}
}
