package holds

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
	// Lease is how long an executing hold stays leased to this process
	// without a renewal (default DefaultLease). On a shared store another
	// replica takes over a hold whose lease has passed: a replica killed
	// mid-send leaves its holds to the others after at most this long.
	Lease  time.Duration
	Logger *slog.Logger
	Now    func() time.Time
}

// DefaultLease is Options.Lease's default.
const DefaultLease = 15 * time.Second

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
	// being sent by this process (claim): at most one send per hold at a
	// time, and the leases keepLeases renews.
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
	if o.Lease <= 0 {
		o.Lease = DefaultLease
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
