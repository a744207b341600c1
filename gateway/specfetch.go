package gateway

import (
	"net/http"
	"net/netip"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
)

// specClient is the client a connector's https spec (and every document
// its $refs name) is fetched with. Its transport is the connector's own:
// every dial goes through the guard with the connector's allow_private, so
// a spec URL (or a redirect) that resolves to a loopback, private or
// metadata address is refused exactly as an upstream call to it would be.
func specClient(d *guard.Dialer, allow []netip.Prefix, timeout time.Duration) *http.Client {
	t := newTransport(d, allow, timeout, 0)
	t.DisableKeepAlives = true // a load fetches each URL once; keep no idle connection
	return &http.Client{Transport: t}
}

// SpecClient is specClient with a guard of its own, for commands that load
// a connector's spec without a running gateway (sluice validate, tools).
func SpecClient(cc config.Connector) *http.Client {
	return specClient(guard.New(guard.Options{}), allowPrivate(cc), 0)
}

// allowPrivate is cc.AllowPrivate as prefixes (config.Validate checked them).
func allowPrivate(cc config.Connector) []netip.Prefix {
	var allow []netip.Prefix
	for _, p := range cc.AllowPrivate {
		if pfx, err := config.ParseAllowPrivate(p); err == nil {
			allow = append(allow, pfx)
		}
	}
	return allow
}
