package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
)

// countingCollector is a loopback OTLP/gRPC trace collector that decodes
// every export (the gRPC server does) and counts the spans.
type countingCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	spans atomic.Int64
}

func (c *countingCollector) Export(_ context.Context, r *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	for _, rs := range r.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.spans.Add(int64(len(ss.Spans)))
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// BenchmarkTracedCall is BenchmarkAllowedCall's tmpfs gateway with tracing
// unset and with every span exported over OTLP/gRPC to a loopback
// collector in this process (test/bench's tracing section, in process):
// with -cpuprofile and -memprofile it shows what spans cost a call.
// on-discarded batches the same spans into an exporter that drops them:
// its difference from unset is the spans' cost on the call's goroutine,
// on's from it the export's.
func BenchmarkTracedCall(b *testing.B) {
	col := &countingCollector{}
	p := otlpProvider(b, col, "OTEL_TRACES_SAMPLER", "always_on", "OTEL_BSP_SCHEDULE_DELAY", "100")
	b.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	up := newUpstream(b)
	off := startGateway(b, up.URL, "", auditOnShm(b))
	testTracing = p.TracerProvider()
	on := startGateway(b, up.URL, "", auditOnShm(b))
	// The same spans batched into an exporter that discards them: what
	// spans cost the call's goroutine, without the export's work.
	discard := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = discard.Shutdown(context.Background()) })
	testTracing = discard
	dropped := startGateway(b, up.URL, "", auditOnShm(b))
	testTracing = nil
	for _, v := range []struct {
		name string
		gw   *testGateway
	}{{"unset", off}, {"on", on}, {"on-discarded", dropped}} {
		via := v.gw.client(agentA)
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				postListTickets(b, via)
			}
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
	if err := p.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	if col.spans.Load() == 0 {
		b.Fatal("the collector received no span")
	}
}

// postListTickets is one allowed call over via, its reply read and
// checked (200).
func postListTickets(b *testing.B, via *http.Client) {
	resp, err := via.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{"query":{"limit":5}}`))
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
}
