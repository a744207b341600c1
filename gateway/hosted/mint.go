package hosted

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/runtoken"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

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

// MintToken is POST /api/v1/sessions/{session}/tokens (admin.Deps.MintToken):
// a per-run token for one (agent, session, user), for a hosted sandbox.
// Only a machine caller (a token of gateway.session_tokens_sha256: the
// platform that starts the sandbox) may mint, which the admin API checked
// (by); an approver may not, since a token names the user a call acts for
// and a person who could mint one for someone else could approve that
// person's held calls. The token is refused for a session already ended;
// the mint is audited (session_token_minted, with the token's id, never
// the token).
func (s *Door) MintToken(w http.ResponseWriter, r *http.Request, rid, by string) {
	h, key := s.d.Config.Gateway.Hosted, s.key.Load()
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
		if !ident.ValidID(*v) {
			bad(k, fmt.Sprintf("must be 1..%d printable characters without spaces", ident.MaxLen))
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
	agent := s.d.Config.Agent(req.Agent)
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
		id := wire.Identity{Sandbox: req.Sandbox, Agent: req.Agent, Session: session, User: req.User, Host: Host, Egress: egress}
		if e := s.d.Narrowing(r.Context(), s.d.Append, rid, id, agent.Egress); e != nil {
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
	ended, err := s.d.Ended(r.Context(), session)
	if err != nil {
		s.d.Log.Error("sessions: mint: store", "session", session, "err", err)
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
		s.d.Log.Error("sessions: mint", "err", err)
		refusal.Write(w, refusal.New(http.StatusInternalServerError, refusal.BadRequest, "the token could not be made"), rid)
		return
	}
	claims, err := key.Check(string(tok), now)
	if err != nil {
		s.d.Log.Error("bug(): a token just minted does not verify", "err", err)
		refusal.Write(w, refusal.New(http.StatusInternalServerError, refusal.BadRequest, "the token could not be made"), rid)
		return
	}
	if _, err := s.d.Append(r.Context(), audit.Record{RequestID: rid, Event: "session_token_minted", Fields: map[string]any{
		"session": session, "agent": req.Agent, "user": req.User, "sandbox": req.Sandbox, "egress": egress, "by": by,
		"token_id": claims.Nonce, "expires": claims.ExpiresAt().UTC().Format(time.RFC3339), "transport": "hosted",
	}}, false); err != nil {
		s.d.Log.Error("sessions: mint not audited; no token given", "request_id", rid, "err", err)
		refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; nothing was minted"), rid)
		return
	}
	s.d.Log.Info("sessions: token minted", "request_id", rid, "session", session, "agent", req.Agent, "sandbox", req.Sandbox,
		"token_id", claims.Nonce, "expires", claims.ExpiresAt().UTC(), "by", by)
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"request_id": rid, "token": mintView{
		Token: runtokenJSON(tok), Session: session, Agent: req.Agent, User: req.User, Sandbox: req.Sandbox, Egress: egress,
		TokenID: claims.Nonce, Expires: claims.ExpiresAt().UTC(),
	}})
}

// Problems is `sluice validate`'s check of gateway.hosted: the
// certificate loads, an existing token key is usable (a missing one is
// made at first start; nothing is created here), and someone can mint.
func Problems(cfg *config.Config) []error {
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
