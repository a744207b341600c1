package gateway

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
)

// TestToolCallUpstreamPoolSizedToLoad holds issue 22's item 5: with more
// concurrent calls than the old fixed 64 idle connections per host, the
// upstream connections of one round of calls are all reused by the next,
// instead of 36 of them being closed and dialled again every round.
func TestToolCallUpstreamPoolSizedToLoad(t *testing.T) {
	const callers, rounds = 100, 4
	var (
		dials   atomic.Int64
		mu      sync.Mutex
		arrived int
		release = make(chan struct{})
	)
	// Each round's calls wait at the upstream until all of them are in
	// flight at once: the pool must then hold callers connections.
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived++
		ch := release
		if arrived == callers {
			arrived = 0
			release = make(chan struct{})
			close(ch)
		}
		mu.Unlock()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			http.Error(w, "round never filled", http.StatusGatewayTimeout)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"tickets":[]}`)
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	g := startGateway(t, up.URL, "", func(c *config.Config) { c.Gateway.MaxConnections, c.Gateway.MaxConnectionsPerSandbox = 512, 256 })
	clients := make([]*http.Client, callers)
	for i := range clients {
		clients[i] = g.client(agentA)
	}
	perRound := make([]int64, rounds)
	for r := range rounds {
		before := dials.Load()
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{"query":{"limit":5}}`))
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("status %d: %s", resp.StatusCode, b)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", r, err)
		}
		perRound[r] = dials.Load() - before
	}
	if perRound[0] != callers {
		t.Errorf("first round dialled %d upstream connections, want %d (one per call in flight)", perRound[0], callers)
	}
	for r := 1; r < rounds; r++ {
		if perRound[r] != 0 {
			t.Errorf("round %d dialled %d new upstream connections, want 0: the idle pool dropped connections the load needs (dials per round %v)", r, perRound[r], perRound)
		}
	}
}
