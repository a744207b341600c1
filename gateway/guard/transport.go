package guard

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// Transport builds a connector's transport. Every dial goes through the
// guard with this connector's allow list; no proxy from the environment is
// ever used; redirects are not followed because callers use RoundTrip.
//
// The idle pool is sized to the load the gateway admits: each sandbox
// socket connection carries one call at a time, so at most
// gateway.max_connections calls are in flight, and every upstream
// connection they used can wait for the next call instead of being closed
// and dialled again (a fixed 64 made 71% of calls at 1,000 callers dial;
// issue 22). Only connections a load actually opened are kept, and each
// for IdleConnTimeout.
func Transport(d *Dialer, allow []netip.Prefix, timeout time.Duration, maxIdle int) *http.Transport {
	maxIdle = max(maxIdle, 2) // http.Transport's own default per host

	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr, allow)
		},
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           maxIdle,
		MaxIdleConnsPerHost:    maxIdle,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: 64 << 10,
	}
}

// SpecClient is the client a connector's https spec (and every document
// its $refs name) is fetched with. Its transport is the connector's own:
// every dial goes through the guard with the connector's allow_private, so
// a spec URL (or a redirect) that resolves to a loopback, private or
// metadata address is refused exactly as an upstream call to it would be.
func SpecClient(d *Dialer, allow []netip.Prefix, timeout time.Duration) *http.Client {
	t := Transport(d, allow, timeout, 0)
	t.DisableKeepAlives = true // a load fetches each URL once; keep no idle connection
	return &http.Client{Transport: t}
}
