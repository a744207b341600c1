// Package holds keeps calls that policy answered "ask" until a person
// decides them, and executes an approved call exactly once.
//
// A hold stores the canonical request exactly as it would be sent (without
// credentials) and its SHA-256; approval is bound to that hash. Holds live
// in the gateway's store, so they survive a restart; an execution that was
// started but whose outcome was never recorded is shown to people as
// "outcome unknown" and never re-sent blindly: only a call whose operation
// is idempotency-keyed (it declares the Idempotency-Key header) is re-sent,
// once, with the same key, so that the upstream answers with the first
// reply instead of acting twice (THREATS G2). On a store several gateway
// replicas share, an execution is leased to the process sending it, and
// another replica does the same once that lease has passed without a
// renewal: a replica killed mid-send leaves its holds to the others, not
// to its own restart (THREATS G20; recover.go).
package holds

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"
)

// Status is a hold's state.
type Status string

const (
	Pending  Status = "pending"
	Approved Status = "approved"  // approved, execution not yet started
	Running  Status = "executing" // execution started; outcome not yet recorded
	Done     Status = "executed"  // executed; Result holds the upstream's answer
	Denied   Status = "denied"
	Expired  Status = "expired"
	Unknown  Status = "outcome_unknown" // the gateway stopped mid-execution
	Failed   Status = "failed"          // re-evaluated to block, or the upstream failed
)

// Request is the canonical upstream request, without credentials.
type Request struct {
	Method  string              `json:"method"`
	URL     string              `json:"url"`
	Headers map[string][]string `json:"headers"`
	Body    []byte              `json:"body,omitempty"`
}

// Caller is who the held call is for (from the relayed identity).
type Caller struct {
	Sandbox string `json:"sandbox"`
	Agent   string `json:"agent"`
	Session string `json:"session"`
	User    string `json:"user"`
	// Egress is the sandbox's egress narrowing (policy.Caller.Egress),
	// kept so that the hold's records carry it too.
	Egress string `json:"egress,omitempty"`
}

// Hold is one held call.
type Hold struct {
	ID             string    `json:"id"`
	Status         Status    `json:"status"`
	Tool           string    `json:"tool"`
	OpSummary      string    `json:"op_summary,omitempty"` // the operation's OpenAPI summary at hold time, for the approver
	Args           []byte    `json:"args"`                 // the canonical JSON arguments document
	Request        Request   `json:"request"`
	SHA256         string    `json:"sha256"`               // hex of the canonical request encoding
	Credential     string    `json:"credential,omitempty"` // the name of what the gateway attaches, never a value
	Caller         Caller    `json:"caller"`
	Approvers      []string  `json:"approvers"` // "alice", "group:finance"
	Rule           string    `json:"rule"`
	Reason         string    `json:"reason"`
	Created        time.Time `json:"created"`
	Expires        time.Time `json:"expires"`
	DecidedBy      string    `json:"decided_by,omitempty"`
	DecisionReason string    `json:"decision_reason,omitempty"`
	Decided        time.Time `json:"decided,omitempty"`
	Result         *Result   `json:"result,omitempty"`
	// RequestID is the agent's call that created the hold (audit correlation).
	RequestID string `json:"request_id"`
	// IdempotencyHeader is the Idempotency-Key header of the hold's
	// operation ("" if it declares none). Every send of the hold carries it:
	// the agent's own value if the request has one (it is part of what was
	// approved), else the hold's ID, which is stable and stored. Only such
	// a hold is re-sent after a crash left its outcome unknown.
	IdempotencyHeader string `json:"idempotency_header,omitempty"`
	// Deferred marks a hold the gateway only decides (an Envoy ext_authz
	// check: Envoy, not the gateway, sends the request). Approving it
	// sends nothing: it becomes Approved, and the same caller's next
	// request with the same hash is let through once (Release), after
	// which it is Done.
	Deferred bool `json:"deferred,omitempty"`
	// TraceParent is the W3C traceparent of the span that created the
	// hold ("" when tracing was off): its execution links to it.
	TraceParent string `json:"trace_parent,omitempty"`
	// Version is the stored hold's change count when it was read: a
	// decision applies only to the version its decider saw.
	Version int64 `json:"-"`
	// Recorded are fields the hold_created audit record carries beside
	// the hold's own: the decision's recorded input (audit.record_inputs).
	// Never stored with the hold.
	Recorded map[string]any `json:"-"`
}

// Terminal says whether the hold's state can no longer change.
func (s Status) Terminal() bool {
	switch s {
	case Done, Denied, Expired, Unknown, Failed:
		return true
	}
	return false
}

// Hash is the hex SHA-256 of the request's canonical encoding: JSON with the
// fields in declaration order, header names in sorted order (encoding/json
// sorts map keys) and the body in base64. Approval is bound to it.
func (r Request) Hash() string {
	data, err := json.Marshal(r)
	if err != nil {
		panic("holds: request not encodable: " + err.Error()) // a struct of strings and bytes always is
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Result is what the agent gets once an approved hold ran (bounded size).
type Result struct {
	HTTPStatus int    `json:"http_status"` // the status the agent's call answers with (200, 403, 502 …)
	Body       []byte `json:"body"`        // the JSON the agent's call answers with
	// Truncated says the upstream's answer was larger than the result bound
	// and Body is a refusal saying so, not the answer.
	Truncated bool `json:"truncated,omitempty"`
	// Answered says the upstream answered the send over HTTP (whatever its
	// status). Execute sets it; it is not stored. A re-send after a crash
	// that got no answer (never sent, network error, timeout) leaves the
	// outcome unknown.
	Answered bool `json:"-"`
	// Receipt is the signed receipt of the execution (gateway/receipts),
	// stored with the result it vouches for; absent when nothing was sent.
	Receipt json.RawMessage `json:"receipt,omitempty"`
}

// Person is an authenticated approver (never anything from the sandbox socket).
type Person struct {
	Name   string
	Groups []string
}

// Errors of the decision calls; the admin API maps them to statuses.
var (
	ErrNotFound     = errors.New("holds: no such hold")                                    // 404
	ErrSelfApproval = errors.New("holds: the person a call is made for cannot approve it") // 403 self_approval_forbidden
	ErrNotApprover  = errors.New("holds: not an approver of this hold")                    // 403 not_an_approver
	ErrConflict     = errors.New("holds: the hold is already decided")                     // 409
	ErrExpired      = errors.New("holds: the hold has expired")                            // 410 (UI) / approval_expired (agent)
	// ErrTooMany is returned by Create when the agent has too many pending holds (429 rate_limited).
	ErrTooMany = errors.New("holds: too many pending holds for this agent")
	// ErrTooManyForSandbox is returned by Create when the sandbox has
	// its share of its agent's pending holds (429 too_many_holds).
	ErrTooManyForSandbox = errors.New("holds: too many pending holds for this sandbox")
	// ErrAudit is returned (wrapped) by Create when the hold_created record
	// cannot be written: the hold is not kept (503 audit_unavailable).
	ErrAudit = errors.New("holds: the audit log cannot be written")
)

// Event tells subscribers that a hold changed (for the review UI's live queue).
type Event struct {
	Hold Hold
	Kind string // "created", "approved", "denied", "expired", "executed", "failed", "outcome_unknown"
}

// Filter selects holds for List.
type Filter struct {
	Status []Status // empty: all
	User   string   // only holds whose caller.user is this (the requester's own view)
	Limit  int      // 0: 100
}
