// Package refusal is what a sandbox or admin request ends in when it is
// refused: a stable code, a message written for the agent on purpose, and
// the request ID that also appears in the log line (like caddy's
// HandlerError.ID and tailscale's vizerror). The cause of a refusal is kept
// apart from its message: it goes to the log only and never reaches the
// agent, because it may carry a raw Vault error or an upstream body.
//
// The package imports only the standard library, so that every entrance
// (the sandbox socket, raw egress, the tool call, the admin API) can share
// it without importing each other.
package refusal

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Code is a stable refusal code; agents and tests rely on these strings.
type Code string

// String returns the code as it is sent.
func (c Code) String() string { return string(c) }

// The refusal codes of the sandbox-side and admin APIs (README: "Error
// codes").
const (
	PolicyBlock           Code = "policy_block"
	NotGranted            Code = "not_granted"
	UnknownTool           Code = "unknown_tool"
	SchemaViolation       Code = "schema_violation"
	ApprovalDenied        Code = "approval_denied"
	ApprovalExpired       Code = "approval_expired"
	ArgsMismatch          Code = "args_mismatch"
	EgressDenied          Code = "egress_denied"
	CredentialUnavailable Code = "credential_unavailable"
	AuditUnavailable      Code = "audit_unavailable"
	ApprovalUnavailable   Code = "approval_unavailable"
	UpstreamError         Code = "upstream_error"
	RateLimited           Code = "rate_limited"
	// ConnectionRequired is a call to a connector that acts with a
	// person's own OAuth account (credential.oauth2, authorization_code)
	// for a person who has not connected it, or whose connection the
	// provider stopped honouring (403). The message names the review UI's
	// Connections page, for the agent to show its user.
	ConnectionRequired Code = "connection_required"
	// TooManyHolds is a sandbox with its share of its agent's pending
	// holds (gateway.max_pending_holds_per_sandbox) asking again (429).
	TooManyHolds Code = "too_many_holds"
	// UnknownAgent is an identity whose agent is not in agents[] asking
	// for its tools (403): refused rather than answered with an empty
	// list, so a misnamed agent shows at once.
	UnknownAgent Code = "unknown_agent"
	// EgressNotGranted is an identity whose egress narrowing (sandboxd
	// --egress) names a host outside its agent's allowlist asking for its
	// tools (403): a narrowing never widens.
	EgressNotGranted Code = "egress_not_granted"
	// SessionEnded is a call from a session an operator ended (403).
	SessionEnded Code = "session_ended"
	// SessionUnavailable is a call whose session state cannot be read
	// (503): fail closed.
	SessionUnavailable Code = "session_unavailable"
	// StoreUnavailable: the state the call needs (its session, its hold,
	// the pending-holds cap, a shared rate limit) could not be read or
	// written because the store did not answer (PostgreSQL down or slow
	// past its statement timeout). Nothing was sent; the call may be
	// retried (on another replica).
	StoreUnavailable Code = "store_unavailable"
	// Connection-level refusals, before any identity exists.
	UntrustedPeer    Code = "untrusted_peer"
	IdentityRequired Code = "identity_required"
	NotFound         Code = "not_found"
	MethodNotAllowed Code = "method_not_allowed"
	// HeaderTooLarge is a request head (request line and header fields)
	// over 64 KiB on the sandbox socket (431).
	HeaderTooLarge Code = "header_too_large"
	// RequestTimeout is a request body that did not arrive within
	// gateway.request_body_timeout, extended by its minimum rate (408).
	RequestTimeout Code = "request_timeout"
	// TooManyConnections is a sandbox with
	// gateway.max_connections_per_sandbox connections open (429).
	TooManyConnections Code = "too_many_connections"
	// GatewayBusy is the gateway with gateway.max_connections open (503).
	GatewayBusy Code = "gateway_busy"
	// BadRequest is an admin API request whose parameters or body are
	// wrong (400); the message names what.
	BadRequest Code = "bad_request"
	// Unauthenticated is an admin API request without the credential it
	// needs (401).
	Unauthenticated Code = "unauthenticated"
)

// Error is a refusal as the agent sees it. Message is written for the
// agent on purpose: it never carries a secret, a raw Vault error or an
// upstream body. The private cause goes to the log only.
type Error struct {
	Status     int
	Code       Code
	Message    string
	RetryAfter time.Duration // > 0: sent as Retry-After
	cause      error         // logged, never returned
}

// New returns a refusal with the HTTP status, code and agent-safe message.
func New(status int, code Code, msg string) *Error {
	return &Error{Status: status, Code: code, Message: msg}
}

// Wrap records cause as the refusal's private cause, for the log line
// only, and returns e.
func (e *Error) Wrap(cause error) *Error {
	e.cause = cause
	return e
}

// Cause returns the private cause set by Wrap, or nil. It is for the log
// line only: never write it where the agent can read it.
func (e *Error) Cause() error { return e.cause }

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Body is the wire shape of a refusal; tests and the CLI decode it.
type Body struct {
	Error struct {
		Code      Code   `json:"code"`
		Message   string `json:"message"`
		RequestID string `json:"request_id,omitempty"`
	} `json:"error"`
}

// Write answers with e as a JSON Body carrying requestID, and Retry-After
// when e has one.
func Write(w http.ResponseWriter, e *Error, requestID string) {
	var b Body
	b.Error.Code, b.Error.Message, b.Error.RequestID = e.Code, e.Message, requestID
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds(e.RetryAfter)))
	}
	WriteJSON(w, e.Status, b)
}

// WriteJSON answers status with v encoded as JSON, never sniffed and never
// cached. A v that cannot be encoded is a bug and answers 500.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"bug: response not encodable"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// WriteUnauthenticated answers an admin API request without the credential
// it needs: 401 unauthenticated, with the Bearer challenge; msg says which.
func WriteUnauthenticated(w http.ResponseWriter, msg, requestID string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
	Write(w, New(http.StatusUnauthorized, Unauthenticated, msg), requestID)
}

// NewRequestID returns a fresh random request ID: 24 hex digits, the ID
// that ties a response to its log line and audit record.
func NewRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// RetryAfterSeconds is d as a Retry-After value: whole seconds, rounded
// up, at least 1.
func RetryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
