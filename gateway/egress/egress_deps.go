package egress

import (
	"context"
	"io"
	"log/slog"

	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault"
)

// Deps is everything raw egress takes from the rest of the gateway,
// named, in place of a pointer back to the Server: the configuration, the
// log, the one dialer, the current policy, the one audit write, the
// credential source, the session check, and the gateway's shared
// instruments. Every field is set by the root gateway (egress_wire.go); raw egress
// reaches nothing of the Server but these (it is never held, and never
// touches the tool catalog), which is what lets it become package egress.
type Deps struct {
	Config *config.Config
	Log    *slog.Logger
	// Dialer is the gateway's guarded dialer; replaced by one on the
	// dns.Resolver when dns.upstreams is set.
	Dialer *guard.Dialer
	// Identity is the relayed identity of a request (ingress.IdentityFrom:
	// egress takes it as a hook, so it never imports the socket's package).
	Identity func(ctx context.Context) (wire.Identity, bool)
	// Hosted says whether a request's connection came through the hosted
	// listener (ingress.HostedFrom), for its records' listener; nil: never.
	Hosted func(ctx context.Context) bool
	// Engine is the current policy; decision caches key on its version.
	Engine func() *policy.Engine
	// Append writes one audit record (Server.appendAudit, the one way
	// the gateway writes one); written: it need only reach the file.
	Append func(ctx context.Context, rec audit.Record, written bool) (audit.Record, error)
	// Credential returns the secret a placeholder stands for, on behalf
	// of the caller.
	Credential func(ctx context.Context, secret string, c policy.Caller) (vault.Secret, error)
	// Session refuses a caller whose session has ended, or whose session
	// state cannot be read; nil for a live session or none.
	Session func(ctx context.Context, session string) *refusal.Error
	// Track registers a connection under its session so that ending the
	// session closes it; remove unregisters it.
	Track func(session string, c io.Closer) (remove func())
	// OnStop runs f when the server begins to stop (DNS streams stop
	// reading); unregister drops f. AtClose runs f when the server
	// closes, before the audit log does (open tunnels write their
	// records).
	OnStop  func(f func()) (unregister func())
	AtClose func(f func())
	// Repeats reports whether an error line with this key and reason is
	// to be logged now rather than counted (identical lines are logged
	// once per interval).
	Repeats func(key, reason string) bool
	// Interceptor holds the interception CA and the placeholders; nil
	// without egress.intercept and egress.placeholders.
	Interceptor *Interceptor

	Meter                               metric.Meter // egress's own instruments
	Decisions, Reflected, AuditFailures metric.Int64Counter
	RuleLabel                           func(rule string) string // a rule's metric label
	UpstreamAnswered                    func(connector, path string, status int)
}
