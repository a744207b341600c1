//go:build linux

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
	"github.com/sluice-gw/sluice/test/internal/otlpsink"
)

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// otelEnv is newEnv with a loopback OTLP collector in the gateway's
// namespace and the standard variables pointing the gateway at it (gRPC,
// plaintext, batches sent every 100ms).
func otelEnv(t *testing.T) (*gwenv.Env, *otlpsink.Sink) {
	e := newEnv(t)
	sink := otlpsink.Serve(t, e.NS.Listen(t, "127.0.0.1:0"))
	e.Environ = []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + sink.Addr,
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_SERVICE_NAME=sluice-e2e",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
	return e, sink
}

// byName indexes a trace's spans by name (the last of a name wins; the
// stages occur once per call).
func byName(spans []otlpsink.Span) map[string]otlpsink.Span {
	m := map[string]otlpsink.Span{}
	for _, s := range spans {
		m[s.Name] = s
	}
	return m
}

// auditTraceIDs are the trace_id fields of rid's audit records.
func auditTraceIDs(g *gwenv.Gateway, rid string) []string {
	var ids []string
	for _, r := range g.AuditRecords() {
		f, _ := r["fields"].(map[string]any)
		if r["request_id"] == rid {
			id, _ := f["trace_id"].(string)
			ids = append(ids, id)
		}
	}
	return ids
}

// TestOTelTraceOfToolCall: with OTEL_EXPORTER_OTLP_ENDPOINT set, the real
// binary exports one trace per tool call over OTLP/gRPC: the sandbox
// socket's HTTP server span is its root, the pipeline's call span its
// child, and every stage a child of that; the upstream request carries the
// gateway's own traceparent (the call's trace); the audit records and the
// canonical line carry the trace ID; the traceparent the sandbox sent is a
// link only (THREATS F13); no span carries an argument value or the
// secret (THREATS F14); /metrics has http.server.request.duration.
func TestOTelTraceOfToolCall(t *testing.T) {
	e, sink := otelEnv(t)
	d := mainConfig(e, "sluice")
	g := e.Start(d, e.Write(d))

	forgedTrace, forgedSpan := randHex(16), randHex(8)
	argValue := "argval-" + randHex(6)
	f13 := casebook.Expect(t, "F13", "the sandbox sends a forged W3C traceparent with a tool call (POST /v1/tools)",
		"a link on the call's root span only: no span of the call has the forged trace ID or the forged span as parent; the upstream gets the gateway's own traceparent, not the forged one")
	f14 := casebook.Expect(t, "F14", "argument values, header values and the connector's secret, searched for in every exported span (attributes, links, events, status, resource)",
		"none found: spans carry only names the gateway chose (tool, decision, rule, route, status)")

	hdr := http.Header{"Traceparent": {"00-" + forgedTrace + "-" + forgedSpan + "-01"}, "Tracestate": {"evil=" + argValue}}
	r := g.Do(agentA, http.MethodPost, "/v1/tools/tickets.get_ticket", `{"path":{"id":"`+argValue+`"}}`, hdr)
	if r.Status != http.StatusOK || r.RequestID == "" {
		t.Fatalf("allowed call: %d %s", r.Status, r.Body)
	}

	// The trace ID is in every audit record of the call and its line.
	ids := auditTraceIDs(g, r.RequestID)
	if len(ids) < 2 || ids[0] == "" || slices.ContainsFunc(ids, func(s string) bool { return s != ids[0] }) {
		t.Fatalf("audit records of %s: trace_id %q, want the same non-empty ID on each (decision and result)", r.RequestID, ids)
	}
	traceID := ids[0]
	line := g.AwaitLog("tool_call line", func(m map[string]any) bool { return m["msg"] == "tool_call" && m["request_id"] == r.RequestID })
	if line["trace_id"] != traceID {
		t.Fatalf("canonical line trace_id %v, audit %s", line["trace_id"], traceID)
	}

	// The upstream saw the gateway's traceparent for its client span.
	reqs := e.Up.Requests()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(reqs))
	}
	tp := reqs[0].Header.Get("Traceparent")
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || parts[1] != traceID {
		t.Fatalf("upstream traceparent %q, want one in trace %s", tp, traceID)
	}
	if strings.Contains(tp, forgedTrace) || reqs[0].Header.Get("Tracestate") != "" {
		t.Fatalf("upstream got the sandbox's trace context: traceparent %q tracestate %q", tp, reqs[0].Header.Get("Tracestate"))
	}

	want := []string{"sluice.limit", "sluice.resolve", "sluice.validate", "sluice.decide", "sluice.grant", "sluice.credential", "sluice.send", "sluice.scrub", "sluice.audit"}
	spans := sink.Await(t, 15*time.Second, "the call's spans", func(all []otlpsink.Span) bool {
		n := byName(sink.Trace(traceID))
		_, root := n["POST /v1/tools/{tool}"]
		_, client := n["GET"]
		for _, w := range want {
			if _, ok := n[w]; !ok {
				return false
			}
		}
		return root && client
	})
	trace := sink.Trace(traceID)
	n := byName(trace)
	server, call, client := n["POST /v1/tools/{tool}"], n["sluice.tool_call"], n["GET"]
	if server.ParentID != "" || server.Kind.String() != "SPAN_KIND_SERVER" {
		t.Errorf("HTTP server span: parent %q kind %v, want a root server span", server.ParentID, server.Kind)
	}
	if server.Attrs["http.route"] != "/v1/tools/{tool}" || server.Attrs["http.request.method"] != "POST" || server.Attrs["http.response.status_code"] != "200" {
		t.Errorf("HTTP server span attributes %v", server.Attrs)
	}
	if call.ParentID != server.SpanID {
		t.Errorf("sluice.tool_call's parent %q, want the server span %s", call.ParentID, server.SpanID)
	}
	if call.Attrs["sluice.tool"] != "tickets.get_ticket" || call.Attrs["sluice.decision"] != "allow" || call.Attrs["sluice.rule"] == "" || call.Attrs["sluice.transport"] != "http" {
		t.Errorf("sluice.tool_call attributes %v", call.Attrs)
	}
	var prev time.Time
	for _, w := range want[:8] { // the stages, in pipeline order, children of the call
		s := n[w]
		if s.ParentID != call.SpanID {
			t.Errorf("%s's parent %q, want sluice.tool_call %s", w, s.ParentID, call.SpanID)
		}
		if s.Start.Before(prev) {
			t.Errorf("%s started before the stage before it", w)
		}
		prev = s.Start
	}
	if client.ParentID != n["sluice.send"].SpanID || client.Kind.String() != "SPAN_KIND_CLIENT" ||
		client.Attrs["url.template"] != "/tickets/{id}" || client.Attrs["http.response.status_code"] != "200" || client.Attrs["server.address"] != "127.0.0.1" {
		t.Errorf("client span: parent %q kind %v attrs %v", client.ParentID, client.Kind, client.Attrs)
	}
	if parts[2] != client.SpanID {
		t.Errorf("upstream traceparent's parent %s, want the client span %s", parts[2], client.SpanID)
	}
	if s := trace[0].Resource["service.name"]; s != "sluice-e2e" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", s)
	}

	// F13: the forged context is a link of the root, nothing more.
	linked := false
	for _, l := range server.Links {
		linked = linked || (l.TraceID == forgedTrace && l.SpanID == forgedSpan && l.Attrs["sluice.link.from"] == "sandbox")
	}
	parented := 0
	for _, s := range spans {
		if s.TraceID == forgedTrace || s.ParentID == forgedSpan {
			parented++
		}
	}
	f13.Observef("server span links the forged context: %v; spans in the forged trace or under the forged span: %d; upstream traceparent %s (trace %s)", linked, parented, tp, traceID)
	if !linked || parented != 0 || traceID == forgedTrace {
		t.Fatalf("F13: linked %v, %d spans parented by the forged context", linked, parented)
	}

	// F14: nothing the caller sent as a value, nor the secret, anywhere.
	secrets := map[string]string{"argument": argValue, "tracestate": "evil="}
	for k, v := range e.SecretForms() {
		secrets["secret "+k] = v
	}
	found := 0
	for _, s := range spans {
		txt := s.Text()
		for what, v := range secrets {
			if strings.Contains(txt, v) {
				found++
				t.Errorf("F14: %s found in span %q: %s", what, s.Name, txt)
			}
		}
	}
	f14.Observef("%d spans searched for %d strings (argument value, tracestate value, %d secret forms): %d found", len(spans), len(secrets), len(secrets)-2, found)

	// http.server.request.duration, with the convention's labels.
	st, body, err := g.AdminGet("/metrics")
	if err != nil || st != http.StatusOK {
		t.Fatalf("/metrics: %d %v", st, err)
	}
	const series = `http_server_request_duration_seconds_bucket{http_request_method="POST",http_response_status_code="200",http_route="/v1/tools/{tool}",le="0.005"}`
	if !strings.Contains(string(body), series) {
		var lines []string
		for _, l := range strings.Split(string(body), "\n") {
			if strings.Contains(l, "http_server_request_duration") {
				lines = append(lines, l)
			}
		}
		t.Errorf("/metrics has no %s; its http_server lines:\n%s", series, strings.Join(lines, "\n"))
	}
}

// TestOTelHoldLinked: a held call's trace has the hold stage (its creation
// and wait); the approved execution is a trace of its own whose call span
// links to the hold stage's span, and its upstream request carries the
// execution's trace.
func TestOTelHoldLinked(t *testing.T) {
	e, sink := otelEnv(t)
	d := mainConfig(e, "sluice")
	const token = gwenv.CarolToken
	withApprovers(d, token)
	g := e.Start(d, e.Write(d))

	reason := "reason-" + randHex(6)
	r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":7,"reason":"`+reason+`"}}`)
	if r.Status != http.StatusAccepted || r.HoldID == "" {
		t.Fatalf("ask: %d %s, want 202 with a hold", r.Status, r.Body)
	}
	ids := auditTraceIDs(g, r.RequestID)
	if len(ids) == 0 || ids[0] == "" {
		t.Fatalf("the hold's audit records carry no trace_id: %q", ids)
	}
	heldTrace := ids[0]
	sink.Await(t, 15*time.Second, "the held call's hold stage", func([]otlpsink.Span) bool {
		_, ok := byName(sink.Trace(heldTrace))["sluice.hold"]
		return ok
	})
	held := byName(sink.Trace(heldTrace))
	hold := held["sluice.hold"]
	if held["sluice.tool_call"].Attrs["sluice.hold_id"] != r.HoldID || held["sluice.tool_call"].Attrs["sluice.decision"] != "ask" {
		t.Errorf("held call span attributes %v, want sluice.hold_id %s and decision ask", held["sluice.tool_call"].Attrs, r.HoldID)
	}
	if hold.ParentID != held["sluice.tool_call"].SpanID {
		t.Errorf("sluice.hold's parent %q, want the call span", hold.ParentID)
	}

	st, _, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+r.HoldID+"/approve", token, `{"reason":"ok"}`)
	if st != http.StatusOK {
		t.Fatalf("approve: %d %v", st, body)
	}
	reqs := e.Up.Requests()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests after approval, want 1", len(reqs))
	}
	tp := strings.Split(reqs[0].Header.Get("Traceparent"), "-")
	if len(tp) != 4 || tp[1] == heldTrace {
		t.Fatalf("executed hold's upstream traceparent %v: want the execution's own trace", tp)
	}
	execTrace := tp[1]
	sink.Await(t, 15*time.Second, "the execution's call span", func([]otlpsink.Span) bool {
		_, ok := byName(sink.Trace(execTrace))["sluice.tool_call"]
		return ok
	})
	exec := byName(sink.Trace(execTrace))["sluice.tool_call"]
	linked := false
	for _, l := range exec.Links {
		linked = linked || (l.TraceID == heldTrace && l.SpanID == hold.SpanID && l.Attrs["sluice.link.from"] == "hold")
	}
	if !linked || exec.ParentID != "" || exec.Attrs["sluice.hold_id"] != r.HoldID {
		t.Fatalf("execution span: parent %q, links %+v, attrs %v; want a root linked to hold span %s/%s", exec.ParentID, exec.Links, exec.Attrs, heldTrace, hold.SpanID)
	}
	if ids := auditTraceIDs(g, r.RequestID); !slices.Contains(ids, execTrace) {
		t.Errorf("the execution's audit records carry trace IDs %q, want %s among them", ids, execTrace)
	}
	for _, s := range sink.Spans() {
		if strings.Contains(s.Text(), reason) || strings.Contains(s.Text(), e.Secret) {
			t.Errorf("F14: an argument value or the secret in span %q: %s", s.Name, s.Text())
		}
	}
}

// TestOTelOffByDefault: without any OTEL_* variable the gateway writes no
// trace_id, and a sandbox's traceparent is still not forwarded upstream.
func TestOTelOffByDefault(t *testing.T) {
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	g := e.Start(d, e.Write(d))
	hdr := http.Header{"Traceparent": {fmt.Sprintf("00-%s-%s-01", randHex(16), randHex(8))}}
	r := g.Do(agentA, http.MethodPost, "/v1/tools/tickets.list_tickets", `{}`, hdr)
	if r.Status != http.StatusOK {
		t.Fatalf("call: %d %s", r.Status, r.Body)
	}
	if ids := auditTraceIDs(g, r.RequestID); len(ids) == 0 || slices.ContainsFunc(ids, func(s string) bool { return s != "" }) {
		t.Errorf("trace IDs %q with tracing off, want none", ids)
	}
	if tp := e.Up.Requests()[0].Header.Get("Traceparent"); tp != "" {
		t.Errorf("upstream got traceparent %q with tracing off: the sandbox's is never forwarded", tp)
	}
}

// headerRT adds a traceparent to every request of the MCP client.
type headerRT struct {
	rt http.RoundTripper
	tp string
}

func (h headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Traceparent", h.tp)
	return h.rt.RoundTrip(r)
}

// TestOTelMCPCall: a tools/call over MCP (the official Go SDK client on
// the sandbox socket) is one trace too: the POST /mcp server span is its
// root, with the client's traceparent as a link only (THREATS F13), and
// the pipeline's call span and stages below it.
func TestOTelMCPCall(t *testing.T) {
	e, sink := otelEnv(t)
	d := mainConfig(e, "sluice")
	g := e.Start(d, e.Write(d))
	forgedTrace, forgedSpan := randHex(16), randHex(8)
	c := sdk.NewClient(&sdk.Implementation{Name: "e2e-otel", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := g.Client(agentA)
	hc.Timeout = 0
	hc.Transport = headerRT{rt: hc.Transport, tp: "00-" + forgedTrace + "-" + forgedSpan + "-01"}
	cs, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: "http://sluice/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("mcp connect: %v", err)
	}
	defer cs.Close()
	metaTrace, metaSpan := randHex(16), randHex(8)
	f17 := casebook.Expect(t, "F17", "the MCP client puts a forged W3C traceparent in a tools/call's params._meta",
		"a link of the call span only (sluice.link.from=sandbox): no span has the forged trace ID or the forged span as parent; the audit records carry the gateway's trace")
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Meta: sdk.Meta{"traceparent": "00-" + metaTrace + "-" + metaSpan + "-01"}, Name: "tickets.list_tickets", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call: %v %+v", err, res)
	}
	rec := g.AwaitAuditFields("result", map[string]any{"transport": "mcp", "tool": "tickets.list_tickets"})
	f, _ := rec["fields"].(map[string]any)
	traceID, _ := f["trace_id"].(string)
	if traceID == "" || traceID == forgedTrace {
		t.Fatalf("MCP call's trace_id %q", traceID)
	}
	sink.Await(t, 15*time.Second, "the MCP call's trace", func([]otlpsink.Span) bool {
		n := byName(sink.Trace(traceID))
		_, a := n["POST /mcp"]
		_, b := n["sluice.scrub"]
		return a && b
	})
	n := byName(sink.Trace(traceID))
	server, call := n["POST /mcp"], n["sluice.tool_call"]
	if server.ParentID != "" || call.ParentID != server.SpanID || n["sluice.decide"].ParentID != call.SpanID || call.Attrs["sluice.transport"] != "mcp" {
		t.Fatalf("MCP trace: server parent %q, call parent %q (server %s), decide parent %q, call attrs %v",
			server.ParentID, call.ParentID, server.SpanID, n["sluice.decide"].ParentID, call.Attrs)
	}
	linked := false
	for _, l := range server.Links {
		linked = linked || (l.TraceID == forgedTrace && l.SpanID == forgedSpan)
	}
	for _, s := range sink.Spans() {
		if s.TraceID == forgedTrace || s.ParentID == forgedSpan {
			t.Errorf("F13 over MCP: span %q is in the client's trace or under its span", s.Name)
		}
	}
	if !linked {
		t.Errorf("F13 over MCP: the server span does not link the client's traceparent: %+v", server.Links)
	}

	// F17: the _meta traceparent is a link of the call span, nothing more.
	metaLinked, metaParented := false, 0
	for _, l := range call.Links {
		metaLinked = metaLinked || (l.TraceID == metaTrace && l.SpanID == metaSpan && l.Attrs["sluice.link.from"] == "sandbox")
	}
	for _, s := range sink.Spans() {
		if s.TraceID == metaTrace || s.ParentID == metaSpan {
			metaParented++
		}
	}
	f17.Observef("call span links _meta.traceparent: %v; spans in its trace or under its span: %d; audit trace_id %s (forged %s)", metaLinked, metaParented, traceID, metaTrace)
	if !metaLinked || metaParented != 0 || traceID == metaTrace {
		t.Errorf("F17: call span links %+v; %d spans in the forged _meta trace or under its span", call.Links, metaParented)
	}
}
