// Package gateway is sluice's gateway: the sandbox-side listener with its
// identity preamble, the tool-call pipeline (identify → tool → validate →
// decide → credential → guarded dial → scrub → audit → respond) and the
// admin listener with health, readiness and metrics.
//
// gateway composes the leaf packages (connectors, policy, vault, and its own
// guard, audit, scrub and store) through the small interfaces it declares
// here; only cmd/sluice wires a Server from a configuration.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/admin"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/catalog"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/connections"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/gateway/extauthz"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/h1"
	"github.com/sluice-gw/sluice/gateway/heads"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/hosted"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/limits"
	"github.com/sluice-gw/sluice/gateway/logcap"
	"github.com/sluice-gw/sluice/gateway/mcp"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/policylife"
	"github.com/sluice-gw/sluice/gateway/remotes"
	"github.com/sluice-gw/sluice/gateway/sessions"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/storecheck"
	"github.com/sluice-gw/sluice/gateway/usage"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault"
	"go.opentelemetry.io/otel/trace"
)

// Decider decides a call. Implementations never return Allow on error.
type Decider interface {
	Decide(ctx context.Context, in *policy.Input) policy.Decision
}

// CredentialRef names the credential a connector's calls carry.
type CredentialRef = creds.Ref

// CredentialSource fetches credentials (package creds holds the stage).
type CredentialSource = creds.Source

// SessionEnder revokes what a session was given when it ends (package
// sessions says when it is called and what it must do).
type SessionEnder = sessions.Ender

// Catalog finds tools.
type Catalog interface {
	Tool(name string) (*connectors.Tool, bool)
	Tools() []*connectors.Tool
}

// Options overrides parts of a Server for embedding and tests. Zero means default.
type Options struct {
	Logger      *slog.Logger
	Credentials CredentialSource // default: from cfg.Secrets
	// Resolver replaces the system resolver of the guarded dialer (tests).
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
	// Tracing is where the gateway's spans go (package tracing builds it
	// from the OTEL_* environment); nil: tracing is off.
	Tracing trace.TracerProvider
}

// Server is a provisioned gateway.
type Server struct {
	cfg     *config.Config
	log     *slog.Logger
	repeats *logcap.Limiter // identical error lines, logged once then counted
	catalog *catalog.Catalog
	creds   CredentialSource
	dialer  *guard.Dialer
	audit   auditLog // the one audit write is its append (auditlog.go)
	store   *store.Store
	heads   *heads.Recorder // the audit log's recorded head (THREATS G9)
	tel     *telemetry
	holds   *holds.Manager
	icpt    *egress.Interceptor // nil without egress.intercept / egress.placeholders

	adminAuth func(*http.Request) (holds.Person, bool) // the review UI's sessions
	reviewUI  http.Handler
	webhook   *http.Client

	// life is the policy life cycle: bundles, decision logs, receipts.
	life *policylife.Life

	policyMu  sync.Mutex // serialises reloads
	engine    atomic.Pointer[policy.Engine]
	policyErr atomic.Pointer[string] // last compile error, nil when healthy

	usage usage.Counters

	ready     chan struct{}
	adminAddr atomic.Pointer[string]
	limits    limits.Calls           // agents[].rate_limit buckets
	relayAddr atomic.Pointer[string] // gateway.relay_tls.listen, once listening

	stop egress.StopHooks // what Serve's shutdown ends (DNS streams) and closes (idle upstream connections)

	// sharedLimits: agents[].rate_limit across the replicas of a shared
	// store (gateway/limits).
	sharedLimits limits.Shared

	sessConns sessions.Conns // open connections by session, closed when it ends

	authzAddr atomic.Pointer[string]   // gateway.ext_authz.listen, once listening (extauthz_door.go)
	xds       *extauthz.XDS            // the ADS server, when gateway.ext_authz.xds is set
	envoy     *envoyDoor               // the Envoy door's hooks (extauthz_door.go)
	mcpDoor   atomic.Pointer[mcp.Door] // the MCP door, once mounted (mcp_door.go)
	remotes   remotes.Runs             // remote MCP servers' listing loops

	hosted *hosted.Door // gateway.hosted: per-run tokens and their listener's checks (gateway/hosted)

	oauth *oauth.Manager // credential.oauth2 connectors' tokens; nil without any (gateway/connections)
	// attacher is the pipeline's credential stage (package creds).
	attacher *creds.Creds
}

// New provisions a gateway from cfg: loads every connector's spec, compiles
// the policy (a policy that fails to compile is reported and the server
// blocks every call), opens the secret store, the audit log and the store.
// It opens no listener.
func New(ctx context.Context, cfg *config.Config, opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	tel, err := newTelemetry(opts.Tracing)
	if err != nil {
		return nil, err
	}
	tel.SetRules(cfg.Policies)
	s := &Server{cfg: cfg, log: log, tel: tel, ready: make(chan struct{})}
	s.repeats = logcap.New(log, logcap.Every)
	built := false
	s.dialer = guard.New(guard.Options{Resolver: opts.Resolver})
	var warns []error
	if s.catalog, warns, err = catalog.Load(ctx, cfg, s.dialer, catalog.Options{}); err != nil {
		return nil, err
	}
	// Operations the credential cannot carry are refused per call; say so
	// once. (validate's upstream and approval checks are not repeated here:
	// the guard and the hold manager refuse those calls, as designed.)
	for _, w := range warns {
		log.Warn("config: "+w.Error(), "check", "credential")
	}
	// A spec is loaded leniently; say once what it left out (the list, with
	// JSON pointers, is `sluice validate`'s).
	for _, slug := range s.catalog.Slugs() {
		conn := s.catalog.Upstream(slug).Conn
		if len(conn.Skipped) > 0 || len(conn.Defects) > 0 {
			log.Warn("connector spec: operations skipped or defects found; `sluice validate` lists them", "connector", slug,
				"tools", len(conn.Tools), "skipped", len(conn.Skipped), "defects", len(conn.Defects))
		}
	}
	if s.life, err = policylife.New(cfg, log, s.engine.Load, tel.Reg); err != nil {
		return nil, err
	}
	if err := s.loadPolicy(ctx); err != nil {
		// Fail closed: serve, but block everything until a reload succeeds.
		log.Error("policy failed to compile; every call is blocked until a reload succeeds", "err", err)
	}
	s.creds = opts.Credentials
	if s.creds == nil {
		if s.creds, err = creds.Open(ctx, cfg, log); err != nil {
			return nil, err
		}
		// Ours to close (revoking what it leased) when New fails below.
		defer func() {
			if !built {
				_ = creds.Close(s.creds)
			}
		}()
	}
	if !cfg.Receipts.Disabled && cfg.ReceiptsSigner() == config.ReceiptsVaultTransit {
		v, ok := s.creds.(*creds.Vault)
		if !ok {
			return nil, errors.New("receipts.signer vault-transit: the credential source is not secrets.vault")
		}
		if err := s.life.UseReceiptKey(ctx, vault.NewTransitEd25519(v.Client(), cfg.Receipts.TransitKey)); err != nil {
			return nil, err
		}
	}
	if s.oauth, err = connections.New(cfg, s.catalog.OAuthClients(), s.creds, func() *store.Store { return s.store }, log); err != nil {
		return nil, err
	}
	s.attacher = creds.New(creds.Deps{Source: s.creds, OAuth: s.oauth, ConnectionsURL: connections.URL(cfg.Approvals.PublicURL)})
	if s.icpt, err = egress.NewInterceptor(cfg); err != nil {
		return nil, err
	}
	aopts := auditOptions(cfg.Audit) // egress_audit.go
	aopts.Replica = cfg.Gateway.ReplicaID
	if s.audit.Log, err = audit.OpenWith(cfg.Audit.Path, aopts); err != nil {
		return nil, fmt.Errorf("audit.path: %w", err)
	}
	s.audit.export = s.life.DecisionExport(s.engine.Load, cfg.Policy.Bundle != nil)
	if n := s.audit.Stats().TruncatedTail; n > 0 {
		// What `sluice audit verify` calls an unfinished write: the last
		// stop left a record half-written (a full disk, a crash). It was
		// never acknowledged, so no answered call loses its record.
		log.Warn("audit: removed an unfinished last line", "path", cfg.Audit.Path, "bytes", n,
			"reason", "a write that did not complete before the last stop (full disk or crash); never acknowledged")
	}
	if s.store, err = store.OpenWith(ctx, cfg.Store, store.Options{AuditLog: cfg.Audit.Path, Replica: cfg.Gateway.ReplicaID}); err != nil {
		s.audit.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := s.store.ClaimReplica(ctx, replicaLost(log)); err != nil { // replica.go (THREATS G21)
		s.audit.Close()
		s.store.Close()
		return nil, err
	}
	s.heads = heads.New(cfg.Audit, s.audit.Log, s.store, log)
	if err := s.heads.Check(ctx); err != nil { // THREATS G9, G22
		s.audit.Close()
		s.store.Close()
		return nil, err
	}
	s.webhook = &http.Client{Timeout: 10 * time.Second}
	s.holds = s.newHolds()
	if err := s.tel.PendingHolds(func() (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return s.store.CountAllHolds(ctx, []string{string(holds.Pending)})
	}); err != nil {
		s.audit.Close()
		s.store.Close()
		return nil, fmt.Errorf("gateway: metric: %w", err)
	}
	s.tel.Zero(s.catalog.Slugs())
	// Before anything is served: an execution the last run left unfinished
	// becomes outcome_unknown, or, when its operation is idempotency-keyed,
	// is re-sent once with the same key by holds.Run (THREATS G2).
	if err := s.holds.Recover(ctx); err != nil {
		s.audit.Close()
		s.store.Close()
		return nil, err
	}
	if err := s.newReviewUI(); err != nil {
		s.audit.Close()
		s.store.Close()
		return nil, err
	}
	s.remotes.Append, s.remotes.Log, s.remotes.Changed = s.audit.append, log, s.mcpChanged
	// A remote with MCP authorization lists with a connected person's
	// token (remotes.OAuthHeader).
	s.remotes.OAuthHeader = remotes.OAuthHeader(s.oauth, s.audit.append, log, s.creds, cfg.Approvals.PublicURL)
	s.hosted = hosted.New(hosted.Deps{Config: cfg, Log: log, Ended: s.store.SessionEnded, Append: s.audit.append, Narrowing: egress.CheckNarrowing,
		Unaudited: func() { s.tel.Unaudited.Add(context.Background(), 1) }})
	s.remotes.Start(ctx, s.catalog.RemoteServers(), s.creds) // remote MCP servers' tools: listed before anything is served
	s.envoy = &envoyDoor{cfg: cfg, log: log, tel: s.tel, connectors: s.catalog.Upstreams(), call: s.Call, decide: s.Decide,
		session: sessions.Check(s.store), append: s.audit.append} // extauthz_door.go
	built = true
	return s, nil
}

func (s *Server) loadPolicy(ctx context.Context) error {
	s.policyMu.Lock()
	defer s.policyMu.Unlock()
	if e := s.engine.Load(); e != nil {
		return e.Reload(ctx) // OnReload records the outcome
	}
	pc := PolicyConfig(s.cfg, s.log)
	// Called for every reload, by SIGHUP or by Watch on a file change.
	pc.OnReload = func(ok bool, err error) {
		s.tel.Reload(ok)
		s.setPolicyErr(err)
		if ok {
			s.mcpChanged() // what a caller may list may have changed
		}
	}
	s.life.Hooks(&pc) // gateway/policylife
	e, err := policy.New(ctx, pc)
	s.tel.Reload(err == nil)
	s.setPolicyErr(err)
	if err != nil {
		return err
	}
	s.engine.Store(e)
	s.log.Info("policy: loaded", "version", e.Version())
	return nil
}

func (s *Server) setPolicyErr(err error) {
	if err == nil {
		s.policyErr.Store(nil)
		return
	}
	msg := err.Error()
	s.policyErr.Store(&msg)
}

// Decide evaluates the current policy. With no policy loaded it blocks.
func (s *Server) Decide(ctx context.Context, in *policy.Input) policy.Decision {
	return s.engine.Load().Decide(ctx, in) // a nil *Engine blocks
}

// adminHandler is the admin listener's handler (package admin), wired to
// this server's state; Serve builds it once, after SetAdminAuth and
// SetReviewUI.
func (s *Server) adminHandler() http.Handler {
	d := admin.Deps{
		Config: s.cfg, Log: s.log, Holds: s.holds, Store: s.store,
		Audit:  s.audit.record,
		Policy: s.engine.Load,
		PolicyErr: func() string {
			if p := s.policyErr.Load(); p != nil {
				return *p
			}
			return ""
		},
		AuditErr:     s.audit.Err,
		StoreProblem: func(ctx context.Context) string { return storecheck.Problem(ctx, s.store) },
		Metrics:      s.tel.Handler,
		JWKS:         creds.JWKS(s.creds, s.log),
		Tools:        func() int { return len(s.catalog.Tools()) },
		Placeholders: func() any { return s.icpt.Placeholders() },
		CloseSession: s.sessConns.CloseSession,
		MintToken:    s.hosted.MintToken, // gateway/hosted
		Receipts:     s.life.Receipts(),
		Person:       s.adminAuth,
		UI:           s.reviewUI,
	}
	if s.icpt != nil {
		d.CACert = s.icpt.CACertPEM
	}
	if se, ok := s.creds.(sessions.Ender); ok {
		d.EndSession = se.EndSession
	}
	return admin.New(d).Handler()
}

// The root's side of the seam with raw egress: what egress is given.

// newRawEgress provisions raw egress for this server.
func (s *Server) newRawEgress() *egress.Proxy { return egress.New(s.egressDeps()) }

// egressDeps wires raw egress to this server.
func (s *Server) egressDeps() egress.Deps {
	return egress.Deps{
		Config:   s.cfg,
		Log:      s.log,
		Dialer:   s.dialer,
		Identity: ingress.IdentityFrom,
		Hosted:   ingress.HostedFrom,
		Engine:   s.engine.Load,
		Append:   s.audit.append,
		Session:  sessions.Check(s.store),
		Credential: func(ctx context.Context, secret string, c policy.Caller) (vault.Secret, error) {
			if tok, ok, err := connections.PlaceholderToken(ctx, s.oauth, secret, c); ok {
				return tok, err
			}
			return s.creds.Credential(ctx, CredentialRef{Connector: "egress", Secret: secret, Caller: c})
		},
		Track:            s.sessConns.Add,
		OnStop:           s.stop.OnStop,
		AtClose:          s.stop.AtClose,
		Repeats:          s.repeats.Allow,
		Interceptor:      s.icpt,
		Meter:            s.tel.Provider.Meter("sluice/gateway/egress"),
		Decisions:        s.tel.Decisions,
		Reflected:        s.tel.Reflected,
		AuditFailures:    s.tel.Audits,
		RuleLabel:        s.tel.RuleLabel,
		UpstreamAnswered: s.tel.UpstreamAnswered,
	}
}

// newMCPDoor mounts the MCP door (gateway/mcp) on the sandbox socket. Its
// hooks are the pipeline's own entrances: the list is Tools (GET
// /v1/tools's), every tools/call is Call with transport mcp, and
// sluice.await_hold is Poll. The door decides, sends and audits nothing
// itself.
func (s *Server) newMCPDoor() *mcp.Door {
	g := s.cfg.Gateway
	d := mcp.New(mcp.Deps{
		Identify: func(r *http.Request) (wire.Identity, bool) { return ingress.IdentityFrom(r.Context()) },
		Tools:    s.Tools,
		Call:     s.Call,
		Poll:     s.Poll,
		Remote: func(name string) (mcp.Remote, bool) { // a remote MCP server's tool, as it listed it
			t, rt, ok := s.catalog.Remote(name)
			if !ok {
				return mcp.Remote{}, false
			}
			return mcp.Remote{Name: t.Name, Title: rt.Title, Description: rt.Description, InputSchema: rt.InputSchema, OutputSchema: rt.OutputSchema, Annotations: rt.Annotations}, true
		},
		Title: func(name string) string {
			if t, ok := s.catalog.Tool(name); ok {
				return t.Summary
			}
			return ""
		},
		Output: func(name string, body []byte) bool {
			t, ok := s.catalog.Tool(name)
			return ok && t.MatchesOutput(body)
		},
		HoldWait:        g.HoldWait.Std(),
		Aliases:         g.MCP.ToolNames == "aliases",
		MaxMessageBytes: g.MCP.MaxMessageBytes,
		Logger:          s.log,
	})
	s.mcpDoor.Store(d)
	return d
}

// mcpChanged tells the MCP door that what callers may list may have
// changed (a policy reload): open sessions whose list changed get
// notifications/tools/list_changed.
func (s *Server) mcpChanged() {
	if d := s.mcpDoor.Load(); d != nil {
		go d.Changed(context.Background())
	}
}

// Serve listens on the sandbox socket and the admin address and serves
// until ctx ends. It returns when both listeners are closed.
func (s *Server) Serve(ctx context.Context) error {
	gc := s.cfg.Gateway
	sl, err := ingress.Listen(ingress.Options{
		Socket: gc.SandboxSocket, TrustedUIDs: gc.TrustedRelayUIDs, Log: s.log, Refused: s.tel.Refused,
		MaxConns: gc.MaxConnections, MaxPerSandbox: gc.MaxConnectionsPerSandbox,
		Body: h1.BodyLimit{Timeout: gc.RequestBodyTimeout.Std(), MinRate: gc.RequestBodyMinRate},
	})
	if err != nil {
		return err
	}
	if rt := s.cfg.Gateway.RelayTLS; rt.Listen != "" {
		tcfg, err := ingress.RelayTLSConfig(rt)
		if err == nil {
			var a net.Addr
			if a, err = sl.ListenRelayTLS(rt.Listen, tcfg); err == nil {
				addr := a.String()
				s.relayAddr.Store(&addr)
			}
		}
		if err != nil {
			sl.Close()
			return err
		}
	}
	if err := s.hosted.Serve(sl); err != nil { // gateway/hosted
		sl.Close()
		return err
	}
	stopAuthz, authzAddr, xds, err := s.envoy.serve(ctx) // extauthz_door.go
	if err != nil {
		sl.Close()
		return err
	}
	if authzAddr != "" {
		s.authzAddr.Store(&authzAddr)
	}
	s.xds = xds
	defer stopAuthz()
	servers := []*http.Server{{
		Handler:           sl.HostedGate(s.sandboxHandler()), // gateway/hosted's tokens admit it
		ConnContext:       s.connContext,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    ingress.MaxHeaderBytes, // ingress refuses longer heads first, with JSON
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}}
	listeners := []net.Listener{ingress.StrictHeads(sl)} // framing checked before parsing
	if s.cfg.Gateway.AdminListen != "" {
		al, err := net.Listen("tcp", s.cfg.Gateway.AdminListen)
		if err != nil {
			sl.Close()
			return fmt.Errorf("gateway.admin_listen: %w", err)
		}
		addr := al.Addr().String()
		s.adminAddr.Store(&addr)
		servers = append(servers, &http.Server{
			Handler:           s.adminHandler(),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		})
		listeners = append(listeners, al)
	}
	go s.watchPolicy(ctx)
	go s.life.Run(ctx) // gateway/policylife
	go s.holds.Run(ctx)
	headDone := make(chan struct{})
	go func() { defer close(headDone); s.heads.Run(ctx) }()
	defer func() { <-headDone }()
	countDone := make(chan struct{})
	go func() { defer close(countDone); s.usage.Loop(ctx, s.store, s.log) }()
	defer func() { <-countDone }()
	errc := make(chan error, len(servers))
	for i := range servers {
		go func() { errc <- servers[i].Serve(listeners[i]) }()
	}
	s.log.Info("sluice gateway serving", "sandbox_socket", s.cfg.Gateway.SandboxSocket, "relay_tls", s.RelayAddr(), "admin", s.AdminAddr(), "tools", len(s.catalog.Tools()))
	close(s.ready)
	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
	}
	s.shutdown(servers)
	if errors.Is(first, http.ErrServerClosed) || errors.Is(first, net.ErrClosed) {
		first = nil
	}
	return first
}

// Ready is closed once Serve is listening.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// AdminAddr is the admin listener's address once Ready.
func (s *Server) AdminAddr() string {
	if p := s.adminAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// RelayAddr is the address remote relays connect to (gateway.relay_tls)
// once Ready, "" when that listener is off.
func (s *Server) RelayAddr() string {
	if p := s.relayAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// ExtAuthzAddr is the ext_authz listener's address once Ready ("" when off).
func (s *Server) ExtAuthzAddr() string {
	if p := s.authzAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// Reload re-reads the policy (SIGHUP). On failure the previous policy keeps
// serving and the error is returned.
// The policy engine logs the outcome; callers need not.
func (s *Server) Reload(ctx context.Context) error {
	err := s.loadPolicy(ctx)
	if s.xds != nil {
		// A new snapshot when what Envoy is served changed (its version is
		// a hash of the resources: an unchanged one pushes nothing).
		if xerr := s.xds.Update(ctx, s.cfg); xerr != nil {
			s.log.Error("xds: reload", "err", xerr)
		}
	}
	return err
}

// watchPolicy reloads the policy when its files change, until ctx ends.
// After a cold start whose policy failed to compile there is no engine to
// watch with, so it polls the files' stamps until a load succeeds.
func (s *Server) watchPolicy(ctx context.Context) {
	watched := policylife.Files(s.cfg) // the rego paths and a bundle file
	if len(watched) == 0 && s.cfg.Policy.Bundle == nil {
		return
	}
	last := regoStamp(watched)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for s.engine.Load() == nil {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A bundle server that was down at start is asked again every tick.
		if st := regoStamp(watched); st != last || policylife.BundleURL(s.cfg) {
			last = st
			_ = s.loadPolicy(ctx) // logged and counted by loadPolicy
		}
	}
	go func() { _ = s.engine.Load().PollBundle(ctx) }() // returns when ctx ends
	if err := s.engine.Load().Watch(ctx); err != nil {
		s.log.Error("policy: file watch stopped; reload with SIGHUP", "err", err)
	}
}

// regoStamp summarises the names, sizes and modification times of the
// files under paths; it changes when any of them does.
func regoStamp(paths []string) string {
	var b strings.Builder
	for _, root := range paths {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				fmt.Fprintf(&b, "%s:err;", p)
				return nil
			}
			if fi, err := d.Info(); err == nil && !d.IsDir() {
				fmt.Fprintf(&b, "%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
			}
			return nil
		})
	}
	return b.String()
}

// HostedAddr is gateway.hosted's listener address once Ready, "" when off.
func (s *Server) HostedAddr() string { return s.hosted.Addr() }

// Catalog returns the loaded tools.
func (s *Server) Catalog() Catalog { return s.catalog }

// Close releases the stores. Call it after Serve returns.
func (s *Server) Close() error {
	s.heads.Close()
	err := errors.Join(s.audit.Close(), s.store.Close(), creds.Close(s.creds))
	_ = s.tel.Provider.Shutdown(context.Background())
	s.remotes.Stop()
	s.catalog.CloseIdle()
	s.stop.CloseAll() // idle upstream connections of raw egress, again: Close may follow a Serve that never stopped cleanly
	s.repeats.Stop()
	return err
}

// shutdownGrace bounds a graceful shutdown: requests still running after
// it have their connections closed.
const shutdownGrace = 10 * time.Second

// shutdown stops servers gracefully. Long-lived requests are told first
// (stopHooks.begin: a DNS stream stops reading questions, answers those in
// flight and ends its body), so that Shutdown waits for them only as long
// as their answers take; whatever still runs after shutdownGrace has its
// connection closed rather than outliving Serve. Then the idle upstream
// connections of raw egress are closed.
func (s *Server) shutdown(servers []*http.Server) {
	s.stop.Begin()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(ctx); err != nil {
			s.log.Warn("gateway: shutdown: grace period over; closing the connections still busy", "grace", shutdownGrace.String(), "err", err)
			_ = srv.Close()
		}
	}
	s.stop.CloseAll()
}

// connContext attaches the admitted connection's identity to its requests
// and registers the connection under its session, so that ending the
// session closes it (sessions.Conns).
func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	if ic, ok := c.(*ingress.Conn); ok {
		ic.OnClose(s.sessConns.Add(ic.Identity().Session, ic))
	}
	return ingress.ConnContext(ctx, c)
}
