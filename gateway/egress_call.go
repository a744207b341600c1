package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
)

// Proxy-Status error types (RFC 9209 section 2.3) used in refusals.
const (
	psDenied     = "http_request_denied"
	psBadRequest = "http_request_error"
	psIPDenied   = "destination_ip_prohibited"
	psDNS        = "dns_error"
	psConnect    = "connection_refused"
	psTLS        = "tls_protocol_error"
	psTimeout    = "http_response_timeout"
	psProtocol   = "http_protocol_error"
	proxyStatusN = "sluice"
)

// egressCall is one proxied request, tunnel or DNS question.
type egressCall struct {
	rid      string
	start    time.Time
	kind     string
	caller   policy.Caller
	destHost string
	port     int
	destIP   atomicString
	decision policy.Decision
	decided  bool
	status   int // the gateway's answer to the sandbox
	// upstreamStatus is the status the upstream answered (0: none).
	upstreamStatus int
	event          string // an extra audit event for the refusal (sni_mismatch …)
	// upstreamErr says why an allowed request's upstream answer was not
	// relayed, or was cut (malformed_response, response_timeout …).
	upstreamErr string
	// firstAsk: the caller's session asks this DNS name for the first
	// time in the subdomain window (countName), so dnsAnswered records it.
	firstAsk bool
	bytesUp  atomic.Int64
	bytesDn  atomic.Int64
}

// egressError is a refusal of raw egress: the JSON error plus the RFC 9209
// Proxy-Status error type.
type egressError struct {
	*refusal.Error
	proxyStatus string
}

func egressRefuse(status int, code refusal.Code, ps, msg string) *egressError {
	return &egressError{Error: refusal.New(status, code, msg), proxyStatus: ps}
}

// refuse answers a refusal before any tunnel exists, audited.
func (e *rawEgress) refuse(w http.ResponseWriter, c *egressCall, ee *egressError) {
	c.status = ee.Status
	if aerr := e.record(context.Background(), c, "decision", ee.Error, false); aerr != nil {
		ee = aerr
	}
	e.logLine(c, ee)
	w.Header().Set("Proxy-Status", fmt.Sprintf("%s; error=%s", proxyStatusN, ee.proxyStatus))
	w.Header().Set("Connection", "close")
	refusal.Write(w, ee.Error, c.rid)
}

// record appends c's audit record. presync only writes (the result's
// fsync makes it durable); a record that cannot be written refuses.
func (e *rawEgress) record(ctx context.Context, c *egressCall, event string, ref *refusal.Error, presync bool) *egressError {
	return e.recordFields(ctx, c, event, c.auditFields(event, ref), presync)
}

// recordFields is record with the fields given (in increasing key order).
func (e *rawEgress) recordFields(ctx context.Context, c *egressCall, event string, f []audit.Field, presync bool) *egressError {
	if _, err := e.d.Append(ctx, audit.Record{RequestID: c.rid, Event: event, Sorted: f}, presync); err != nil {
		e.d.AuditFailures.Add(ctx, 1)
		// Some callers log no refusal after a failed result record (the
		// answer is already out): this line names the cause, once per
		// interval while it repeats (logcap.go).
		if e.d.Repeats("audit: record not durable; refusing raw egress", err.Error()) {
			e.d.Log.Error("audit: record not durable; refusing raw egress", "request_id", c.rid, "err", err)
		}
		ee := egressRefuse(http.StatusServiceUnavailable, refusal.AuditUnavailable, psDenied, "the audit log cannot be written; no egress is served until it can")
		ee.Wrap(err)
		return ee
	}
	return nil
}

// auditFields are the fields of c's audit record for event, in increasing
// key order (audit.Record.Sorted): every proxied request writes two of
// these records, and a map per record was its largest allocation.
func (c *egressCall) auditFields(event string, ref *refusal.Error) []audit.Field {
	f := make([]audit.Field, 0, 18)
	f = append(f, audit.Field{Key: "agent", Value: c.caller.Agent})
	if event == "result" {
		f = append(f, audit.Field{Key: "bytes_down", Value: c.bytesDn.Load()}, audit.Field{Key: "bytes_up", Value: c.bytesUp.Load()})
	}
	if ref != nil {
		f = append(f, audit.Field{Key: "code", Value: string(ref.Code)})
	}
	if c.decided {
		f = append(f, audit.Field{Key: "decision", Value: c.decision.Action.String()})
	}
	f = append(f, audit.Field{Key: "dest_host", Value: c.destHost})
	if event == "result" {
		f = append(f, audit.Field{Key: "duration_ms", Value: time.Since(c.start).Milliseconds()})
	}
	if c.caller.Egress != "" {
		f = append(f, audit.Field{Key: "egress", Value: c.caller.Egress})
	}
	f = append(f, audit.Field{Key: "kind", Value: c.kind})
	if c.port != 0 {
		f = append(f, audit.Field{Key: "port", Value: c.port})
	}
	switch {
	case c.decided:
		f = append(f, audit.Field{Key: "reason", Value: c.decision.Reason})
	case c.event != "":
		f = append(f, audit.Field{Key: "reason", Value: c.event}) // a refusal before policy (doh_refused …)
	}
	if ip := c.destIP.Load(); ip != "" {
		f = append(f, audit.Field{Key: "resolved_ip", Value: ip})
	}
	if c.decided {
		f = append(f, audit.Field{Key: "rule", Value: c.decision.Rule})
	}
	f = append(f, audit.Field{Key: "sandbox", Value: c.caller.Sandbox}, audit.Field{Key: "session", Value: c.caller.Session})
	if c.status != 0 {
		f = append(f, audit.Field{Key: "status", Value: c.status})
	}
	if c.upstreamErr != "" {
		f = append(f, audit.Field{Key: "upstream_error", Value: c.upstreamErr})
	}
	if c.upstreamStatus != 0 {
		f = append(f, audit.Field{Key: "upstream_status", Value: c.upstreamStatus})
	}
	f = append(f, audit.Field{Key: "user", Value: c.caller.User})
	return f
}

// logLine writes the one canonical decision line of a request or tunnel.
func (e *rawEgress) logLine(c *egressCall, ee *egressError) {
	decision, reason := "", c.decision.Reason
	if c.decided {
		decision = c.decision.Action.String()
	}
	level := slog.LevelInfo
	if ee != nil {
		reason = string(ee.Code)
		if c.event != "" {
			reason = c.event
		}
		if ee.Cause() != nil {
			reason += ": " + ee.Cause().Error()
		}
		if ee.Status >= 500 {
			level = slog.LevelWarn
		}
		if ee.Code == refusal.AuditUnavailable && !e.d.Repeats("egress", reason) {
			return // the same refusal was logged in this interval: counted (logcap.go)
		}
	}
	e.d.Log.LogAttrs(context.Background(), level, "egress",
		slog.String("request_id", c.rid),
		slog.String("kind", c.kind),
		slog.String("decision", decision),
		slog.String("reason", reason),
		slog.String("rule", c.decision.Rule),
		slog.String("agent", c.caller.Agent),
		slog.String("session", c.caller.Session),
		slog.String("user", c.caller.User),
		slog.String("sandbox", c.caller.Sandbox),
		slog.String("dest_host", c.destHost),
		slog.Int("port", c.port),
		slog.String("resolved_ip", c.destIP.Load()),
		slog.Int("status", c.status),
		slog.Int("upstream_status", c.upstreamStatus),
		slog.Int64("bytes_up", c.bytesUp.Load()),
		slog.Int64("bytes_down", c.bytesDn.Load()),
		slog.Float64("duration_ms", float64(time.Since(c.start).Microseconds())/1000),
	)
}

// httptraceEgress records the address actually dialled for a proxied request.
func httptraceEgress(ctx context.Context, c *egressCall) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if info.Conn == nil {
				return
			}
			if a, ok := info.Conn.RemoteAddr().(*net.TCPAddr); ok {
				c.destIP.Store(a.AddrPort().Addr().Unmap().String())
			} else if host, _, err := net.SplitHostPort(info.Conn.RemoteAddr().String()); err == nil {
				c.destIP.Store(host)
			}
		},
	})
}
