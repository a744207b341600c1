package admin

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/receipts"
	"github.com/sluice-gw/sluice/gateway/refusal"
)

// person authenticates a person on the admin API: a bearer token
// whose SHA-256 is an approver's token_sha256, or the review UI's hook.
func (a *API) person(r *http.Request) (holds.Person, bool) {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && tok != "" {
		sum := sha256.Sum256([]byte(tok))
		got := []byte(hex.EncodeToString(sum[:]))
		var found *holds.Person
		for _, u := range a.d.Config.Approvers.Users {
			if u.TokenSHA256 != "" && subtle.ConstantTimeCompare(got, []byte(u.TokenSHA256)) == 1 && found == nil {
				found = &holds.Person{Name: u.Name, Groups: slices.Clone(u.Groups)}
			}
		}
		if found != nil {
			return *found, true
		}
		return holds.Person{}, false
	}
	if a.d.Person != nil {
		return a.d.Person(r)
	}
	return holds.Person{}, false
}

// holdView is a hold as the admin API shows it: arguments and JSON bodies
// as JSON, other bodies as text or base64.
type holdView struct {
	holds.Hold
	Args    json.RawMessage `json:"args"`
	Request requestView     `json:"request"`
	Result  *resultView     `json:"result,omitempty"`
}

type requestView struct {
	Method       string              `json:"method"`
	URL          string              `json:"url"`
	Headers      map[string][]string `json:"headers"`
	Body         any                 `json:"body,omitempty"`
	BodyEncoding string              `json:"body_encoding,omitempty"`
}

type resultView struct {
	HTTPStatus int             `json:"http_status"`
	Body       json.RawMessage `json:"body"`
	Truncated  bool            `json:"truncated,omitempty"`
}

func viewHold(h holds.Hold) holdView {
	v := holdView{Hold: h, Args: json.RawMessage(h.Args)}
	if !json.Valid(h.Args) {
		v.Args, _ = json.Marshal(string(h.Args))
	}
	v.Request = requestView{Method: h.Request.Method, URL: h.Request.URL, Headers: h.Request.Headers}
	switch b := h.Request.Body; {
	case len(b) == 0:
	case json.Valid(b):
		v.Request.Body = json.RawMessage(b)
	default:
		v.Request.Body, v.Request.BodyEncoding = b, "base64"
	}
	if h.Result != nil {
		v.Result = &resultView{HTTPStatus: h.Result.HTTPStatus, Body: json.RawMessage(h.Result.Body), Truncated: h.Result.Truncated}
		if !json.Valid(h.Result.Body) {
			v.Result.Body, _ = json.Marshal(string(h.Result.Body))
		}
	}
	return v
}

// routeHolds routes the holds API of the admin listener.
func (a *API) routeHolds(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/holds", a.withPerson(a.handleListHolds))
	mux.HandleFunc("GET /api/v1/holds/{id}", a.withPerson(a.handleGetHold))
	mux.HandleFunc("POST /api/v1/holds/{id}/approve", a.withPerson(a.handleDecide(true)))
	mux.HandleFunc("POST /api/v1/holds/{id}/deny", a.withPerson(a.handleDecide(false)))
	a.routeGrants(mux)
}

func (a *API) withPerson(fn func(http.ResponseWriter, *http.Request, holds.Person)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := a.person(r)
		if !ok {
			refusal.WriteUnauthenticated(w, "a valid approver token is required", refusal.NewRequestID())
			return
		}
		if a.d.Holds == nil {
			refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "holds are not available"), refusal.NewRequestID())
			return
		}
		fn(w, r, p)
	}
}

func (a *API) handleListHolds(w http.ResponseWriter, r *http.Request, _ holds.Person) {
	var f holds.Filter
	if v := r.URL.Query().Get("status"); v != "" {
		for _, st := range strings.Split(v, ",") {
			f.Status = append(f.Status, holds.Status(st))
		}
	}
	var ok bool
	if f.Limit, ok = limitParam(w, r, 0); !ok {
		return
	}
	hs, err := a.d.Holds.List(r.Context(), f)
	if err != nil {
		a.holdsError(w, err)
		return
	}
	views := make([]holdView, len(hs))
	for i, h := range hs {
		views[i] = viewHold(h)
	}
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"holds": views})
}

func (a *API) handleGetHold(w http.ResponseWriter, r *http.Request, _ holds.Person) {
	h, err := a.d.Holds.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		a.holdsError(w, err)
		return
	}
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"hold": viewHold(h)})
}

func (a *API) handleDecide(approve bool) func(http.ResponseWriter, *http.Request, holds.Person) {
	return func(w http.ResponseWriter, r *http.Request, p holds.Person) {
		var in struct {
			Reason string `json:"reason"`
			Always bool   `json:"always"` // approve only: also grant "always allow this exact call"
			TTL    string `json:"ttl"`    // the grant's lifetime (default 8h, at most 24h)
			// MaxUses: how many calls the grant lets through (0: no limit).
			MaxUses int `json:"max_uses"`
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err == nil && len(bytes.TrimSpace(body)) > 0 {
			err = json.Unmarshal(body, &in)
		}
		if err != nil {
			refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, `want {"reason": "...", "always": false, "ttl": "8h"}`), refusal.NewRequestID())
			return
		}
		if (in.Always || in.TTL != "" || in.MaxUses != 0) && !approve {
			refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, "always, ttl and max_uses apply only to approve"), refusal.NewRequestID())
			return
		}
		if in.MaxUses != 0 && !in.Always {
			refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, `max_uses needs "always": true`), refusal.NewRequestID())
			return
		}
		var h holds.Hold
		if approve && (in.Always || in.TTL != "") {
			ttl, aerr := grantTTL(in.Always, in.TTL)
			if aerr != nil {
				refusal.Write(w, aerr, refusal.NewRequestID())
				return
			}
			var g holds.Grant
			h, g, err = a.d.Holds.ApproveGrant(r.Context(), r.PathValue("id"), p, in.Reason, holds.GrantTerms{TTL: ttl, MaxUses: in.MaxUses})
			if err != nil {
				a.holdsError(w, err)
				return
			}
			refusal.WriteJSON(w, http.StatusOK, map[string]any{"hold": viewHold(h), "grant": g})
			return
		}
		if approve {
			h, err = a.d.Holds.Approve(r.Context(), r.PathValue("id"), p, in.Reason)
		} else {
			if strings.TrimSpace(in.Reason) == "" {
				refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, "a denial needs a reason"), refusal.NewRequestID())
				return
			}
			h, err = a.d.Holds.Deny(r.Context(), r.PathValue("id"), p, in.Reason)
		}
		if err != nil {
			a.holdsError(w, err)
			return
		}
		refusal.WriteJSON(w, http.StatusOK, map[string]any{"hold": viewHold(h)})
	}
}

// holdsError maps the holds errors to statuses and codes.
func (a *API) holdsError(w http.ResponseWriter, err error) {
	var e *refusal.Error
	switch {
	case errors.Is(err, holds.ErrNotFound):
		e = refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold")
	case errors.Is(err, holds.ErrSelfApproval):
		e = refusal.New(http.StatusForbidden, "self_approval_forbidden", "the person a call is made for cannot decide it")
	case errors.Is(err, holds.ErrNotApprover):
		e = refusal.New(http.StatusForbidden, "not_an_approver", "this hold's rule does not name you as an approver")
	case errors.Is(err, holds.ErrConflict):
		e = refusal.New(http.StatusConflict, "conflict", "the hold is already decided")
	case errors.Is(err, holds.ErrExpired):
		e = refusal.New(http.StatusGone, "expired", "the hold has expired")
	case errors.Is(err, holds.ErrGrantUses):
		e = refusal.New(http.StatusBadRequest, refusal.BadRequest, fmt.Sprintf("max_uses must be 0 (no limit) to %d", holds.MaxGrantUses))
	case errors.Is(err, holds.ErrGrantTTL):
		e = refusal.New(http.StatusBadRequest, refusal.BadRequest, "ttl must be more than 0 and at most 24h")
	case errors.Is(err, holds.ErrGrantNotFound):
		e = refusal.New(http.StatusNotFound, refusal.NotFound, "no such grant")
	case errors.Is(err, holds.ErrGrantRevoked):
		e = refusal.New(http.StatusConflict, "conflict", "the grant is already revoked")
	default:
		a.d.Log.Error("holds: admin API", "err", err)
		e = refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the holds store is unavailable")
	}
	refusal.Write(w, e, refusal.NewRequestID())
}

// grantTTL parses the approve body's ttl: "" is holds.DefaultGrantTTL, at
// most holds.MaxGrantTTL. A ttl without always is refused rather than
// silently ignored.
func grantTTL(always bool, v string) (time.Duration, *refusal.Error) {
	if !always {
		return 0, refusal.New(http.StatusBadRequest, refusal.BadRequest, `ttl needs "always": true`)
	}
	if v == "" {
		return holds.DefaultGrantTTL, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > holds.MaxGrantTTL {
		return 0, refusal.New(http.StatusBadRequest, refusal.BadRequest, "ttl must be a duration like 8h, more than 0 and at most 24h")
	}
	return d, nil
}

// routeGrants routes the grants API of the admin listener: any
// authenticated approver may list and revoke (revoking only takes a
// permission away); grants are made only by approving a hold.
func (a *API) routeGrants(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/grants", a.withPerson(a.handleListGrants))
	mux.HandleFunc("DELETE /api/v1/grants/{id}", a.withPerson(a.handleRevokeGrant))
}

func (a *API) handleListGrants(w http.ResponseWriter, r *http.Request, _ holds.Person) {
	all := false
	switch v := r.URL.Query().Get("status"); v {
	case "", "active":
	case "all":
		all = true
	default:
		refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, "status must be active or all"), refusal.NewRequestID())
		return
	}
	limit, ok := limitParam(w, r, 0)
	if !ok {
		return
	}
	gs, err := a.d.Holds.Grants(r.Context(), all, limit)
	if err != nil {
		a.holdsError(w, err)
		return
	}
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"grants": gs})
}

func (a *API) handleRevokeGrant(w http.ResponseWriter, r *http.Request, p holds.Person) {
	g, err := a.d.Holds.RevokeGrant(r.Context(), r.PathValue("id"), p)
	if err != nil {
		a.holdsError(w, err)
		return
	}
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"grant": g})
}

// routeReceipts serves GET /api/v1/holds/{id}/receipt (the signed receipt
// of an executed hold, as a file) and GET /api/v1/receipts/key (the
// verification key).
func (a *API) routeReceipts(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/holds/{id}/receipt", a.withPerson(func(w http.ResponseWriter, r *http.Request, _ holds.Person) {
		h, err := a.d.Holds.Get(r.Context(), r.PathValue("id"))
		if err != nil {
			a.holdsError(w, err)
			return
		}
		if h.Result == nil || len(h.Result.Receipt) == 0 {
			refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "this hold has no receipt: it has not been executed (or receipts are disabled)"), refusal.NewRequestID())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Disposition", `attachment; filename="receipt-`+h.ID+`.json"`)
		rc := h.Result.Receipt
		if rc[len(rc)-1] != '\n' {
			rc = append(rc, '\n') // the store keeps it compact; the file ends in a newline
		}
		_, _ = w.Write(rc)
	}))
	mux.HandleFunc("GET /api/v1/receipts/key", func(w http.ResponseWriter, r *http.Request) {
		if a.d.Receipts == nil {
			refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "receipts are disabled"), refusal.NewRequestID())
			return
		}
		keys, err := a.d.Receipts.Keys(r.Context())
		if err != nil { // a key in Vault, and Vault unavailable
			a.d.Log.Error("receipts: the verification keys are unavailable", "err", err)
			refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the receipts' keys are unavailable"), refusal.NewRequestID())
			return
		}
		// The key that signs now, and every version of a Vault key
		// (receipts signed before a rotation name theirs by key_id).
		all := make([]map[string]string, len(keys))
		for i, k := range keys {
			all[i] = map[string]string{"key_id": k.KeyID, "name": k.Name, "public_key_pem": string(receipts.PublicPEM(k.Key))}
		}
		refusal.WriteJSON(w, http.StatusOK, map[string]any{
			"algorithm": "Ed25519", "key_id": keys[0].KeyID, "public_key_pem": all[0]["public_key_pem"], "keys": all,
		})
	})
}
