package egress

import (
	"context"
	"net"
	"net/http/httptrace"
	"time"

	"github.com/sluice-gw/sluice/gateway/call"
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

// egressCall is one proxied request, tunnel or DNS question: its record
// (call.Record, the one type every decision's audit records and
// canonical line are made from) and what policy needs in its own types.
type egressCall struct {
	call.Record
	caller   policy.Caller   // set through setCaller, which copies it into the record
	decision policy.Decision // set through decide, which copies it into the record
	// firstAsk: the caller's session asks this DNS name for the first
	// time in the subdomain window (countName), so dnsAnswered records it.
	firstAsk bool
}

// newEgressCall starts the record of a piece of raw egress of kind k.
func newEgressCall(rid string, start time.Time, k call.Kind) *egressCall {
	return &egressCall{Record: call.Record{RequestID: rid, Start: start, Kind: k}}
}

// setCaller sets who calls, in c and in its record.
func (c *egressCall) setCaller(caller policy.Caller) {
	c.caller = caller
	c.Sandbox, c.Agent, c.Session, c.User, c.Egress = caller.Sandbox, caller.Agent, caller.Session, caller.User, caller.Egress
}

// setListener records the listener ctx's connection came through
// (Deps.Hosted, nil: the socket), beside the caller.
func (c *egressCall) setListener(ctx context.Context, hosted func(context.Context) bool) {
	if hosted != nil && hosted(ctx) {
		c.Listener = call.ListenerHosted
	}
}

// decide records policy's decision d, in c and in its record.
func (c *egressCall) decide(d policy.Decision) {
	c.decision = d
	c.Decision, c.Decided = call.Decision{Action: d.Action.String(), Rule: d.Rule, Reason: d.Reason, Revision: d.Revision}, true
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

// httptraceEgress records the address actually dialled for a proxied request.
func httptraceEgress(ctx context.Context, c *egressCall) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if info.Conn == nil {
				return
			}
			if a, ok := info.Conn.RemoteAddr().(*net.TCPAddr); ok {
				c.SetResolvedIP(a.AddrPort().Addr().Unmap().String())
			} else if host, _, err := net.SplitHostPort(info.Conn.RemoteAddr().String()); err == nil {
				c.SetResolvedIP(host)
			}
		},
	})
}
