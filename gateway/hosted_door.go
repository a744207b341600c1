package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/gateway/admin"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	rawegress "github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/runtoken"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"go.opentelemetry.io/otel/metric"
)

// Hosted sandboxes (gateway.hosted): sandboxes on hosts without sandboxd
// (E2B, Daytona, Modal) reach the gateway over TLS with a per-run token
// the platform mints here (POST /api/v1/sessions/{session}/tokens). The
// listener (ingress.ListenHosted) only establishes identity from the
// token and hands the connection to the sandbox socket's own server: the
// forward proxy, CONNECT, the tool API and their audit are the ones every
// relayed sandbox gets.
//
// A token is bound to its session: the one session-end path
// (handleEndSession) records the end in the store, which checkHosted reads
// for every new connection, and closes the session's open connections,
// hosted ones included (sessionConns). Replicas accept each other's
// tokens by sharing gateway.hosted.token_key_file; nothing is stored per
// token.

// HostedHost is the host field of a hosted sandbox's identity: there is
// no sandboxd host to name, and the per-sandbox connection cap keys on it.
const HostedHost = "hosted"

// maxMintBytes bounds a mint request's body.
const maxMintBytes = 4 << 10

// hostedDoor is the hosted sandboxes' door: per-run tokens, their
// listener and the mint. New gives it what it reads.
type hostedDoor struct {
	cfg   *config.Config
	log   *slog.Logger
	store *store.Store // whether a token's session ended
	audit auditLog     // refusals and mints are audited

	unaudited metric.Int64Counter // refusals past their address's budget

	key  atomic.Pointer[runtoken.Key] // loaded at Serve (nil: gateway.hosted off, or not serving yet)
	addr atomic.Pointer[string]       // the listener's address once listening

	// Refusals of credentials that name nobody (no token, or none whose
	// MAC verified) are each audited, but logged at most once a second,
	// the next line counting those left out: the listener may face more
	// than sandboxes, and junk must not flood the log. A refusal of a real
	// token (expired, ended, another session's, changed) is always logged.
	anonLast  atomic.Int64 // unix second of the last logged anonymous refusal
	anonQuiet atomic.Int64 // anonymous refusals not logged since
}

// serveHosted loads the token key and opens gateway.hosted's listener into
// sl (a no-op without gateway.hosted). A key that cannot be loaded, or a
// certificate, refuses the start.
func (s *hostedDoor) serveHosted(sl *ingress.Listener) error {
	h := s.cfg.Gateway.Hosted
	if h == nil {
		return nil
	}
	key, err := runtoken.LoadKey(h.TokenKeyFile, true)
	if err != nil {
		return fmt.Errorf("gateway.hosted.token_key_file: %w", err)
	}
	tcfg, err := ingress.HostedTLSConfig(h)
	if err != nil {
		return err
	}
	s.key.Store(key)
	a, err := sl.ListenHosted(h.Listen, tcfg, ingress.HostedOptions{Check: s.checkHosted, Refused: s.hostedRefused, RefusalBudget: h.RefusalBudget,
		RefusalWindow: h.RefusalWindow.Std(), Summarised: s.hostedSummarised, Unaudited: func() { s.unaudited.Add(context.Background(), 1) }})
	if err != nil {
		return err
	}
	addr := a.String()
	s.addr.Store(&addr)
	s.log.Info("hosted listener serving", "hosted", addr)
	return nil
}

// Addr is gateway.hosted's listener address once Ready, "" when off.
func (d *hostedDoor) Addr() string {
	if p := d.addr.Load(); p != nil {
		return *p
	}
	return ""
}

// checkHosted is the hosted listener's credential check: the token's MAC
// (constant time) and expiry, the Basic user naming the token's session,
// and the session not ended in the store (a store that cannot answer
// refuses: fail closed).
func (s *hostedDoor) checkHosted(ctx context.Context, session, token string) ingress.HostedVerdict {
	key := s.key.Load()
	if key == nil {
		return ingress.HostedVerdict{Refused: "hosted_off"}
	}
	c, err := key.Check(token, time.Now())
	var v ingress.HostedVerdict
	if c.Session != "" { // the MAC verified (an expired token's claims are authentic)
		v.ID = wire.Identity{Sandbox: c.Sandbox, Agent: c.Agent, Session: c.Session, User: c.User, Host: HostedHost, Egress: c.Egress}
		v.TokenID, v.Expires = c.Nonce, c.ExpiresAt()
	}
	if err != nil {
		var te *runtoken.Error
		v.Refused = "malformed"
		if errors.As(err, &te) {
			v.Refused = string(te.Reason)
		}
		return v
	}
	if cs, err := ident.Canonical(session); err != nil || cs != c.Session {
		v.Refused = "session_mismatch" // the Basic user must name the token's session
		return v
	}
	ended, err := s.store.SessionEnded(ctx, c.Session)
	if err != nil {
		s.log.Error("hosted listener: whether the token's session ended cannot be read; refused", "session", c.Session, "err", err)
		v.Refused, v.Unavailable = "session_unavailable", true
		return v
	}
	if ended {
		v.Refused = "session_ended"
	}
	return v
}

// hostedRefused audits and logs one refused hosted connection or request.
// Neither the token nor the Basic user it came with is recorded (either
// may be the secret: a client can swap them); the identity is the
// token's claims, and only when its MAC verified.
func (s *hostedDoor) hostedRefused(r ingress.HostedRefusal) {
	rid := refusal.NewRequestID()
	fields := map[string]any{"reason": r.Reason, "remote": r.Remote, "method": r.Method, "status": r.Status, "transport": "hosted"}
	if r.Target != "" {
		fields["dest_host"] = r.Target
	}
	if r.ID.Session != "" {
		fields["sandbox"], fields["agent"], fields["session"], fields["user"], fields["token_id"] = r.ID.Sandbox, r.ID.Agent, r.ID.Session, r.ID.User, r.TokenID
	}
	if _, err := s.audit.append(context.Background(), audit.Record{RequestID: rid, Event: "hosted_token_refused", Fields: fields}, false); err != nil {
		s.log.Error("hosted listener: refusal not audited", "request_id", rid, "err", err)
	}
	quiet := int64(0)
	if r.ID.Session == "" {
		now, last := time.Now().Unix(), s.anonLast.Load()
		if now == last || !s.anonLast.CompareAndSwap(last, now) {
			s.anonQuiet.Add(1)
			return
		}
		quiet = s.anonQuiet.Swap(0)
	}
	s.log.Warn("hosted listener: refused", "request_id", rid, "decision", "block", "reason", r.Reason, "remote", r.Remote,
		"agent", r.ID.Agent, "session", r.ID.Session, "dest_host", r.Target, "status", r.Status, "not_logged_since", quiet)
}

// hostedSummarised audits one source address's refusals past its budget
// in one window, as one record instead of each.
func (s *hostedDoor) hostedSummarised(h ingress.HostedSummary) {
	rid := refusal.NewRequestID()
	if _, err := s.audit.append(context.Background(), audit.Record{RequestID: rid, Event: "hosted_refusals_summarised", Fields: map[string]any{"remote": h.Remote,
		"unaudited": h.Unaudited, "from": h.From.UTC().Format(time.RFC3339), "to": h.To.UTC().Format(time.RFC3339), call.KeyListener: call.ListenerHosted}}, false); err != nil {
		s.log.Error("hosted listener: refusal summary not audited", "request_id", rid, "err", err)
	}
	s.log.Warn("hosted listener: refusals past the address's budget", "request_id", rid, "remote", h.Remote, "unaudited", h.Unaudited, "from", h.From.UTC())
}

// mintRequest is the body of POST /api/v1/sessions/{session}/tokens.
type mintRequest struct {
	Agent   string   `json:"agent"`
	User    string   `json:"user"`
	Sandbox string   `json:"sandbox"` // default: the session
	TTL     string   `json:"ttl"`     // Go duration; default 1h, at most gateway.hosted.max_token_ttl
	Egress  []string `json:"egress"`  // narrows the agent's egress allowlist for this run (as sandboxd --egress)
}

// mintView is its answer. Token is the secret: this answer is the only
// place it ever appears.
type mintView struct {
	Token   runtokenJSON `json:"token"`
	Session string       `json:"session"`
	Agent   string       `json:"agent"`
	User    string       `json:"user,omitempty"`
	Sandbox string       `json:"sandbox"`
	Egress  string       `json:"egress,omitempty"`
	TokenID string       `json:"token_id"`
	Expires time.Time    `json:"expires"`
}

// runtokenJSON marshals a token's value (a runtoken.Token prints as
// [redacted] everywhere else).
type runtokenJSON runtoken.Token

func (t runtokenJSON) MarshalJSON() ([]byte, error) { return json.Marshal(string(t)) }

// DefaultMintTTL is a minted token's lifetime when the request names none.
const DefaultMintTTL = time.Hour

// mintToken is POST /api/v1/sessions/{session}/tokens (admin.Deps.MintToken):
// a per-run token for one (agent, session, user), for a hosted sandbox.
// Only a machine caller (a token of gateway.session_tokens_sha256: the
// platform that starts the sandbox) may mint, which the admin API checked
// (by); an approver may not, since a token names the user a call acts for
// and a person who could mint one for someone else could approve that
// person's held calls. The token is refused for a session already ended;
// the mint is audited (session_token_minted, with the token's id, never
// the token).
func (s *hostedDoor) mintToken(w http.ResponseWriter, r *http.Request, rid, by string) {
	h, key := s.cfg.Gateway.Hosted, s.key.Load()
	if h == nil || key == nil {
		refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "hosted sandboxes are off: set gateway.hosted"), rid)
		return
	}
	bad := func(key, msg string) {
		refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, key+": "+msg), rid)
	}
	var req mintRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxMintBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		bad("body", "want one JSON object {agent, user, sandbox, ttl}: "+err.Error())
		return
	}
	session := r.PathValue("session")
	ids := map[string]*string{"session": &session, "agent": &req.Agent, "user": &req.User, "sandbox": &req.Sandbox}
	for _, k := range []string{"session", "agent", "user", "sandbox"} {
		v := ids[k]
		if k == "sandbox" && *v == "" {
			*v = session // canonical by now
		}
		if *v == "" && k == "user" {
			continue
		}
		if !admin.ValidSessionID(*v) {
			bad(k, fmt.Sprintf("must be 1..%d printable characters without spaces", admin.MaxSessionIDLen))
			return
		}
		if k == "session" || k == "user" { // canonical, as the preamble's are (canonicalIdentity)
			c, err := ident.Canonical(*v)
			if err != nil {
				bad(k, "ambiguous: "+err.Error())
				return
			}
			*v = c
		}
	}
	agent := s.cfg.Agent(req.Agent)
	if agent == nil {
		bad("agent", fmt.Sprintf("%q is not in agents[]", req.Agent))
		return
	}
	egress := ""
	if req.Egress != nil {
		var err error
		if egress, err = wire.FormatEgress(req.Egress); err != nil {
			bad("egress", err.Error())
			return
		}
		// A narrowing never widens: refused (and audited) as sandboxd's is.
		id := wire.Identity{Sandbox: req.Sandbox, Agent: req.Agent, Session: session, User: req.User, Host: HostedHost, Egress: egress}
		if e := rawegress.CheckNarrowing(r.Context(), s.audit.append, rid, id, agent.Egress); e != nil {
			refusal.Write(w, e, rid)
			return
		}
	}
	ttl := DefaultMintTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil {
			bad("ttl", "want a duration such as 1h: "+err.Error())
			return
		}
		ttl = d
	}
	if ttl < time.Second || ttl > h.MaxTokenTTL.Std() {
		bad("ttl", fmt.Sprintf("must be between 1s and gateway.hosted.max_token_ttl (%s)", h.MaxTokenTTL.Std()))
		return
	}
	ended, err := s.store.SessionEnded(r.Context(), session)
	if err != nil {
		s.log.Error("sessions: mint: store", "session", session, "err", err)
		refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.SessionUnavailable, "whether the session has ended cannot be read; nothing was minted"), rid)
		return
	}
	if ended {
		refusal.Write(w, refusal.New(http.StatusConflict, refusal.SessionEnded, "this session has ended; a token for it would be refused"), rid)
		return
	}
	now := time.Now()
	c := runtoken.Claims{Sandbox: req.Sandbox, Agent: req.Agent, Session: session, User: req.User, Egress: egress, Issued: now.Unix(), Expires: now.Add(ttl).Unix()}
	tok, err := key.Mint(c)
	if err != nil {
		s.log.Error("sessions: mint", "err", err)
		refusal.Write(w, refusal.New(http.StatusInternalServerError, refusal.BadRequest, "the token could not be made"), rid)
		return
	}
	claims, err := key.Check(string(tok), now)
	if err != nil {
		s.log.Error("bug(): a token just minted does not verify", "err", err)
		refusal.Write(w, refusal.New(http.StatusInternalServerError, refusal.BadRequest, "the token could not be made"), rid)
		return
	}
	if _, err := s.audit.append(r.Context(), audit.Record{RequestID: rid, Event: "session_token_minted", Fields: map[string]any{
		"session": session, "agent": req.Agent, "user": req.User, "sandbox": req.Sandbox, "egress": egress, "by": by,
		"token_id": claims.Nonce, "expires": claims.ExpiresAt().UTC().Format(time.RFC3339), "transport": "hosted",
	}}, false); err != nil {
		s.log.Error("sessions: mint not audited; no token given", "request_id", rid, "err", err)
		refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; nothing was minted"), rid)
		return
	}
	s.log.Info("sessions: token minted", "request_id", rid, "session", session, "agent", req.Agent, "sandbox", req.Sandbox,
		"token_id", claims.Nonce, "expires", claims.ExpiresAt().UTC(), "by", by)
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"request_id": rid, "token": mintView{
		Token: runtokenJSON(tok), Session: session, Agent: req.Agent, User: req.User, Sandbox: req.Sandbox, Egress: egress,
		TokenID: claims.Nonce, Expires: claims.ExpiresAt().UTC(),
	}})
}

// hostedProblems is `sluice validate`'s check of gateway.hosted: the
// certificate loads, an existing token key is usable (a missing one is
// made at first start; nothing is created here), and someone can mint.
func hostedProblems(cfg *config.Config) []error {
	h := cfg.Gateway.Hosted
	if h == nil {
		return nil
	}
	var errs []error
	if _, err := ingress.HostedTLSConfig(h); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat(h.TokenKeyFile); err == nil {
		if _, err := runtoken.LoadKey(h.TokenKeyFile, false); err != nil {
			errs = append(errs, fmt.Errorf("gateway.hosted.token_key_file: %w", err))
		}
	}
	if len(cfg.Gateway.SessionTokensSHA256) == 0 {
		errs = append(errs, errors.New("gateway.session_tokens_sha256: empty, so with gateway.hosted nobody can mint a per-run token (only a machine caller may)"))
	}
	return errs
}
