package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/storecheck"
	"github.com/sluice-gw/sluice/policy"
)

// useGrant is asked for every ask decision before it is held: it reports
// whether an approver's "always allow" grant covers exactly this call
// (THREATS E7): the same agent, the same user, the same tool and the same
// canonical request hash (holds.Request.Hash, taken before the credential
// is attached), unexpired and unrevoked, granted by someone the current
// decision would still let approve. Then the use is audited "grant_used"
// and c's decision becomes allow with rule "grant:ID", so the decision
// record names the grant. Any other arguments, user or agent asks again.
// A block is never turned into anything: only ask comes here.
//
// A re-send that names its hold (Sluice-Hold) is never granted: it must
// get its hold's answer, not a second execution.
func useGrant(ctx context.Context, hm *holds.Manager, l auditLog, c *toolCall, tool *connectors.Tool, req *http.Request) (bool, *refusal.Error) {
	if hm == nil || c.req.HoldID != "" || c.decision.Action != policy.Ask {
		return false, nil
	}
	hr, err := c.holdRequest(req)
	if err != nil {
		e := refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the call could not be checked for a standing approval; it was not sent").Wrap(err)
		return false, e
	}
	key := holds.GrantKey{Agent: c.rec.Agent, User: c.rec.User, Tool: tool.Name, SHA256: hr.Hash()}
	g, ok, err := hm.MatchGrant(ctx, key, c.decision.Approvers)
	if e := storecheck.Refusal(err); e != nil {
		return false, e
	}
	if err != nil {
		// Fail closed: an unreadable store allows nothing.
		e := refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "standing approvals cannot be read; the call was not sent").Wrap(err)
		return false, e
	}
	if !ok {
		return false, nil
	}
	f := map[string]any{
		"grant": g.ID, "hold": g.Hold, "granted_by": g.By, "grant_expires": g.Expires.Format(time.RFC3339),
		"tool": tool.Name, "sha256": key.SHA256, "rule": c.decision.Rule,
		"sandbox": c.rec.Sandbox, "agent": c.rec.Agent, "session": c.rec.Session, "user": c.rec.User,
	}
	if c.rec.Egress != "" {
		f["egress"] = c.rec.Egress
	}
	if _, err := l.append(ctx, audit.Record{RequestID: c.rec.RequestID, Event: "grant_used", Fields: f}, false); err != nil {
		e := refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; no call is served until it can").Wrap(err)
		return false, e
	}
	c.decide(policy.Decision{Action: policy.Allow, Rule: "grant:" + g.ID,
		Reason: "always allowed by " + g.By + " (grant " + g.ID + " from hold " + g.Hold + "; policy " + c.decision.Rule + " asked)"})
	return true, nil
}
