package gateway

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
)

// vmRSS is this process's resident set in bytes, from /proc/self/status.
func vmRSS(tb testing.TB) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		tb.Skip("no /proc/self/status")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkHolds holds 10,000 pending calls through the socket (the whole
// pipeline, audit and store included) and reports the process's RSS (the
// gateway, the test client and the upstream together: an upper bound),
// then measures approve (admin API) → the waiting agent's result, b.N
// times, with the 10,000 still pending.
//
//	go test -run '^$' -bench BenchmarkHolds -benchtime 200x ./gateway
func BenchmarkHolds(b *testing.B) {
	const pending = 10000
	up := newUpstream(b)
	g := startGateway(b, up.URL, approversYAML, func(c *config.Config) {
		c.Gateway.HoldWait = 0
		c.Gateway.MaxPendingHolds = pending + 10
		c.Gateway.MaxPendingHoldsPerSandbox = pending + 10
	})
	agentB := agentA
	agentB.Session = "bench-fill"
	fill := g.client(agentB)
	start := time.Now()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				// A loaded machine can time out a policy evaluation (which
				// blocks, failing closed): try again.
				var r reply
				for try := 0; try < 5 && r.status != 202; try++ {
					r = doCall(b, fill, "tickets.create_refund", fmt.Sprintf(`{"body":{"amount":%d}}`, i+1))
				}
				if r.status != 202 {
					b.Errorf("hold %d: %d %s", i, r.status, r.raw)
				}
			}
		}()
	}
	for i := range pending {
		work <- i
	}
	close(work)
	wg.Wait()
	fillTime := time.Since(start)
	runtime.GC()
	rss := vmRSS(b)

	// The waiting agent: each call blocks until its hold is decided.
	g.cfg.Gateway.HoldWait = config.Duration(30 * time.Second)
	c := g.client(agentA)
	sub, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := g.Holds().Subscribe(sub)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		got := make(chan reply, 1)
		go func() {
			got <- doCall(b, c, "tickets.create_refund", fmt.Sprintf(`{"body":{"amount":%d}}`, 1_000_000+i))
		}()
		var id string
		for id == "" {
			if e := <-events; e.Kind == "created" && e.Hold.Caller.Session == agentA.Session {
				id = e.Hold.ID
			}
		}
		// Let the agent's call reach its wait.
		time.Sleep(time.Millisecond)
		t0 := time.Now()
		if r := g.admin(b, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", ""); r.status != 200 {
			b.Fatalf("approve: %d %s", r.status, r.raw)
		}
		r := <-got
		lat = append(lat, time.Since(t0))
		if r.status != 200 {
			b.Fatalf("agent: %d %s", r.status, r.raw)
		}
	}
	b.StopTimer()
	// Reported here: ResetTimer discards metrics reported before it.
	b.ReportMetric(float64(rss)/(1<<20), "RSS_MB")
	b.ReportMetric(float64(fillTime.Microseconds())/1000/pending, "ms/hold_created")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*95/100].Microseconds())/1000, "p95_ms")
	if n, _ := g.Holds().List(context.Background(), holds.Filter{Status: []holds.Status{holds.Pending}, Limit: 1}); len(n) != 1 {
		b.Fatal("the pending holds are gone")
	}
}
