package policylife

import (
	"encoding/json"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/policy/decisionlog"
)

// The decision-log export is fed from the audit records of decisions,
// the one place every decision of every entrance passes (the root's auditLog.append):
// a tool call's decision record (HTTP, MCP or Envoy's door), an ask's
// hold_created record, raw egress's decision records (forward proxy,
// CONNECT, interception, DNS) whether the decision was made or served
// from the one-second decision cache. So each decision is exported
// once, as it was recorded, and only once it is in the audit log (the
// record of truth). The engine's evaluations for GET /v1/tools, which
// only hide tools policy blocks whatever the arguments, are not
// decisions of anything sent and are not exported.

// eventHoldCreated is the record that stands for an ask's decision.
const eventHoldCreated = "hold_created"

// DecisionExport is what queues the decision a record states, written at
// time at, for l's decision-log export (nil without decision_logs). It
// never blocks (decisionlog.Exporter.Log). engine is the policy in force
// (a hold_created record does not name its revision); bundle says the
// policy comes from a bundle.
func (l *Life) DecisionExport(engine func() *policy.Engine, bundle bool) func(rec audit.Record, at time.Time) {
	x := l.decisions
	if x == nil {
		return nil
	}
	return func(rec audit.Record, at time.Time) { exportDecision(x, l, engine, bundle, rec, at) }
}

func exportDecision(x *decisionlog.Exporter, life *Life, engine func() *policy.Engine, bundle bool, rec audit.Record, at time.Time) {
	if rec.Event != call.EventDecision && rec.Event != eventHoldCreated {
		return
	}
	get := func(k string) any {
		if rec.Fields != nil {
			return rec.Fields[k]
		}
		for _, f := range rec.Sorted {
			if f.Key == k {
				return f.Value
			}
		}
		return nil
	}
	str := func(k string) string { v, _ := get(k).(string); return v }
	action := str(call.KeyDecision)
	if action == "" {
		return // refused before any decision (unknown tool, not granted …)
	}
	result := map[string]any{"action": action, "rule": str(call.KeyRule), "reason": str(call.KeyReason)}
	if a, ok := get("approvers").([]string); ok && len(a) > 0 {
		result["approvers"] = a
	}
	rev := str(call.KeyPolicyRevision)
	if rev == "" {
		rev = engine().Revision() // a hold_created record does not name it
	}
	if rev != "" {
		result["revision"] = rev
	}
	entrance := str(call.KeyKind)
	if entrance == "" {
		entrance = string(call.KindToolCall)
		if t := str(call.KeyTransport); t != "" {
			entrance += "/" + t
		}
	}
	ev := decisionlog.Event{DecisionID: decisionlog.NewDecisionID(), Path: DecisionLogPath, Result: result,
		Revision: rev, Timestamp: at.UTC(), RequestID: rec.RequestID, Labels: life.EntranceLabels(entrance)}
	if in, ok := get(call.KeyInput).(call.EncodedJSON); ok {
		ev.Input = json.RawMessage(in) // exactly what was decided and recorded (audit.record_inputs)
	}
	if bundle {
		ev.Bundles = map[string]decisionlog.Bundle{"sluice": {Revision: rev}}
	}
	x.Log(ev)
}
