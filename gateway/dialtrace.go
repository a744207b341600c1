package gateway

import (
	"context"
	"net"
	"net/http/httptrace"
	"sync/atomic"

	"github.com/sluice-gw/sluice/gateway/call"
)

// atomicString is a string safe to set from another goroutine.
type atomicString struct{ v atomic.Pointer[string] }

func (a *atomicString) Store(s string) { a.v.Store(&s) }

func (a *atomicString) Load() string {
	if p := a.v.Load(); p != nil {
		return *p
	}
	return ""
}

// httptraceDial records the address actually dialled for the decision line.
func httptraceDial(ctx context.Context, rec *call.Record) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectStart: func(_, addr string) {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				rec.SetResolvedIP(host)
			}
		},
		GotConn: func(info httptrace.GotConnInfo) {
			if info.Conn == nil {
				return
			}
			if host, _, err := net.SplitHostPort(info.Conn.RemoteAddr().String()); err == nil {
				rec.SetResolvedIP(host)
			}
		},
	})
}
