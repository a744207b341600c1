package grants

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/policy"
)

// granted returns a holds manager over a real SQLite store holding one
// "always allow" grant (by bob) for alice's call through agent a, and the
// request it is bound to.
func granted(t *testing.T) (*holds.Manager, *store.Store, holds.Grant, holds.Request) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := holds.New(holds.Options{Store: st, Execute: func(context.Context, holds.Hold) (holds.Result, bool) {
		return holds.Result{HTTPStatus: 200}, true
	}})
	req := holds.Request{Method: "POST", URL: "http://127.0.0.1:9/refunds", Body: []byte(`{"amount":42}`)}
	h, _, err := m.Create(ctx, holds.Hold{Tool: "t.refund", Args: []byte(`{"body":{"amount":42}}`), Request: req,
		Caller:    holds.Caller{Sandbox: "sb", Agent: "a", Session: "s", User: "alice"},
		Approvers: []string{"bob"}, Rule: "policies[0]", Expires: time.Now().Add(time.Hour), RequestID: "r0"})
	if err != nil {
		t.Fatal(err)
	}
	_, g, err := m.ApproveAlways(ctx, h.ID, holds.Person{Name: "bob"}, "recurring", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return m, st, g, req
}

// recorder is the audit hook: the records Use wrote, or err.
type recorder struct {
	recs []audit.Record
	err  error
}

func (r *recorder) record(_ context.Context, rec audit.Record) error {
	if r.err != nil {
		return r.err
	}
	r.recs = append(r.recs, rec)
	return nil
}

func ask() policy.Decision {
	return policy.Decision{Action: policy.Ask, Rule: "policies[0]", Approvers: []string{"bob"}}
}

// TestUse is THREATS E7 at the package: the grant covers exactly its call
// (agent, user, tool, request hash) and turns ask into allow, audited
// "grant_used"; anything else is left as policy decided, unaudited.
func TestUse(t *testing.T) {
	m, _, g, req := granted(t)
	caller := policy.Caller{Sandbox: "sb", Agent: "a", Session: "s", User: "alice", Egress: "narrowed"}
	exact := func() (holds.Request, error) { return req, nil }

	var r recorder
	d, ok, e := Use(context.Background(), m, r.record, Call{RequestID: "r1", Caller: caller, Tool: "t.refund", Decision: ask(), Request: exact})
	if e != nil || !ok || d.Action != policy.Allow || d.Rule != "grant:"+g.ID {
		t.Fatalf("Use = %+v, %v, %v; want allow by grant:%s", d, ok, e, g.ID)
	}
	if len(r.recs) != 1 || r.recs[0].Event != "grant_used" || r.recs[0].RequestID != "r1" {
		t.Fatalf("records %+v, want one grant_used for r1", r.recs)
	}
	f := r.recs[0].Fields
	for k, want := range map[string]any{"grant": g.ID, "hold": g.Hold, "granted_by": "bob", "tool": "t.refund",
		"sha256": req.Hash(), "rule": "policies[0]", "agent": "a", "user": "alice", "egress": "narrowed"} {
		if f[k] != want {
			t.Errorf("grant_used %s = %v, want %v", k, f[k], want)
		}
	}

	other := req
	other.Body = []byte(`{"amount":4200}`)
	notCalled := func() (holds.Request, error) {
		t.Error("the request was asked for a call no grant may cover")
		return req, nil
	}
	for _, tc := range []struct {
		name string
		c    Call
	}{
		{"other arguments", Call{Caller: caller, Tool: "t.refund", Decision: ask(), Request: func() (holds.Request, error) { return other, nil }}},
		{"another user", Call{Caller: policy.Caller{Agent: "a", User: "dave"}, Tool: "t.refund", Decision: ask(), Request: exact}},
		{"another agent", Call{Caller: policy.Caller{Agent: "b", User: "alice"}, Tool: "t.refund", Decision: ask(), Request: exact}},
		{"another tool", Call{Caller: caller, Tool: "t.delete", Decision: ask(), Request: exact}},
		{"an approver list the granter is no longer on", Call{Caller: caller, Tool: "t.refund",
			Decision: policy.Decision{Action: policy.Ask, Approvers: []string{"carol"}}, Request: exact}},
		{"a block", Call{Caller: caller, Tool: "t.refund", Decision: policy.Decision{Action: policy.Block}, Request: notCalled}},
		{"an allow", Call{Caller: caller, Tool: "t.refund", Decision: policy.Decision{Action: policy.Allow}, Request: notCalled}},
		{"a re-send naming its hold", Call{Caller: caller, Tool: "t.refund", HoldID: g.Hold, Decision: ask(), Request: notCalled}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r recorder
			d, ok, e := Use(context.Background(), m, r.record, tc.c)
			if ok || e != nil || !reflect.DeepEqual(d, policy.Decision{}) || len(r.recs) != 0 {
				t.Fatalf("Use = %+v, %v, %v, records %v; want no grant and nothing audited", d, ok, e, r.recs)
			}
		})
	}
	t.Run("no holds manager", func(t *testing.T) {
		var r recorder
		if _, ok, e := Use(context.Background(), nil, r.record, Call{Caller: caller, Tool: "t.refund", Decision: ask(), Request: notCalled}); ok || e != nil {
			t.Fatalf("Use without a manager = %v, %v", ok, e)
		}
	})
}

// TestUseFailsClosed: when the grant's use cannot be audited, the call's
// request cannot be made canonical, or the store cannot be read, the call
// is refused 503 with the code that says why, never allowed.
func TestUseFailsClosed(t *testing.T) {
	m, st, _, req := granted(t)
	caller := policy.Caller{Agent: "a", User: "alice"}
	exact := func() (holds.Request, error) { return req, nil }
	check := func(t *testing.T, d policy.Decision, ok bool, e *refusal.Error, code refusal.Code) {
		t.Helper()
		if ok || d.Action == policy.Allow || e == nil || e.Status != 503 || e.Code != code {
			t.Fatalf("Use = %+v, %v, %v; want 503 %s", d, ok, e, code)
		}
	}

	r := recorder{err: errors.New("disk full")}
	d, ok, e := Use(context.Background(), m, r.record, Call{Caller: caller, Tool: "t.refund", Decision: ask(), Request: exact})
	check(t, d, ok, e, refusal.AuditUnavailable)

	r = recorder{}
	d, ok, e = Use(context.Background(), m, r.record, Call{Caller: caller, Tool: "t.refund", Decision: ask(),
		Request: func() (holds.Request, error) { return holds.Request{}, errors.New("no canonical form") }})
	check(t, d, ok, e, refusal.ApprovalUnavailable)

	st.Close()
	d, ok, e = Use(context.Background(), m, r.record, Call{Caller: caller, Tool: "t.refund", Decision: ask(), Request: exact})
	check(t, d, ok, e, refusal.ApprovalUnavailable) // closed, not unreachable (store.ErrUnavailable is store_unavailable)
	if len(r.recs) != 0 {
		t.Fatalf("a refused call was audited as a grant's use: %+v", r.recs)
	}
}
