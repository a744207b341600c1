// Package guard is the gateway's one egress chokepoint: every outbound
// connection is resolved, each address classified, and exactly the
// classified address dialled. Loopback, private, CGNAT, link-local, cloud
// metadata, multicast, unspecified and IPv6 forms that embed such IPv4
// addresses (mapped, compatible, NAT64, 6to4, Teredo) are refused before any
// packet is sent, unless a connector's allow_private CIDRs admit them.
//
// The design follows stripe/smokescreen (classify every resolved address,
// re-check at dial time) and tailscale's single dialer: nothing else in the
// gateway may open an outbound socket.
package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
)

// Class names why an address is or is not dialable.
type Class int

const (
	Public      Class = iota
	Loopback          // 127/8, ::1
	Private           // RFC 1918, ULA fc00::/7
	CGNAT             // 100.64.0.0/10
	LinkLocal         // 169.254/16, fe80::/10
	Metadata          // 169.254.169.254, fd00:ec2::254, and friends
	Multicast         // 224/4, ff00::/8
	Unspecified       // 0.0.0.0/8, ::
	Reserved          // documentation, benchmarking, broadcast, 240/4 ...
	Self              // one of the gateway's own addresses
)

var classNames = [...]string{
	Public:      "public",
	Loopback:    "loopback",
	Private:     "private",
	CGNAT:       "cgnat",
	LinkLocal:   "link-local",
	Metadata:    "metadata",
	Multicast:   "multicast",
	Unspecified: "unspecified",
	Reserved:    "reserved",
	Self:        "self",
}

// String returns a short lower-case name such as "loopback" or "metadata".
func (c Class) String() string {
	if c >= 0 && int(c) < len(classNames) {
		return classNames[c]
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// Allowable reports whether a connector's allow_private CIDRs may admit an
// address of class c. Metadata, Unspecified and Multicast never are: no
// legitimate API lives there, and admitting them is how SSRF steals cloud
// credentials.
func (c Class) Allowable() bool {
	switch c {
	case Public, Loopback, Private, CGNAT, LinkLocal, Reserved, Self:
		return true
	}
	return false
}

type rule struct {
	p netip.Prefix
	c Class
}

// v4Rules is scanned in order; exact metadata addresses come before the
// ranges that contain them.
var v4Rules = []rule{
	{netip.MustParsePrefix("169.254.169.254/32"), Metadata}, // AWS, GCP, Azure, OpenStack IMDS
	{netip.MustParsePrefix("169.254.169.253/32"), Metadata}, // AWS VPC resolver (link-local service)
	{netip.MustParsePrefix("169.254.170.2/32"), Metadata},   // AWS ECS task metadata and credentials
	{netip.MustParsePrefix("100.100.100.200/32"), Metadata}, // Alibaba Cloud metadata
	{netip.MustParsePrefix("168.63.129.16/32"), Metadata},   // Azure WireServer
	{netip.MustParsePrefix("0.0.0.0/8"), Unspecified},       // RFC 1122 "this network"
	{netip.MustParsePrefix("127.0.0.0/8"), Loopback},        // RFC 1122
	{netip.MustParsePrefix("10.0.0.0/8"), Private},          // RFC 1918
	{netip.MustParsePrefix("172.16.0.0/12"), Private},       // RFC 1918
	{netip.MustParsePrefix("192.168.0.0/16"), Private},      // RFC 1918
	{netip.MustParsePrefix("100.64.0.0/10"), CGNAT},         // RFC 6598
	{netip.MustParsePrefix("169.254.0.0/16"), LinkLocal},    // RFC 3927
	{netip.MustParsePrefix("224.0.0.0/4"), Multicast},       // RFC 5771
	{netip.MustParsePrefix("240.0.0.0/4"), Reserved},        // RFC 1112, includes 255.255.255.255
	{netip.MustParsePrefix("192.0.0.0/24"), Reserved},       // RFC 6890 IETF protocol assignments
	{netip.MustParsePrefix("192.0.2.0/24"), Reserved},       // RFC 5737 TEST-NET-1
	{netip.MustParsePrefix("192.88.99.0/24"), Reserved},     // RFC 7526 deprecated 6to4 relay anycast
	{netip.MustParsePrefix("198.18.0.0/15"), Reserved},      // RFC 2544 benchmarking
	{netip.MustParsePrefix("198.51.100.0/24"), Reserved},    // RFC 5737 TEST-NET-2
	{netip.MustParsePrefix("203.0.113.0/24"), Reserved},     // RFC 5737 TEST-NET-3
}

// v6Rules is scanned in order after any embedded IPv4 address was checked.
var v6Rules = []rule{
	{netip.MustParsePrefix("fd00:ec2::254/128"), Metadata}, // AWS IMDS over IPv6
	{netip.MustParsePrefix("::/128"), Unspecified},         // RFC 4291
	{netip.MustParsePrefix("::1/128"), Loopback},           // RFC 4291
	{netip.MustParsePrefix("64:ff9b::/96"), Public},        // RFC 6052 well-known NAT64 with a public IPv4
	{netip.MustParsePrefix("64:ff9b:1::/48"), Public},      // RFC 8215 local-use NAT64, every candidate IPv4 public
	{netip.MustParsePrefix("64:ff9b::/32"), Reserved},      // unassigned rest of 64:ff9b::/32
	{netip.MustParsePrefix("::/8"), Reserved},              // RFC 4291 reserved (compatible, SIIT and the rest)
	{netip.MustParsePrefix("100::/64"), Reserved},          // RFC 6666 discard-only
	{netip.MustParsePrefix("2001:2::/48"), Reserved},       // RFC 5180 benchmarking
	{netip.MustParsePrefix("2001:10::/28"), Reserved},      // RFC 4843 ORCHID
	{netip.MustParsePrefix("2001:20::/28"), Reserved},      // RFC 7343 ORCHIDv2
	{netip.MustParsePrefix("2001:db8::/32"), Reserved},     // RFC 3849 documentation
	{netip.MustParsePrefix("3fff::/20"), Reserved},         // RFC 9637 documentation
	{netip.MustParsePrefix("fe80::/10"), LinkLocal},        // RFC 4291
	{netip.MustParsePrefix("fec0::/10"), Private},          // RFC 3879 deprecated site-local
	{netip.MustParsePrefix("fc00::/7"), Private},           // RFC 4193 ULA
	{netip.MustParsePrefix("ff00::/8"), Multicast},         // RFC 4291
}

// Classify returns the class of ip, looking through IPv4-mapped,
// IPv4-compatible, NAT64 (64:ff9b::/96, 64:ff9b:1::/48), 6to4 (2002::/16)
// and Teredo (2001::/32) forms to the IPv4 address they carry.
//
// An IPv6 address that embeds an IPv4 address takes the class of the IPv4
// address when that is not Public. A zoned address (fe80::1%eth0) that would
// otherwise be Public is LinkLocal: a zone only means something on a link.
// The invalid zero Addr is Unspecified, which is never dialable.
func Classify(ip netip.Addr) Class {
	if !ip.IsValid() {
		return Unspecified
	}
	zoned := ip.Zone() != ""
	c := classify(ip.WithZone(""))
	if zoned && c == Public {
		return LinkLocal
	}
	return c
}

func classify(ip netip.Addr) Class {
	ip = ip.Unmap()
	if ip.Is4() {
		return classify4(ip)
	}
	var buf [4]netip.Addr
	first := Public
	for _, v4 := range embedded(ip, buf[:0]) {
		switch c := classify4(v4); {
		case c == Metadata:
			return c // the class that matters most wins over position order
		case first == Public:
			first = c
		}
	}
	if first != Public {
		return first
	}
	for _, r := range v6Rules {
		if r.p.Contains(ip) {
			return r.c
		}
	}
	return Public
}

func classify4(ip netip.Addr) Class {
	for _, r := range v4Rules {
		if r.p.Contains(ip) {
			return r.c
		}
	}
	return Public
}

// embedded appends the IPv4 addresses that the IPv6 address ip carries.
// IPv4-mapped addresses were unmapped by the caller.
func embedded(ip netip.Addr, dst []netip.Addr) []netip.Addr {
	b := ip.As16()
	v4 := func(i, j, k, l int) netip.Addr { return netip.AddrFrom4([4]byte{b[i], b[j], b[k], b[l]}) }
	zero := func(from, to int) bool {
		for _, x := range b[from:to] {
			if x != 0 {
				return false
			}
		}
		return true
	}
	switch {
	case zero(0, 12):
		// IPv4-compatible ::a.b.c.d (RFC 4291 2.5.5.1, deprecated); :: and
		// ::1 are themselves, not 0.0.0.0 and 0.0.0.1.
		if !zero(12, 15) || b[15] > 1 {
			dst = append(dst, v4(12, 13, 14, 15))
		}
	case zero(0, 8) && b[8] == 0xff && b[9] == 0xff && b[10] == 0 && b[11] == 0:
		// IPv4-translated ::ffff:0:a.b.c.d (RFC 2765 SIIT).
		dst = append(dst, v4(12, 13, 14, 15))
	case b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b:
		if zero(4, 12) {
			// Well-known NAT64 prefix 64:ff9b::/96 (RFC 6052).
			dst = append(dst, v4(12, 13, 14, 15))
		} else if b[4] == 0 && b[5] == 1 {
			// Local-use NAT64 64:ff9b:1::/48 (RFC 8215): the operator picks
			// the prefix length, so check every RFC 6052 position it allows
			// (/96, /64, /56, /48); bits 64..71 are the "u" octet. A
			// candidate in 0.0.0.0/8 outside /96 is mostly prefix padding:
			// skipping it keeps 64:ff9b:1::/96 usable, and a translator
			// must not map to 0.0.0.0/8 anyway (RFC 6052 3.1).
			dst = append(dst, v4(12, 13, 14, 15))
			for _, c := range [...]netip.Addr{v4(9, 10, 11, 12), v4(7, 9, 10, 11), v4(6, 7, 9, 10)} {
				if c.As4()[0] != 0 {
					dst = append(dst, c)
				}
			}
		}
	case b[0] == 0x20 && b[1] == 0x02:
		// 6to4 2002:aabb:ccdd::/48 (RFC 3056).
		dst = append(dst, v4(2, 3, 4, 5))
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0:
		// Teredo 2001:0::/32 (RFC 4380): the client address is the last 32
		// bits inverted; the server address sits in bits 32..63.
		client := netip.AddrFrom4([4]byte{b[12] ^ 0xff, b[13] ^ 0xff, b[14] ^ 0xff, b[15] ^ 0xff})
		dst = append(dst, client, v4(4, 5, 6, 7))
	}
	return dst
}

// DeniedError is returned when a destination is refused. It is the
// gateway's cue to answer 403 egress_denied.
type DeniedError struct {
	Host  string     // as asked for
	Addr  netip.Addr // the address refused (zero if the name itself was refused)
	Class Class
}

func (e *DeniedError) Error() string {
	if !e.Addr.IsValid() {
		return fmt.Sprintf("guard: egress denied: host %q is %s", e.Host, e.Class)
	}
	return fmt.Sprintf("guard: egress denied: host %q address %s is %s", e.Host, e.Addr, e.Class)
}

// Resolver looks up the addresses of a name; *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer resolves, classifies and dials. Its zero value is not usable; use New.
type Dialer struct {
	resolver Resolver
	self     []netip.Prefix
	onDial   func(host string, addr netip.AddrPort)
	dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Options configure a Dialer.
type Options struct {
	// Resolver looks up names; nil means net.DefaultResolver.
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
	// Self lists the gateway's own addresses, refused as Self.
	Self []netip.Prefix
	// OnDial, if set, is called with the address about to be dialled (for logs and tests).
	OnDial func(host string, addr netip.AddrPort)
	// DialFunc, if set, replaces the guarded net.Dialer for the final
	// connect (tests, or a custom transport). It is only ever called with an
	// "ip:port" that has already been classified and admitted, never a name,
	// so it needs no resolver; it does not get the dial-time Control re-check.
	DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)
}

// New returns a Dialer configured by opts.
func New(opts Options) *Dialer {
	d := &Dialer{
		resolver: opts.Resolver,
		onDial:   opts.OnDial,
		dialFunc: opts.DialFunc,
	}
	if d.resolver == nil {
		d.resolver = net.DefaultResolver
	}
	for _, p := range opts.Self {
		d.self = append(d.self, normPrefix(p))
	}
	return d
}

// normPrefix turns an IPv4-mapped prefix into its IPv4 form so that it can
// contain unmapped addresses.
func normPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	return p
}

// Class returns the class of ip for this Dialer: Classify, except that an
// address inside Options.Self (directly or embedded in an IPv6 form) is
// Self. Metadata, Unspecified and Multicast stay what they are.
func (d *Dialer) Class(ip netip.Addr) Class {
	c := Classify(ip)
	if !c.Allowable() || len(d.self) == 0 {
		return c
	}
	a := ip.WithZone("").Unmap()
	if containsAny(d.self, a) {
		return Self
	}
	if a.Is6() {
		var buf [4]netip.Addr
		for _, v4 := range embedded(a, buf[:0]) {
			if containsAny(d.self, v4) {
				return Self
			}
		}
	}
	return c
}

func containsAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.IsValid() && p.Contains(a) {
			return true
		}
	}
	return false
}

// Admitted reports whether an address ip of class c may be dialled given a
// connector's allow_private CIDRs: Public always, Metadata, Unspecified and
// Multicast never, anything else only inside one of allow.
func Admitted(c Class, ip netip.Addr, allow []netip.Prefix) bool {
	if c == Public {
		return true
	}
	if !c.Allowable() {
		return false
	}
	a := ip.WithZone("").Unmap()
	for _, p := range allow {
		if p = normPrefix(p); p.IsValid() && p.Contains(a) {
			return true
		}
	}
	return false
}

// Check classifies ip and returns a *DeniedError naming host if allow does
// not admit it. The gateway can use it for addresses it learns some other
// way (a redirect target, the DNS stub's answer).
func (d *Dialer) Check(host string, ip netip.Addr, allow []netip.Prefix) error {
	if c := d.Class(ip); !Admitted(c, ip, allow) {
		return &DeniedError{Host: host, Addr: ip, Class: c}
	}
	return nil
}

// metadataNames are refused before any lookup: on a cloud host they resolve
// (through the platform resolver) to the metadata service.
var metadataNames = map[string]bool{
	"metadata.google.internal":   true,
	"metadata.goog":              true,
	"metadata":                   true,
	"instance-data":              true,
	"instance-data.ec2.internal": true,
	"metadata.azure.internal":    true,
}

// NameClass returns the class a canonical host name is refused as before
// resolution (Metadata for cloud metadata names, Loopback for localhost and
// *.localhost, RFC 6761), or Public if the name itself is not refused.
func NameClass(host string) Class {
	switch {
	case metadataNames[host]:
		return Metadata
	case host == "localhost" || strings.HasSuffix(host, ".localhost"):
		return Loopback
	}
	return Public
}

// DialContext dials addr ("host:port"). allow lists the CIDRs that may be
// dialled despite their class (a connector's allow_private); Metadata and
// Unspecified are refused even then. A refusal is *DeniedError and no
// connection is attempted.
//
// Every resolved address is classified and one refused address refuses the
// whole name: an attacker's DNS answering with a public and a loopback
// address must not get a dial to either. The connect goes to the classified
// IP, never the name, so the answer cannot change between check and dial
// (DNS rebinding), and a socket Control hook checks the address once more.
func (d *Dialer) DialContext(ctx context.Context, network, addr string, allow []netip.Prefix) (net.Conn, error) {
	if d == nil || d.resolver == nil {
		return nil, errors.New("guard: bug(): Dialer not made with New")
	}
	var lookupNet string
	switch network {
	case "tcp", "udp":
		lookupNet = "ip"
	case "tcp4", "udp4":
		lookupNet = "ip4"
	case "tcp6", "udp6":
		lookupNet = "ip6"
	default:
		return nil, fmt.Errorf("guard: dial: unsupported network %q", network)
	}
	host, portStr, err := ParseAuthority(addr, "")
	if err != nil {
		return nil, err
	}
	port64, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("guard: bug(): port %q passed ParseAuthority: %w", portStr, err)
	}
	if c := NameClass(host); c != Public {
		return nil, &DeniedError{Host: host, Class: c}
	}

	var addrs []netip.Addr
	if ip, perr := netip.ParseAddr(host); perr == nil {
		addrs = []netip.Addr{ip}
	} else {
		addrs, err = d.resolver.LookupNetIP(ctx, lookupNet, host)
		if err != nil {
			return nil, fmt.Errorf("guard: resolve %s: %w", host, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("guard: resolve %s: no addresses", host)
		}
	}

	targets := make([]netip.AddrPort, 0, len(addrs))
	for _, a := range addrs {
		if err := d.Check(host, a, allow); err != nil {
			return nil, err
		}
		a = a.Unmap()
		if (lookupNet == "ip4" && !a.Is4()) || (lookupNet == "ip6" && !a.Is6()) {
			continue
		}
		targets = append(targets, netip.AddrPortFrom(a, uint16(port64)))
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("guard: dial %s: no %s address", host, lookupNet)
	}

	var errs []error
	for _, t := range targets {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if d.onDial != nil {
			d.onDial(host, t)
		}
		conn, err := d.dial(ctx, network, t.String(), allow)
		if err == nil {
			return conn, nil
		}
		var de *DeniedError
		if errors.As(err, &de) {
			de.Host = host
			return nil, de
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("guard: dial %s: %w", host, errors.Join(errs...))
}

func (d *Dialer) dial(ctx context.Context, network, addr string, allow []netip.Prefix) (net.Conn, error) {
	if d.dialFunc != nil {
		return d.dialFunc(ctx, network, addr)
	}
	nd := net.Dialer{Control: d.control(allow)}
	return nd.DialContext(ctx, network, addr)
}

// control re-checks, just before connect(2), the address the socket is
// really being connected to. It is the second lock: it also holds if a
// future change passes a name or an unchecked address to the net.Dialer.
func (d *Dialer) control(allow []netip.Prefix) func(network, address string, _ syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("guard: dial-time check: unparsable address %q: %w", address, err)
		}
		return d.Check(address, ap.Addr(), allow)
	}
}
