package limits

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/storecheck"
	"github.com/sluice-gw/sluice/policy"
)

// Shared makes agents[].rate_limit one limit across the replicas
// of a shared (PostgreSQL) store: a sandbox allowed N calls a second gets
// N in total, not N per replica. The per-replica bucket (Calls)
// is then not used (it would refuse calls the shared one allows, since
// each replica sees only part of a sandbox's calls); this one draws from
// the shared bucket in the store,
// a lease of a few tokens at a time, so an allowed call waits on the
// database once per lease, not once per call. A lease's unused tokens
// lapse after leaseTTL: held tokens can never add up to a burst.
type Shared struct {
	mu sync.Mutex
	m  map[policy.Caller]*tokenLease
}

type tokenLease struct {
	tokens int
	until  time.Time
}

// leaseTTL is how long a replica may spend tokens it leased.
const leaseTTL = time.Second

// leaseSize is how many tokens one lease takes: a twentieth of a second's
// budget (at least 1), so that the tokens leased by idle replicas are a
// small share of the total.
func leaseSize(rl *config.RateLimit) int {
	return max(1, int(rl.PerSecond/20))
}

// sharedLimitKey names a caller's bucket in the store without its
// identity strings (which the database need not hold, and which may hold
// bytes a text column refuses).
func sharedLimitKey(c policy.Caller) string {
	h := sha256.New()
	for _, f := range []string{c.Agent, c.Sandbox, c.Session, c.User} {
		fmt.Fprintf(h, "%d:%s;", len(f), f)
	}
	return "call:" + hex.EncodeToString(h.Sum(nil))
}

// SharedOn says whether agents[].rate_limit is enforced by Shared.Take
// (a shared store st) instead of the per-replica Calls.
func SharedOn(st *store.Store) bool { return st.Kind() == store.Postgres }

// Take refuses a call past the caller's shared limit (429
// rate_limited), or when the shared bucket cannot be read (503
// store_unavailable: fail closed); nil on an unshared store or for an
// agent without a limit.
func (sl *Shared) Take(ctx context.Context, st *store.Store, c policy.Caller, a *config.Agent) *refusal.Error {
	if !SharedOn(st) || a == nil || a.RateLimit == nil {
		return nil
	}
	rl, agent := a.RateLimit, a.Name
	now := time.Now()
	sl.mu.Lock()
	if l := sl.m[c]; l != nil && l.tokens > 0 && now.Before(l.until) {
		l.tokens--
		sl.mu.Unlock()
		return nil
	}
	sl.mu.Unlock()
	// Config.Validate already set a burst of 0 to per_second rounded up.
	n, err := st.TakeTokens(ctx, sharedLimitKey(c), leaseSize(rl), rl.PerSecond, rl.Burst)
	if err != nil {
		if e := storecheck.Refusal(err); e != nil {
			return e
		}
		return refusal.New(http.StatusServiceUnavailable, refusal.StoreUnavailable, "the shared rate limit cannot be read; the call was not sent").Wrap(err)
	}
	if n == 0 {
		e := refusal.New(http.StatusTooManyRequests, refusal.RateLimited, fmt.Sprintf("agent %q may make %g tool calls per second per sandbox, across every gateway (burst %d); retry later", agent, rl.PerSecond, rl.Burst))
		e.RetryAfter = time.Duration(float64(time.Second) / max(rl.PerSecond, 1e-9))
		return e
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.m == nil || len(sl.m) >= maxLimitedCallers {
		sl.m = map[policy.Caller]*tokenLease{}
	}
	sl.m[c] = &tokenLease{tokens: n - 1, until: now.Add(leaseTTL)}
	return nil
}
