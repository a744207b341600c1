// Package policylife is the policy's life cycle around the engine: the
// bundle's configuration and the files whose change reloads it, bundle
// loads and the revision in force on /metrics, the decision-log export
// (OPA's format), and the signer of approval receipts. The gateway hands
// it the config, the engine's getter and its metric registry; it decides
// nothing.
package policylife

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/receipts"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/policy/decisionlog"
)

// Life is the policy life cycle around the engine: bundle loads and the
// revision in force on /metrics, the decision-log export, and the signer
// of approval receipts. Make it with New.
type Life struct {
	cfg    *config.Config
	log    *slog.Logger
	engine func() *policy.Engine // the policy in force (its revision is on /metrics)

	bundleLoads *prometheus.CounterVec
	decisions   *decisionlog.Exporter // nil without decision_logs
	receipts    *receipts.Signer      // nil with receipts.disabled (and until UseReceiptKey for vault-transit)
	signFails   prometheus.Counter    // receipts that could not be signed (Vault down)
	// labels are the decision-log labels; byEntrance the same with each
	// entrance's (export.go).
	labels     map[string]string
	byEntrance sync.Map
}

// DecisionLogPath is the decision logs' path, as OPA names the query.
const DecisionLogPath = "sluice/main/decision"

// BundleConfig is cfg's policy.bundle as the engine takes it.
func BundleConfig(cfg *config.Config) *policy.BundleConfig {
	b := cfg.Policy.Bundle
	if b == nil {
		return nil
	}
	bc := &policy.BundleConfig{File: b.File, URL: b.URL, Poll: b.Poll.Std()}
	if v := b.Verification; v != nil {
		bc.Verification = &policy.Verification{KeyFile: v.KeyFile, KeyID: v.KeyID, Scope: v.Scope, Algorithm: v.Algorithm}
	}
	return bc
}

// Files are the files whose change reloads the policy: the rego
// paths (Rego and data documents) and a bundle file.
func Files(cfg *config.Config) []string {
	out := append([]string(nil), cfg.Rego...)
	if b := cfg.Policy.Bundle; b != nil && b.File != "" {
		out = append(out, b.File)
	}
	return out
}

// BundleURL says the policy comes (partly) from a bundle server: when it
// was down at start, the load is retried on every tick.
func BundleURL(cfg *config.Config) bool {
	return cfg.Policy.Bundle != nil && cfg.Policy.Bundle.URL != ""
}

// New registers the life cycle's metrics on reg and makes the
// decision-log exporter and the receipts signer, as cfg says; the gateway
// calls it before the policy is first loaded. engine is the policy in
// force (its revision is on /metrics).
func New(cfg *config.Config, log *slog.Logger, engine func() *policy.Engine, reg prometheus.Registerer) (*Life, error) {
	l := &Life{cfg: cfg, log: log, engine: engine}
	return l, l.init(reg)
}

func (l *Life) init(reg prometheus.Registerer) error {
	l.bundleLoads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_policy_bundle_loads_total",
		Help: "OPA bundles read (from the file or the bundle server), by result: ok, or error (refused: the previous policy kept deciding).",
	}, []string{"result"})
	l.bundleLoads.WithLabelValues("ok")
	l.bundleLoads.WithLabelValues("error")
	revision := prometheus.NewDesc("sluice_policy_revision_info",
		"The policy revision in force (the bundle's manifest revision, or a digest of the Rego and data files); always 1.", []string{"revision"}, nil)
	l.signFails = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_receipts_sign_failures_total",
		Help: "Executed holds whose receipt could not be signed (receipts.signer vault-transit and Vault unavailable): the call was sent, its result is recorded without a receipt.",
	})
	cs := []prometheus.Collector{l.bundleLoads, l.signFails, &revisionCollector{desc: revision, engine: l.engine}}
	if dl := l.cfg.DecisionLogs; dl != nil {
		l.labels = decisionLabels(dl.Labels)
		x, err := decisionlog.New(decisionlog.Config{File: dl.File, URL: dl.URL, Format: dl.Format, Mask: dl.Mask, Labels: l.labels,
			Buffer: dl.Buffer, Batch: dl.Batch, Flush: dl.Flush.Std(), Timeout: dl.Timeout.Std(), Logger: l.log})
		if err != nil {
			return fmt.Errorf("decision_logs: %w", err)
		}
		l.decisions = x
	}
	// Zero without decision_logs: every family is there from the start.
	stat := func(f func(decisionlog.Stats) int64) func() float64 {
		return func() float64 { return float64(f(l.Stats())) }
	}
	cs = append(cs,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_decision_logs_sent_total", Help: "Decision-log events delivered."},
			stat(func(st decisionlog.Stats) int64 { return st.Sent })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_decision_logs_dropped_total", Help: "Decision-log events dropped because the bounded buffer was full (the collector was down or slow); the audit log still has every decision."},
			stat(func(st decisionlog.Stats) int64 { return st.Dropped })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_decision_logs_failures_total", Help: "Decision-log deliveries that failed (each is retried)."},
			stat(func(st decisionlog.Stats) int64 { return st.Failed })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_decision_logs_queued", Help: "Decision-log events waiting to be delivered."},
			stat(func(st decisionlog.Stats) int64 { return int64(st.Queued) })),
	)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("gateway: metric: %w", err)
		}
	}
	if !l.cfg.Receipts.Disabled && l.cfg.ReceiptsSigner() == config.ReceiptsLocal {
		key, err := receipts.LoadKey(l.cfg.ReceiptsKeyFile(), true)
		if err != nil {
			return fmt.Errorf("receipts.key_file: %w", err)
		}
		l.receipts = receipts.NewSigner(key)
	}
	return nil
}

// decisionLabels are OPA's labels (id: the host) and the configured ones.
func decisionLabels(cfg map[string]string) map[string]string {
	out := map[string]string{"app": "sluice"}
	if h, err := os.Hostname(); err == nil {
		out["id"] = h
	}
	for k, v := range cfg {
		out[k] = v
	}
	return out
}

// revisionCollector reports the revision in force at each scrape.
type revisionCollector struct {
	desc   *prometheus.Desc
	engine func() *policy.Engine
}

func (c *revisionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *revisionCollector) Collect(ch chan<- prometheus.Metric) {
	if e := c.engine(); e != nil {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, e.Revision())
	}
}

// Hooks sets the engine's hooks for the life cycle. The decision log is
// fed from the audit records of decisions (DecisionExport, export.go),
// not from the engine.
func (l *Life) Hooks(pc *policy.Config) {
	pc.OnBundle = l.bundleLoaded
}

// Run runs the decision-log export until ctx ends.
func (l *Life) Run(ctx context.Context) {
	if l.decisions != nil {
		_ = l.decisions.Run(ctx) // returns nil when ctx ends
	}
}

func (l *Life) bundleLoaded(ok bool, _ error) {
	if l.bundleLoads == nil {
		return
	}
	r := "ok"
	if !ok {
		r = "error" // logged by the engine, with the reason
	}
	l.bundleLoads.WithLabelValues(r).Inc()
}

// Exporter is the decision-log exporter (nil without decision_logs).
func (l *Life) Exporter() *decisionlog.Exporter { return l.decisions }

// EntranceLabel is the decision-log label naming the entrance a decision
// came through: tool_call/http, tool_call/mcp, tool_call/envoy, tool_call
// (an ask's hold), http, connect, dns (raw egress); see DecisionExport.
const EntranceLabel = "entrance"

// EntranceLabels are the export's labels with the entrance's; built
// once per entrance (a handful), shared read-only by the events.
func (l *Life) EntranceLabels(entrance string) map[string]string {
	if m, ok := l.byEntrance.Load(entrance); ok {
		return m.(map[string]string)
	}
	m := maps.Clone(l.labels)
	m[EntranceLabel] = entrance // from the code's kinds and transports: a fixed set
	l.byEntrance.Store(entrance, m)
	return m
}

// Execution is what a receipt says of an approved hold's execution.
type Execution struct {
	Answered       bool            // the upstream answered over HTTP: nothing is signed otherwise
	Decision       policy.Decision // the decision it was sent under
	UpstreamStatus int
	Credential     string // where the credential went, never its value
	LeaseID        string // the Vault lease the credential came from, "" for none
}

// Stats are the decision-log exporter's counters (zero without
// decision_logs).
func (l *Life) Stats() decisionlog.Stats {
	if l.decisions == nil {
		return decisionlog.Stats{}
	}
	return l.decisions.Stats()
}

// Receipts is the signer of approval receipts (nil: receipts.disabled).
func (l *Life) Receipts() *receipts.Signer { return l.receipts }

// UseReceiptKey makes k, a key held in Vault (receipts.signer
// vault-transit), the receipts' signer; the gateway calls it once the
// credential source is open, before serving. It fails, and the gateway
// does not start, unless Vault names k's versions, they are ed25519 and
// the latest signs a probe (not a receipt) that verifies.
func (l *Life) UseReceiptKey(ctx context.Context, k receipts.Key) error {
	s := receipts.NewKeySigner(k)
	if err := s.Probe(ctx); err != nil {
		return fmt.Errorf("receipts.transit_key %q: %w", l.cfg.Receipts.TransitKey, err)
	}
	l.receipts = s
	return nil
}

// signTimeout bounds signing one receipt (a Vault request at most).
const signTimeout = 10 * time.Second

// Receipt signs the receipt of an approved hold that was executed (e).
// Nothing is signed for a hold that was not sent. Signing comes after the
// upstream answered, so its failure (Vault down, with vault-transit)
// cannot undo the call: the result is recorded without a receipt (GET
// .../receipt answers 404), the failure is logged with the hold's id and
// counted (sluice_receipts_sign_failures_total) — as a local signer's
// failure always was, minus the counter.
func (l *Life) Receipt(h holds.Hold, e Execution) []byte {
	if l.receipts == nil || !e.Answered {
		return nil
	}
	r := receipts.Receipt{
		HoldID: h.ID, RequestID: h.RequestID, Tool: h.Tool,
		Caller:   receipts.Caller{Sandbox: h.Caller.Sandbox, Agent: h.Caller.Agent, Session: h.Caller.Session, User: h.Caller.User},
		Approver: h.DecidedBy, ApprovedAt: h.Decided, ExecutedAt: time.Now(),
		RequestSHA256: h.SHA256, PolicyRevision: e.Decision.Revision, Decision: e.Decision.Action.String(),
		UpstreamStatus: e.UpstreamStatus, Credential: e.Credential, LeaseID: e.LeaseID,
	}
	ctx, cancel := context.WithTimeout(context.Background(), signTimeout)
	defer cancel()
	b, err := l.receipts.Sign(ctx, r)
	if err != nil {
		l.signFails.Inc()
		l.log.Error("receipts: the executed hold's receipt could not be signed; its result is recorded without one", "hold", h.ID, "err", err)
		return nil
	}
	return b
}
