package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/policy"
)

// egressDecisionTTL bounds how long a cached policy decision of kind http
// or connect is reused, as dnsDecisionTTL does for kind dns: a reload (a
// new engine or a new engine version) drops every cached decision at once;
// the TTL only bounds how late a policy that reads input.time (or
// time.now_ns) sees the clock.
const egressDecisionTTL = time.Second

// maxEgressDecisions bounds the cache; when it is full it is emptied, so
// a caller sending endless distinct requests costs one Rego evaluation
// each, as without the cache, and never more memory.
const maxEgressDecisions = 8192

// egressDecisions caches policy decisions of kinds http and connect for
// one engine generation. The key is the whole input document but its time:
// the caller, the kind and the SHA-256 of an injective encoding of
// policy.Request (method, host, port, path, every query parameter and every
// header the policy sees, maps in sorted order), so a cached decision is
// the one the same engine generation made for the same input within
// egressDecisionTTL (two inputs sharing a key would be a SHA-256 collision).
// Hashing also keeps no header value (a cookie, the agent's own token) in
// the cache. Different callers never share an entry; a block stays
// a block. Decisions that are policy errors (timeouts, cancellations,
// evaluation failures, no engine) are never cached.
type egressDecisions struct {
	mu      sync.RWMutex
	eng     *policy.Engine
	version int64
	m       map[egressDecisionKey]egressDecisionEntry
}

type egressDecisionKey struct {
	caller policy.Caller
	kind   string
	req    [sha256.Size]byte // requestKey
}

type egressDecisionEntry struct {
	d       policy.Decision
	expires time.Time
}

// get returns the cached decision for k under engine eng at version v.
func (dc *egressDecisions) get(eng *policy.Engine, v int64, k egressDecisionKey, now time.Time) (policy.Decision, bool) {
	dc.mu.RLock()
	defer dc.mu.RUnlock()
	if dc.eng != eng || dc.version != v {
		return policy.Decision{}, false
	}
	e, ok := dc.m[k]
	if !ok || !now.Before(e.expires) {
		return policy.Decision{}, false
	}
	return e.d, true
}

// put caches d for k under engine eng at version v; a different engine or
// a later version than the cached one, or a full cache, starts an empty
// cache. A decision made under an earlier version of the cached engine is
// dropped rather than emptying the cache of the current one.
func (dc *egressDecisions) put(eng *policy.Engine, v int64, k egressDecisionKey, d policy.Decision, now time.Time) {
	if eng == nil || d.Rule == policy.RulePolicyError {
		return
	}
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if dc.eng == eng && v < dc.version {
		return // decided before a reload this cache has already seen
	}
	if dc.eng != eng || dc.version != v || dc.m == nil || len(dc.m) >= maxEgressDecisions {
		dc.eng, dc.version, dc.m = eng, v, make(map[egressDecisionKey]egressDecisionEntry)
	}
	dc.m[k] = egressDecisionEntry{d: d, expires: now.Add(egressDecisionTTL)}
}

// requestKey hashes an injective encoding of every field of req the
// policy sees: each string is preceded by its length, each map by its size
// (nil apart from empty) and its keys come sorted.
func requestKey(req *policy.Request) [sha256.Size]byte {
	var stack [1024]byte
	b := stack[:0]
	str := func(s string) { b = binary.AppendUvarint(b, uint64(len(s))); b = append(b, s...) }
	str(req.Method)
	str(req.Host)
	b = binary.AppendUvarint(b, uint64(req.Port))
	str(req.Path)
	for _, m := range [2]map[string][]string{req.Query, req.Headers} {
		if m == nil {
			b = append(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(m))+1)
		var kstack [16]string
		keys := kstack[:0]
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			str(k)
			vs := m[k]
			b = binary.AppendUvarint(b, uint64(len(vs)))
			for _, v := range vs {
				str(v)
			}
		}
	}
	return sha256.Sum256(b)
}

// decideCached asks policy about c with request req through the decision
// cache. On a miss the input document goes to the current engine exactly
// as without the cache.
func (e *rawEgress) decideCached(ctx context.Context, c *egressCall, req *policy.Request) policy.Decision {
	eng := e.s.engine.Load()
	v := eng.Version()
	now := time.Now()
	k := egressDecisionKey{caller: c.caller, kind: c.kind, req: requestKey(req)}
	if d, ok := e.decisions.get(eng, v, k, now); ok {
		return d
	}
	d := eng.Decide(ctx, &policy.Input{Version: policy.InputVersion, Kind: c.kind, Caller: c.caller, Request: *req, Time: now.UTC()})
	e.decisions.put(eng, v, k, d, now)
	return d
}
