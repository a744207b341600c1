// Package hosted is the door of hosted sandboxes (gateway.hosted):
// sandboxes on hosts without sandboxd (E2B, Daytona, Modal) reach the
// gateway over TLS with a per-run token the platform mints here (POST
// /api/v1/sessions/{session}/tokens, MintToken, which the admin listener
// serves). The listener (ingress.ListenHosted) only establishes identity
// from the token, through the hooks this door gives it, and hands the
// connection to the sandbox socket's own server: the forward proxy,
// CONNECT, the tool API and their audit are the ones every relayed
// sandbox gets.
//
// A token is bound to its session: the one session-end path records the
// end in the store, which check reads (Deps.Ended) for every new
// connection, and closes the session's open connections, hosted ones
// included (sessions.Conns). Replicas accept each other's tokens by
// sharing gateway.hosted.token_key_file; nothing is stored per token.
//
// The door decides nothing about a call and reaches nothing of the
// pipeline: New is handed what it reads and writes (Deps).
package hosted

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/ident"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/runtoken"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Host is the host field of a hosted sandbox's identity: there is no
// sandboxd host to name, and the per-sandbox connection cap keys on it.
const Host = "hosted"

// maxMintBytes bounds a mint request's body.
const maxMintBytes = 4 << 10

// AppendFunc is the gateway's one audit write (detached from the
// caller's context, with its own deadline); written: the record need
// only reach the file, a later one's sync makes it durable.
type AppendFunc = func(ctx context.Context, rec audit.Record, written bool) (audit.Record, error)

// Deps are what the door reads and writes; the root fills them.
type Deps struct {
	Config *config.Config
	Log    *slog.Logger
	// Ended says whether a session has ended (the store's); an error
	// refuses the token or the mint: fail closed.
	Ended func(ctx context.Context, session string) (bool, error)
	// Append audits refusals and mints.
	Append AppendFunc
	// Narrowing refuses, and audits through appendRec, a minted egress
	// narrowing that names a host its agent's allowlist does not cover
	// (egress.CheckNarrowing: a narrowing never widens).
	Narrowing func(ctx context.Context, appendRec AppendFunc, rid string, id wire.Identity, allow []string) *refusal.Error
	// Unaudited counts a refusal past its address's budget; nil: none.
	Unaudited func()
}

// Door is the hosted sandboxes' door: per-run tokens, their listener's
// checks and the mint.
type Door struct {
	d Deps

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

// New makes the door; Serve opens its listener.
func New(d Deps) *Door {
	if d.Unaudited == nil {
		d.Unaudited = func() {}
	}
	return &Door{d: d}
}

// Serve loads the token key and opens gateway.hosted's listener into sl
// (a no-op without gateway.hosted). A key that cannot be loaded, or a
// certificate, refuses the start.
func (s *Door) Serve(sl *ingress.Listener) error {
	h := s.d.Config.Gateway.Hosted
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
	a, err := sl.ListenHosted(h.Listen, tcfg, ingress.HostedOptions{Check: s.check, Refused: s.refused, RefusalBudget: h.RefusalBudget,
		RefusalWindow: h.RefusalWindow.Std(), Summarised: s.summarised, Unaudited: s.d.Unaudited})
	if err != nil {
		return err
	}
	addr := a.String()
	s.addr.Store(&addr)
	s.d.Log.Info("hosted listener serving", "hosted", addr)
	return nil
}

// Addr is gateway.hosted's listener address once Ready, "" when off.
func (d *Door) Addr() string {
	if p := d.addr.Load(); p != nil {
		return *p
	}
	return ""
}

// check is the hosted listener's credential check: the token's MAC
// (constant time) and expiry, the Basic user naming the token's session,
// and the session not ended in the store (a store that cannot answer
// refuses: fail closed).
func (s *Door) check(ctx context.Context, session, token string) ingress.HostedVerdict {
	key := s.key.Load()
	if key == nil {
		return ingress.HostedVerdict{Refused: "hosted_off"}
	}
	c, err := key.Check(token, time.Now())
	var v ingress.HostedVerdict
	if c.Session != "" { // the MAC verified (an expired token's claims are authentic)
		v.ID = wire.Identity{Sandbox: c.Sandbox, Agent: c.Agent, Session: c.Session, User: c.User, Host: Host, Egress: c.Egress}
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
	ended, err := s.d.Ended(ctx, c.Session)
	if err != nil {
		s.d.Log.Error("hosted listener: whether the token's session ended cannot be read; refused", "session", c.Session, "err", err)
		v.Refused, v.Unavailable = "session_unavailable", true
		return v
	}
	if ended {
		v.Refused = "session_ended"
	}
	return v
}

// refused audits and logs one refused hosted connection or request.
// Neither the token nor the Basic user it came with is recorded (either
// may be the secret: a client can swap them); the identity is the
// token's claims, and only when its MAC verified.
func (s *Door) refused(r ingress.HostedRefusal) {
	rid := refusal.NewRequestID()
	fields := map[string]any{"reason": r.Reason, "remote": r.Remote, "method": r.Method, "status": r.Status, "transport": "hosted"}
	if r.Target != "" {
		fields["dest_host"] = r.Target
	}
	if r.ID.Session != "" {
		fields["sandbox"], fields["agent"], fields["session"], fields["user"], fields["token_id"] = r.ID.Sandbox, r.ID.Agent, r.ID.Session, r.ID.User, r.TokenID
	}
	if _, err := s.d.Append(context.Background(), audit.Record{RequestID: rid, Event: "hosted_token_refused", Fields: fields}, false); err != nil {
		s.d.Log.Error("hosted listener: refusal not audited", "request_id", rid, "err", err)
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
	s.d.Log.Warn("hosted listener: refused", "request_id", rid, "decision", "block", "reason", r.Reason, "remote", r.Remote,
		"agent", r.ID.Agent, "session", r.ID.Session, "dest_host", r.Target, "status", r.Status, "not_logged_since", quiet)
}

// summarised audits one source address's refusals past its budget
// in one window, as one record instead of each.
func (s *Door) summarised(h ingress.HostedSummary) {
	rid := refusal.NewRequestID()
	if _, err := s.d.Append(context.Background(), audit.Record{RequestID: rid, Event: "hosted_refusals_summarised", Fields: map[string]any{"remote": h.Remote,
		"unaudited": h.Unaudited, "from": h.From.UTC().Format(time.RFC3339), "to": h.To.UTC().Format(time.RFC3339), call.KeyListener: call.ListenerHosted}}, false); err != nil {
		s.d.Log.Error("hosted listener: refusal summary not audited", "request_id", rid, "err", err)
	}
	s.d.Log.Warn("hosted listener: refusals past the address's budget", "request_id", rid, "remote", h.Remote, "unaudited", h.Unaudited, "from", h.From.UTC())
}
