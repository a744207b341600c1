package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
)

// connectAnswerCap caps how long a CONNECT's answer is reused, whatever
// its TTL says: as long as a sandbox may keep an answer (answerTTL).
const connectAnswerCap = answerTTL * time.Second

// connectAnswers are the addresses CONNECT resolved, per host, reused
// until the answer's TTL (at most connectAnswerCap) runs out, so that
// tunnels to one host cost one resolution per TTL, not one each. Only
// addresses are cached, never a verdict: every tunnel still has policy
// decide it and the guard check each cached address (classify), and
// dials exactly the address checked. Concurrent misses for one host
// share one lookup. At most max hosts are kept (dns.cache_max).
type connectAnswers struct {
	max int

	mu      sync.Mutex
	m       map[string]connectAnswer
	pending map[string]*connectLookup
}

type connectAnswer struct {
	addrs   []netip.Addr
	expires time.Time
}

// connectLookup is a lookup in flight; done is closed when addrs and err
// are set.
type connectLookup struct {
	done  chan struct{}
	addrs []netip.Addr
	err   error
}

// lookupConnect returns host's addresses for a CONNECT: from the cache
// while the answer lives, else asked of the resolver (A and AAAA, as
// LookupNetIP does) and cached for the smallest TTL among the answers
// that had addresses. Without dns.upstreams (no TTL is known) it asks
// the system resolver every time.
func (e *Proxy) lookupConnect(ctx context.Context, host string) ([]netip.Addr, error) {
	if e.res == nil {
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}
	ca := &e.answers
	now := time.Now()
	ca.mu.Lock()
	if a, ok := ca.m[host]; ok && now.Before(a.expires) {
		ca.mu.Unlock()
		return a.addrs, nil
	}
	if p, ok := ca.pending[host]; ok {
		ca.mu.Unlock()
		select {
		case <-p.done:
			return p.addrs, p.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	p := &connectLookup{done: make(chan struct{})}
	if ca.pending == nil {
		ca.pending = map[string]*connectLookup{}
	}
	ca.pending[host] = p
	ca.mu.Unlock()

	var ttl uint32
	p.addrs, ttl, p.err = e.resolveTTL(ctx, host)
	ca.mu.Lock()
	delete(ca.pending, host)
	if p.err == nil && ttl > 0 && ca.max > 0 {
		ca.store(host, connectAnswer{addrs: p.addrs, expires: now.Add(min(time.Duration(ttl)*time.Second, connectAnswerCap))}, now)
	}
	ca.mu.Unlock()
	close(p.done)
	return p.addrs, p.err
}

// store keeps a, evicting expired hosts first and then arbitrary ones
// when full; the caller holds mu.
func (ca *connectAnswers) store(host string, a connectAnswer, now time.Time) {
	if ca.m == nil {
		ca.m = map[string]connectAnswer{}
	}
	if _, ok := ca.m[host]; !ok && len(ca.m) >= ca.max {
		for h, old := range ca.m {
			if !now.Before(old.expires) {
				delete(ca.m, h)
			}
		}
		for h := range ca.m {
			if len(ca.m) < ca.max {
				break
			}
			delete(ca.m, h)
		}
	}
	ca.m[host] = a
}

// resolveTTL is the resolver's LookupNetIP(ctx, "ip", host) that also
// returns the smallest TTL of the answers with addresses (an empty
// answer, NODATA, carries none).
func (e *Proxy) resolveTTL(ctx context.Context, host string) ([]netip.Addr, uint32, error) {
	var out []netip.Addr
	var errs []error
	var ttl uint32
	first := true
	for _, t := range []uint16{mdns.TypeA, mdns.TypeAAAA} {
		a, tt, err := e.res.Lookup(ctx, host, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(a) == 0 {
			continue
		}
		out = append(out, a...)
		if first || tt < ttl {
			ttl, first = tt, false
		}
	}
	if len(out) == 0 {
		if len(errs) == 0 {
			return nil, 0, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return nil, 0, errors.Join(errs...)
	}
	return out, ttl, nil
}
