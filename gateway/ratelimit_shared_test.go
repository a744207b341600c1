package gateway

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store/pgtest"
)

// TestRateLimitAcrossReplicas: three gateways on one PostgreSQL store,
// one sandbox calling through all three as fast as it can for 3 s with a
// limit of 20/s (burst 20). The calls answered 200 are the limit's in
// total — burst plus 20 a second, never more than 10% over — not three
// times that;
// the rest are 429 rate_limited and never reach the upstream.
func TestRateLimitAcrossReplicas(t *testing.T) {
	srv := pgtest.StartT(t, pgtest.Options{})
	dsn := srv.SuperURL(srv.NewDatabaseT(t))
	up := newUpstream(t)
	var gs []*testGateway
	for i := range 3 {
		gs = append(gs, startGateway(t, up.URL, "", func(c *config.Config) {
			c.Store = dsn
			c.Gateway.ReplicaID = fmt.Sprintf("r%d", i) // one host: one audit head each
			for i := range c.Agents {
				if c.Agents[i].Name == "agent-a" {
					c.Agents[i].RateLimit = &config.RateLimit{PerSecond: 20, Burst: 20}
				}
			}
		}))
	}
	before := up.requests.Load()
	var ok, limited, other atomic.Int64
	start := time.Now()
	const dur = 3 * time.Second
	var wg sync.WaitGroup
	for i := range 9 {
		c := gs[i%3].client(agentA)
		wg.Go(func() {
			for time.Since(start) < dur {
				r := doCall(t, c, "tickets.list_tickets", `{}`)
				switch {
				case r.status == http.StatusOK:
					ok.Add(1)
				case r.status == http.StatusTooManyRequests && r.code() == string(refusal.RateLimited):
					limited.Add(1)
				default:
					other.Add(1)
					t.Errorf("%d %s", r.status, r.raw)
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	want := 20 + 20*el
	t.Logf("%.2fs: %d allowed (limit %.0f), %d rate_limited", el, ok.Load(), want, limited.Load())
	// Never more than 10% over the limit (that would be the hole). Under
	// it only by what a loaded machine (two cores shared by several suites,
	// or -race) leaves unused: tokens accrue while no call is being made.
	if got, least := float64(ok.Load()), 0.85*(20+20*dur.Seconds()); got > want*1.1 || got < least {
		t.Fatalf("%d calls allowed in %.2fs across 3 replicas; the shared limit allows %.0f (at most +10%%, at least %.0f)", ok.Load(), el, want, least)
	}
	if limited.Load() == 0 {
		t.Fatal("no call was rate limited: the load did not reach the limit")
	}
	if n := up.requests.Load() - before; n != ok.Load() {
		t.Fatalf("the upstream got %d requests for %d allowed calls", n, ok.Load())
	}
}
