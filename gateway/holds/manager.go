package holds

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/store"
)

// Options configures a Manager.
type Options struct {
	Store *store.Store
	// Execute runs an approved hold: it evaluates policy again, attaches the
	// credential and sends exactly h.Request, once (with h's idempotency
	// key, if its operation has one). Its Result is what the agent gets; ok
	// false marks the hold Failed (blocked on re-evaluation, upstream
	// unreachable) instead of Done. It sets Result.Answered when the
	// upstream answered over HTTP. Recovery re-sends an idempotency-keyed
	// hold through it too.
	Execute func(ctx context.Context, h Hold) (res Result, ok bool)
	// Audit appends an audit record for the hold; an error on "hold_created"
	// fails the hold.
	Audit func(ctx context.Context, event string, h Hold, fields map[string]any) error
	// Notify is called (in its own goroutine) for every new hold: the webhook.
	Notify func(h Hold)
	// MaxPendingPerAgent caps an agent's pending holds (default 100).
	MaxPendingPerAgent int
	// MaxPendingPerSandbox caps one sandbox's share of its agent's pending
	// holds, so that one sandbox's flood of asks leaves the others of the
	// same agent room (THREATS B9). Default: a quarter of
	// MaxPendingPerAgent, at least 1; never above it.
	MaxPendingPerSandbox int
	// MaxResultBytes bounds a stored result (default 1 MiB).
	MaxResultBytes int
	Logger         *slog.Logger
	Now            func() time.Time
}

// Manager owns the holds. Safe for concurrent use.
type Manager struct {
	o   Options
	now func() time.Time
	log *slog.Logger

	mu      sync.Mutex
	waiters map[string]chan struct{} // closed when the hold changes
	subs    map[chan Event]struct{}
	// reconcile is what Recover found to re-send (idempotency-keyed holds
	// left executing); Run starts the re-sends. inflight holds the IDs
	// being re-sent by this process: at most one re-send per hold at a time.
	reconcile []string
	inflight  map[string]struct{}
	// resyncs counts wakeAll calls (re-checks after a lost notification
	// connection), for tests.
	resyncs atomic.Int64
}

// New returns a Manager over o.Store.
func New(o Options) *Manager {
	if o.MaxPendingPerAgent <= 0 {
		o.MaxPendingPerAgent = 100
	}
	if o.MaxPendingPerSandbox <= 0 {
		o.MaxPendingPerSandbox = max(1, o.MaxPendingPerAgent/4)
	}
	o.MaxPendingPerSandbox = min(o.MaxPendingPerSandbox, o.MaxPendingPerAgent)
	if o.MaxResultBytes <= 0 {
		o.MaxResultBytes = 1 << 20
	}
	m := &Manager{o: o, now: o.Now, log: o.Logger, waiters: map[string]chan struct{}{}, subs: map[chan Event]struct{}{},
		inflight: map[string]struct{}{}}
	if m.now == nil {
		m.now = time.Now
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.o.Audit == nil {
		m.o.Audit = func(context.Context, string, Hold, map[string]any) error { return nil }
	}
	return m
}

// MaxPendingPerSandbox is the per-sandbox cap in force (its default
// resolved), for the refusal's message.
func (m *Manager) MaxPendingPerSandbox() int { return m.o.MaxPendingPerSandbox }

// doc is the immutable part of a hold, stored as JSON.
type doc struct {
	Tool       string   `json:"tool"`
	OpSummary  string   `json:"op_summary,omitempty"`
	Args       []byte   `json:"args"`
	Request    Request  `json:"request"`
	Credential string   `json:"credential,omitempty"`
	Caller     Caller   `json:"caller"`
	Approvers  []string `json:"approvers"`
	Rule       string   `json:"rule"`
	Reason     string   `json:"reason"`
	RequestID  string   `json:"request_id"`
	// IdempotencyHeader: absent in holds stored before it existed, which
	// are therefore never re-sent.
	IdempotencyHeader string `json:"idempotency_header,omitempty"`
	Deferred          bool   `json:"deferred,omitempty"`
	TraceParent       string `json:"trace_parent,omitempty"`
}

func fromRow(r store.HoldRow) (Hold, error) {
	var d doc
	if err := json.Unmarshal(r.Doc, &d); err != nil {
		return Hold{}, fmt.Errorf("holds: hold %s: stored document: %w", r.ID, err)
	}
	h := Hold{ID: r.ID, Status: Status(r.Status), Tool: d.Tool, OpSummary: d.OpSummary, Args: d.Args, Request: d.Request, SHA256: r.SHA256,
		Credential: d.Credential, Caller: d.Caller, Approvers: d.Approvers, Rule: d.Rule, Reason: d.Reason,
		Created: r.Created, Expires: r.Expires, DecidedBy: r.DecidedBy, DecisionReason: r.DecisionReason, Decided: r.Decided,
		RequestID: d.RequestID, IdempotencyHeader: d.IdempotencyHeader, Deferred: d.Deferred, TraceParent: d.TraceParent, Version: r.Version}
	if r.Result != nil {
		h.Result = &Result{}
		if err := json.Unmarshal(r.Result, h.Result); err != nil {
			return Hold{}, fmt.Errorf("holds: hold %s: stored result: %w", r.ID, err)
		}
	}
	return h, nil
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Create persists h as a new pending hold, unless this caller (the same
// agent, sandbox, session and user: a hold is never shared across
// sandboxes) already has a pending hold for the same tool and request
// hash: then that one is returned and created is false (a re-sent call is
// idempotent). The caller sets everything but ID, Status, SHA256 and
// Created; Expires must be set. A store failure is returned as is: the
// call must not be allowed.
func (m *Manager) Create(ctx context.Context, h Hold) (Hold, bool, error) {
	h.SHA256 = h.Request.Hash()
	st := m.o.Store
	c := h.Caller
	h.ID, h.Status, h.Created = newID(), Pending, m.now().UTC()
	d, err := json.Marshal(doc{Tool: h.Tool, OpSummary: h.OpSummary, Args: h.Args, Request: h.Request, Credential: h.Credential, Caller: c,
		Approvers: h.Approvers, Rule: h.Rule, Reason: h.Reason, RequestID: h.RequestID, IdempotencyHeader: h.IdempotencyHeader,
		Deferred: h.Deferred, TraceParent: h.TraceParent})
	if err != nil {
		return Hold{}, false, fmt.Errorf("holds: create: %w", err)
	}
	row, created, err := st.CreateHold(ctx, store.HoldRow{ID: h.ID, Status: string(Pending), Agent: c.Agent, Sandbox: c.Sandbox, Session: c.Session, User: c.User,
		Tool: h.Tool, SHA256: h.SHA256, Created: h.Created, Expires: h.Expires, Doc: d},
		store.HoldCaps{Statuses: []string{string(Pending), string(Running)}, Pending: string(Pending),
			PerAgent: m.o.MaxPendingPerAgent, PerSandbox: m.o.MaxPendingPerSandbox})
	switch {
	case errors.Is(err, store.ErrAgentCap):
		return Hold{}, false, ErrTooMany
	case errors.Is(err, store.ErrSandboxCap):
		return Hold{}, false, ErrTooManyForSandbox
	case err != nil:
		return Hold{}, false, fmt.Errorf("holds: create: %w", err)
	case !created:
		o, err := fromRow(row)
		return o, false, err
	}
	extra := map[string]any{"expires": h.Expires.Format(time.RFC3339)}
	for k, v := range h.Recorded {
		extra[k] = v
	}
	h.Recorded = nil
	if err := m.o.Audit(ctx, "hold_created", h, extra); err != nil {
		_, _ = st.FinishHold(context.WithoutCancel(ctx), h.ID, string(Pending), string(Failed), nil)
		return Hold{}, false, fmt.Errorf("holds: create: %w: %w", ErrAudit, err)
	}
	m.publish(h, "created")
	if m.o.Notify != nil {
		go m.o.Notify(h)
	}
	return h, true, nil
}

// Get returns one hold. A pending hold past its expiry is expired first.
func (m *Manager) Get(ctx context.Context, id string) (Hold, error) {
	r, err := m.o.Store.GetHold(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Hold{}, ErrNotFound
	}
	if err != nil {
		return Hold{}, fmt.Errorf("holds: get: %w", err)
	}
	h, err := fromRow(r)
	if err != nil {
		return Hold{}, err
	}
	if h.Status == Pending && !m.now().Before(h.Expires) {
		m.ExpireDue(ctx)
		return m.get(ctx, id)
	}
	return h, nil
}

func (m *Manager) get(ctx context.Context, id string) (Hold, error) {
	r, err := m.o.Store.GetHold(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Hold{}, ErrNotFound
	}
	if err != nil {
		return Hold{}, fmt.Errorf("holds: get: %w", err)
	}
	return fromRow(r)
}

// List returns holds, newest first.
func (m *Manager) List(ctx context.Context, f Filter) ([]Hold, error) {
	m.ExpireDue(ctx)
	q := store.HoldQuery{User: f.User, Limit: f.Limit}
	for _, s := range f.Status {
		q.Statuses = append(q.Statuses, string(s))
	}
	rows, err := m.o.Store.ListHolds(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("holds: list: %w", err)
	}
	out := make([]Hold, 0, len(rows))
	for _, r := range rows {
		h, err := fromRow(r)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// CanApprove says whether p may decide h: never the person the call is made
// for (ErrSelfApproval, whatever else p is), otherwise only a person the
// decision names, by name or as "group:G" (ErrNotApprover). Names and
// groups are compared in canonical form (package ident: case, Unicode
// normalisation), and a name that cannot be canonicalised is taken to be
// the requester's (self-approval) and no approver's.
func (m *Manager) CanApprove(h Hold, p Person) error {
	if p.Name == "" {
		return ErrNotApprover
	}
	if ident.Conflict(h.Caller.User, p.Name) {
		return ErrSelfApproval
	}
	for _, a := range h.Approvers {
		if g, ok := strings.CutPrefix(a, "group:"); ok {
			if g != "" && slices.ContainsFunc(p.Groups, func(pg string) bool { return ident.Same(g, pg) }) {
				return nil
			}
		} else if ident.Same(a, p.Name) {
			return nil
		}
	}
	return ErrNotApprover
}

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
	if _, err := m.o.Store.FinishHold(ctx, h.ID, string(Running), string(status), data); err != nil {
		// The store lost the outcome; at the next start the hold shows
		// outcome_unknown, which is the truth.
		return h, fmt.Errorf("holds: record result: %w", err)
	}
	h.Status, h.Result = status, &res
	fields := map[string]any{"status": res.HTTPStatus, "outcome": string(status)}
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

// Wait returns the hold once it is terminal (executed, denied, expired,
// failed, outcome unknown) or, for a deferred hold, approved (its request
// may then be released), or when ctx ends, whichever is first; then it
// returns the hold as it is and no error.
func (m *Manager) Wait(ctx context.Context, id string) (Hold, error) {
	// Reads are not cut short by ctx: when the wait ends the caller still
	// gets the hold's state.
	rctx := context.WithoutCancel(ctx)
	for {
		ch := m.waiter(id)
		h, err := m.Get(rctx, id)
		if err != nil || h.Status.Terminal() || (h.Deferred && h.Status == Approved) {
			return h, err
		}
		d := time.Hour
		if h.Status == Pending {
			d = h.Expires.Sub(m.now()) + time.Millisecond
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return m.Get(rctx, id)
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

func (m *Manager) waiter(id string) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch, ok := m.waiters[id]
	if !ok {
		ch = make(chan struct{})
		m.waiters[id] = ch
	}
	return ch
}

// Subscribe returns the stream of hold changes; it is closed when ctx
// ends. A subscriber that does not keep up misses events (never blocks
// the gateway) and should re-list.
func (m *Manager) Subscribe(ctx context.Context) <-chan Event {
	ch := make(chan Event, 64)
	m.mu.Lock()
	m.subs[ch] = struct{}{}
	m.mu.Unlock()
	go func() {
		<-ctx.Done()
		m.mu.Lock()
		delete(m.subs, ch)
		close(ch)
		m.mu.Unlock()
	}()
	return ch
}

// remoteChanged handles another replica's change to hold id: when
// something here waits on it or watches the queue, the hold is read and
// published as if changed here.
func (m *Manager) remoteChanged(ctx context.Context, id string) {
	m.mu.Lock()
	_, waiting := m.waiters[id]
	watched := len(m.subs) > 0
	m.mu.Unlock()
	if !waiting && !watched {
		return
	}
	h, err := m.get(ctx, id)
	if err != nil {
		m.wake(id) // the waiter reads it again itself
		return
	}
	m.publish(h, eventKind(h.Status))
}

// eventKind is the Event.Kind a hold in status st was last changed by.
func eventKind(st Status) string {
	switch st {
	case Pending:
		return "created"
	case Running:
		return "approved"
	}
	return string(st) // executed, denied, expired, failed, outcome_unknown
}

// wake releases whoever waits on id, without an event.
func (m *Manager) wake(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch, ok := m.waiters[id]; ok {
		close(ch)
		delete(m.waiters, id)
	}
}

// wakeAll releases every waiter: each reads its hold again. Called after
// the notification connection was lost, when changes may have been missed.
func (m *Manager) wakeAll() {
	m.resyncs.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, ch := range m.waiters {
		close(ch)
		delete(m.waiters, id)
	}
}

func (m *Manager) publish(h Hold, kind string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch, ok := m.waiters[h.ID]; ok {
		close(ch)
		delete(m.waiters, h.ID)
	}
	for s := range m.subs {
		select {
		case s <- Event{Hold: h, Kind: kind}:
		default:
		}
	}
}

// ExpireDue expires every pending hold past its expiry (audited
// "hold_expired"). Errors are logged: the next call tries again.
func (m *Manager) ExpireDue(ctx context.Context) {
	ids, err := m.o.Store.ExpireHolds(ctx, m.now().UTC())
	if err != nil {
		m.log.Warn("holds: expiry", "err", err)
		return
	}
	for _, id := range ids {
		h, err := m.get(ctx, id)
		if err != nil {
			continue
		}
		if err := m.o.Audit(ctx, "hold_expired", h, nil); err != nil {
			m.log.Error("holds: expiry not audited", "hold", id, "err", err)
		}
		m.publish(h, "expired")
	}
}

// Recover runs at startup, before anything is served. A hold that was
// executing when the gateway stopped may or may not have reached the
// upstream:
//   - if its operation is not idempotency-keyed it becomes outcome_unknown
//     (audited hold_outcome_unknown) for a person to look at, and is never
//     re-sent;
//   - if it is, it stays executing, is audited hold_reconciling, and Run
//     re-sends it once in the background with the same key (the upstream
//     answers a repeated key with its first reply and does not act twice);
//     see reconcileHold.
//
// Pending holds stay pending (or expire). Recover does not wait for any
// upstream.
func (m *Manager) Recover(ctx context.Context) error {
	rows, err := m.o.Store.ListHolds(ctx, store.HoldQuery{Statuses: []string{string(Running)}, Limit: maxRecover})
	if err != nil {
		return fmt.Errorf("holds: recover: %w", err)
	}
	var keyed []string
	for _, r := range rows {
		h, err := fromRow(r)
		if err != nil {
			return fmt.Errorf("holds: recover: %w", err)
		}
		if h.IdempotencyHeader != "" {
			from := "hold_id"
			if http.Header(h.Request.Headers).Get(h.IdempotencyHeader) != "" {
				from = "arguments"
			}
			// The header's name and where its value comes from; the value
			// itself is the hold's ID or the agent's (in the stored request).
			if err := m.o.Audit(ctx, "hold_reconciling", h, map[string]any{"idempotency_header": h.IdempotencyHeader, "idempotency_key_from": from}); err != nil {
				return fmt.Errorf("holds: recover: audit: %w", err)
			}
			m.log.Warn("holds: the gateway stopped while this approved call was being sent; it is idempotency-keyed and is re-sent once with the same key", "hold", h.ID)
			keyed = append(keyed, h.ID)
			continue
		}
		ok, err := m.o.Store.FinishHold(ctx, h.ID, string(Running), string(Unknown), nil)
		if err != nil {
			return fmt.Errorf("holds: recover: %w", err)
		}
		if !ok {
			continue // no longer executing: someone else recorded it
		}
		h.Status = Unknown
		if err := m.o.Audit(ctx, "hold_outcome_unknown", h, nil); err != nil {
			return fmt.Errorf("holds: recover: audit: %w", err)
		}
		m.log.Warn("holds: the gateway stopped while this approved call was being sent; its outcome is unknown and it is not re-sent", "hold", h.ID)
	}
	m.mu.Lock()
	m.reconcile = keyed
	m.mu.Unlock()
	m.ExpireDue(ctx)
	return nil
}

// maxRecover bounds the executing holds one Recover looks at (a crash
// leaves at most the calls that were in flight).
const maxRecover = 1 << 20

// Run re-sends what Recover left to reconcile (in the background), listens
// for hold changes made by other gateways on a shared store, and expires
// holds as they come due, until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	m.startReconcile(ctx)
	// A shared store: holds change on other replicas too. Their
	// notifications wake this replica's waiters and feed its live queue;
	// after a lost connection every waiter re-checks its hold.
	go m.o.Store.ListenHolds(ctx, func(id string) { m.remoteChanged(ctx, id) }, m.wakeAll)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.ExpireDue(ctx)
		}
	}
}

// startReconcile starts one goroutine per hold Recover queued and returns
// at once: the gateway serves while the re-sends wait for their upstreams.
func (m *Manager) startReconcile(ctx context.Context) {
	m.mu.Lock()
	ids := m.reconcile
	m.reconcile = nil
	m.mu.Unlock()
	// Like an approval: once started, a re-send is finished (recorded)
	// even if the gateway is shutting down; the upstream timeout bounds it.
	ctx = context.WithoutCancel(ctx)
	for _, id := range ids {
		if !m.claim(id) {
			continue
		}
		go func() {
			defer m.unclaim(id)
			m.reconcileHold(ctx, id)
		}()
	}
}

// claim marks id as being re-sent by this process; false if it already is.
//
// This makes a re-send unique per hold per process only. Another process
// (the gateway restarted again while a re-send was in flight: the hold is
// still executing, so the next start re-sends it too) may send it again,
// possibly while the old connection is still open at the upstream; that
// is harmless because every send carries the same idempotency key, and
// the upstream answers a repeated key with its first reply.
func (m *Manager) claim(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, busy := m.inflight[id]; busy {
		return false
	}
	m.inflight[id] = struct{}{}
	return true
}

func (m *Manager) unclaim(id string) {
	m.mu.Lock()
	delete(m.inflight, id)
	m.mu.Unlock()
}

// reconcileHold re-sends one idempotency-keyed hold that a crash left
// executing, through Execute (policy evaluated again, credential attached,
// the same key), once. An HTTP answer finishes it like an approval's
// execution (hold_executed, reconciled=true); no answer (not sent because
// policy, session or credential now refuse it, network error, timeout)
// makes it outcome_unknown, audited: the first send may have been applied,
// so only a person can tell. It is never retried in a loop.
func (m *Manager) reconcileHold(ctx context.Context, id string) {
	h, err := m.get(ctx, id)
	if err != nil {
		m.log.Error("holds: reconcile: the hold cannot be read; it stays executing until the next start", "hold", id, "err", err)
		return
	}
	if h.Status != Running || h.IdempotencyHeader == "" {
		return // recorded meanwhile (or never re-sendable)
	}
	res, ok := m.o.Execute(ctx, h)
	if !res.Answered {
		if _, err := m.unknown(ctx, h, map[string]any{"reconciled": true, "reason": "the re-send got no answer from the upstream"}); err != nil {
			m.log.Error("holds: reconcile", "hold", id, "err", err)
		}
		return
	}
	status, kind, res := m.outcome(h, res, ok)
	if _, err := m.finish(ctx, h, status, res, kind, map[string]any{"reconciled": true}); err != nil {
		m.log.Error("holds: reconcile", "hold", id, "err", err)
	}
}

// unknown moves an executing hold to outcome_unknown (audited
// hold_outcome_unknown with fields).
func (m *Manager) unknown(ctx context.Context, h Hold, fields map[string]any) (Hold, error) {
	ok, err := m.o.Store.FinishHold(ctx, h.ID, string(Running), string(Unknown), nil)
	if err != nil {
		return h, fmt.Errorf("holds: record outcome unknown: %w", err)
	}
	if !ok {
		return h, nil
	}
	h.Status = Unknown
	if err := m.o.Audit(ctx, "hold_outcome_unknown", h, fields); err != nil {
		m.log.Error("holds: outcome unknown not audited", "hold", h.ID, "err", err)
	}
	m.log.Warn("holds: the re-sent approved call got no answer; its outcome is unknown and it is not sent again", "hold", h.ID)
	m.publish(h, "outcome_unknown")
	return h, nil
}

// refusalBody is the JSON of a refusal as the agent sees it.
func refusalBody(code, msg, rid string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": msg, "request_id": rid}})
	return b
}
