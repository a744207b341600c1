package gateway

import (
	"maps"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/gateway/extauthz"
)

// envoyRoutes is the Envoy door's request→tool matcher over an index built
// once from the catalogue (which is loaded once and never changes while
// the server runs): per lower-cased base_url host, the slugs of the
// connectors on it, in slug order. A Check then asks only those
// connectors' specs (connectors.Match) instead of scanning and sorting
// every connector's base URL per request.
func (d *envoyDoor) envoyRoutes() func(host string, port int, method, path, query string) (extauthz.Match, extauthz.Found) {
	byHost := map[string][]string{}
	for _, slug := range slices.Sorted(maps.Keys(d.connectors)) {
		if b := d.connectors[slug].Conn.BaseURL; b != nil {
			h := strings.ToLower(b.Hostname())
			byHost[h] = append(byHost[h], slug)
		}
	}
	return func(host string, port int, method, path, query string) (extauthz.Match, extauthz.Found) {
		slugs, ok := byHost[host]
		if !ok {
			// The door's host is canonical (lower case); a mixed-case
			// one is looked up folded, as matchTool compares.
			slugs = byHost[strings.ToLower(host)]
		}
		return d.matchTool(slugs, host, port, method, path, query)
	}
}
