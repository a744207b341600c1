// Package call is the transport-independent shape of one tool call: the
// Request a front door (the sandbox socket's POST /v1/tools/{tool}, an MCP
// tools/call, an Envoy ext_authz check) hands to the gateway's one
// pipeline, gateway.Server.Call, and the Outcome it gets back. It also
// holds the one audit record type and the one canonical log line every
// kind of decision writes, with constant keys.
//
// The invariant the package exists for: a door only translates. It never
// decides, holds, attaches a credential or audits; every entrance passes
// the same stages in the same order (limit → resolve → validate → decide
// → grant/hold → credential → send → scrub → audit), so that a check added
// to the pipeline holds for every door at once.
//
// call imports only the standard library, gateway/refusal and
// sandboxd/wire, so that every door may import it without importing the
// others or the gateway's root.
package call

import (
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Transport names the front door a call came through. It is recorded in
// the call's audit record and log line.
type Transport string

// The front doors.
const (
	// HTTP is the sandbox socket's POST /v1/tools/{tool}.
	HTTP Transport = "http"
	// MCP is an MCP tools/call.
	MCP Transport = "mcp"
	// Envoy is an Envoy ext_authz check: the gateway decides and hands
	// the credential to attach, Envoy sends.
	Envoy Transport = "envoy"
)

// String returns the transport's name as recorded.
func (t Transport) String() string { return string(t) }

// Mode says who sends an allowed call.
type Mode int

const (
	// Send: the gateway attaches the credential, sends the call through
	// the guarded dialer, scrubs the reply and answers with it.
	Send Mode = iota
	// Decide: the gateway decides and, when the call is allowed, answers
	// with the credential headers to attach (Outcome.Attach); the caller
	// (Envoy) sends. The decision is audited before the outcome returns.
	Decide
)

// String returns "send" or "decide".
func (m Mode) String() string {
	if m == Decide {
		return "decide"
	}
	return "send"
}

// Request is one tool call as a door hands it over.
type Request struct {
	// Identity is who calls: sandbox, agent, session and user. It comes
	// from the connection (the relay's preamble), never from the call's
	// content. The pipeline canonicalises user and session itself
	// (package ident), whatever the door did.
	Identity wire.Identity
	// Tool is the tool's name or its function-safe alias.
	Tool string
	// Args is the arguments document {"path":{…},"query":{…},
	// "headers":{…},"body":…}; empty means {}.
	Args json.RawMessage
	// Body, when set, is read (bounded by connectors.MaxArgsBytes) at the
	// validate stage instead of Args: the HTTP door passes its request
	// body, so that nothing is read before the call is limited, resolved
	// and granted.
	Body io.Reader
	// Transport is the door's name; "" is HTTP.
	Transport Transport
	// Mode is Send or Decide.
	Mode Mode
	// HTTP is the request as it will be sent, when the door has it
	// already formed (ext_authz: the request Envoy holds). Decide mode
	// only. The gateway checks that it is the resolved tool's operation
	// on its connector's base URL and decides on it as given; holds are
	// bound to its method, URL and body (not its headers, which a proxy
	// adds to). Its body must be readable; it is read and replaced.
	HTTP *http.Request
	// HoldID names the hold this call re-sends (the HTTP door's
	// Sluice-Hold header): it must be exactly the held request, and it
	// gets that hold's answer, never a second execution.
	HoldID string
	// HoldWait bounds how long an ask waits for a decision before the
	// outcome is the pending hold: 0 is gateway.hold_wait, < 0 does not
	// wait.
	HoldWait time.Duration
	// Progress, when set, is called while an ask waits: once as soon as
	// the call is held (Waited 0), then every ProgressEvery until the
	// hold is decided or HoldWait is up. It runs on the waiting
	// goroutine and must return quickly.
	Progress func(Progress)
	// ProgressEvery is the interval of Progress calls; 0 is one second.
	ProgressEvery time.Duration
	// IdempotencyKey, when the tool has an idempotency header and the
	// arguments set none, is sent in it. It is part of the request that
	// is decided, held and approved.
	IdempotencyKey string
	// RequestID ties the answer to the log line and audit record; ""
	// makes a fresh one.
	RequestID string
	// Envoy is the request in opa-envoy-plugin's input shape (the
	// ext_authz door's), shown to policy as input.envoy; nil otherwise.
	Envoy json.RawMessage
	// TraceParent is the W3C traceparent the caller sent ("" when none).
	// The pipeline records it only as a link of the call's span, never as
	// its parent: the caller does not place the decision in its trace.
	TraceParent string
}

// Progress is one report of a held call's wait.
type Progress struct {
	Hold   string        // the hold's ID
	Waited time.Duration // how long the call has waited so far
	Bound  time.Duration // how long it waits at most before the outcome is the pending hold
}

// Outcome is how a call ended. Exactly one of Refusal, Reply, Answer,
// Attach or a pending Hold carries the answer:
//
//   - Refusal: refused (Status is its status); Hold is set too when the
//     refusal is a hold's (denied, expired, failed);
//   - Reply: sent and answered (Status 200; the upstream's status is in
//     Reply);
//   - Hold pending (Status 202): the ask is waiting for a person; poll it;
//   - Answer: a held call's stored answer once it ran (Status is the
//     status to answer with; the bytes are the JSON the HTTP door writes);
//   - Attach (Decide mode, Status 200): allowed; send with these headers.
type Outcome struct {
	RequestID string
	Status    int
	Refusal   *refusal.Error
	Reply     *Reply
	Hold      *Hold
	Answer    []byte
	// Attach is the credential headers to set on the request (Decide
	// mode): their values are secrets, for the sender only, never for a
	// log or the sandbox. Remove lists headers to delete (a range that
	// could cut a reply mid-credential).
	Attach http.Header
	Remove []string
	// Decision and Rule are the policy's action ("allow", "ask",
	// "block"; "" when the call was refused before policy) and rule.
	Decision, Rule string
}

// Reply is the upstream's answer, scrubbed: no credential the gateway
// attached can be in it.
type Reply struct {
	Status       int                 `json:"status"`
	Headers      map[string][]string `json:"headers"`
	Body         any                 `json:"body"`                    // JSON as itself, text as a string, else base64
	BodyEncoding string              `json:"body_encoding,omitempty"` // "base64" when Body is not text
}

// Hold is a held call as its caller may see it.
type Hold struct {
	ID      string
	State   string // pending, approved, done, failed, denied, expired, unknown
	Expires time.Time
	Poll    string // the sandbox socket's path to poll it
	// RequestID is the request ID the hold was created under; the
	// answers a hold gives carry it.
	RequestID string
	// Tool is the held call's tool (the MCP door answers a remote MCP
	// server's tool with that server's result).
	Tool string
}

// Tool is a tool as an agent sees it in its list (GET /v1/tools, MCP
// tools/list).
type Tool struct {
	Name        string          `json:"name"`
	Alias       string          `json:"alias"` // function-safe: ^[a-zA-Z0-9_-]{1,64}$; a call may use it
	Description string          `json:"description,omitempty"`
	Method      string          `json:"method"`
	Path        string          `json:"path"`
	Risk        string          `json:"risk"`
	Schema      json.RawMessage `json:"schema"`
	// OutputSchema is the JSON Schema of the success reply's body (its
	// spec's 200, else 201, else 2xx JSON response), when it declares one.
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
}
