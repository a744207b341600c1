package tracing

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Server wraps the sandbox socket's handler: every request the mux routes
// is timed into duration (http.server.request.duration: method, route,
// status), and with a tracer (nil: tracing is off) gets an HTTP server
// span named by its route ("POST /v1/tools/{tool}"), a new root with the
// sandbox's traceparent as a link (THREATS F13). Raw egress (CONNECT,
// absolute URLs) is not timed: a tunnel's lifetime is not a request's
// duration; it is traced when tracing is on. attrs, if not nil, gives the
// duration's attribute set for a method, route and status, built once per
// set (metrics.Gateway.ServerAttrs): an attribute set built per request
// sorts and hashes its attributes every time.
func Server(next http.Handler, tracer trace.Tracer, duration metric.Float64Histogram, attrs func(method, route string, status int) metric.MeasurementOption) http.Handler {
	tracing := tracer != nil
	if attrs == nil {
		attrs = ServerAttrs
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		egress := r.Method == http.MethodConnect || r.URL.IsAbs()
		if egress && !tracing {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		var span trace.Span = noop.Span{}
		if tracing {
			// A new root by design: nothing the sandbox sent is a parent.
			// The attributes are set once, at the end: each SetAttributes
			// on a span that has some grows its slice.
			opts := [3]trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot()}
			n := 2
			if l, ok := SandboxLink(r.Header.Get(HeaderTraceparent)); ok {
				opts[n] = trace.WithLinks(l)
				n++
			}
			var ctx context.Context
			ctx, span = tracer.Start(r.Context(), method(r.Method), opts[:n]...)
			r = r.WithContext(ctx)
		}
		if egress { // traced only: the handler may hijack the connection
			next.ServeHTTP(w, r)
			span.SetAttributes(semconv.HTTPRequestMethodKey.String(method(r.Method)))
			span.End()
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		route := r.Pattern // set by the mux on this request
		m := method(r.Method)
		duration.Record(context.Background(), time.Since(start).Seconds(), attrs(m, route, status))
		if tracing {
			attrs := [3]attribute.KeyValue{semconv.HTTPRequestMethodKey.String(m), semconv.HTTPResponseStatusCodeKey.Int(status)}
			n := 2
			if rt := routeOf(route); rt != "" {
				span.SetName(m + " " + rt)
				attrs[n] = semconv.HTTPRouteKey.String(rt)
				n++
			}
			span.SetAttributes(attrs[:n]...)
			if status >= 500 {
				span.SetStatus(codes.Error, "")
			}
			span.End()
		}
	})
}

// ServerAttrs is http.server.request.duration's attribute set for an
// HTTP method (already a label: see method), the mux's pattern and the
// status answered.
func ServerAttrs(method, route string, status int) metric.MeasurementOption {
	return metric.WithAttributes(semconv.HTTPRequestMethodKey.String(method), semconv.HTTPRouteKey.String(routeOf(route)), semconv.HTTPResponseStatusCodeKey.Int(status))
}

// method is an HTTP method as a metric and span label: a known one, else
// _OTHER (the caller chooses it; its cardinality must not be theirs).
func method(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "_OTHER"
}

// routeOf is a mux pattern's path ("POST /v1/tools/{tool}" →
// "/v1/tools/{tool}"), "" for the catch-all.
func routeOf(pattern string) string {
	for i := 0; i < len(pattern); i++ {
		if pattern[i] == ' ' {
			pattern = pattern[i+1:]
			break
		}
	}
	if pattern == "/" {
		return ""
	}
	return pattern
}

// statusWriter notes the status a handler wrote. It passes Flush, Hijack
// and Unwrap through, so streaming (MCP, DNS streams) and upgrades work
// as without it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
