package holds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-gw/sluice/gateway/store"
)

// decide checks p against the hold and flips it from pending to `to`
// atomically; it returns the hold as it was and ErrConflict when another
// decision won.
func (m *Manager) decide(ctx context.Context, id string, p Person, reason string, to Status) (Hold, error) {
	return m.decideGrant(ctx, id, p, reason, to, nil, 0)
}

// decideGrant is decide that, when g is not nil, also stores g (filled in
// from the hold, lasting ttl) in the same transaction as the decision.
func (m *Manager) decideGrant(ctx context.Context, id string, p Person, reason string, to Status, g *Grant, ttl time.Duration) (Hold, error) {
	h, err := m.Get(ctx, id)
	if err != nil {
		return Hold{}, err
	}
	if err := m.CanApprove(h, p); err != nil {
		if errors.Is(err, ErrSelfApproval) {
			// Audited: a requester trying to decide their own call, under
			// any spelling of their name, is worth a record.
			_ = m.o.Audit(context.WithoutCancel(ctx), "hold_self_approval_refused", h, map[string]any{"by": p.Name})
		}
		return h, err
	}
	switch {
	case h.Status == Expired:
		return h, ErrExpired
	case h.Status != Pending:
		return h, ErrConflict
	}
	now := m.now().UTC()
	var ok bool
	// Conditional on the status and on the version read above: of any
	// number of deciders, on any number of gateways, one wins.
	dec := store.Decision{ID: id, Version: h.Version, To: string(to), By: p.Name, Reason: reason, Now: now}
	if to == Running {
		// Leased to this process while it sends (renewed by Run): if it
		// dies mid-send, another replica takes the hold over (THREATS G20).
		dec.Lease = m.o.Lease
	}
	if g != nil {
		// Bound to the hold's own key: this agent, this user, this tool,
		// exactly this request.
		g.Agent, g.User, g.Tool, g.SHA256, g.Hold = h.Caller.Agent, h.Caller.User, h.Tool, h.SHA256, h.ID
		g.Created, g.Expires = now, now.Add(ttl)
		d, merr := json.Marshal(grantDoc{ByGroups: g.ByGroups, Reason: g.Reason})
		if merr != nil {
			return h, fmt.Errorf("holds: decide: grant: %w", merr)
		}
		dec.Grant = &store.GrantRow{ID: g.ID, Agent: g.Agent,
			User: g.User, Tool: g.Tool, SHA256: g.SHA256, Hold: g.Hold, GrantedBy: g.By, Created: g.Created, Expires: g.Expires, Doc: d, MaxUses: g.MaxUses}
	}
	ok, err = m.o.Store.Decide(ctx, dec)
	if err != nil {
		return h, fmt.Errorf("holds: decide: %w", err)
	}
	if !ok {
		cur, gerr := m.Get(ctx, id)
		if gerr == nil && cur.Status == Expired {
			return cur, ErrExpired
		}
		return cur, ErrConflict
	}
	h.Status, h.DecidedBy, h.DecisionReason, h.Decided = to, p.Name, reason, now
	return h, nil
}

// Approve approves a pending hold for p and executes it, exactly once:
// the flip from pending to executing is one conditional UPDATE, so of
// concurrent approvals (or an approval racing a denial) one wins and the
// others get ErrConflict. It returns the hold after execution.
func (m *Manager) Approve(ctx context.Context, id string, p Person, reason string) (Hold, error) {
	return m.approve(ctx, id, p, reason, nil, 0)
}

func (m *Manager) approve(ctx context.Context, id string, p Person, reason string, g *Grant, ttl time.Duration) (Hold, error) {
	if cur, err := m.Get(ctx, id); err == nil && cur.Deferred {
		return m.approveDeferred(ctx, id, p, reason, g, ttl)
	}
	h, err := m.decideGrant(ctx, id, p, reason, Running, g, ttl)
	if err != nil {
		return h, err
	}
	if m.claim(h.ID) { // the lease keepLeases renews while this sends
		defer m.unclaim(h.ID)
	}
	// The decision is made; finish it even if the approver goes away.
	ctx = context.WithoutCancel(ctx)
	fields := map[string]any{"by": p.Name, "decision_reason": reason}
	if g != nil {
		fields["always"], fields["grant"], fields["grant_expires"] = true, g.ID, g.Expires.Format(time.RFC3339)
	}
	if err := m.o.Audit(ctx, "hold_approved", h, fields); err != nil {
		m.log.Error("holds: approval not audited; the hold is not executed", "hold", id, "err", err)
		if g != nil {
			// An unaudited grant must not stand.
			if derr := m.o.Store.DeleteGrant(ctx, g.ID); derr != nil {
				m.log.Error("holds: unaudited grant not deleted", "grant", g.ID, "err", derr)
			}
		}
		return m.finish(ctx, h, Failed, Result{HTTPStatus: 503, Body: refusalBody("audit_unavailable", "the audit log cannot be written; the approved call was not sent", h.RequestID)}, "failed", nil)
	}
	m.publish(h, "approved")
	res, ok := m.o.Execute(ctx, h)
	status, kind, res := m.outcome(h, res, ok)
	return m.finish(ctx, h, status, res, kind, nil)
}

// approveDeferred approves a hold the gateway only decides: nothing is
// sent; the hold is Approved until the caller's matching request takes it
// (Release). An approval that cannot be audited fails the hold.
func (m *Manager) approveDeferred(ctx context.Context, id string, p Person, reason string, g *Grant, ttl time.Duration) (Hold, error) {
	h, err := m.decideGrant(ctx, id, p, reason, Approved, g, ttl)
	if err != nil {
		return h, err
	}
	ctx = context.WithoutCancel(ctx)
	fields := map[string]any{"by": p.Name, "decision_reason": reason, "deferred": true}
	if g != nil {
		fields["always"], fields["grant"], fields["grant_expires"] = true, g.ID, g.Expires.Format(time.RFC3339)
	}
	if err := m.o.Audit(ctx, "hold_approved", h, fields); err != nil {
		m.log.Error("holds: approval not audited; the hold is not released", "hold", id, "err", err)
		if g != nil {
			if derr := m.o.Store.DeleteGrant(ctx, g.ID); derr != nil {
				m.log.Error("holds: unaudited grant not deleted", "grant", g.ID, "err", derr)
			}
		}
		res := Result{HTTPStatus: 503, Body: refusalBody("audit_unavailable", "the audit log cannot be written; the approved call is not let through", h.RequestID)}
		data, _ := json.Marshal(res)
		if _, ferr := m.o.Store.FinishHold(ctx, h.ID, string(Approved), string(Failed), data); ferr != nil {
			return h, fmt.Errorf("holds: record result: %w", ferr)
		}
		h.Status, h.Result = Failed, &res
		m.publish(h, "failed")
		return h, nil
	}
	m.publish(h, "approved")
	return h, nil
}

// FindApproved returns the caller's approved deferred hold for exactly
// this tool and request hash, if there is one not yet released.
func (m *Manager) FindApproved(ctx context.Context, c Caller, tool, sha string) (Hold, bool, error) {
	r, ok, err := m.o.Store.FindHold(ctx, c.Agent, c.Sandbox, c.Session, c.User, tool, sha, []string{string(Approved)})
	if err != nil || !ok {
		return Hold{}, false, err
	}
	h, err := fromRow(r)
	if err != nil || !h.Deferred {
		return Hold{}, false, err
	}
	return h, true, nil
}

// ExpireApproved ends an approved deferred hold whose request was not sent
// again before the hold expired (audited hold_expired): its approval no
// longer lets anything through, and the next identical request is held
// anew.
func (m *Manager) ExpireApproved(ctx context.Context, h Hold) error {
	ok, err := m.o.Store.FinishHold(ctx, h.ID, string(Approved), string(Expired), nil)
	if err != nil || !ok {
		return err
	}
	h.Status = Expired
	if err := m.o.Audit(context.WithoutCancel(ctx), "hold_expired", h, map[string]any{"approved_unused": true}); err != nil {
		m.log.Error("holds: expiry not audited", "hold", h.ID, "err", err)
	}
	m.publish(h, "expired")
	return nil
}

// Release lets an approved deferred hold's request through, exactly once:
// the flip from approved to executed is one conditional UPDATE, so of two
// matching requests at the same time one is released and the other is
// not (ok false). The release is audited (hold_released) before ok is
// returned; an unaudited release is not one.
func (m *Manager) Release(ctx context.Context, h Hold, requestID string) (bool, error) {
	if !h.Deferred {
		return false, errors.New("holds: bug(): release of a hold the gateway sends itself")
	}
	res := Result{HTTPStatus: 200, Body: []byte(`{"released":true,"request_id":` + strconv.Quote(requestID) + `}`)}
	data, err := json.Marshal(res)
	if err != nil {
		return false, fmt.Errorf("holds: release: %w", err)
	}
	ok, err := m.o.Store.FinishHold(ctx, h.ID, string(Approved), string(Done), data)
	if err != nil || !ok {
		return false, err
	}
	h.Status, h.Result = Done, &res
	if err := m.o.Audit(context.WithoutCancel(ctx), "hold_released", h, map[string]any{"released_request_id": requestID}); err != nil {
		return false, fmt.Errorf("holds: release: %w: %w", ErrAudit, err)
	}
	m.publish(h, "executed")
	return true, nil
}

// outcome is the status an execution's result gives the hold, with the
// result bounded to MaxResultBytes.
func (m *Manager) outcome(h Hold, res Result, ok bool) (Status, string, Result) {
	if len(res.Body) > m.o.MaxResultBytes {
		res = Result{HTTPStatus: 502, Truncated: true, Answered: res.Answered, Body: refusalBody("upstream_error",
			fmt.Sprintf("the approved call was sent, but its reply is larger than the %d bytes a hold keeps", m.o.MaxResultBytes), h.RequestID)}
	}
	if !ok {
		return Failed, "failed", res
	}
	return Done, "executed", res
}

// finish records an execution's outcome (hold_executed, with extra's
// fields too).
func (m *Manager) finish(ctx context.Context, h Hold, status Status, res Result, kind string, extra map[string]any) (Hold, error) {
	data, err := json.Marshal(res)
	if err != nil {
		return h, fmt.Errorf("holds: result: %w", err)
	}
	ok, err := m.o.Store.FinishHold(ctx, h.ID, string(Running), string(status), data)
	if err != nil {
		// The store lost the outcome; at the next start the hold shows
		// outcome_unknown, which is the truth.
		return h, fmt.Errorf("holds: record result: %w", err)
	}
	late := false
	if !ok {
		// No longer executing: this process's lease passed mid-send and
		// another replica took the hold over (THREATS G20). If it re-sent
		// and recorded the answer, that record stands; if it marked the
		// outcome unknown, this send's answer is the outcome, recorded late.
		if ok, err = m.o.Store.FinishHold(ctx, h.ID, string(Unknown), string(status), data); err != nil {
			return h, fmt.Errorf("holds: record result: %w", err)
		}
		if !ok {
			cur, err := m.get(ctx, h.ID)
			if err != nil {
				return h, fmt.Errorf("holds: record result: %w", err)
			}
			m.log.Warn("holds: the hold's outcome was recorded by the replica that took it over; this send's answer is not recorded again", "hold", h.ID, "status", cur.Status)
			return cur, nil
		}
		late = true
	}
	h.Status, h.Result = status, &res
	fields := map[string]any{"status": res.HTTPStatus, "outcome": string(status)}
	if late {
		fields["late"] = true // after hold_outcome_unknown by the replica that took it over
	}
	for k, v := range extra {
		fields[k] = v
	}
	if err := m.o.Audit(ctx, "hold_executed", h, fields); err != nil {
		m.log.Error("holds: execution not audited", "hold", h.ID, "err", err)
	}
	m.publish(h, kind)
	return h, nil
}

// Deny denies a pending hold for p with reason.
func (m *Manager) Deny(ctx context.Context, id string, p Person, reason string) (Hold, error) {
	h, err := m.decide(ctx, id, p, reason, Denied)
	if err != nil {
		return h, err
	}
	if err := m.o.Audit(context.WithoutCancel(ctx), "hold_denied", h, map[string]any{"by": p.Name, "decision_reason": reason}); err != nil {
		m.log.Error("holds: denial not audited", "hold", id, "err", err)
	}
	m.publish(h, "denied")
	return h, nil
}
