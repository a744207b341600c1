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

// maxCacheTTL caps how long an answer is cached, whatever its TTL says;
// it caps negative answers too (RFC 2308 section 5 allows one to three
// hours; a sandbox's registry that starts answering should not wait that
// long).
const maxCacheTTL = 5 * time.Minute

// ErrNoUpstream is returned when no DNS upstream is configured.
var ErrNoUpstream = errors.New("resolver: no dns.upstreams configured")

// RcodeError is an upstream answer that is not NOERROR (NXDOMAIN, SERVFAIL…).
type RcodeError struct{ Rcode int }

func (e *RcodeError) Error() string {
	return "resolver: upstream answered " + mdns.RcodeToString[e.Rcode]
}

// Resolver is the gateway-side resolver of raw egress: the DNS answerer,
// CONNECT and the proxy's guarded dialer all resolve with it, so the
// address the proxy dials is one the answerer would also have classified.
// It asks the configured upstreams in order with a miekg/dns client.
//
// It caches in one bounded map, keyed by name and type: positive answers
// for their smallest TTL, and negative ones (NXDOMAIN, and NODATA: NOERROR
// with no address of the type) for the negative TTL of RFC 2308 section 5,
// the smaller of the authority SOA's TTL and its MINIMUM. A negative
// answer without an SOA is not cached (RFC 2308 section 5), nor is any
// failure: SERVFAIL, REFUSED, a timeout or a mismatched answer is the
// error of this lookup only, and the next one asks again. Concurrent
// lookups of one name and type that miss the cache share one upstream
// query. It decides nothing: policy and the dial-time address check stay
// with its callers.
type Resolver struct {
	upstreams []string
	timeout   time.Duration
	max       int
	queries   atomic.Int64 // upstream queries sent (Queries)

	mu      sync.RWMutex
	cache   map[resolverKey]resolverEntry
	flights map[resolverKey]*flight // lookups in flight, under mu
}

type resolverKey struct {
	name  string
	qtype uint16
}

// resolverEntry is a cached answer; nxdomain marks a cached NXDOMAIN, and
// an entry with no addrs that is not nxdomain is a cached NODATA.
type resolverEntry struct {
	addrs    []netip.Addr
	nxdomain bool
	expires  time.Time
}

// flight is one upstream lookup that concurrent callers wait on; done is
// closed once addrs, ttl and err are set.
type flight struct {
	done  chan struct{}
	addrs []netip.Addr
	ttl   uint32
	err   error
}

// NewResolver returns a Resolver that asks upstreams (host:port) in order,
// each within timeout, and caches up to max answers (0: none).
func NewResolver(upstreams []string, timeout time.Duration, max int) *Resolver {
	return &Resolver{upstreams: upstreams, timeout: timeout, max: max, cache: map[resolverKey]resolverEntry{}, flights: map[resolverKey]*flight{}}
}

// Lookup returns the A or AAAA addresses of name (a canonical name without
// the trailing dot) and the smallest TTL among them. CNAME chains are
// followed by the upstream; only address records are kept. NODATA is no
// addresses and no error. An answer that is not NOERROR is *RcodeError.
//
// A lookup that misses the cache joins the one in flight for the same name
// and type, if any, else starts it. The upstream query runs on its own,
// bounded by the resolver's timeout per upstream, so that one caller
// giving up fails neither the others nor the cache. Each caller stops
// waiting at its own ctx's deadline, but not at its cancellation, as the
// miekg/dns exchange this wraps always did: a question in flight when the
// gateway begins to stop is still answered (the DNS stream's shutdown
// relies on it), and the wait is bounded by the query's own timeout.
func (r *Resolver) Lookup(ctx context.Context, name string, qtype uint16) ([]netip.Addr, uint32, error) {
	k := resolverKey{name, qtype}
	now := time.Now()
	r.mu.RLock()
	e, ok := r.cache[k]
	r.mu.RUnlock()
	if ok && now.Before(e.expires) {
		if e.nxdomain {
			return nil, 0, &RcodeError{mdns.RcodeNameError}
		}
		if len(e.addrs) == 0 {
			return nil, 0, nil // NODATA, as asked
		}
		return e.addrs, uint32(e.expires.Sub(now) / time.Second), nil
	}
	if len(r.upstreams) == 0 {
		return nil, 0, ErrNoUpstream
	}
	r.mu.Lock()
	f, joined := r.flights[k]
	if !joined {
		f = &flight{done: make(chan struct{})}
		r.flights[k] = f
		// The query's context keeps ctx's values (trace) but not its
		// cancellation: the answer is shared.
		go r.fly(context.WithoutCancel(ctx), k, f)
	}
	r.mu.Unlock()
	var expired <-chan time.Time
	if dl, ok := ctx.Deadline(); ok {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-f.done:
		return f.addrs, f.ttl, f.err
	case <-expired:
		return nil, 0, fmt.Errorf("resolver: %s: %w", name, context.DeadlineExceeded)
	}
}

// fly asks the upstreams for k, caches what may be cached, and releases
// the flight's waiters.
func (r *Resolver) fly(ctx context.Context, k resolverKey, f *flight) {
	var neg uint32
	var cacheable bool
	f.addrs, f.ttl, neg, cacheable, f.err = r.ask(ctx, k)
	r.mu.Lock()
	delete(r.flights, k)
	if cacheable {
		r.storeLocked(k, f.addrs, f.err != nil, f.ttl, neg)
	}
	r.mu.Unlock()
	close(f.done)
}

// ask queries the upstreams in order for k. It returns the addresses and
// their smallest TTL, the negative TTL of a negative answer (RFC 2308: the
// smaller of the authority SOA's TTL and MINIMUM, 0 without an SOA), and
// whether the outcome may be cached: a NOERROR answer or an NXDOMAIN, never
// a failure.
func (r *Resolver) ask(ctx context.Context, k resolverKey) (addrs []netip.Addr, ttl, neg uint32, cacheable bool, err error) {
	q := new(mdns.Msg)
	q.SetQuestion(mdns.Fqdn(k.name), k.qtype)
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
				return nil, 0, negativeTTL(in), true, &RcodeError{in.Rcode}
			}
			errs = append(errs, &RcodeError{in.Rcode})
			continue
		}
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
			if rr.Header().Rrtype != k.qtype || !a.IsValid() {
				continue
			}
			addrs = append(addrs, a)
			ttl = min(ttl, rr.Header().Ttl)
		}
		if len(addrs) == 0 {
			return nil, 0, negativeTTL(in), true, nil // NODATA
		}
		return addrs, ttl, 0, true, nil
	}
	return nil, 0, 0, false, fmt.Errorf("resolver: %s: %w", k.name, errors.Join(errs...))
}

// negativeTTL is how long the negative answer in may be cached (RFC 2308
// section 5): the smaller of the TTL of the SOA in its authority section
// and that SOA's MINIMUM field, or 0 (not cached) when it carries no SOA.
func negativeTTL(in *mdns.Msg) uint32 {
	for _, rr := range in.Ns {
		if soa, ok := rr.(*mdns.SOA); ok {
			return min(soa.Hdr.Ttl, soa.Minttl)
		}
	}
	return 0
}

// Cached returns what Lookup would answer for name and qtype from the
// cache — the addresses and the seconds left of their TTL — or false when
// Lookup would have to ask an upstream or would answer an error (a cached
// NXDOMAIN). A cached NODATA is true with no addresses. It never asks an
// upstream.
func (r *Resolver) Cached(name string, qtype uint16) ([]netip.Addr, uint32, bool) {
	now := time.Now()
	r.mu.RLock()
	e, ok := r.cache[resolverKey{name, qtype}]
	r.mu.RUnlock()
	if !ok || !now.Before(e.expires) || e.nxdomain {
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

// storeLocked caches an answer: addresses for ttl, a negative one (no
// addresses; nxdomain or NODATA) for neg, each capped at maxCacheTTL; a
// TTL of 0 is not cached. When full, expired entries go first, then
// arbitrary ones. The caller holds mu.
func (r *Resolver) storeLocked(k resolverKey, addrs []netip.Addr, nxdomain bool, ttl, neg uint32) {
	if len(addrs) == 0 {
		ttl = neg
	}
	if ttl == 0 || r.max <= 0 {
		return
	}
	d := min(time.Duration(ttl)*time.Second, maxCacheTTL)
	now := time.Now()
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
	r.cache[k] = resolverEntry{addrs: addrs, nxdomain: nxdomain, expires: now.Add(d)}
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
