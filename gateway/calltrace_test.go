package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/gateway/tracing"
)

// testTracing is the provider startGateway hands the gateway (nil: off).
var testTracing trace.TracerProvider

// withTracing makes the gateways the test starts export to an in-memory
// exporter of the real SDK, synchronously, and returns it.
func withTracing(t *testing.T) *tracetest.InMemoryExporter {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	testTracing = tp
	t.Cleanup(func() { testTracing = nil; _ = tp.Shutdown(context.Background()) })
	return exp
}

// TestTraceEnvoyCheck: an ext_authz Check is a server span of its own
// (OTel RPC conventions), a new root whatever traceparent the checked
// request carries, which is only its link (THREATS F13); the pipeline's
// call span and stages are its children; the audit record carries the
// trace ID.
func TestTraceEnvoyCheck(t *testing.T) {
	exp := withTracing(t)
	g := startEnvoyGateway(t, nil)
	const forgedTrace, forgedSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	res := g.check(t, g.checkRequest("HTTP/1.1", "GET", "/tickets?limit=5", nil, map[string]string{"traceparent": "00-" + forgedTrace + "-" + forgedSpan + "-01"}))
	if res.GetOkResponse() == nil {
		t.Fatalf("want OK, got %v", res)
	}
	spans := exp.GetSpans()
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = s
		if s.SpanContext.TraceID().String() == forgedTrace || s.Parent.SpanID().String() == forgedSpan {
			t.Errorf("span %s is in the forged trace or under the forged span", s.Name)
		}
	}
	check, ok := byName[checkMethod]
	if !ok {
		t.Fatalf("no %s span among %d", checkMethod, len(spans))
	}
	if check.Parent.IsValid() || check.SpanKind != trace.SpanKindServer || len(check.Links) != 1 ||
		check.Links[0].SpanContext.TraceID().String() != forgedTrace || check.Links[0].SpanContext.SpanID().String() != forgedSpan {
		t.Fatalf("Check span: parent %v kind %v links %+v", check.Parent, check.SpanKind, check.Links)
	}
	attrs := map[string]string{}
	for _, a := range check.Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs["rpc.system.name"] != "grpc" || attrs["rpc.method"] != checkMethod || attrs["sluice.allow"] != "true" {
		t.Errorf("Check span attributes %v", attrs)
	}
	call := byName["sluice.tool_call"]
	if call.Parent.SpanID() != check.SpanContext.SpanID() || byName["sluice.decide"].Parent.SpanID() != call.SpanContext.SpanID() {
		t.Errorf("call span's parent %v, decide's %v; want Check → call → stages", call.Parent.SpanID(), byName["sluice.decide"].Parent.SpanID())
	}
	if _, sent := byName["sluice.send"]; sent {
		t.Error("a send stage on a decided-only call: Envoy sends, not the gateway")
	}
	recs := envoyRecords(t, g.testGateway)
	if len(recs) != 1 || fieldsOf(recs[0])["trace_id"] != check.SpanContext.TraceID().String() {
		t.Fatalf("audit records %v, want one with trace_id %s", recs, check.SpanContext.TraceID())
	}
	if !strings.Contains(g.logBuf.String(), `"trace_id":"`+check.SpanContext.TraceID().String()+`"`) {
		t.Error("the canonical line has no trace_id")
	}
}

// TestTraceEgressLinkOnly: a CONNECT and a plain proxied request over the
// sandbox socket are server spans of their own, new roots, with the
// sandbox's traceparent only a link (THREATS F13); a refused one is
// still traced, by method only (never the target, which the sandbox
// chose). Each one's audit record and canonical line carry its span's
// trace ID, never the forged one (issue 22).
func TestTraceEgressLinkOnly(t *testing.T) {
	exp := withTracing(t)
	up := egresstest.NewDNSUpstream(t, nil)
	g := startEgressGateway(t, up, nil)
	const forgedTrace, forgedSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	tp := "Traceparent: 00-" + forgedTrace + "-" + forgedSpan + "-01\r\n"
	for _, req := range []string{
		"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n" + tp + "\r\n",
		"GET http://denied.test/secret-path HTTP/1.1\r\nHost: denied.test\r\n" + tp + "\r\n",
	} {
		resp, body, conn, _ := exchange(t, g, req)
		conn.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("%q: %d %s, want 403", req, resp.StatusCode, body)
		}
	}
	var names []string
	for _, s := range exp.GetSpans() {
		names = append(names, s.Name)
		if s.Parent.IsValid() || s.SpanContext.TraceID().String() == forgedTrace {
			t.Errorf("span %s: parent %v, trace %s; want a new root", s.Name, s.Parent, s.SpanContext.TraceID())
		}
		if len(s.Links) != 1 || s.Links[0].SpanContext.SpanID().String() != forgedSpan {
			t.Errorf("span %s: links %+v, want the sandbox's context", s.Name, s.Links)
		}
		for _, a := range s.Attributes {
			if strings.Contains(a.Value.Emit(), "denied.test") || strings.Contains(a.Value.Emit(), "secret-path") {
				t.Errorf("span %s carries the sandbox's target: %s=%s", s.Name, a.Key, a.Value.Emit())
			}
		}
	}
	if strings.Join(names, ",") != "CONNECT,GET" {
		t.Fatalf("spans %v, want CONNECT and GET", names)
	}
	spans := exp.GetSpans()
	var traced []string
	for _, r := range auditEvents(t, g) {
		if f := fieldsOf(r); f["dest_host"] == "denied.test" {
			id, _ := f["trace_id"].(string)
			traced = append(traced, f["kind"].(string)+" "+id)
		}
	}
	want := []string{"connect " + spans[0].SpanContext.TraceID().String(), "http " + spans[1].SpanContext.TraceID().String()}
	if !slices.Equal(traced, want) {
		t.Fatalf("raw egress records (kind trace_id) %q, want %q: each record names its request's trace", traced, want)
	}
	for _, id := range []string{spans[0].SpanContext.TraceID().String(), spans[1].SpanContext.TraceID().String()} {
		if !strings.Contains(g.logBuf.String(), `"trace_id":"`+id+`"`) {
			t.Errorf("no canonical line has trace_id %s", id)
		}
	}
}

// TestTraceEnvoyEgress: a Check for a host that is no connector's is
// decided as raw egress; its audit record and canonical line carry the
// Check span's trace ID, allowed or refused, as a tool call's do (issue
// 22), and never the checked request's forged traceparent.
func TestTraceEnvoyEgress(t *testing.T) {
	exp := withTracing(t)
	g := startEnvoyGateway(t, nil)
	const forged = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, host := range []string{"pypi.org", "evil.example"} {
		cr := g.checkRequest("HTTP/1.1", "GET", "/simple/", nil, map[string]string{"traceparent": forged})
		cr.Attributes.Request.Http.Host, cr.Attributes.Request.Http.Headers[":authority"] = host, host
		res := g.check(t, cr)
		if allowed := res.GetOkResponse() != nil; allowed != (host == "pypi.org") {
			t.Fatalf("%s: allowed %v: %v", host, allowed, res)
		}
	}
	var checks []string
	for _, s := range exp.GetSpans() {
		if s.Name == checkMethod {
			checks = append(checks, s.SpanContext.TraceID().String())
		}
	}
	var traced []string
	for _, r := range envoyRecords(t, g.testGateway) {
		f := fieldsOf(r)
		id, _ := f["trace_id"].(string)
		traced = append(traced, id)
		if f["kind"] != "http" {
			t.Errorf("record kind %v, want raw egress (http)", f["kind"])
		}
	}
	if len(checks) != 2 || !slices.Equal(traced, checks) {
		t.Fatalf("raw egress records' trace_id %q, Check spans' traces %q: want one record per Check, in its trace", traced, checks)
	}
	for _, id := range checks {
		if !strings.Contains(g.logBuf.String(), `"trace_id":"`+id+`"`) {
			t.Errorf("no canonical line has trace_id %s", id)
		}
	}
}

// TestTraceMCPMetaTraceparent: an MCP tools/call's _meta.traceparent (the
// MCP client's trace context) is a link of the call's span, as the HTTP
// traceparent is of the server span, and never a parent: no span is in
// the forged trace or under the forged span (THREATS F13, F17); the audit
// records carry the gateway's own trace.
func TestTraceMCPMetaTraceparent(t *testing.T) {
	exp := withTracing(t)
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil)
	const forgedTrace, forgedSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := context.Background()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "trace-test", Version: "1"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: "http://sluice/mcp", HTTPClient: &http.Client{Transport: g.client(agentA).Transport}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Meta: sdk.Meta{"traceparent": "00-" + forgedTrace + "-" + forgedSpan + "-01"},
		Name: "tickets.list_tickets", Arguments: map[string]any{"query": map[string]any{"limit": 5}}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call: %v %+v", err, res)
	}
	var call tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID().String() == forgedTrace || s.Parent.SpanID().String() == forgedSpan {
			t.Errorf("span %s is in the forged trace or under the forged span", s.Name)
		}
		if s.Name == "sluice.tool_call" {
			call = s
		}
	}
	if !call.Parent.IsValid() {
		t.Fatalf("no sluice.tool_call span under the POST /mcp server span (%d spans)", len(exp.GetSpans()))
	}
	linked := false
	for _, l := range call.Links {
		from := ""
		for _, a := range l.Attributes {
			if a.Key == "sluice.link.from" {
				from = a.Value.Emit()
			}
		}
		linked = linked || (l.SpanContext.TraceID().String() == forgedTrace && l.SpanContext.SpanID().String() == forgedSpan && from == "sandbox")
	}
	if !linked {
		t.Fatalf("the call span's links %+v, want _meta.traceparent linked (sluice.link.from=sandbox)", call.Links)
	}
	for _, r := range auditEvents(t, g) {
		if f := fieldsOf(r); f["transport"] == "mcp" && f["trace_id"] != call.SpanContext.TraceID().String() {
			t.Errorf("MCP record %s trace_id %v, want the call's %s", r.Event, f["trace_id"], call.SpanContext.TraceID())
		}
	}
}

// stuckCollector is an OTLP/gRPC trace collector whose Export never
// answers until released: a collector that hangs.
type stuckCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	entered chan struct{}
	release chan struct{}
}

func (c *stuckCollector) Export(ctx context.Context, _ *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	select {
	case c.entered <- struct{}{}:
	default:
	}
	select {
	case <-c.release:
	case <-ctx.Done():
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TestTraceStuckCollectorNeverHoldsCalls: with the OTLP collector hung
// mid-export, the batch queue fills and then drops spans: no call waits
// for the exporter (every one answers, none near the export timeout).
func TestTraceStuckCollectorNeverHoldsCalls(t *testing.T) {
	col := &stuckCollector{entered: make(chan struct{}, 1), release: make(chan struct{})}
	p := otlpProvider(t, col, "OTEL_EXPORTER_OTLP_TIMEOUT", "8000", "OTEL_BSP_SCHEDULE_DELAY", "10")
	up := newUpstream(t)
	testTracing = p.TracerProvider()
	g := startGateway(t, up.URL, "", nil)
	testTracing = nil
	via := g.client(agentA)
	// 2048 spans fill the queue; each call makes more than ten.
	const calls = 400
	var slowest time.Duration
	for i := 0; i < calls; i++ {
		t0 := time.Now()
		resp, err := via.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{"query":{"limit":5}}`))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: status %d", i, resp.StatusCode)
		}
		slowest = max(slowest, time.Since(t0))
	}
	select {
	case <-col.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the exporter never reached the collector: nothing was stuck")
	}
	close(col.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.Shutdown(ctx)
	t.Logf("%d calls with the collector hung, slowest %v", calls, slowest)
	if slowest > 5*time.Second {
		t.Fatalf("a call took %v with the collector hung: calls wait for the exporter", slowest)
	}
}

// otlpProvider is the gateway's trace pipeline (tracing.FromEnv) exporting
// over OTLP/gRPC to col, served on loopback until the test ends; kv are
// more OTEL_* variables, name then value.
func otlpProvider(t testing.TB, col collectortrace.TraceServiceServer, kv ...string) *tracing.Provider {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, col)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + ln.Addr().String(), "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_EXPORTER_OTLP_INSECURE": "true"}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	for k, v := range env { // the SDK reads its own (OTEL_BSP_*, _TIMEOUT)
		t.Setenv(k, v)
	}
	p, err := tracing.FromEnv(context.Background(), func(k string) string { return env[k] }, "test")
	if err != nil || p == nil {
		t.Fatalf("provider: %v", err)
	}
	return p
}
