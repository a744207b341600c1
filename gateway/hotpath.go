package gateway

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// This file holds what the tool-call pipeline builds once instead of on
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

// optCache maps label values to their measurement option.
type optCache struct {
	mu sync.RWMutex
	m  map[labelKey]metric.MeasurementOption
}

// get returns k's option, made by mk the first time.
func (c *optCache) get(k labelKey, mk func() metric.MeasurementOption) metric.MeasurementOption {
	c.mu.RLock()
	o, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return o
	}
	o = mk()
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[labelKey]metric.MeasurementOption)
	}
	if len(c.m) < hotCacheMax {
		c.m[k] = o
	}
	c.mu.Unlock()
	return o
}

// hotMetrics are the pipeline's cached instruments' label sets.
type hotMetrics struct {
	decisions optCache // action, rule
	upstream  optCache // connector, path, class
	latencyMu sync.RWMutex
	latency   map[string]prometheus.Observer // decision → its series
}

// decisionAttrs is the decisions counter's option for action and rule.
func (t *telemetry) decisionAttrs(action, rule string) metric.MeasurementOption {
	return t.hot.decisions.get(labelKey{action, rule, ""}, func() metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("action", action), attribute.String("rule", rule))
	})
}

// upstreamAttrs is the upstream-responses counter's option.
func (t *telemetry) upstreamAttrs(connector, path, class string) metric.MeasurementOption {
	return t.hot.upstream.get(labelKey{connector, path, class}, func() metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("connector", connector), attribute.String("path", path), attribute.String("class", class))
	})
}

// observeLatency records a tool call's latency under its decision.
func (t *telemetry) observeLatency(decision string, seconds float64) {
	h := &t.hot
	h.latencyMu.RLock()
	o, ok := h.latency[decision]
	h.latencyMu.RUnlock()
	if !ok {
		o = t.latency.WithLabelValues(decision)
		h.latencyMu.Lock()
		if h.latency == nil {
			h.latency = make(map[string]prometheus.Observer)
		}
		if len(h.latency) < hotCacheMax {
			h.latency[decision] = o
		}
		h.latencyMu.Unlock()
	}
	o.Observe(seconds)
}
