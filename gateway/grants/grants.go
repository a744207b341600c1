// Package grants applies an approver's standing "always allow" grant
// (holds.Grant, THREATS E7) to a tool call that policy asked about: the
// grant that covers exactly this call is audited as used, and the call's
// decision becomes allow. It reads grants through the holds manager and
// writes its record through the hook the gateway hands it; it never
// changes a block, and it never grants a re-send that names its hold.
package grants

import (
	"context"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/storecheck"
	"github.com/sluice-gw/sluice/policy"
)

// Call is what a grant is matched against: one tool call after its
// decision, before it is held.
type Call struct {
	RequestID string
	Caller    policy.Caller // the call's canonical identity (agent, user, … as audited)
	Tool      string        // the tool's name (not an alias)
	HoldID    string        // the hold a re-send names (Sluice-Hold), else ""
	Decision  policy.Decision
	// Request is the canonical request a grant is bound to (holds.Request,
	// before the credential is attached); asked only for an ask.
	Request func() (holds.Request, error)
}

// Use is asked for every ask decision before it is held: it reports
// whether an approver's "always allow" grant covers exactly this call
// (THREATS E7): the same agent, the same user, the same tool and the same
// canonical request hash (holds.Request.Hash, taken before the credential
// is attached), unexpired and unrevoked, granted by someone the current
// decision would still let approve. Then the use is audited "grant_used"
// (through record) and Use returns the decision that replaces c's: allow
// with rule "grant:ID", so the decision record names the grant. Any other
// arguments, user or agent asks again. A block is never turned into
// anything: only ask is looked at.
//
// A re-send that names its hold (Sluice-Hold) is never granted: it must
// get its hold's answer, not a second execution.
func Use(ctx context.Context, hm *holds.Manager, record func(context.Context, audit.Record) error, c Call) (policy.Decision, bool, *refusal.Error) {
	if hm == nil || c.HoldID != "" || c.Decision.Action != policy.Ask {
		return policy.Decision{}, false, nil
	}
	hr, err := c.Request()
	if err != nil {
		e := refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the call could not be checked for a standing approval; it was not sent").Wrap(err)
		return policy.Decision{}, false, e
	}
	key := holds.GrantKey{Agent: c.Caller.Agent, User: c.Caller.User, Tool: c.Tool, SHA256: hr.Hash()}
	g, ok, err := hm.MatchGrant(ctx, key, c.Decision.Approvers)
	if e := storecheck.Refusal(err); e != nil {
		return policy.Decision{}, false, e
	}
	if err != nil {
		// Fail closed: an unreadable store allows nothing.
		e := refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "standing approvals cannot be read; the call was not sent").Wrap(err)
		return policy.Decision{}, false, e
	}
	if !ok {
		return policy.Decision{}, false, nil
	}
	f := map[string]any{
		"grant": g.ID, "hold": g.Hold, "granted_by": g.By, "grant_expires": g.Expires.Format(time.RFC3339),
		"tool": c.Tool, "sha256": key.SHA256, "rule": c.Decision.Rule,
		"sandbox": c.Caller.Sandbox, "agent": c.Caller.Agent, "session": c.Caller.Session, "user": c.Caller.User,
	}
	if c.Caller.Egress != "" {
		f["egress"] = c.Caller.Egress
	}
	if err := record(ctx, audit.Record{RequestID: c.RequestID, Event: "grant_used", Fields: f}); err != nil {
		e := refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; no call is served until it can").Wrap(err)
		return policy.Decision{}, false, e
	}
	return policy.Decision{Action: policy.Allow, Rule: "grant:" + g.ID,
		Reason: "always allowed by " + g.By + " (grant " + g.ID + " from hold " + g.Hold + "; policy " + c.Decision.Rule + " asked)"}, true, nil
}
