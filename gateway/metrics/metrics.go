// Package metrics holds the gateway's metric instruments: Prometheus and
// OpenTelemetry counters and histograms, exported in Prometheus format on
// the admin listener's /metrics. Spans are the root's (calltrace.go).
package metrics

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/tracing"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Gateway holds the gateway's metric instruments, exported in Prometheus
// format on the admin listener's /metrics (Handler).
type Gateway struct {
	Provider  *sdkmetric.MeterProvider
	Handler   http.Handler
	Decisions metric.Int64Counter
	// latency and approval are Prometheus histograms, not OpenTelemetry
	// ones: a histogram series can then exist, zero-valued, before its
	// first observation.
	latency   *prometheus.HistogramVec
	reloads   metric.Int64Counter
	refusals  metric.Int64Counter
	Unaudited metric.Int64Counter // hosted refusals past their address's budget (ingress/hosted_budget.go)
	Audits    metric.Int64Counter
	Reflected metric.Int64Counter
	upstream  metric.Int64Counter
	// approval is the time from a hold's creation to a person's decision.
	Approval *prometheus.HistogramVec
	Reg      *prometheus.Registry
	// rules maps a simple rule's decision Rule ("policies[3]", its index)
	// to its metric label, made of the rule's own match and action, so a
	// reordered config keeps its series (SetRules).
	rules map[string]string
	hot   hotMetrics // label sets built once (below)

	// ServerDuration is OTel's standard http.server.request.duration of
	// the sandbox socket (seconds, the convention's buckets).
	ServerDuration metric.Float64Histogram
}

// SetRules names each of the config's simple rules for the rule label:
// "policy:" + match + ":" + action, with "#2", "#3" … on a repeat of the
// same pair. Set once, before anything is served; the config's policies
// do not change while the server runs.
func (t *Gateway) SetRules(policies []config.Policy) {
	t.rules = make(map[string]string, len(policies))
	seen := map[string]int{}
	for i, p := range policies {
		l := "policy:" + p.Match + ":" + p.Action
		if seen[l]++; seen[l] > 1 {
			l += "#" + strconv.Itoa(seen[l])
		}
		t.rules["policies["+strconv.Itoa(i)+"]"] = l
	}
}

// RuleLabel is the rule label of a decision's Rule: a simple rule's
// stable name, any other (a Rego module's, "default", "egress") as is.
func (t *Gateway) RuleLabel(rule string) string {
	if l, ok := t.rules[rule]; ok {
		return l
	}
	return rule
}

// New builds the instruments on a registry of their own.
func New() (*Gateway, error) {
	reg := prometheus.NewRegistry()
	// Go runtime (goroutines, heap, GC) and process (open fds, RSS, CPU)
	// families on the same registry: what an operator checks first.
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("gateway: go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("gateway: process collector: %w", err)
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("gateway: metrics exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	m := mp.Meter("sluice/gateway")
	t := &Gateway{
		Provider: mp,
		Handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		Reg:      reg,
	}
	t.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sluice_request_duration_seconds",
		Help:    "Time from a tool call's arrival to its answer, by decision.",
		Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"decision"})
	t.Approval = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sluice_approval_latency_seconds",
		Help:    "Time from a hold's creation to an approver's decision, by decision (approved, denied).",
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400},
	}, []string{"decision"})
	for _, c := range []prometheus.Collector{t.latency, t.Approval} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("gateway: metric: %w", err)
		}
	}
	var errs [8]error
	t.Decisions, errs[0] = m.Int64Counter("sluice.decisions", metric.WithDescription("Policy decisions by action and rule."))
	t.reloads, errs[1] = m.Int64Counter("sluice.policy.reloads", metric.WithDescription("Policy reload attempts by result (ok, error)."))
	t.refusals, errs[2] = m.Int64Counter("sluice.connections.refused", metric.WithDescription("Sandbox-socket connections refused before any request was served (untrusted peer, bad preamble or handoff, malformed request head), by code."))
	t.Unaudited, errs[7] = m.Int64Counter("sluice.hosted.refusals.unaudited", metric.WithDescription("Refusals at the hosted listener of attempts naming no token, past their source address's budget: answered 407 and counted here, audited once per address and window (hosted_refusals_summarised) instead of each."))
	t.Audits, errs[3] = m.Int64Counter("sluice.audit.failures", metric.WithDescription("Audit records that could not be made durable."))
	t.Reflected, errs[4] = m.Int64Counter("sluice.secret.reflected", metric.WithDescription("Upstream responses that echoed an attached credential (scrubbed)."))
	t.upstream, errs[5] = m.Int64Counter("sluice.upstream.responses", metric.WithDescription("Upstream answers by connector (empty for raw egress), path (tool_call, proxy, intercept) and status class (2xx … 5xx); a relayed 401 is counted here as 4xx whatever the gateway answered."))
	t.ServerDuration, errs[6] = m.Float64Histogram("http.server.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP server requests."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	for _, e := range errs {
		if e != nil {
			return nil, fmt.Errorf("gateway: metric: %w", e)
		}
	}
	return t, nil
}

// Zero makes every family visible from the start: each counter gets a
// zero-valued series for the label values known now (results, classes,
// the configured connectors), so a dashboard or an alert on rate() sees
// the family before its first event. connectors are the configured slugs.
func (t *Gateway) Zero(connectors []string) {
	ctx := context.Background()
	for _, r := range []string{"ok", "error"} {
		t.reloads.Add(ctx, 0, metric.WithAttributes(attribute.String("result", r)))
	}
	t.Audits.Add(ctx, 0)
	t.Reflected.Add(ctx, 0)
	t.Unaudited.Add(ctx, 0)
	for _, a := range []string{"allow", "ask", "block"} {
		t.Decisions.Add(ctx, 0, metric.WithAttributes(attribute.String("action", a), attribute.String("rule", "default")))
	}
	for _, c := range []refusal.Code{refusal.UntrustedPeer, refusal.IdentityRequired, refusal.HeaderTooLarge, refusal.RequestTimeout, refusal.TooManyConnections} {
		t.refusals.Add(ctx, 0, metric.WithAttributes(attribute.String("code", string(c))))
	}
	for _, d := range []string{"allow", "ask", "block"} {
		t.latency.WithLabelValues(d)
	}
	for _, d := range []string{"approved", "denied"} {
		t.Approval.WithLabelValues(d)
	}
	for _, conn := range connectors {
		for _, class := range []string{"2xx", "3xx", "4xx", "5xx"} {
			t.upstream.Add(ctx, 0, metric.WithAttributes(
				attribute.String("connector", conn), attribute.String("path", "tool_call"), attribute.String("class", class)))
		}
	}
}

// PendingHolds exposes the current number of pending holds, read from
// count at each scrape (the store is the truth, across restarts).
func (t *Gateway) PendingHolds(count func() (int, error)) error {
	return t.Reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_holds_pending",
		Help: "Holds waiting for an approver's decision.",
	}, func() float64 {
		n, err := count()
		if err != nil {
			return math.NaN() // unknown, not zero: an alert on > 0 must not go quiet
		}
		return float64(n)
	}))
}

func (t *Gateway) Reload(ok bool) {
	r := "ok"
	if !ok {
		r = "error"
	}
	t.reloads.Add(context.Background(), 1, metric.WithAttributes(attribute.String("result", r)))
}

func (t *Gateway) Refused(code refusal.Code) {
	t.refusals.Add(context.Background(), 1, metric.WithAttributes(attribute.String("code", string(code))))
}

// UpstreamAnswered counts an upstream's answer of status on path (tool_call,
// proxy, intercept) for connector ("" on raw egress: a host is not a label,
// its cardinality is the agent's to choose).
func (t *Gateway) UpstreamAnswered(connector, path string, status int) {
	t.upstream.Add(context.Background(), 1, t.upstreamAttrs(connector, path, statusClass(status)))
}

// statusClass is the class of an HTTP status: "2xx" … "5xx", or "other"
// for a status outside 100..599 (refused as invalid, counted all the same).
func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return string(rune('0'+status/100)) + "xx"
}

// What follows is what the tool-call pipeline builds once instead of on
// every call (test/report/perf-hotpath.md): the attribute sets of its
// counters and the histogram series of its latency. Building them is
// pure overhead — metric.WithAttributes sorts, dedups and hashes its
// attributes, WithLabelValues hashes its values and takes the vector's
// lock — and the label values come from a small, closed set (actions,
// configured rules and connectors, status classes).

// hotCacheMax bounds each cache: label values past it are built per call,
// as before, so a policy that makes many rule names costs time, not
// memory.
const hotCacheMax = 4096

// labelKey is up to three label values.
type labelKey struct{ a, b, c string }

// cache maps label values to what is built from them (a measurement
// option, a histogram's series).
type cache[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

// get returns k's value, made by mk the first time.
func (c *cache[K, V]) get(k K, mk func() V) V {
	c.mu.RLock()
	o, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return o
	}
	o = mk()
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[K]V)
	}
	if len(c.m) < hotCacheMax {
		c.m[k] = o
	}
	c.mu.Unlock()
	return o
}

// optCache maps label values to their measurement option.
type optCache = cache[labelKey, metric.MeasurementOption]

// hotMetrics are the pipeline's cached instruments' label sets.
type hotMetrics struct {
	server    cache[serverKey, metric.MeasurementOption] // method, route, status
	decisions optCache                                   // action, rule
	upstream  optCache                                   // connector, path, class
	latency   cache[string, prometheus.Observer]         // decision → its series
}

// serverKey is http.server.request.duration's label values.
type serverKey struct {
	method, route string
	status        int
}

// ServerAttrs is http.server.request.duration's option for a request's
// method (a known one or _OTHER), mux pattern and status, built once per
// set (tracing.Server).
func (t *Gateway) ServerAttrs(method, route string, status int) metric.MeasurementOption {
	return t.hot.server.get(serverKey{method, route, status}, func() metric.MeasurementOption {
		return tracing.ServerAttrs(method, route, status)
	})
}

// DecisionAttrs is the decisions counter's option for action and rule.
func (t *Gateway) DecisionAttrs(action, rule string) metric.MeasurementOption {
	return t.hot.decisions.get(labelKey{action, rule, ""}, func() metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("action", action), attribute.String("rule", rule))
	})
}

// upstreamAttrs is the upstream-responses counter's option.
func (t *Gateway) upstreamAttrs(connector, path, class string) metric.MeasurementOption {
	return t.hot.upstream.get(labelKey{connector, path, class}, func() metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("connector", connector), attribute.String("path", path), attribute.String("class", class))
	})
}

// ObserveLatency records a tool call's latency under its decision.
func (t *Gateway) ObserveLatency(decision string, seconds float64) {
	t.hot.latency.get(decision, func() prometheus.Observer { return t.latency.WithLabelValues(decision) }).Observe(seconds)
}
