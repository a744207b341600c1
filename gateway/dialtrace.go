package gateway

import (
	"context"
	"net"
	"net/http/httptrace"

	"github.com/sluice-gw/sluice/gateway/call"
)

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
