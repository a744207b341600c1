// Package otlpsink is a loopback OTLP trace collector for tests: a gRPC
// server implementing the collector's TraceService (the generated code of
// go.opentelemetry.io/proto/otlp), keeping every span it is sent, so a test
// can read what the real binary exported over the real protocol.
package otlpsink

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Span is one exported span, flattened: IDs in hex, attribute values as
// text.
type Span struct {
	TraceID, SpanID, ParentID string
	Name                      string
	Kind                      tracepb.Span_SpanKind
	Attrs                     map[string]string
	Links                     []Link
	Status                    tracepb.Status_StatusCode
	StatusMessage             string
	Start, End                time.Time
	// Resource is the exporting process's resource attributes.
	Resource map[string]string
	// Events are the span's events' names and attributes, as text.
	Events []string
}

// Link is one span link.
type Link struct {
	TraceID, SpanID string
	Attrs           map[string]string
}

// Sink is the collector.
type Sink struct {
	Addr    string // host:port it listens on
	mu      sync.Mutex
	spans   []Span
	exports int
	counted int  // spans received in counting mode
	count   bool // ServeCounting: spans are counted, not kept
	srv     *grpc.Server
	collectortrace.UnimplementedTraceServiceServer
}

// Serve serves the collector on ln until the test ends.
func Serve(t testing.TB, ln net.Listener) *Sink {
	s := &Sink{Addr: ln.Addr().String(), srv: grpc.NewServer()}
	collectortrace.RegisterTraceServiceServer(s.srv, s)
	go func() { _ = s.srv.Serve(ln) }()
	t.Cleanup(s.srv.Stop)
	return s
}

// ServeCounting is Serve for a benchmark: the spans are received and
// decoded (gRPC and protobuf, as any collector does) and counted, not
// kept, so that the sink costs the shared cores little beside what it
// measures.
func ServeCounting(t testing.TB, ln net.Listener) *Sink {
	s := &Sink{Addr: ln.Addr().String(), srv: grpc.NewServer(), count: true}
	collectortrace.RegisterTraceServiceServer(s.srv, s)
	go func() { _ = s.srv.Serve(ln) }()
	t.Cleanup(s.srv.Stop)
	return s
}

// Counted is how many spans a counting sink received.
func (s *Sink) Counted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counted
}

// Export is the TraceService's one method.
func (s *Sink) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	if s.count {
		n := 0
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				n += len(ss.GetSpans())
			}
		}
		s.mu.Lock()
		s.counted += n
		s.exports++
		s.mu.Unlock()
		return &collectortrace.ExportTraceServiceResponse{}, nil
	}
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				o := Span{
					TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					Name: sp.GetName(), Kind: sp.GetKind(), Attrs: attrs(sp.GetAttributes()), Resource: res,
					Status: sp.GetStatus().GetCode(), StatusMessage: sp.GetStatus().GetMessage(),
					Start: time.Unix(0, int64(sp.GetStartTimeUnixNano())), End: time.Unix(0, int64(sp.GetEndTimeUnixNano())),
				}
				if p := sp.GetParentSpanId(); len(p) > 0 {
					o.ParentID = hex.EncodeToString(p)
				}
				for _, l := range sp.GetLinks() {
					o.Links = append(o.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId()), Attrs: attrs(l.GetAttributes())})
				}
				for _, e := range sp.GetEvents() {
					o.Events = append(o.Events, e.GetName()+" "+fmt.Sprint(attrs(e.GetAttributes())))
				}
				got = append(got, o)
			}
		}
	}
	s.mu.Lock()
	s.spans = append(s.spans, got...)
	s.exports++
	s.mu.Unlock()
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_BytesValue:
		return string(x.BytesValue)
	case *commonpb.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, value(e))
		}
		return "[" + strings.Join(parts, ",") + "]"
	case *commonpb.AnyValue_KvlistValue:
		return fmt.Sprint(attrs(x.KvlistValue.GetValues()))
	}
	return ""
}

// Spans returns every span received so far.
func (s *Sink) Spans() []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Span(nil), s.spans...)
}

// Trace returns the spans of one trace, by start time.
func (s *Sink) Trace(traceID string) []Span {
	var out []Span
	for _, sp := range s.Spans() {
		if sp.TraceID == traceID {
			out = append(out, sp)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Await waits up to within until pred holds of the spans received, and
// returns them; the test fails if it never does.
func (s *Sink) Await(t testing.TB, within time.Duration, what string, pred func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		sp := s.Spans()
		if pred(sp) {
			return sp
		}
		if time.Now().After(deadline) {
			t.Fatalf("otlpsink: %s not received within %v (%d spans so far)", what, within, len(sp))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Exports is how many export requests arrived.
func (s *Sink) Exports() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exports
}

// Text is everything a span carries as text a test can search: name,
// status message, attributes, link attributes, events and resource.
func (sp Span) Text() string {
	var b strings.Builder
	b.WriteString(sp.Name + "\n" + sp.StatusMessage + "\n")
	for _, m := range []map[string]string{sp.Attrs, sp.Resource} {
		for k, v := range m {
			b.WriteString(k + "=" + v + "\n")
		}
	}
	for _, l := range sp.Links {
		for k, v := range l.Attrs {
			b.WriteString(k + "=" + v + "\n")
		}
	}
	for _, e := range sp.Events {
		b.WriteString(e + "\n")
	}
	return b.String()
}
