package tracing

import (
	"context"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestFromEnv: off unless an endpoint or OTEL_TRACES_EXPORTER=otlp asks;
// OTEL_SDK_DISABLED wins; a value sluice cannot honour is an error naming
// its variable (tracing is never half set up).
func TestFromEnv(t *testing.T) {
	const ep = "http://127.0.0.1:4318"
	for _, c := range []struct {
		name string
		env  map[string]string
		on   bool
		err  string // the variable the error must name; "" = no error
	}{
		{"nothing set", nil, false, ""},
		{"only the service name", map[string]string{"OTEL_SERVICE_NAME": "x"}, false, ""},
		{"only a sampler", map[string]string{EnvSampler: "always_on"}, false, ""},
		{"endpoint", map[string]string{EnvEndpoint: ep}, true, ""},
		{"traces endpoint", map[string]string{EnvTracesEndpoint: ep + "/v1/traces"}, true, ""},
		{"exporter otlp", map[string]string{EnvExporter: "otlp"}, true, ""},
		{"exporter none beats an endpoint", map[string]string{EnvExporter: "none", EnvEndpoint: ep}, false, ""},
		{"disabled beats an endpoint", map[string]string{EnvDisabled: "true", EnvEndpoint: ep}, false, ""},
		{"disabled false", map[string]string{EnvDisabled: "false", EnvEndpoint: ep}, true, ""},
		{"grpc", map[string]string{EnvEndpoint: ep, EnvProtocol: "grpc"}, true, ""},
		{"traces protocol wins", map[string]string{EnvEndpoint: ep, EnvProtocol: "bogus", EnvTracesProtocol: "grpc"}, true, ""},
		{"http/json", map[string]string{EnvEndpoint: ep, EnvProtocol: "http/json"}, false, EnvProtocol},
		{"bad traces protocol", map[string]string{EnvEndpoint: ep, EnvTracesProtocol: "udp"}, false, EnvTracesProtocol},
		{"bad disabled", map[string]string{EnvDisabled: "yes please", EnvEndpoint: ep}, false, EnvDisabled},
		{"bad exporter", map[string]string{EnvExporter: "zipkin"}, false, EnvExporter},
		{"bad sampler", map[string]string{EnvEndpoint: ep, EnvSampler: "sometimes"}, false, EnvSampler},
		{"ratio above 1", map[string]string{EnvEndpoint: ep, EnvSampler: "traceidratio", EnvSamplerArg: "1.5"}, false, EnvSamplerArg},
		{"ratio not a number", map[string]string{EnvEndpoint: ep, EnvSampler: "parentbased_traceidratio", EnvSamplerArg: "half"}, false, EnvSamplerArg},
		{"ratio", map[string]string{EnvEndpoint: ep, EnvSampler: "parentbased_traceidratio", EnvSamplerArg: "0.25"}, true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := FromEnv(context.Background(), env(c.env), "test")
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one naming %s", err, c.err)
				}
				if p != nil {
					t.Fatal("a provider with an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (p != nil) != c.on {
				t.Fatalf("provider %v, want on=%v", p != nil, c.on)
			}
			if p != nil {
				_ = p.Shutdown(context.Background())
			}
		})
	}
}

// TestSamplerFrom: the specification's names map to the SDK's samplers.
func TestSamplerFrom(t *testing.T) {
	for name, want := range map[string]string{
		"":                         "ParentBased{root:AlwaysOnSampler",
		"always_on":                "AlwaysOnSampler",
		"always_off":               "AlwaysOffSampler",
		"parentbased_always_off":   "ParentBased{root:AlwaysOffSampler",
		"traceidratio":             "TraceIDRatioBased{1}",
		"parentbased_traceidratio": "ParentBased{root:TraceIDRatioBased{0.5}",
	} {
		s, err := samplerFrom(env(map[string]string{EnvSampler: name, EnvSamplerArg: map[bool]string{true: "0.5"}[name == "parentbased_traceidratio"]}))
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		if !strings.HasPrefix(s.Description(), want) {
			t.Errorf("%q: sampler %s, want %s…", name, s.Description(), want)
		}
	}
}

// TestSandboxLink: a valid traceparent becomes a link marked as the
// sandbox's; a malformed one (W3C: ignored) none. The W3C rules are
// the propagator's: version ff, all-zero IDs, wrong lengths, upper case.
func TestSandboxLink(t *testing.T) {
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	l, ok := SandboxLink("00-" + tid + "-" + sid + "-01")
	if !ok || l.SpanContext.TraceID().String() != tid || l.SpanContext.SpanID().String() != sid || !l.SpanContext.IsRemote() {
		t.Fatalf("link %+v ok %v", l, ok)
	}
	if len(l.Attributes) != 1 || l.Attributes[0].Key != LinkFrom || l.Attributes[0].Value.AsString() != "sandbox" {
		t.Errorf("link attributes %v", l.Attributes)
	}
	for _, bad := range []string{
		"", "garbage", "00-" + tid + "-" + sid, // too few fields
		"ff-" + tid + "-" + sid + "-01",                      // version ff is invalid
		"00-00000000000000000000000000000000-" + sid + "-01", // zero trace ID
		"00-" + tid + "-0000000000000000-01",                 // zero span ID
		"00-" + strings.ToUpper(tid) + "-" + sid + "-01",     // upper case
		"00-" + tid[:30] + "-" + sid + "-01",                 // short trace ID
		"00-" + tid + "-" + sid + "-01\r\nX-Evil: 1",         // smuggled line
	} {
		if _, ok := SandboxLink(bad); ok {
			t.Errorf("SandboxLink(%q) made a link", bad)
		}
	}
}

// TestInject: the upstream gets ctx's span context in place of anything
// the sandbox set; with no span context both headers are removed.
func TestInject(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "Tracestate": {"evil=1"}}
	Inject(ctx, h)
	sc := span.SpanContext()
	if got, want := h.Get("Traceparent"), "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01"; got != want || len(h.Values("Traceparent")) != 1 {
		t.Errorf("traceparent %q, want %q once", h.Values("Traceparent"), want)
	}
	if h.Get("Tracestate") != "" {
		t.Errorf("tracestate %q kept", h.Get("Tracestate"))
	}
	h = http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "Tracestate": {"evil=1"}}
	Inject(context.Background(), h)
	if len(h) != 0 {
		t.Errorf("tracing off: headers %v left", h)
	}
	if Traceparent(ctx) != "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01" || TraceIDOf(Traceparent(ctx)) != sc.TraceID().String() || TraceID(ctx) != sc.TraceID().String() {
		t.Errorf("Traceparent %q TraceIDOf %q TraceID %q", Traceparent(ctx), TraceIDOf(Traceparent(ctx)), TraceID(ctx))
	}
	if Traceparent(context.Background()) != "" || TraceID(context.Background()) != "" || TraceIDOf("junk") != "" {
		t.Error("a span context from nothing")
	}
	if l, ok := HoldLink(Traceparent(ctx)); !ok || l.SpanContext.SpanID() != sc.SpanID() || l.Attributes[0].Value.AsString() != "hold" {
		t.Errorf("HoldLink %+v %v", l, ok)
	}
}
