package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/review"
	"github.com/sluice-gw/sluice/gateway/tracing"
)

// Holds returns the holds manager (the review UI decides through it).
func (s *Server) Holds() *holds.Manager { return s.holds }

// SetAdminAuth adds a way to authenticate people on the admin API besides
// bearer tokens (the review UI's cookie sessions). fn must verify its own
// CSRF protection for state-changing requests. Call before Serve.
func (s *Server) SetAdminAuth(fn func(*http.Request) (holds.Person, bool)) { s.adminAuth = fn }

// SetReviewUI mounts the review web UI at "/" on the admin listener
// (replacing the index page). Call before Serve.
func (s *Server) SetReviewUI(h http.Handler) { s.reviewUI = h }

// approvalsEnabled says whether anyone could ever decide a hold: without
// approver accounts an ask is refused as approval_unavailable instead of
// being held until it expires.
func (s *Server) approvalsEnabled() bool {
	return s.holds != nil && (len(s.cfg.Approvers.Users) > 0 || s.cfg.Approvers.OIDC != nil)
}

func (s *Server) newHolds() *holds.Manager {
	return holds.New(holds.Options{
		Store:                s.store,
		Execute:              s.executeHold,
		Audit:                s.auditHold,
		Notify:               s.notifyHold,
		MaxPendingPerAgent:   s.cfg.Gateway.MaxPendingHolds,
		MaxPendingPerSandbox: s.cfg.Gateway.MaxPendingHoldsPerSandbox,
		Lease:                s.cfg.Gateway.HoldLease.Std(),
		Logger:               s.log,
	})
}

// newReviewUI mounts the review web UI when anyone can sign in to it
// (approvers with a password_hash, or OIDC), and lets its sessions use the
// admin API too.
func (s *Server) newReviewUI() error {
	var users []config.User
	for _, u := range s.cfg.Approvers.Users {
		if u.PasswordHash != "" {
			users = append(users, u)
		}
	}
	oc := s.cfg.Approvers.OIDC
	if len(users) == 0 && oc == nil {
		return nil
	}
	opt := review.Options{
		Holds:  s.holds,
		Grants: s.holds, // review/grants.go: the Grants page
		Users:  users,
		Log:    s.log,
		Audit: func(ctx context.Context, event string, fields map[string]any) error {
			_, err := s.appendAudit(ctx, audit.Record{RequestID: refusal.NewRequestID(), Event: event, Fields: fields}, false)
			return err
		},
		AuditFile:     s.cfg.Audit.Path,
		SecureCookies: strings.HasPrefix(s.cfg.Approvals.PublicURL, "https://"),
	}
	if oc != nil {
		secret, err := os.ReadFile(oc.ClientSecretFile)
		if err != nil {
			return fmt.Errorf("approvers.oidc.client_secret_file: %w", err)
		}
		opt.OIDC = &review.OIDC{Issuer: oc.Issuer, ClientID: oc.ClientID, ClientSecret: strings.TrimSpace(string(secret)),
			RedirectURL: strings.TrimRight(s.cfg.Approvals.PublicURL, "/") + "/oidc/callback", GroupsClaim: oc.GroupsClaim}
	}
	opt.Sessions = s.store // sign-ins shared by the replicas sharing the store (sess25)
	if s.oauth != nil && len(s.oauth.PersonClients()) > 0 {
		opt.Connections = oauthConnections{m: s.oauth, connected: s.connectHeld} // oauthcreds.go
	}
	ui, err := review.New(opt)
	if err != nil {
		return fmt.Errorf("review UI: %w", err)
	}
	s.reviewUI, s.adminAuth = ui, ui.Person
	return nil
}

// auditHold appends a hold's audit record.
func (s *Server) auditHold(ctx context.Context, event string, h holds.Hold, extra map[string]any) error {
	f := map[string]any{
		"hold": h.ID, "tool": h.Tool, "sha256": h.SHA256, "rule": h.Rule,
		"sandbox": h.Caller.Sandbox, "agent": h.Caller.Agent, "session": h.Caller.Session, "user": h.Caller.User,
	}
	if h.Caller.Egress != "" {
		f["egress"] = h.Caller.Egress
	}
	if event == "hold_created" {
		f["decision"], f["approvers"], f["reason"] = "ask", h.Approvers, h.Reason
		if id := tracing.TraceIDOf(h.TraceParent); id != "" {
			f[call.KeyTraceID] = id // the held call's trace
		}
	}
	for k, v := range extra {
		f[k] = v
	}
	if d, ok := strings.CutPrefix(event, "hold_"); ok && (d == "approved" || d == "denied") && !h.Decided.IsZero() {
		s.tel.approval.WithLabelValues(d).Observe(h.Decided.Sub(h.Created).Seconds())
	}
	_, err := s.appendAudit(ctx, audit.Record{RequestID: h.RequestID, Event: event, Fields: f}, false)
	return err
}

// holdLink is the review UI's page of a hold.
func (s *Server) holdLink(id string) string {
	base := s.cfg.Approvals.PublicURL
	if base == "" {
		base = "http://" + s.AdminAddr()
	}
	return strings.TrimRight(base, "/") + "/holds/" + id
}

// notifyHold posts the Slack-compatible webhook for a new hold. Failures
// are logged; they never affect the hold.
func (s *Server) notifyHold(h holds.Hold) {
	u := s.cfg.Approvals.WebhookURL
	if u == "" {
		return
	}
	text := fmt.Sprintf("sluice: %s (agent %s, user %s) is waiting for approval: %s %s. Rule %s. Review: %s",
		h.Tool, h.Caller.Agent, h.Caller.User, h.Request.Method, h.Request.URL, h.Rule, s.holdLink(h.ID))
	body, _ := json.Marshal(map[string]string{"text": text})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		s.log.Warn("approvals: webhook request", "hold", h.ID, "err", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.webhook.Do(req)
	if err != nil {
		// The URL may carry a token (Slack's do): log only the failure kind.
		s.log.Warn("approvals: webhook not delivered", "hold", h.ID, "err", errors.Unwrap(err))
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		s.log.Warn("approvals: webhook refused", "hold", h.ID, "status", resp.StatusCode)
	}
}

// adminPerson authenticates a person on the admin API: a bearer token
// whose SHA-256 is an approver's token_sha256, or the review UI's hook.
func (s *Server) adminPerson(r *http.Request) (holds.Person, bool) {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && tok != "" {
		sum := sha256.Sum256([]byte(tok))
		got := []byte(hex.EncodeToString(sum[:]))
		var found *holds.Person
		for _, u := range s.cfg.Approvers.Users {
			if u.TokenSHA256 != "" && subtle.ConstantTimeCompare(got, []byte(u.TokenSHA256)) == 1 && found == nil {
				found = &holds.Person{Name: u.Name, Groups: slices.Clone(u.Groups)}
			}
		}
		if found != nil {
			return *found, true
		}
		return holds.Person{}, false
	}
	if s.adminAuth != nil {
		return s.adminAuth(r)
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

// adminHolds routes the holds API of the admin listener.
func (s *Server) adminHolds(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/holds", s.withPerson(s.handleListHolds))
	mux.HandleFunc("GET /api/v1/holds/{id}", s.withPerson(s.handleGetHold))
	mux.HandleFunc("POST /api/v1/holds/{id}/approve", s.withPerson(s.handleDecide(true)))
	mux.HandleFunc("POST /api/v1/holds/{id}/deny", s.withPerson(s.handleDecide(false)))
	s.adminGrants(mux)
}

func (s *Server) withPerson(fn func(http.ResponseWriter, *http.Request, holds.Person)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.adminPerson(r)
		if !ok {
			refusal.WriteUnauthenticated(w, "a valid approver token is required", refusal.NewRequestID())
			return
		}
		if s.holds == nil {
			refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "holds are not available"), refusal.NewRequestID())
			return
		}
		fn(w, r, p)
	}
}

func (s *Server) handleListHolds(w http.ResponseWriter, r *http.Request, _ holds.Person) {
	var f holds.Filter
	if v := r.URL.Query().Get("status"); v != "" {
		for _, st := range strings.Split(v, ",") {
			f.Status = append(f.Status, holds.Status(st))
		}
	}
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, "limit must be 1..1000"), refusal.NewRequestID())
			return
		}
		f.Limit = n
	}
	hs, err := s.holds.List(r.Context(), f)
	if err != nil {
		s.holdsError(w, err)
		return
	}
	views := make([]holdView, len(hs))
	for i, h := range hs {
		views[i] = viewHold(h)
	}
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"holds": views})
}

func (s *Server) handleGetHold(w http.ResponseWriter, r *http.Request, _ holds.Person) {
	h, err := s.holds.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.holdsError(w, err)
		return
	}
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"hold": viewHold(h)})
}

func (s *Server) handleDecide(approve bool) func(http.ResponseWriter, *http.Request, holds.Person) {
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
			h, g, err = s.holds.ApproveGrant(r.Context(), r.PathValue("id"), p, in.Reason, holds.GrantTerms{TTL: ttl, MaxUses: in.MaxUses})
			if err != nil {
				s.holdsError(w, err)
				return
			}
			refusal.WriteJSON(w, http.StatusOK, map[string]any{"hold": viewHold(h), "grant": g})
			return
		}
		if approve {
			h, err = s.holds.Approve(r.Context(), r.PathValue("id"), p, in.Reason)
		} else {
			if strings.TrimSpace(in.Reason) == "" {
				refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, "a denial needs a reason"), refusal.NewRequestID())
				return
			}
			h, err = s.holds.Deny(r.Context(), r.PathValue("id"), p, in.Reason)
		}
		if err != nil {
			s.holdsError(w, err)
			return
		}
		refusal.WriteJSON(w, http.StatusOK, map[string]any{"hold": viewHold(h)})
	}
}

// holdsError maps the holds errors to statuses and codes.
func (s *Server) holdsError(w http.ResponseWriter, err error) {
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
		s.log.Error("holds: admin API", "err", err)
		e = refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the holds store is unavailable")
	}
	refusal.Write(w, e, refusal.NewRequestID())
}
