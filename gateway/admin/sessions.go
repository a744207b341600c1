package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// routeSessions routes the sessions API of the admin listener.
func (a *API) routeSessions(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/sessions/{session}/end", a.handleEndSession)
	mux.HandleFunc("POST /api/v1/sessions/{session}/tokens", a.handleMintToken)
}

// handleMintToken is POST /api/v1/sessions/{session}/tokens: a per-run
// token for a hosted sandbox (Deps.MintToken). Only a machine caller (a
// token of gateway.session_tokens_sha256) may mint; an approver may not.
func (a *API) handleMintToken(w http.ResponseWriter, r *http.Request) {
	rid := refusal.NewRequestID()
	by, ok := a.machineCaller(r)
	if !ok {
		refusal.WriteUnauthenticated(w, "a session token (gateway.session_tokens_sha256) is required to mint a per-run token", rid)
		return
	}
	if a.d.MintToken == nil {
		refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "hosted sandboxes are off: set gateway.hosted"), rid)
		return
	}
	a.d.MintToken(w, r, rid, by)
}

// sessionCaller authenticates who may end sessions: a machine caller with
// a token whose SHA-256 is in gateway.session_tokens_sha256 (named
// "session_token[i]"), or an approver (token or review UI session).
func (a *API) sessionCaller(r *http.Request) (string, bool) {
	if by, ok := a.machineCaller(r); ok { // below
		return by, true
	}
	if p, ok := a.person(r); ok && p.Name != "" {
		return p.Name, true
	}
	return "", false
}

// sessionTokenIndex is the index in gateway.session_tokens_sha256 of tok's
// SHA-256, or -1. Every entry is compared, in constant time.
func (a *API) sessionTokenIndex(tok string) int {
	sum := sha256.Sum256([]byte(tok))
	got := []byte(hex.EncodeToString(sum[:]))
	found := -1
	for i, h := range a.d.Config.Gateway.SessionTokensSHA256 {
		if subtle.ConstantTimeCompare(got, []byte(h)) == 1 && found < 0 {
			found = i
		}
	}
	return found
}

// sessionEndView is the answer to an end: the same for a repeat.
type sessionEndView struct {
	Session string    `json:"session"`
	Ended   time.Time `json:"ended"`
	EndedBy string    `json:"ended_by"`
	Holds   []string  `json:"holds_expired"`
}

// handleEndSession is POST /api/v1/sessions/{session}/end: the session is
// recorded as ended (later tool calls and proxy requests carrying it are
// refused 403 session_ended), its pending holds expire (a waiting agent
// gets 403 approval_expired; an approval after this finds the hold
// expired), the end is audited "session_ended" with who ended it, and the
// credential source's SessionEnder, if any, revokes (Deps.EndSession). Idempotent: a repeat
// answers 200 with the first end's time and name.
func (a *API) handleEndSession(w http.ResponseWriter, r *http.Request) {
	rid := refusal.NewRequestID()
	by, ok := a.sessionCaller(r)
	if !ok {
		refusal.WriteUnauthenticated(w, "an approver token or a session token is required", rid)
		return
	}
	session := r.PathValue("session")
	if !ident.ValidID(session) {
		refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, fmt.Sprintf("a session id is 1..%d printable characters without spaces", ident.MaxLen)), rid)
		return
	}
	// The canonical form, as the relayed identities carry it
	// (canonicalIdentity): "S1" ends the session sandboxes call "s1".
	session, err := ident.Canonical(session)
	if err != nil {
		refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, "the session id is ambiguous: "+err.Error()), rid)
		return
	}
	// The end is finished even if the caller goes away.
	ctx := context.WithoutCancel(r.Context())
	storeErr := func(err error) {
		a.d.Log.Error("sessions: end", "session", session, "err", err)
		refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.SessionUnavailable, "the session could not be ended: the store is unavailable"), rid)
	}
	now := time.Now().UTC()
	// Ended first, so no new call of the session gets through while its
	// holds are being expired; a hold created in between is refused when
	// approved (runHeld checks the session too).
	end, first, err := a.d.Store.EndSession(ctx, session, by, now)
	if err != nil {
		storeErr(err)
		return
	}
	ids, err := a.d.Store.CutSessionHolds(ctx, session, now)
	if err != nil {
		storeErr(err)
		return
	}
	if len(ids) > 0 {
		if end, err = a.d.Store.AddSessionHolds(ctx, session, ids); err != nil {
			storeErr(err)
			return
		}
	}
	if a.d.Holds != nil {
		// Moves the cut holds to expired (audited hold_expired) and wakes
		// their waiting agents.
		a.d.Holds.ExpireDue(ctx)
	}
	// The session's open connections and tunnels end now (THREATS C12):
	// the end is in the store, so what the sandbox opens next is refused.
	closed := a.d.CloseSession(session)
	if err := a.d.Audit(ctx, audit.Record{RequestID: rid, Event: "session_ended", Fields: map[string]any{
		"session": session, "by": by, "repeat": !first, "holds": ids, "ended": end.Ended.Format(time.RFC3339Nano),
		"connections_closed": closed,
	}}); err != nil {
		a.d.Log.Error("sessions: end not audited", "session", session, "err", err)
		refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the session is ended but the audit log cannot be written; retry"), rid)
		return
	}
	if a.d.EndSession != nil {
		if err := a.d.EndSession(ctx, session); err != nil {
			a.d.Log.Error("sessions: revocation failed; the session stays ended", "session", session, "err", err)
			refusal.Write(w, refusal.New(http.StatusBadGateway, "revocation_failed", "the session is ended but its credentials could not be revoked; retry"), rid)
			return
		}
	}
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"session": viewSessionEnd(end), "request_id": rid})
}

func viewSessionEnd(e store.SessionEnd) sessionEndView {
	return sessionEndView{Session: e.Session, Ended: e.Ended, EndedBy: e.EndedBy, Holds: e.Holds}
}

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
// without spaces and at most ident.MaxLen bytes (as an identity
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
		if !ident.ValidID(f.v) {
			return ev, fmt.Errorf("sandbox event: %s must be 1..%d printable characters without spaces", f.name, ident.MaxLen)
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
