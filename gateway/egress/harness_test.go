package egress

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault"
)

// The egress-only harness: raw egress served on a sandbox socket of its
// own, as the gateway's Serve wires it (ingress.Listen, strict heads, the
// relayed identity), built from Deps with the real pieces — the policy
// engine on the shipped Rego with the agents' allowlists, a hash-chained
// audit log in a temporary directory, the guarded dialer — and no tool
// catalog, store or holds, which raw egress never touches. Whole-gateway
// behaviour (ending a session in the store, /metrics, shutdown order,
// the admin routes) is tested in the root package.

const testSecret = "sk-test-0123456789abcdef"

// egressYAML is the harness's configuration; %[1]s is its directory and
// %[2]d the uid trusted as a relay. The connector section is empty: raw
// egress decides on agents[].egress and the rules below.
const egressYAML = `
gateway:
  sandbox_socket: %[1]s/relay.sock
  trusted_relay_uids: [%[2]d]
audit: { path: %[1]s/audit.log }
secrets: { backend: local, local: { path: %[1]s/secrets.json, key_file: %[1]s/secrets.key } }
agents:
  - { name: agent-a }
  - { name: agent-b }
policies:
  - { match: "*", action: block }
`

// testGateway is raw egress on its socket, with what the tests inspect:
// the configuration, the directory, the log and the audit log.
type testGateway struct {
	cfg    *config.Config
	dir    string
	log    *slog.Logger
	logBuf *syncBuffer
	audit  *audit.Log
	engine atomic.Pointer[policy.Engine]
	secret map[string]vault.Secret // the placeholders' secrets, by name
	eg     *Proxy                  // what the socket serves
	stop   StopHooks
	srv    *http.Server
	served chan struct{}            // closed when srv.Serve has returned
	meter  *sdkmetric.MeterProvider // egress's instruments, read by counter
	reader *sdkmetric.ManualReader

	mu       sync.Mutex
	answered []upstreamAnswer // Deps.UpstreamAnswered's calls
}

// upstreamAnswer is one call of Deps.UpstreamAnswered: an upstream's
// status, which the gateway counts in sluice_upstream_responses_total.
type upstreamAnswer struct {
	connector, path string
	status          int
}

// startGateway serves raw egress configured by egressYAML and then edit.
func startGateway(t testing.TB, edit func(*config.Config)) *testGateway {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-eg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg, err := config.Parse([]byte(fmt.Sprintf(egressYAML, dir, os.Getuid())), dir)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	logBuf := &syncBuffer{}
	g := &testGateway{cfg: cfg, dir: dir, logBuf: logBuf,
		log:    slog.New(slog.NewJSONHandler(logBuf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		secret: map[string]vault.Secret{"tickets-key": vault.NewSecret([]byte(testSecret))}}
	opts := audit.Options{Sync: audit.SyncAlways} // audit.sync as the gateway maps it (auditOptions)
	if cfg.Audit.Sync == config.AuditSyncInterval {
		opts = audit.Options{Sync: audit.SyncInterval, SyncInterval: cfg.Audit.SyncInterval.Std()}
	}
	if g.audit, err = audit.OpenWith(cfg.Audit.Path, opts); err != nil {
		t.Fatal(err)
	}
	e, err := policy.New(context.Background(), policyConfig(cfg, g.log))
	if err != nil {
		t.Fatal(err)
	}
	g.engine.Store(e)
	g.reader = sdkmetric.NewManualReader()
	g.meter = sdkmetric.NewMeterProvider(sdkmetric.WithReader(g.reader))
	g.eg = g.newProxy()
	sl, err := ingress.Listen(ingress.Options{Socket: cfg.Gateway.SandboxSocket, TrustedUIDs: cfg.Gateway.TrustedRelayUIDs, Log: g.log})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: sandboxHandler(g.eg), ConnContext: ingress.ConnContext,
		ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: ingress.MaxHeaderBytes}
	g.srv, g.served = srv, make(chan struct{})
	go func() { defer close(g.served); _ = srv.Serve(ingress.StrictHeads(sl)) }()
	t.Cleanup(func() {
		g.stop.Begin()
		_ = srv.Close()
		<-g.served
		g.stop.CloseAll() // open tunnels write their records before the audit log closes
		_ = g.audit.Close()
		if strings.Contains(logBuf.String(), testSecret) {
			t.Errorf("the egress log contains the secret")
		}
	})
	return g
}

// shutdownGrace is the gateway's (Server.shutdown): requests still
// running after it have their connections closed.
const shutdownGrace = 10 * time.Second

// shutdown stops g's server as the gateway's shutdown does (stop.go in
// the root): the stop hooks are told first, the server shuts down within
// the grace, and then the closers run. It returns how long that took.
func shutdown(t *testing.T, g *testGateway, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	g.stop.Begin()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := g.srv.Shutdown(ctx); err != nil {
		_ = g.srv.Close()
	}
	<-g.served
	g.stop.CloseAll()
	took := time.Since(start)
	if took > limit {
		t.Fatalf("the shutdown took %v, want at most %v", took, limit)
	}
	return took
}

// sandboxHandler routes the sandbox socket as the gateway does for raw
// egress: absolute-form and CONNECT to the proxy, POST /v1/dns to the
// answerer, anything else 404.
func sandboxHandler(eg *Proxy) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodConnect || r.URL.IsAbs():
			eg.ServeProxy(w, r)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/dns":
			eg.ServeDNS(w, r)
		default:
			refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "no such endpoint on the sandbox socket"), refusal.NewRequestID())
		}
	})
}

// policyConfig is the gateway's policy configuration (gateway.PolicyConfig)
// for what raw egress decides on: the rules, the Rego paths, the agents'
// allowlists and the CONNECT ports.
func policyConfig(cfg *config.Config, log *slog.Logger) policy.Config {
	rules := make([]policy.Rule, len(cfg.Policies))
	for i, p := range cfg.Policies {
		rules[i] = policy.Rule{Match: p.Match, Action: p.Action, Approvers: p.Approvers, Reason: p.Reason}
	}
	allow := map[string][]string{}
	for _, a := range cfg.Agents {
		allow[a.Name] = a.Egress
	}
	return policy.Config{Rules: rules, Paths: cfg.Rego, Egress: allow, ConnectPorts: cfg.Egress.ConnectPorts, Logger: log}
}

// newProxy builds raw egress on the harness's pieces; every proxy it
// builds shares the one audit log, policy and stop hooks.
func (g *testGateway) newProxy() *Proxy {
	var errs sync.Map
	return New(Deps{
		Config:   g.cfg,
		Log:      g.log,
		Dialer:   guard.New(guard.Options{}),
		Identity: ingress.IdentityFrom,
		Engine:   g.engine.Load,
		Append: func(ctx context.Context, rec audit.Record, written bool) (audit.Record, error) {
			// As the gateway's appendAudit: detached from the caller's
			// cancellation, with a deadline of its own (THREATS G10).
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if written {
				return g.audit.AppendWritten(ctx, rec)
			}
			return g.audit.Append(ctx, rec)
		},
		Credential: func(_ context.Context, secret string, _ policy.Caller) (vault.Secret, error) {
			s, ok := g.secret[secret]
			if !ok {
				return vault.Secret{}, fmt.Errorf("secret %q: %w", secret, vault.ErrNotFound)
			}
			return s, nil
		},
		Session:       func(context.Context, string) *refusal.Error { return nil }, // sessions end in the root's store
		Track:         func(string, io.Closer) func() { return func() {} },
		OnStop:        g.stop.OnStop,
		AtClose:       g.stop.AtClose,
		Repeats:       func(key, reason string) bool { _, seen := errs.LoadOrStore(key+"\x00"+reason, true); return !seen },
		Meter:         g.meter.Meter("sluice/gateway/egress"),
		Decisions:     must1(g.meter.Meter("sluice/gateway").Int64Counter("sluice.decisions")),
		Reflected:     must1(g.meter.Meter("sluice/gateway").Int64Counter("sluice.scrub.reflected")),
		AuditFailures: must1(g.meter.Meter("sluice/gateway").Int64Counter("sluice.audit.failures")),
		RuleLabel:     func(rule string) string { return rule },
		UpstreamAnswered: func(connector, path string, status int) {
			g.mu.Lock()
			g.answered = append(g.answered, upstreamAnswer{connector, path, status})
			g.mu.Unlock()
		},
	})
}

// counter is the sum of the int64 counter name over the points whose
// attribute key is value (every point when key is "").
func (g *testGateway) counter(t testing.TB, name, key, value string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := g.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != name || !ok {
				continue
			}
			for _, p := range sum.DataPoints {
				if v, _ := p.Attributes.Value(attribute.Key(key)); key == "" || v.AsString() == value {
					n += p.Value
				}
			}
		}
	}
	return n
}

func must1[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Reload recompiles the policy from its files, as SIGHUP does.
func (g *testGateway) Reload(ctx context.Context) error { return g.engine.Load().Reload(ctx) }

// client speaks HTTP over the sandbox socket as a relay would: preamble first.
func (g *testGateway) client(id wire.Identity) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, g.cfg.Gateway.SandboxSocket, id)
		},
		MaxIdleConnsPerHost: 16,
	}}
}

var agentA = wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "alice", Host: "h1"}

// auditEvents reads every record of the audit log; none may carry the secret.
func auditEvents(t testing.TB, g *testGateway) []audit.Record {
	t.Helper()
	return egresstest.AuditRecords(t, g.cfg.Audit.Path, testSecret)
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
