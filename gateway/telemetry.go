package gateway

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"
)

// telemetry holds the gateway's OpenTelemetry instruments. Metrics are
// exported in Prometheus format on the admin listener's /metrics; spans go
// to the process's global TracerProvider (a no-op unless one is installed).
type telemetry struct {
	provider  *sdkmetric.MeterProvider
	handler   http.Handler
	tracer    trace.Tracer
	decisions metric.Int64Counter
	latency   metric.Float64Histogram
	reloads   metric.Int64Counter
	refusals  metric.Int64Counter
	audits    metric.Int64Counter
	reflected metric.Int64Counter
	upstream  metric.Int64Counter
}

func newTelemetry() (*telemetry, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("gateway: metrics exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	m := mp.Meter("sluice/gateway")
	t := &telemetry{
		provider: mp,
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		tracer:   otel.Tracer("sluice/gateway"),
	}
	var errs [7]error
	t.decisions, errs[0] = m.Int64Counter("sluice.decisions", metric.WithDescription("Policy decisions by action and rule."))
	t.latency, errs[1] = m.Float64Histogram("sluice.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a tool call's arrival to its answer, by decision."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
	t.reloads, errs[2] = m.Int64Counter("sluice.policy.reloads", metric.WithDescription("Policy reload attempts by result (ok, error)."))
	t.refusals, errs[3] = m.Int64Counter("sluice.connections.refused", metric.WithDescription("Sandbox-socket connections refused before any request was served (untrusted peer, bad preamble or handoff, malformed request head), by code."))
	t.audits, errs[4] = m.Int64Counter("sluice.audit.failures", metric.WithDescription("Audit records that could not be made durable."))
	t.reflected, errs[5] = m.Int64Counter("sluice.secret.reflected", metric.WithDescription("Upstream responses that echoed an attached credential (scrubbed)."))
	t.upstream, errs[6] = m.Int64Counter("sluice.upstream.responses", metric.WithDescription("Upstream answers by connector (empty for raw egress), path (tool_call, proxy, intercept) and status class (2xx … 5xx); a relayed 401 is counted here as 4xx whatever the gateway answered."))
	for _, e := range errs {
		if e != nil {
			return nil, fmt.Errorf("gateway: metric: %w", e)
		}
	}
	return t, nil
}

func (t *telemetry) reload(ok bool) {
	r := "ok"
	if !ok {
		r = "error"
	}
	t.reloads.Add(context.Background(), 1, metric.WithAttributes(attribute.String("result", r)))
}

func (t *telemetry) refused(code Code) {
	t.refusals.Add(context.Background(), 1, metric.WithAttributes(attribute.String("code", string(code))))
}

// upstreamAnswered counts an upstream's answer of status on path (tool_call,
// proxy, intercept) for connector ("" on raw egress: a host is not a label,
// its cardinality is the agent's to choose).
func (t *telemetry) upstreamAnswered(connector, path string, status int) {
	t.upstream.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("connector", connector), attribute.String("path", path), attribute.String("class", statusClass(status))))
}

// statusClass is the class of an HTTP status: "2xx" … "5xx", or "other"
// for a status outside 100..599 (refused as invalid, counted all the same).
func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return string(rune('0'+status/100)) + "xx"
}
