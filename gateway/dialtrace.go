package gateway

import (
	"context"
	"net"
	"net/http/httptrace"
	"sync/atomic"
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
func httptraceDial(ctx context.Context, c *call) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectStart: func(_, addr string) {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				c.destIP.Store(host)
			}
		},
		GotConn: func(info httptrace.GotConnInfo) {
			if info.Conn == nil {
				return
			}
			if host, _, err := net.SplitHostPort(info.Conn.RemoteAddr().String()); err == nil {
				c.destIP.Store(host)
			}
		},
	})
}
