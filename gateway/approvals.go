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

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/review"
	"github.com/sluice-gw/sluice/policy"
)

// maxPollWait bounds GET /v1/holds/{id}?wait=.
const maxPollWait = 5 * time.Minute

// heldReply is the answer to a call that was held: 202 with the hold, or
// the stored outcome once it has one.
type heldReply struct {
	status int
	body   []byte
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(bytes.TrimRight(body, "\n"), '\n'))
}

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
		Holds: s.holds,
		Users: users,
		Log:   s.log,
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
	ui, err := review.New(opt)
	if err != nil {
		return fmt.Errorf("review UI: %w", err)
	}
	s.reviewUI, s.adminAuth = ui, ui.Person
	return nil
}

// holdTTL is the rule's hold_ttl, else gateway.hold_ttl.
func (s *Server) holdTTL(rule string) time.Duration {
	if rest, ok := strings.CutPrefix(rule, "policies["); ok {
		if i, err := strconv.Atoi(strings.TrimSuffix(rest, "]")); err == nil && i >= 0 && i < len(s.cfg.Policies) {
			if t := s.cfg.Policies[i].HoldTTL.Std(); t > 0 {
				return t
			}
		}
	}
	return s.cfg.Gateway.HoldTTL.Std()
}

// holdCall holds an ask call: it persists the canonical request (taken
// before any credential is attached), waits up to gateway.hold_wait for a
// decision and answers with the outcome or 202. Any failure to hold is
// 503 approval_unavailable: an ask is never allowed by accident.
func (s *Server) holdCall(ctx context.Context, c *call, r *http.Request, tool *connectors.Tool, args connectors.Args, req *http.Request) *refusal.Error {
	if !s.approvalsEnabled() {
		return refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "this call needs approval and no approval service is running; it was not sent")
	}
	if len(c.decision.Approvers) == 0 {
		// Nobody could approve it: holding it would only make it expire.
		return refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "this call needs approval and its rule names no approvers; it was not sent")
	}
	hr, err := canonicalRequest(req)
	if err != nil {
		return refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the call could not be held; it was not sent").Wrap(err)
	}
	argDoc, err := json.Marshal(args)
	if err != nil {
		return refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the call could not be held; it was not sent").Wrap(err)
	}
	// A call that names its hold is a re-send of it: it must be the very
	// request that was (or will be) approved (THREATS E4).
	if id := r.Header.Get("Sluice-Hold"); id != "" {
		h, err := s.holds.Get(ctx, id)
		if err != nil || !sameCaller(h.Caller, c.caller) || h.Tool != tool.Name {
			return refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold")
		}
		if h.SHA256 != hr.Hash() {
			return refusal.New(http.StatusConflict, refusal.ArgsMismatch, "the arguments differ from the held call's; the approval covers only the request it was given for")
		}
		return s.awaitHold(ctx, c, h.ID, s.cfg.Gateway.HoldWait.Std())
	}
	// The hold_created record carries the decision; a failure to hold is
	// audited as the call's decision with its refusal code.
	cred := ""
	if up := s.catalog.connectors[tool.Connector]; up != nil && up.cfg.Credential != nil {
		cred = credentialLabel(up.cfg.Credential)
	}
	h, _, err := s.holds.Create(ctx, holds.Hold{
		Tool: tool.Name, OpSummary: tool.Summary, Args: argDoc, Request: hr, Credential: cred,
		Caller:    holds.Caller{Sandbox: c.caller.Sandbox, Agent: c.caller.Agent, Session: c.caller.Session, User: c.caller.User, Egress: c.caller.Egress},
		Approvers: slices.Clone(c.decision.Approvers), Rule: c.decision.Rule, Reason: c.decision.Reason,
		Expires: time.Now().UTC().Add(s.holdTTL(c.decision.Rule)), RequestID: c.rid,
		IdempotencyHeader: tool.IdempotencyHeader,
	})
	switch {
	case errors.Is(err, holds.ErrTooManyForSandbox):
		return refusal.New(http.StatusTooManyRequests, refusal.TooManyHolds, fmt.Sprintf("this sandbox has %d calls waiting for approval, its share of its agent's %d (gateway.max_pending_holds_per_sandbox); wait for decisions", s.holds.MaxPendingPerSandbox(), s.cfg.Gateway.MaxPendingHolds))
	case errors.Is(err, holds.ErrTooMany):
		return refusal.New(http.StatusTooManyRequests, refusal.RateLimited, fmt.Sprintf("this agent has %d calls waiting for approval; wait for decisions", s.cfg.Gateway.MaxPendingHolds))
	case errors.Is(err, holds.ErrAudit):
		return refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; the call was not held and not sent").Wrap(err)
	case storeRefusal(err) != nil:
		return storeRefusal(err)
	case err != nil:
		return refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the call could not be held for approval; it was not sent").Wrap(err)
	}
	return s.awaitHold(ctx, c, h.ID, s.cfg.Gateway.HoldWait.Std())
}

// awaitHold waits up to d for the hold to be decided and sets the answer.
func (s *Server) awaitHold(ctx context.Context, c *call, id string, d time.Duration) *refusal.Error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	h, err := s.holds.Wait(wctx, id)
	if e := storeRefusal(err); e != nil {
		return e
	}
	if err != nil {
		return refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the hold could not be read").Wrap(err)
	}
	c.held = holdAnswer(h)
	return nil
}

func sameCaller(h holds.Caller, c policy.Caller) bool {
	return h.Sandbox == c.Sandbox && h.Agent == c.Agent && h.Session == c.Session && h.User == c.User
}

// canonicalRequest takes the request as it would be sent, before the
// credential is attached, and leaves req's body readable again.
func canonicalRequest(req *http.Request) (holds.Request, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return holds.Request{}, fmt.Errorf("hold: read request body: %w", err)
		}
		req.Body.Close()
		body = b
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	return holds.Request{Method: req.Method, URL: req.URL.String(), Headers: req.Header.Clone(), Body: body}, nil
}

// holdAnswer is what the agent gets for a hold in its current state.
func holdAnswer(h holds.Hold) *heldReply {
	heldRefusal := func(status int, code refusal.Code, msg string) *heldReply {
		var b refusal.Body
		b.Error.Code, b.Error.Message, b.Error.RequestID = code, msg, h.RequestID
		data, _ := json.Marshal(b)
		return &heldReply{status: status, body: data}
	}
	switch h.Status {
	case holds.Done, holds.Failed:
		if h.Result != nil {
			return &heldReply{status: h.Result.HTTPStatus, body: h.Result.Body}
		}
		return heldRefusal(http.StatusBadGateway, refusal.UpstreamError, "the approved call failed and left no result")
	case holds.Denied:
		msg := "denied by " + h.DecidedBy
		if h.DecisionReason != "" {
			msg += ": " + h.DecisionReason
		}
		return heldRefusal(http.StatusForbidden, refusal.ApprovalDenied, msg)
	case holds.Expired:
		return heldRefusal(http.StatusForbidden, refusal.ApprovalExpired, "no one decided this call before it expired; it was not sent")
	case holds.Unknown:
		return heldRefusal(http.StatusBadGateway, refusal.UpstreamError, "the gateway stopped while sending this approved call; its outcome is unknown and it is not re-sent")
	}
	data, _ := json.Marshal(map[string]any{
		"hold":       map[string]any{"id": h.ID, "status": h.Status, "poll": "/v1/holds/" + h.ID, "expires": h.Expires},
		"request_id": h.RequestID,
	})
	return &heldReply{status: http.StatusAccepted, body: data}
}

// handlePollHold is GET /v1/holds/{id}?wait=30s on the sandbox socket:
// only the caller the hold is for sees it; anyone else gets 404.
func (s *Server) handlePollHold(w http.ResponseWriter, r *http.Request) {
	rid := refusal.NewRequestID()
	id, ok := ingress.IdentityFrom(r.Context())
	if !ok {
		refusal.Write(w, refusal.New(http.StatusForbidden, refusal.IdentityRequired, "no identity"), rid)
		return
	}
	if s.holds == nil {
		refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold"), rid)
		return
	}
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.SchemaViolation, "wait must be a duration like 30s"), rid)
			return
		}
		wait = min(d, maxPollWait)
	}
	h, err := s.holds.Get(r.Context(), r.PathValue("id"))
	caller := callerOf(id)
	if errors.Is(err, holds.ErrNotFound) || (err == nil && !sameCaller(h.Caller, caller)) {
		refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold"), rid)
		return
	}
	if e := storeRefusal(err); e != nil {
		refusal.Write(w, e, rid)
		return
	}
	if err != nil {
		refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the hold could not be read"), rid)
		return
	}
	if wait > 0 && !h.Status.Terminal() {
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		h, err = s.holds.Wait(ctx, h.ID)
		cancel()
		if err != nil {
			refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the hold could not be read"), rid)
			return
		}
	}
	a := holdAnswer(h)
	writeRaw(w, a.status, a.body)
}

// executeHold runs an approved hold: the policy is evaluated again with
// the stored input, the credential is attached now, and exactly the stored
// request is sent, once. The result is the answer the agent's call gets.
// The holds manager also re-sends an idempotency-keyed hold through here
// after a crash left its outcome unknown (THREATS G2).
func (s *Server) executeHold(ctx context.Context, h holds.Hold) (holds.Result, bool) {
	c := &call{rid: h.RequestID, start: time.Now(), tool: h.Tool,
		caller: policy.Caller{Sandbox: h.Caller.Sandbox, Agent: h.Caller.Agent, Session: h.Caller.Session, User: h.Caller.User, Egress: h.Caller.Egress}}
	res, aerr := s.runHeld(ctx, c, h)
	if aerr != nil {
		c.status = aerr.Status
		if err := s.record(ctx, c, "result", aerr); err != nil {
			aerr = err
		}
		s.logCall(c, aerr)
		var b refusal.Body
		b.Error.Code, b.Error.Message, b.Error.RequestID = aerr.Code, aerr.Message, c.rid
		data, _ := json.Marshal(b)
		return holds.Result{HTTPStatus: aerr.Status, Body: data, Answered: c.answered}, false
	}
	res.RequestID = c.rid
	data, err := json.Marshal(res)
	if err != nil {
		return holds.Result{HTTPStatus: http.StatusInternalServerError, Body: []byte(`{"error":{"code":"internal","message":"bug: response not encodable"}}`), Answered: true}, false
	}
	s.logCall(c, nil)
	return holds.Result{HTTPStatus: http.StatusOK, Body: data, Answered: true}, true
}

func (s *Server) runHeld(ctx context.Context, c *call, h holds.Hold) (*result, *refusal.Error) {
	// A hold created while its session was being ended is never sent.
	if aerr := s.sessionRefusal(ctx, h.Caller.Session); aerr != nil {
		return nil, aerr
	}
	tool, ok := s.catalog.Tool(h.Tool)
	if !ok {
		return nil, refusal.New(http.StatusNotFound, refusal.UnknownTool, fmt.Sprintf("no tool is named %q any more", h.Tool))
	}
	agent := s.cfg.Agent(h.Caller.Agent)
	if agent == nil || !slices.Contains(agent.Connectors, tool.Connector) {
		return nil, refusal.New(http.StatusForbidden, refusal.NotGranted, fmt.Sprintf("agent %q is not granted connector %q", h.Caller.Agent, tool.Connector))
	}
	c.connector = tool.Connector
	up := s.catalog.connectors[tool.Connector]
	args, err := connectors.DecodeArgs(h.Args)
	if err != nil {
		return nil, refusal.New(http.StatusBadRequest, refusal.SchemaViolation, "stored arguments: "+err.Error())
	}
	req, err := http.NewRequestWithContext(ctx, h.Request.Method, h.Request.URL, bytes.NewReader(h.Request.Body))
	if err != nil {
		return nil, refusal.New(http.StatusBadGateway, refusal.UpstreamError, "the stored request cannot be rebuilt").Wrap(err)
	}
	if len(h.Request.Body) == 0 {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	req.Header = http.Header(h.Request.Headers).Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	c.destHost = req.URL.Hostname()
	in := toolInput(c.caller.Sandbox, c.caller.Agent, c.caller.Session, c.caller.User, tool, &args, req, time.Now().UTC())
	c.decision, c.decided = s.Decide(ctx, in), true
	if c.decision.Action == policy.Block {
		msg := "blocked by policy (evaluated again at approval)"
		if c.decision.Reason != "" {
			msg += ": " + c.decision.Reason
		}
		return nil, refusal.New(http.StatusForbidden, refusal.PolicyBlock, msg)
	}
	// Ask again is fine: a person approved exactly this request.
	//
	// An idempotency-keyed operation is sent with the key: the agent's own
	// value when the approved request has one, else the hold's ID. The ID
	// is stable and stored, so a re-send after a crash carries the same key
	// and the upstream answers it with its first reply instead of acting
	// twice. It is added after the decision, which saw the request exactly
	// as it was approved.
	if hk := h.IdempotencyHeader; hk != "" && req.Header.Get(hk) == "" {
		req.Header.Set(hk, h.ID)
	}
	scr, aerr := s.credential(ctx, c, tool, up, req)
	if aerr != nil {
		return nil, aerr
	}
	return s.send(ctx, c, up, req, scr)
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
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err == nil && len(bytes.TrimSpace(body)) > 0 {
			err = json.Unmarshal(body, &in)
		}
		if err != nil {
			refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, `want {"reason": "...", "always": false, "ttl": "8h"}`), refusal.NewRequestID())
			return
		}
		if (in.Always || in.TTL != "") && !approve {
			refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, "always and ttl apply only to approve"), refusal.NewRequestID())
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
			h, g, err = s.holds.ApproveAlways(r.Context(), r.PathValue("id"), p, in.Reason, ttl)
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
