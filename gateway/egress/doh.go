package egress

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
)

// DNS over HTTPS (RFC 8484) and DNS over TLS (RFC 7858) are refused by the
// forward proxy whatever an allowlist says: a resolver reached through a
// tunnel answers names the gateway's DNS answerer would refuse and carries
// arbitrary data in its questions (THREATS: DNS is closed by design; the
// gateway's own answerer, POST /v1/dns, is the sandbox's only resolver).
//
// This is the one list of well-known public endpoints. It cannot be
// complete — any host can serve DoH — so it is a backstop behind the
// allowlist, not a replacement for it; it exists so that an allowlist that
// names one by mistake (or a glob that covers one) does not open a
// resolver. `sluice validate` reports an agents[].egress entry that names
// one of these, or a "*.domain" glob inside a resolver-only domain (see
// Validate).

// dotPort is the DNS-over-TLS port (RFC 7858 3.1); CONNECT or absolute-form
// http to it is refused on any host.
const dotPort = 853

// dohHosts are refused host names. An entry "*.domain" refuses every name
// under domain (not domain itself; list that separately).
var dohHosts = []string{
	// Google Public DNS
	"dns.google", "dns.google.com", "8888.google", "dns64.dns.google",
	// Cloudflare 1.1.1.1 (every *.cloudflare-dns.com name is a resolver)
	"cloudflare-dns.com", "*.cloudflare-dns.com", "one.one.one.one", "1dot1dot1dot1.cloudflare-dns.com", "dns.cloudflare.com",
	// Quad9
	"dns.quad9.net", "dns9.quad9.net", "dns10.quad9.net", "dns11.quad9.net", "dns12.quad9.net",
	// Cisco OpenDNS
	"doh.opendns.com", "dns.opendns.com", "doh.familyshield.opendns.com", "familyshield.opendns.com", "dns.umbrella.com",
	// AdGuard, NextDNS, CleanBrowsing, Mullvad, Control D
	"dns.adguard.com", "dns.adguard-dns.com", "*.adguard-dns.com", "dns.nextdns.io", "*.dns.nextdns.io",
	"doh.cleanbrowsing.org", "*.cleanbrowsing.org", "dns.mullvad.net", "*.dns.mullvad.net", "freedns.controld.com", "dns.controld.com",
}

// dohAddrs are refused address literals (the anycast addresses of the
// resolvers above, which serve DoH and DoT on them directly).
var dohAddrs = func() map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	for _, s := range []string{
		"8.8.8.8", "8.8.4.4", "2001:4860:4860::8888", "2001:4860:4860::8844",
		"1.1.1.1", "1.0.0.1", "1.1.1.2", "1.0.0.2", "1.1.1.3", "1.0.0.3",
		"2606:4700:4700::1111", "2606:4700:4700::1001",
		"9.9.9.9", "149.112.112.112", "9.9.9.10", "9.9.9.11", "2620:fe::fe", "2620:fe::9",
		"208.67.222.222", "208.67.220.220", "2620:119:35::35", "2620:119:53::53",
		"94.140.14.14", "94.140.15.15", "45.90.28.0", "45.90.30.0", "185.228.168.9", "194.242.2.2", "76.76.2.0",
	} {
		m[netip.MustParseAddr(s)] = true
	}
	return m
}()

// isDoHEndpoint reports whether host (canonical: lower case, no trailing
// dot, an IP literal without brackets) names a well-known DoH/DoT endpoint
// or port is the DoT port.
func isDoHEndpoint(host string, port int) bool {
	return port == dotPort || isDoHHost(host)
}

// isDoHHost reports whether host is on the list, by name or address.
func isDoHHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return dohAddrs[a.Unmap().WithZone("")]
	}
	for _, h := range dohHosts {
		if d, ok := strings.CutPrefix(h, "*."); ok {
			if strings.HasSuffix(host, "."+d) {
				return true
			}
		} else if host == h {
			return true
		}
	}
	return false
}

// refuseDoH refuses c when its destination is a DoH/DoT endpoint, before
// policy is asked: no allowlist entry can open one.
func refuseDoH(c *egressCall) *egressError {
	if !isDoHEndpoint(c.DestHost, c.Port) {
		return nil
	}
	c.Event = "doh_refused"
	msg := c.DestHost + " is a DNS-over-HTTPS/TLS endpoint; resolve names through the gateway (POST /v1/dns)"
	if c.Port == dotPort {
		msg = "port 853 is DNS over TLS; resolve names through the gateway (POST /v1/dns)"
	}
	return egressRefuse(http.StatusForbidden, refusal.EgressDenied, psDenied, msg)
}

// Validate reports every agents[].egress entry that names a
// DoH/DoT endpoint (see isDoHWildcard for globs). sluice validate has no warning level, so each
// is an error: the entry can never work (the proxy refuses it) and most
// likely means someone tried to open a resolver. Globs are not expanded
// ("*.google" is not reported, though dns.google stays refused).
func Validate(cfg *config.Config) []error {
	var errs []error
	for i, a := range cfg.Agents {
		for j, h := range a.Egress {
			if !strings.HasPrefix(h, "*.") && isDoHHost(h) || strings.HasPrefix(h, "*.") && isDoHWildcard(h) {
				errs = append(errs, fmt.Errorf("agents[%d].egress[%d]: %q is a DNS-over-HTTPS/TLS endpoint; the proxy refuses it whatever the allowlist says (doh_refused): remove the entry", i, j, h))
			}
		}
	}
	return errs
}

// isDoHWildcard reports whether the allowlist glob "*.domain" is itself a
// listed "*.domain" entry or covers only resolvers (a subdomain of one).
func isDoHWildcard(glob string) bool {
	d := strings.TrimPrefix(glob, "*.")
	for _, h := range dohHosts {
		if w, ok := strings.CutPrefix(h, "*."); ok && (d == w || strings.HasSuffix(d, "."+w)) {
			return true
		}
	}
	return false
}
