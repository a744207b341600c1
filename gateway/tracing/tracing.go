// Package tracing exports the gateway's spans over OTLP when the standard
// OpenTelemetry environment asks for it, and carries W3C trace context
// across the gateway's two edges: what a sandbox sends is only ever a
// link (a sandbox must not be able to place the gateway's decision inside
// a trace it forged), what the gateway sends upstream is its own span.
//
// Tracing is off unless an OTLP endpoint or OTEL_TRACES_EXPORTER=otlp is
// set: then no provider is built and the gateway's tracer is the no-op
// one, so the default costs nothing.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// The environment variables that decide whether, and how, spans are
// exported. The exporters read the rest of OTEL_EXPORTER_OTLP_* (headers,
// insecure, certificates, timeout, compression, their TRACES_ variants)
// themselves, as the specification lays out.
const (
	EnvDisabled       = "OTEL_SDK_DISABLED"
	EnvExporter       = "OTEL_TRACES_EXPORTER"
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvSampler        = "OTEL_TRACES_SAMPLER"
	EnvSamplerArg     = "OTEL_TRACES_SAMPLER_ARG"
)

// Provider is an installed trace pipeline: an OTLP exporter behind a
// batching span processor.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// TracerProvider is the provider spans are started from.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// Shutdown exports what is still batched and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error {
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// Enabled says whether getenv's environment asks for spans to be
// exported: an OTLP endpoint, or OTEL_TRACES_EXPORTER=otlp (whose endpoint
// is then the specification's default), and OTEL_SDK_DISABLED not true.
func Enabled(getenv func(string) string) (bool, error) {
	if v := strings.TrimSpace(getenv(EnvDisabled)); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("tracing: %s: %q is not true or false", EnvDisabled, v)
		}
		if b {
			return false, nil
		}
	}
	switch v := strings.ToLower(strings.TrimSpace(getenv(EnvExporter))); v {
	case "none":
		return false, nil
	case "otlp":
		return true, nil
	case "":
	default:
		return false, fmt.Errorf("tracing: %s: %q is not supported (otlp or none)", EnvExporter, v)
	}
	return getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != "", nil
}

// FromEnv builds the trace pipeline getenv's environment asks for, or
// returns nil when it asks for none (Enabled). service.name is
// OTEL_SERVICE_NAME, else "sluice"; OTEL_RESOURCE_ATTRIBUTES adds to the
// resource. A variable with a value sluice cannot honour is an error that
// names it: tracing is never half set up.
func FromEnv(ctx context.Context, getenv func(string) string, version string) (*Provider, error) {
	on, err := Enabled(getenv)
	if err != nil || !on {
		return nil, err
	}
	sampler, err := samplerFrom(getenv)
	if err != nil {
		return nil, err
	}
	proto, key := getenv(EnvTracesProtocol), EnvTracesProtocol
	if proto == "" {
		proto, key = getenv(EnvProtocol), EnvProtocol
	}
	var client otlptrace.Client
	switch strings.TrimSpace(proto) {
	case "", "http/protobuf": // the specification's default
		client = otlptracehttp.NewClient()
	case "grpc":
		client = otlptracegrpc.NewClient()
	default:
		return nil, fmt.Errorf("tracing: %s: %q is not supported (grpc or http/protobuf)", key, proto)
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	res, err := resource.Merge(
		resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName("sluice"), semconv.ServiceVersion(version)),
		envResource(ctx))
	if err != nil {
		res = resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName("sluice"), semconv.ServiceVersion(version))
	}
	// The batcher never blocks: with its queue full (a slow or hung
	// collector) a span is dropped, not waited for, so no call waits on
	// the exporter (TestTraceStuckCollectorNeverHoldsCalls). Never add
	// WithBlocking here.
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sampler),
		sdktrace.WithResource(res))
	return &Provider{tp: tp}, nil
}

// envResource is OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, with the
// SDK's own attributes.
func envResource(ctx context.Context) *resource.Resource {
	r, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && r == nil {
		return resource.Empty()
	}
	return r
}

// samplerFrom is OTEL_TRACES_SAMPLER with its argument, refused by name
// when unknown or out of range (the SDK would only log it and sample
// everything). The default is parentbased_always_on: the gateway's root
// spans have no parent, so every call is sampled.
func samplerFrom(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(getenv(EnvSampler)))
	arg := strings.TrimSpace(getenv(EnvSamplerArg))
	ratio := func() (sdktrace.Sampler, error) {
		if arg == "" {
			return sdktrace.TraceIDRatioBased(1), nil
		}
		v, err := strconv.ParseFloat(arg, 64)
		if err != nil || v < 0 || v > 1 {
			return nil, fmt.Errorf("tracing: %s: %q is not a ratio between 0 and 1", EnvSamplerArg, arg)
		}
		return sdktrace.TraceIDRatioBased(v), nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio":
		return ratio()
	case "parentbased_traceidratio":
		s, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(s), nil
	}
	return nil, fmt.Errorf("tracing: %s: %q is not supported (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio)", EnvSampler, name)
}

// HeaderTraceparent is the W3C Trace Context header (and its state's).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

var w3c = propagation.TraceContext{}

// errNoContext: the value is absent or not a valid traceparent.
var errNoContext = errors.New("tracing: no valid traceparent")

// parse is a W3C traceparent (with its tracestate) as a remote span context.
func parse(traceparent, tracestate string) (trace.SpanContext, error) {
	if traceparent == "" {
		return trace.SpanContext{}, errNoContext
	}
	carrier := propagation.MapCarrier{HeaderTraceparent: traceparent}
	if tracestate != "" {
		carrier[HeaderTracestate] = tracestate
	}
	sc := trace.SpanContextFromContext(w3c.Extract(context.Background(), carrier))
	if !sc.IsValid() {
		return trace.SpanContext{}, errNoContext
	}
	return sc, nil
}

// SandboxLink is the span link for a trace context a sandbox sent (the
// value of its traceparent, "" when none): a link, never a parent, so
// that what the sandbox claims cannot make the gateway's decision part
// of a trace it chose, nor steer its sampling. ok is false when the value
// is absent or malformed (it is then ignored, as W3C says a receiver
// must).
func SandboxLink(traceparent string) (trace.Link, bool) {
	sc, err := parse(traceparent, "")
	if err != nil {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{LinkFrom.String("sandbox")}}, true
}

// LinkFrom names where a link's span context came from: "sandbox" (a
// caller's traceparent), "hold" (the span that created a hold, on its
// execution).
const LinkFrom = attribute.Key("sluice.link.from")

// Traceparent is ctx's span context as a W3C traceparent, "" when ctx has
// no valid span context (tracing off). Stored with a hold, it links the
// hold's later execution to the call that created it.
func Traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	w3c.Inject(ctx, carrier)
	return carrier[HeaderTraceparent]
}

// HoldLink is the link from a hold's execution to the span that created
// the hold, from the traceparent stored with it (Traceparent).
func HoldLink(traceparent string) (trace.Link, bool) {
	sc, err := parse(traceparent, "")
	if err != nil {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{LinkFrom.String("hold")}}, true
}

// Inject puts ctx's span context on an upstream request's headers,
// replacing any traceparent and tracestate already there (a sandbox's:
// never forwarded as the gateway's). With tracing off it only removes
// them.
func Inject(ctx context.Context, h http.Header) {
	h.Del(HeaderTraceparent)
	h.Del(HeaderTracestate)
	if trace.SpanContextFromContext(ctx).IsValid() {
		w3c.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// TraceID is the hex trace ID of ctx's span, "" when it has none (tracing
// off). An unsampled call has one too: the upstream saw it.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// TraceIDOf is the trace ID of a stored traceparent (Traceparent's), ""
// when it is absent or malformed.
func TraceIDOf(traceparent string) string {
	sc, err := parse(traceparent, "")
	if err != nil {
		return ""
	}
	return sc.TraceID().String()
}
