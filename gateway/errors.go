package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Code is a stable refusal code; agents and tests rely on these strings.
type Code string

// The refusal codes of the sandbox-side API (README: "Error codes").
const (
	CodePolicyBlock           Code = "policy_block"
	CodeNotGranted            Code = "not_granted"
	CodeUnknownTool           Code = "unknown_tool"
	CodeSchemaViolation       Code = "schema_violation"
	CodeApprovalDenied        Code = "approval_denied"
	CodeApprovalExpired       Code = "approval_expired"
	CodeArgsMismatch          Code = "args_mismatch"
	CodeEgressDenied          Code = "egress_denied"
	CodeCredentialUnavailable Code = "credential_unavailable"
	CodeAuditUnavailable      Code = "audit_unavailable"
	CodeApprovalUnavailable   Code = "approval_unavailable"
	CodeUpstreamError         Code = "upstream_error"
	CodeRateLimited           Code = "rate_limited"
	// CodeTooManyHolds is a sandbox with its share of its agent's pending
	// holds (gateway.max_pending_holds_per_sandbox) asking again (429).
	CodeTooManyHolds Code = "too_many_holds"
	// CodeUnknownAgent is an identity whose agent is not in agents[]
	// asking for its tools (403): refused rather than answered with an
	// empty list, so a misnamed agent shows at once.
	CodeUnknownAgent Code = "unknown_agent"
	// CodeEgressNotGranted is an identity whose egress narrowing
	// (sandboxd --egress) names a host outside its agent's allowlist
	// asking for its tools (403): a narrowing never widens.
	CodeEgressNotGranted Code = "egress_not_granted"
	// Connection-level refusals, before any identity exists.
	CodeUntrustedPeer    Code = "untrusted_peer"
	CodeIdentityRequired Code = "identity_required"
	CodeNotFound         Code = "not_found"
	CodeMethodNotAllowed Code = "method_not_allowed"
	// CodeHeaderTooLarge is a request head (request line and header
	// fields) over 64 KiB on the sandbox socket (431).
	CodeHeaderTooLarge Code = "header_too_large"
	// CodeRequestTimeout is a request body that did not arrive within
	// gateway.request_body_timeout, extended by its minimum rate (408).
	CodeRequestTimeout Code = "request_timeout"
	// CodeTooManyConnections is a sandbox with
	// gateway.max_connections_per_sandbox connections open (429).
	CodeTooManyConnections Code = "too_many_connections"
	// CodeGatewayBusy is the gateway with gateway.max_connections open (503).
	CodeGatewayBusy Code = "gateway_busy"
)

// apiError is a refusal as the agent sees it. Message is written for the
// agent on purpose: it never carries a secret, a raw Vault error or an
// upstream body. The private cause goes to the log only.
type apiError struct {
	Status     int
	Code       Code
	Message    string
	cause      error         // logged, never returned
	retryAfter time.Duration // > 0: sent as Retry-After
}

func (e *apiError) Error() string { return string(e.Code) + ": " + e.Message }

func refuse(status int, code Code, msg string) *apiError {
	return &apiError{Status: status, Code: code, Message: msg}
}

type errorBody struct {
	Error struct {
		Code      Code   `json:"code"`
		Message   string `json:"message"`
		RequestID string `json:"request_id,omitempty"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, e *apiError, requestID string) {
	var b errorBody
	b.Error.Code, b.Error.Message, b.Error.RequestID = e.Code, e.Message, requestID
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds(e.retryAfter)))
	}
	writeJSON(w, e.Status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
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

// writeUnauthenticated answers an admin API request without the credential
// it needs: 401 unauthenticated, with the Bearer challenge; msg says which.
func writeUnauthenticated(w http.ResponseWriter, msg, requestID string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
	writeError(w, refuse(http.StatusUnauthorized, "unauthenticated", msg), requestID)
}
