package gateway

import (
	"net/http"
	"net/netip"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
)

// SpecClient is guard.SpecClient with a guard of its own, for commands that load
// a connector's spec without a running gateway (sluice validate, tools).
func SpecClient(cc config.Connector) *http.Client {
	return guard.SpecClient(guard.New(guard.Options{}), allowPrivate(cc), 0)
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
