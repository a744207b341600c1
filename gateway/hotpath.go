package gateway

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
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

// appendResult appends the 200 answer of a sent call, exactly as
// json.Marshal(replyBody(o)) would encode it, without reflection and
// without a second scan of a JSON reply body: roundTrip validated it
// already (json.Valid), and a body that is compact with nothing to escape
// (the common case, and what any JSON encoder writes) is copied as it is.
// ok is false for a body of another type, which the caller encodes with
// encoding/json.
func appendResult(dst []byte, r *call.Reply, requestID string) (_ []byte, ok bool) {
	if r == nil {
		return dst, false
	}
	dst = append(dst, `{"status":`...)
	dst = strconv.AppendInt(dst, int64(r.Status), 10)
	dst = append(dst, `,"headers":`...)
	if r.Headers == nil {
		dst = append(dst, "null"...)
	} else {
		keys := make([]string, 0, len(r.Headers))
		for k := range r.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = audit.AppendJSONString(dst, k)
			dst = append(dst, ':')
			vs := r.Headers[k]
			if vs == nil {
				dst = append(dst, "null"...)
				continue
			}
			dst = append(dst, '[')
			for j, v := range vs {
				if j > 0 {
					dst = append(dst, ',')
				}
				dst = audit.AppendJSONString(dst, v)
			}
			dst = append(dst, ']')
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `,"body":`...)
	switch b := r.Body.(type) {
	case nil:
		dst = append(dst, "null"...)
	case string:
		dst = audit.AppendJSONString(dst, b)
	case json.RawMessage:
		if b == nil {
			dst = append(dst, "null"...)
			break
		}
		if !plainJSON(b) {
			// What encoding/json does to a RawMessage: compact it (which
			// also validates it) and escape HTML.
			var c bytes.Buffer
			if err := json.Compact(&c, b); err != nil {
				return dst, false
			}
			var e bytes.Buffer
			json.HTMLEscape(&e, c.Bytes())
			dst = append(dst, e.Bytes()...)
			break
		}
		dst = append(dst, b...)
	default:
		return dst, false
	}
	if r.BodyEncoding != "" {
		dst = append(dst, `,"body_encoding":`...)
		dst = audit.AppendJSONString(dst, r.BodyEncoding)
	}
	dst = append(dst, `,"request_id":`...)
	dst = audit.AppendJSONString(dst, requestID)
	return append(dst, '}'), true
}

// plainJSON says whether a valid JSON text is already what encoding/json
// would write for it: no whitespace (none is needed between tokens, so
// any is insignificant or inside a string, where json.Marshal keeps it
// escaped anyway) and nothing it escapes for HTML (<, >, &, U+2028 and
// U+2029, whose UTF-8 encodings start with 0xE2).
func plainJSON(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r', '<', '>', '&', 0xE2:
			return false
		}
	}
	return true
}
