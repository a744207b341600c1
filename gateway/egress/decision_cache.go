package egress

import (
	"sync"
	"time"

	"github.com/sluice-gw/sluice/policy"
)

// decisionTTL bounds how long a cached policy decision is reused. A reload
// (a new engine or a new engine version) drops every cached decision at
// once; the TTL only bounds how late a policy that reads input.time (or
// time.now_ns) sees the clock: at most this much.
const decisionTTL = time.Second

// maxCachedDecisions bounds a decision cache; when it is full it is
// emptied, so a caller sending endless distinct inputs costs one Rego
// evaluation each, as without the cache, and never more memory.
const maxCachedDecisions = 8192

// decisionCache caches policy decisions by K for one engine generation:
// the raw-egress kinds (dns in dns_decisions.go; http and connect in
// egress_decisions.go) each key it on everything their input document
// holds but the time, so a cached decision is the one the same engine
// generation made for the same input within decisionTTL. A refusal stays
// a refusal. Decisions that are policy errors (timeouts, cancellations,
// evaluation failures, no engine) are never cached.
type decisionCache[K comparable] struct {
	mu      sync.RWMutex
	eng     *policy.Engine
	version int64
	m       map[K]cachedDecision
}

type cachedDecision struct {
	d       policy.Decision
	expires time.Time
}

// get returns the cached decision for k under engine eng at version v.
func (dc *decisionCache[K]) get(eng *policy.Engine, v int64, k K, now time.Time) (policy.Decision, bool) {
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
func (dc *decisionCache[K]) put(eng *policy.Engine, v int64, k K, d policy.Decision, now time.Time) {
	if eng == nil || d.Rule == policy.RulePolicyError {
		return
	}
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if dc.eng == eng && v < dc.version {
		return // decided before a reload this cache has already seen
	}
	if dc.eng != eng || dc.version != v || dc.m == nil || len(dc.m) >= maxCachedDecisions {
		dc.eng, dc.version, dc.m = eng, v, make(map[K]cachedDecision)
	}
	dc.m[k] = cachedDecision{d: d, expires: now.Add(decisionTTL)}
}
