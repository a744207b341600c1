// Package limits holds agents[].rate_limit: a token bucket per caller on
// this replica (Calls), or one bucket per caller across the replicas of a
// shared store (Shared).
package limits

import (
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/policy"
)

// maxLimitedCallers bounds the callers with a bucket (see sweepLocked).
const maxLimitedCallers = 65536

// limiterIdle is how long an unused bucket is kept. A bucket unused for
// longer than it takes to refill is full anyway, so dropping it changes
// nothing as long as limiterIdle exceeds every agent's refill time.
const limiterIdle = 10 * time.Minute

// Calls are the tool-call token buckets (agents[].rate_limit), one
// per caller: every sandbox of an agent has its own, so one flooding
// sandbox cannot starve the agent's others.
type Calls struct {
	mu    sync.Mutex
	m     map[policy.Caller]*callBucket
	swept time.Time
}

type callBucket struct {
	l    *rate.Limiter
	used time.Time
}

// Allow takes one call from c's bucket under rl. When the bucket is
// empty it reports false and how long until a call would be allowed.
func (cl *Calls) Allow(c policy.Caller, rl *config.RateLimit, now time.Time) (bool, time.Duration) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.m == nil {
		cl.m = map[policy.Caller]*callBucket{}
	}
	if now.Sub(cl.swept) >= limiterIdle/2 || len(cl.m) >= maxLimitedCallers {
		cl.sweepLocked(now)
	}
	b := cl.m[c]
	if b == nil {
		b = &callBucket{l: rate.NewLimiter(rate.Limit(rl.PerSecond), rl.Burst)}
		cl.m[c] = b
	}
	b.used = now
	r := b.l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now) // a refused call takes no token
		return false, d
	}
	return true, 0
}

// sweepLocked drops idle buckets and, while the map is still full, an
// arbitrary sixteenth of the rest (map order): a dropped bucket only
// starts full again.
func (cl *Calls) sweepLocked(now time.Time) {
	cl.swept = now
	for c, b := range cl.m {
		if now.Sub(b.used) >= limiterIdle {
			delete(cl.m, c)
		}
	}
	if len(cl.m) < maxLimitedCallers {
		return
	}
	drop := len(cl.m) / 16
	for c := range cl.m {
		if drop == 0 {
			break
		}
		delete(cl.m, c)
		drop--
	}
}
