package egress

import (
	"context"

	"go.opentelemetry.io/otel/trace"
)

// traceFrom puts the trace of ctx's span on c's record, unless it has one
// already, so that every audit record and the canonical line of a piece of
// raw egress name the trace of the request or tunnel that made it (the
// sandbox socket's HTTP server span, a new root: the sandbox's own
// traceparent is only its link). With tracing off ctx has no valid span
// and the record no trace_id.
func traceFrom(c *egressCall, ctx context.Context) {
	if c.TraceID != "" {
		return
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		c.TraceID = sc.TraceID().String()
	}
}
