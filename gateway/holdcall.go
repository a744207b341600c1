package gateway

import (
	"bytes"
	"context"
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
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/catalog"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/connections"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/policylife"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/review"
	"github.com/sluice-gw/sluice/gateway/storecheck"
	"github.com/sluice-gw/sluice/gateway/tracing"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// maxPollWait bounds GET /v1/holds/{id}?wait=.
const maxPollWait = 5 * time.Minute

// holdCall holds an ask call: it persists the canonical request (taken
// before any credential is attached), waits up to the hold wait for a
// decision and answers with the outcome or the pending hold. Any failure
// to hold is 503 approval_unavailable: an ask is never allowed by
// accident.
func (s *Server) holdCall(ctx context.Context, c *toolCall, tool *connectors.Tool, args *connectors.Args, req *http.Request) (call.Outcome, *refusal.Error) {
	if !s.approvalsEnabled() {
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "this call needs approval and no approval service is running; it was not sent")
	}
	hctx := s.tel.stage(c, stageHold) // the hold's creation and its wait (calltrace.go)
	if len(c.decision.Approvers) == 0 {
		// Nobody could approve it: holding it would only make it expire.
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "this call needs approval and its rule names no approvers; it was not sent")
	}
	hr, err := c.holdRequest(req)
	if err != nil {
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the call could not be held; it was not sent").Wrap(err)
	}
	argDoc, err := json.Marshal(args)
	if err != nil {
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the call could not be held; it was not sent").Wrap(err)
	}
	// A call that names its hold is a re-send of it: it must be the very
	// request that was (or will be) approved (THREATS E4).
	if id := c.req.HoldID; id != "" {
		h, err := s.holds.Get(ctx, id)
		if err != nil || !sameCaller(h.Caller, c.caller()) || h.Tool != tool.Name {
			return call.Outcome{}, refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold")
		}
		if h.SHA256 != hr.Hash() {
			return call.Outcome{}, refusal.New(http.StatusConflict, refusal.ArgsMismatch, "the arguments differ from the held call's; the approval covers only the request it was given for")
		}
		c.holdID = h.ID
		return s.awaitHold(ctx, c, h.ID)
	}
	// The hold_created record carries the decision; a failure to hold is
	// audited as the call's decision with its refusal code.
	cred := ""
	if up := s.catalog.Upstream(tool.Connector); up != nil && up.Config.Credential != nil {
		cred = creds.Label(up.Config.Credential)
	}
	h, _, err := s.holds.Create(ctx, holds.Hold{
		Tool: tool.Name, OpSummary: tool.Summary, Args: argDoc, Request: hr, Credential: cred,
		Caller:    holds.Caller{Sandbox: c.rec.Sandbox, Agent: c.rec.Agent, Session: c.rec.Session, User: c.rec.User, Egress: c.rec.Egress},
		Approvers: slices.Clone(c.decision.Approvers), Rule: c.decision.Rule, Reason: c.decision.Reason,
		Expires: time.Now().UTC().Add(s.holdTTL(c.decision.Rule)), RequestID: c.rec.RequestID,
		IdempotencyHeader: tool.IdempotencyHeader, Deferred: c.req.Mode == call.Decide,
		Recorded:    c.inputFields(), // recordinput.go
		TraceParent: tracing.Traceparent(hctx),
	})
	switch {
	case errors.Is(err, holds.ErrTooManyForSandbox):
		return call.Outcome{}, refusal.New(http.StatusTooManyRequests, refusal.TooManyHolds, fmt.Sprintf("this sandbox has %d calls waiting for approval, its share of its agent's %d (gateway.max_pending_holds_per_sandbox); wait for decisions", s.holds.MaxPendingPerSandbox(), s.cfg.Gateway.MaxPendingHolds))
	case errors.Is(err, holds.ErrTooMany):
		return call.Outcome{}, refusal.New(http.StatusTooManyRequests, refusal.RateLimited, fmt.Sprintf("this agent has %d calls waiting for approval; wait for decisions", s.cfg.Gateway.MaxPendingHolds))
	case errors.Is(err, holds.ErrAudit):
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; the call was not held and not sent").Wrap(err)
	case storecheck.Refusal(err) != nil:
		return call.Outcome{}, storecheck.Refusal(err)
	case err != nil:
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the call could not be held for approval; it was not sent").Wrap(err)
	}
	c.holdID = h.ID
	return s.awaitHold(ctx, c, h.ID)
}

// holdRequest is the request a hold (or a grant) is bound to: the
// canonical request as it would be sent, before the credential. A call
// the gateway only decides is bound to its method, URL and body: the
// proxy that sends it adds headers of its own.
func (c *toolCall) holdRequest(req *http.Request) (holds.Request, error) {
	hr, err := canonicalRequest(req)
	if c.req.Mode == call.Decide {
		hr.Headers = nil
	}
	return hr, err
}

// releaseHold lets a decided-only call through when a person approved a
// hold of exactly this request for this caller (identity, tool, method,
// URL, body: the hold's hash), once: of two matching calls one is
// released. The release is audited before the call goes on.
func (s *Server) releaseHold(ctx context.Context, c *toolCall, tool *connectors.Tool, req *http.Request) (bool, *refusal.Error) {
	if s.holds == nil {
		return false, nil
	}
	hr, err := c.holdRequest(req)
	if err != nil {
		return false, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the call could not be matched to its approval").Wrap(err)
	}
	h, ok, err := s.holds.FindApproved(ctx, holds.Caller{Sandbox: c.rec.Sandbox, Agent: c.rec.Agent, Session: c.rec.Session, User: c.rec.User, Egress: c.rec.Egress}, tool.Name, hr.Hash())
	if err != nil {
		return false, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the approvals cannot be read").Wrap(err)
	}
	if !ok {
		return false, nil
	}
	if time.Now().After(h.Expires) {
		// Approved but not sent again in time: the approval lapses and
		// this request is held anew.
		if err := s.holds.ExpireApproved(ctx, h); err != nil {
			return false, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the approvals cannot be updated").Wrap(err)
		}
		return false, nil
	}
	released, err := s.holds.Release(ctx, h, c.rec.RequestID)
	switch {
	case errors.Is(err, holds.ErrAudit):
		return false, refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; the approved call was not let through").Wrap(err)
	case err != nil:
		return false, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the approval could not be used").Wrap(err)
	}
	return released, nil
}

// awaitHold waits up to the call's hold wait for the hold to be decided,
// reporting progress if the door asked for it, and answers with the
// hold's state then.
func (s *Server) awaitHold(ctx context.Context, c *toolCall, id string) (call.Outcome, *refusal.Error) {
	bound := c.req.HoldWait
	if bound == 0 {
		bound = s.cfg.Gateway.HoldWait.Std()
	}
	bound = max(bound, 0)
	h, err := s.waitHold(ctx, id, bound, c.req.Progress, c.req.ProgressEvery)
	if e := storecheck.Refusal(err); e != nil {
		return call.Outcome{}, e
	}
	if err != nil {
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the hold could not be read").Wrap(err)
	}
	return holdOutcome(h), nil
}

// waitHold waits up to bound for the hold to be terminal and returns it as
// it is then. With progress, it reports at once and every every.
func (s *Server) waitHold(ctx context.Context, id string, bound time.Duration, progress func(call.Progress), every time.Duration) (holds.Hold, error) {
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if progress == nil {
		return s.holds.Wait(wctx, id)
	}
	if every <= 0 {
		every = time.Second
	}
	start := time.Now()
	progress(call.Progress{Hold: id, Bound: bound})
	for {
		sctx, scancel := context.WithTimeout(wctx, every)
		h, err := s.holds.Wait(sctx, id)
		scancel()
		if err != nil || h.Status.Terminal() || wctx.Err() != nil {
			return h, err
		}
		progress(call.Progress{Hold: id, Waited: time.Since(start), Bound: bound})
	}
}

// holdOutcome is what a call gets for a hold in its state: the pending
// hold, the stored answer once it ran, or the refusal it ended in.
func holdOutcome(h holds.Hold) call.Outcome {
	o := call.Outcome{Hold: &call.Hold{ID: h.ID, State: string(h.Status), Expires: h.Expires, Poll: "/v1/holds/" + h.ID, RequestID: h.RequestID, Tool: h.Tool}}
	refused := func(status int, code refusal.Code, msg string) call.Outcome {
		o.Status, o.Refusal = status, refusal.New(status, code, msg)
		return o
	}
	switch h.Status {
	case holds.Done, holds.Failed:
		if h.Result != nil {
			o.Status, o.Answer = h.Result.HTTPStatus, h.Result.Body
			return o
		}
		return refused(http.StatusBadGateway, refusal.UpstreamError, "the approved call failed and left no result")
	case holds.Denied:
		msg := "denied by " + h.DecidedBy
		if h.DecisionReason != "" {
			msg += ": " + h.DecisionReason
		}
		return refused(http.StatusForbidden, refusal.ApprovalDenied, msg)
	case holds.Expired:
		return refused(http.StatusForbidden, refusal.ApprovalExpired, "no one decided this call before it expired; it was not sent")
	case holds.Unknown:
		return refused(http.StatusBadGateway, refusal.UpstreamError, "the gateway stopped while sending this approved call; its outcome is unknown and it is not re-sent")
	}
	o.Status = http.StatusAccepted
	return o
}

// Poll answers a caller about one of its holds, waiting up to wait (at
// most maxPollWait) for it to be decided: the same outcomes a held call
// gets. Only the caller the hold is for sees it; for anyone else it does
// not exist.
func (s *Server) Poll(ctx context.Context, id wire.Identity, hold string, wait time.Duration) call.Outcome {
	rid := refusal.NewRequestID()
	refused := func(e *refusal.Error) call.Outcome { return call.Outcome{RequestID: rid, Status: e.Status, Refusal: e} }
	if s.holds == nil {
		return refused(refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold"))
	}
	id, e := canonicalCaller(id)
	if e != nil {
		return refused(e)
	}
	h, err := s.holds.Get(ctx, hold)
	if errors.Is(err, holds.ErrNotFound) || (err == nil && !sameCaller(h.Caller, policy.Caller{Sandbox: id.Sandbox, Agent: id.Agent, Session: id.Session, User: id.User})) {
		return refused(refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold"))
	}
	if e := storecheck.Refusal(err); e != nil {
		return refused(e)
	}
	if err != nil {
		return refused(refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the hold could not be read"))
	}
	if wait = min(wait, maxPollWait); wait > 0 && !h.Status.Terminal() {
		if h, err = s.waitHold(ctx, h.ID, wait, nil, 0); err != nil {
			return refused(refusal.New(http.StatusServiceUnavailable, refusal.ApprovalUnavailable, "the hold could not be read"))
		}
	}
	o := holdOutcome(h)
	o.RequestID = rid
	return o
}

// executeHold runs an approved hold through the pipeline (run, with the
// hold): the policy is evaluated again with the stored input, the
// credential is attached now, and exactly the stored request is sent,
// once. The result is the answer the agent's call gets. The holds
// manager also re-sends an idempotency-keyed hold through here after a
// crash left its outcome unknown (THREATS G2).
func (s *Server) executeHold(ctx context.Context, h holds.Hold) (holds.Result, bool) {
	if h.Deferred {
		// The gateway never sends a request it only decided: its sender
		// re-sends it, and releaseHold lets it through.
		return holds.Result{HTTPStatus: http.StatusInternalServerError, Body: []byte(`{"error":{"code":"internal","message":"bug: a deferred hold is never executed by the gateway"}}`)}, false
	}
	o, c := s.run(ctx, call.Request{RequestID: h.RequestID}, &h)
	if o.Refusal != nil {
		var b refusal.Body
		b.Error.Code, b.Error.Message, b.Error.RequestID = o.Refusal.Code, o.Refusal.Message, o.RequestID
		data, _ := json.Marshal(b)
		return holds.Result{HTTPStatus: o.Refusal.Status, Body: data, Answered: c.answered, Receipt: s.receipt(h, c)}, false
	}
	data, err := json.Marshal(replyBody(o))
	if err != nil {
		return holds.Result{HTTPStatus: http.StatusInternalServerError, Body: []byte(`{"error":{"code":"internal","message":"bug: response not encodable"}}`), Answered: true}, false
	}
	return holds.Result{HTTPStatus: http.StatusOK, Body: data, Answered: true, Receipt: s.receipt(h, c)}, true
}

// receipt signs the receipt of an approved hold's execution c (nil: it
// was not executed).
func (s *Server) receipt(h holds.Hold, c *toolCall) []byte {
	if c == nil {
		return nil
	}
	return s.life.Receipt(h, policylife.Execution{Answered: c.answered, Decision: c.decision,
		UpstreamStatus: c.rec.UpstreamStatus, Credential: c.rec.Credential, LeaseID: c.leaseID})
}

// storedRequest rebuilds an approved hold's request exactly as stored.
func storedRequest(ctx context.Context, h *holds.Hold) (*connectors.Args, *http.Request, *refusal.Error) {
	args, err := connectors.DecodeArgs(h.Args)
	if err != nil {
		return nil, nil, refusal.New(http.StatusBadRequest, refusal.SchemaViolation, "stored arguments: "+err.Error())
	}
	req, err := http.NewRequestWithContext(ctx, h.Request.Method, h.Request.URL, bytes.NewReader(h.Request.Body))
	if err != nil {
		return nil, nil, refusal.New(http.StatusBadGateway, refusal.UpstreamError, "the stored request cannot be rebuilt").Wrap(err)
	}
	if len(h.Request.Body) == 0 {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	req.Header = http.Header(h.Request.Headers).Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	return &args, req, nil
}

// sameCaller says whether a hold is the caller's.
func sameCaller(h holds.Caller, c policy.Caller) bool {
	return h.Sandbox == c.Sandbox && h.Agent == c.Agent && h.Session == c.Session && h.User == c.User
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
			_, err := s.audit.append(ctx, audit.Record{RequestID: refusal.NewRequestID(), Event: event, Fields: fields}, false)
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
	opt.Sessions = s.store // sign-ins shared by the replicas sharing the store
	if s.oauth != nil && len(s.oauth.PersonClients()) > 0 {
		opt.Connections = connections.Page{M: s.oauth, OnConnect: s.connectHeld} // below
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
		s.tel.Approval.WithLabelValues(d).Observe(h.Decided.Sub(h.Created).Seconds())
	}
	_, err := s.audit.append(ctx, audit.Record{RequestID: h.RequestID, Event: event, Fields: f}, false)
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

// OAuth returns the OAuth manager of the credential.oauth2 connectors,
// nil without any (tests, and embedders that drop its cache on reload).
func (s *Server) OAuth() *oauth.Manager { return s.oauth }

// connectionApprover is the approver a call held for a connection names:
// only the connect of that connector by the call's person approves it.
func connectionApprover(connector string) string { return "connection:" + connector }

// holdForConnection holds a call to a credential.oauth2 connector with
// on_missing: hold whose person has no usable connection: like an ask,
// until they connect (connectHeld approves it then and it is sent once),
// or until the hold expires. held is false when the call goes on to the
// credential stage (connected, refuse mode, an approved hold's execution,
// a decided-only call, no person).
func (s *Server) holdForConnection(ctx context.Context, c *toolCall, tool *connectors.Tool, up *catalog.Upstream, args *connectors.Args, req *http.Request) (o call.Outcome, e *refusal.Error, held bool) {
	if up.OAuth == nil || up.Config.Credential.OAuth2.OnMissing != "hold" || c.held != nil || c.req.Mode == call.Decide || c.rec.User == "" || s.oauth == nil {
		return call.Outcome{}, nil, false
	}
	conn, err := s.oauth.Get(ctx, tool.Connector, c.rec.User)
	if err != nil {
		return call.Outcome{}, refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the OAuth connection for this connector cannot be read").Wrap(err), true
	}
	if conn.Status == oauth.Connected {
		return call.Outcome{}, nil, false
	}
	c.decision.Approvers = []string{connectionApprover(tool.Connector)}
	c.decision.Reason = fmt.Sprintf("waiting for %s to connect %s at %s (%s)", c.rec.User, tool.Connector, connections.URL(s.cfg.Approvals.PublicURL)(tool.Connector), conn.Status)
	o, e = s.holdCall(ctx, c, tool, args, req)
	return o, e, true
}

// connectHeld sends, once each, the calls held for user's connection of
// connector (approved as connectionApprover, through the same execution
// as any approval).
func (s *Server) connectHeld(connector, user string) {
	s.catalog.Kick(connector) // a remote MCP server's listing may have waited for a connection
	ctx := context.Background()
	hs, err := s.holds.List(ctx, holds.Filter{Status: []holds.Status{holds.Pending}, User: user, Limit: 1000})
	if err != nil {
		s.log.Error("oauth: held calls not released after a connect", "connector", connector, "user", user, "err", err)
		return
	}
	who := holds.Person{Name: connectionApprover(connector)}
	for _, h := range hs {
		if len(h.Approvers) != 1 || h.Approvers[0] != who.Name || !ident.Same(h.Caller.User, user) {
			continue
		}
		if _, err := s.holds.Approve(ctx, h.ID, who, user+" connected "+connector); err != nil {
			s.log.Warn("oauth: held call not released", "hold", h.ID, "err", err)
		}
	}
}
