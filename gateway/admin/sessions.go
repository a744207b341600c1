package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"
	"unicode"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
)

// MaxSessionIDLen bounds a session id on the admin API.
const MaxSessionIDLen = 256

// routeSessions routes the sessions API of the admin listener.
func (a *API) routeSessions(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/sessions/{session}/end", a.handleEndSession)
}

// sessionCaller authenticates who may end sessions: a machine caller with
// a token whose SHA-256 is in gateway.session_tokens_sha256 (named
// "session_token[i]"), or an approver (token or review UI session).
func (a *API) sessionCaller(r *http.Request) (string, bool) {
	if by, ok := a.machineCaller(r); ok { // sandbox_events.go
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

// validSessionID accepts what an identity preamble could carry and a
// person could type: printable, no spaces, bounded.
func validSessionID(id string) bool {
	if id == "" || len(id) > MaxSessionIDLen {
		return false
	}
	for _, r := range id {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
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
	if !validSessionID(session) {
		refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, fmt.Sprintf("a session id is 1..%d printable characters without spaces", MaxSessionIDLen)), rid)
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
