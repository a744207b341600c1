package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// sandboxEventKinds are the events a sandbox host reports: a command of a
// sandbox killed by one of its limits (THREATS B2, B1, B3), or a sandbox
// whose init died, which leaves it failed (THREATS A13). The gateway
// writes each into the audit log as "sandbox_" + the kind, beside the
// decisions of the same sandbox, so that a security team reads one
// tamper-evident record of what a sandbox did and what stopped it.
var sandboxEventKinds = map[string]bool{"oom": true, "pids_limit": true, "timeout": true, "init_died": true}

// MaxSandboxEventBytes bounds a report's body (POST /api/v1/sandbox-events).
const MaxSandboxEventBytes = 4 << 10

// sandboxEvent is the body of POST /api/v1/sandbox-events, as sandboxd
// sends it.
type sandboxEvent struct {
	Event   string `json:"event"`   // a key of sandboxEventKinds
	Sandbox string `json:"sandbox"` // the sandbox's id
	Agent   string `json:"agent"`
	Session string `json:"session"`
	User    string `json:"user"`
	Host    string `json:"host"`             // the sandbox host (sandboxd's host)
	Limit   int64  `json:"limit,omitempty"`  // the limit reached: memory bytes (oom), processes (pids_limit), milliseconds (timeout)
	Egress  string `json:"egress,omitempty"` // the sandbox's egress narrowing, as in its preamble
}

// routeSandboxEvents routes the sandbox-events API of the admin listener.
func (a *API) routeSandboxEvents(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/sandbox-events", a.handleSandboxEvent)
}

// handleSandboxEvent is POST /api/v1/sandbox-events: a sandbox host reports
// that one of its sandbox's commands was killed by a limit, or that its
// init died. Only a machine
// caller (a token of gateway.session_tokens_sha256, which sandboxd holds)
// may report; approvers may not. The report is audited before it is
// answered 200; a report the audit log cannot take is 503
// audit_unavailable, so that sandboxd records it as not delivered.
func (a *API) handleSandboxEvent(w http.ResponseWriter, r *http.Request) {
	rid := refusal.NewRequestID()
	by, ok := a.machineCaller(r)
	if !ok {
		refusal.WriteUnauthenticated(w, "a session token (gateway.session_tokens_sha256) is required", rid)
		return
	}
	ev, err := decodeSandboxEvent(http.MaxBytesReader(w, r.Body, MaxSandboxEventBytes))
	if err != nil {
		refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, err.Error()), rid)
		return
	}
	fields := map[string]any{"sandbox": ev.Sandbox, "agent": ev.Agent, "session": ev.Session, "user": ev.User,
		"host": ev.Host, "reported_by": by}
	if ev.Limit != 0 {
		fields["limit"] = ev.Limit
	}
	if ev.Egress != "" {
		fields["egress"] = ev.Egress
	}
	if err := a.d.Audit(r.Context(), audit.Record{RequestID: rid, Event: "sandbox_" + ev.Event, Fields: fields}); err != nil {
		a.d.Log.Error("sandbox event not audited", "request_id", rid, "event", ev.Event, "sandbox", ev.Sandbox, "err", err)
		refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; report again"), rid)
		return
	}
	a.d.Log.Warn("sandbox event", "request_id", rid, "event", ev.Event, "sandbox", ev.Sandbox,
		"agent", ev.Agent, "session", ev.Session, "host", ev.Host, "limit", ev.Limit)
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"request_id": rid})
}

// decodeSandboxEvent reads one report strictly: known keys only, one JSON
// object, a known event, a sandbox id, and every text field printable
// without spaces and at most MaxSessionIDLen bytes (as an identity
// preamble carries them).
func decodeSandboxEvent(body io.Reader) (sandboxEvent, error) {
	var ev sandboxEvent
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return ev, fmt.Errorf("a sandbox event is at most %d bytes", MaxSandboxEventBytes)
		}
		return ev, fmt.Errorf("sandbox event: %v", err)
	}
	if dec.More() {
		return ev, errors.New("sandbox event: one JSON object, nothing after it")
	}
	if !sandboxEventKinds[ev.Event] {
		return ev, fmt.Errorf("sandbox event: event %q, want oom, pids_limit, timeout or init_died", ev.Event)
	}
	for _, f := range []struct {
		name, v  string
		required bool
	}{{"sandbox", ev.Sandbox, true}, {"agent", ev.Agent, false}, {"session", ev.Session, false}, {"user", ev.User, false}, {"host", ev.Host, false}} {
		if f.v == "" && !f.required {
			continue
		}
		if !validSessionID(f.v) {
			return ev, fmt.Errorf("sandbox event: %s must be 1..%d printable characters without spaces", f.name, MaxSessionIDLen)
		}
	}
	if ev.Limit < 0 {
		return ev, errors.New("sandbox event: limit must not be negative")
	}
	if _, err := wire.ParseEgress(ev.Egress); err != nil {
		return ev, fmt.Errorf("sandbox event: %v", err)
	}
	return ev, nil
}

// machineCaller authenticates a machine caller: a bearer token whose
// SHA-256 is in gateway.session_tokens_sha256, named "session_token[i]".
func (a *API) machineCaller(r *http.Request) (string, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "", false
	}
	if i := a.sessionTokenIndex(tok); i >= 0 {
		return fmt.Sprintf("session_token[%d]", i), true
	}
	return "", false
}
