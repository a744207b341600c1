package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
)

// maxCacheTTL caps how long an answer is cached, whatever its TTL says.
const maxCacheTTL = 5 * time.Minute

// ErrNoUpstream is returned when no DNS upstream is configured.
var ErrNoUpstream = errors.New("resolver: no dns.upstreams configured")

// RcodeError is an upstream answer that is not NOERROR (NXDOMAIN, SERVFAIL…).
type RcodeError struct{ Rcode int }

func (e *RcodeError) Error() string {
	return "resolver: upstream answered " + mdns.RcodeToString[e.Rcode]
}

// Resolver is the gateway-side resolver of raw egress: the DNS answerer
// and the proxy's guarded dialer both resolve with it, so the address the
// proxy dials is one the answerer would also have classified. It asks the
// configured upstreams in order with a miekg/dns client and caches answers
// by TTL in a bounded map. It decides nothing: policy and the dial-time
// address check stay with its callers.
type Resolver struct {
	upstreams []string
	timeout   time.Duration
	max       int
	queries   atomic.Int64 // upstream queries sent (Queries)

	mu    sync.RWMutex
	cache map[resolverKey]resolverEntry
}

type resolverKey struct {
	name  string
	qtype uint16
}

type resolverEntry struct {
	addrs   []netip.Addr
	ttl     uint32
	expires time.Time
}

// NewResolver returns a Resolver that asks upstreams (host:port) in order,
// each within timeout, and caches up to max answers (0: none).
func NewResolver(upstreams []string, timeout time.Duration, max int) *Resolver {
	return &Resolver{upstreams: upstreams, timeout: timeout, max: max, cache: map[resolverKey]resolverEntry{}}
}

// Lookup returns the A or AAAA addresses of name (a canonical name without
// the trailing dot) and the smallest TTL among them. CNAME chains are
// followed by the upstream; only address records are kept. An answer that
// is not NOERROR is *RcodeError.
func (r *Resolver) Lookup(ctx context.Context, name string, qtype uint16) ([]netip.Addr, uint32, error) {
	k := resolverKey{name, qtype}
	if addrs, ttl, ok := r.Cached(name, qtype); ok {
		return addrs, ttl, nil
	}
	if len(r.upstreams) == 0 {
		return nil, 0, ErrNoUpstream
	}
	q := new(mdns.Msg)
	q.SetQuestion(mdns.Fqdn(name), qtype)
	q.RecursionDesired = true
	var errs []error
	for _, up := range r.upstreams {
		in, err := r.exchange(ctx, q, up)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if in.Rcode != mdns.RcodeSuccess {
			if in.Rcode == mdns.RcodeNameError {
				return nil, 0, &RcodeError{in.Rcode}
			}
			errs = append(errs, &RcodeError{in.Rcode})
			continue
		}
		var addrs []netip.Addr
		ttl := uint32(maxCacheTTL / time.Second)
		for _, rr := range in.Answer {
			var a netip.Addr
			switch v := rr.(type) {
			case *mdns.A:
				a, _ = netip.AddrFromSlice(v.A.To4())
			case *mdns.AAAA:
				a, _ = netip.AddrFromSlice(v.AAAA.To16())
			default:
				continue
			}
			if rr.Header().Rrtype != qtype || !a.IsValid() {
				continue
			}
			addrs = append(addrs, a)
			ttl = min(ttl, rr.Header().Ttl)
		}
		if len(addrs) == 0 {
			ttl = 0 // NODATA is not cached: a later answer may exist
		}
		r.store(k, addrs, ttl)
		return addrs, ttl, nil
	}
	return nil, 0, fmt.Errorf("resolver: %s: %w", name, errors.Join(errs...))
}

// Cached returns what Lookup would answer for name and qtype from the
// cache — the addresses and the seconds left of their TTL — or false when
// Lookup would have to ask an upstream. It never asks one.
func (r *Resolver) Cached(name string, qtype uint16) ([]netip.Addr, uint32, bool) {
	now := time.Now()
	r.mu.RLock()
	e, ok := r.cache[resolverKey{name, qtype}]
	r.mu.RUnlock()
	if !ok || !now.Before(e.expires) {
		return nil, 0, false
	}
	return e.addrs, uint32(e.expires.Sub(now) / time.Second), true
}

// Queries is the number of upstream queries sent so far, a truncated UDP
// answer's TCP retry included.
func (r *Resolver) Queries() int64 { return r.queries.Load() }

func (r *Resolver) exchange(ctx context.Context, q *mdns.Msg, up string) (*mdns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	r.queries.Add(1)
	c := &mdns.Client{Net: "udp", Timeout: r.timeout}
	in, _, err := c.ExchangeContext(ctx, q, up)
	if err == nil && in.Truncated {
		r.queries.Add(1)
		c.Net = "tcp"
		in, _, err = c.ExchangeContext(ctx, q, up)
	}
	if err != nil {
		return nil, fmt.Errorf("resolver: ask %s: %w", up, err)
	}
	if in.Id != q.Id || len(in.Question) != 1 || !strings.EqualFold(in.Question[0].Name, q.Question[0].Name) {
		return nil, fmt.Errorf("resolver: ask %s: answer does not match the question", up)
	}
	return in, nil
}

// store caches an answer for its TTL (capped); TTL 0 is not cached. When
// full, expired entries go first, then arbitrary ones.
func (r *Resolver) store(k resolverKey, addrs []netip.Addr, ttl uint32) {
	if ttl == 0 || r.max <= 0 {
		return
	}
	d := min(time.Duration(ttl)*time.Second, maxCacheTTL)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cache) >= r.max {
		for ck, e := range r.cache {
			if !now.Before(e.expires) {
				delete(r.cache, ck)
			}
		}
		for ck := range r.cache {
			if len(r.cache) < r.max {
				break
			}
			delete(r.cache, ck)
		}
	}
	r.cache[k] = resolverEntry{addrs: addrs, ttl: ttl, expires: now.Add(d)}
}

// LookupNetIP resolves host for the guarded dialer: A for ip4, AAAA for
// ip6, both for ip. A name with no address is an error.
func (r *Resolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	var types []uint16
	switch network {
	case "ip":
		types = []uint16{mdns.TypeA, mdns.TypeAAAA}
	case "ip4":
		types = []uint16{mdns.TypeA}
	case "ip6":
		types = []uint16{mdns.TypeAAAA}
	default:
		return nil, fmt.Errorf("resolver: network %q", network)
	}
	var out []netip.Addr
	var errs []error
	for _, t := range types {
		a, _, err := r.Lookup(ctx, host, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, a...)
	}
	if len(out) == 0 {
		if len(errs) == 0 {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return nil, errors.Join(errs...)
	}
	return out, nil
}
