package egress

import (
	"context"
	"net/http"

	"github.com/sluice-gw/sluice/gateway/refusal"
)

// sessionGate refuses egress of c's caller when its session has ended, or
// when whether it has cannot be read (fail closed). decide (every proxied
// request, CONNECT, intercepted request and WebSocket upgrade) and the DNS
// answerer call it before policy; the DNS fast path leaves an ended
// session's questions to the full path, which answers REFUSED. The
// refusal's code is session_ended (or session_unavailable), and it is the
// reason in the audit record.
func (e *Proxy) sessionGate(ctx context.Context, c *egressCall) *egressError {
	aerr := e.d.Session(ctx, c.caller.Session)
	if aerr == nil {
		return nil
	}
	c.Event = string(aerr.Code)
	return &egressError{Error: aerr, proxyStatus: psDenied}
}

// endedDuring is the refusal a tunnel's result record carries when the
// tunnel ended because its session was ended while it was open (the end
// closed it, sessionConns), nil otherwise.
func (e *Proxy) endedDuring(ctx context.Context, c *egressCall) *egressError {
	if c.caller.Session == "" {
		return nil
	}
	if aerr := e.d.Session(ctx, c.caller.Session); aerr == nil || aerr.Code != refusal.SessionEnded {
		return nil // live, or unreadable: the tunnel's own outcome stands
	}
	c.UpstreamErr = string(refusal.SessionEnded)
	return &egressError{Error: refusal.New(http.StatusForbidden, refusal.SessionEnded, "this session was ended; its tunnel was closed"), proxyStatus: psDenied}
}
