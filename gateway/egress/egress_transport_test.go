package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestProxyUpstreamConnectionsPerCaller: absolute-form requests reuse an
// upstream connection for the same caller and host, and never send two
// callers' requests over one connection (THREATS F1-F4: a caller who
// desynchronises a connection confuses only its own responses).
func TestProxyUpstreamConnectionsPerCaller(t *testing.T) {
	be := startBenchEgress(t, "", nil)
	callers := []struct {
		name string
		id   wire.Identity
	}{
		{"agent-a in sb-1", agentA},
		{"agent-a in sb-2", wire.Identity{Sandbox: "sb-2", Agent: "agent-a", Session: "s-2", User: "alice"}},
		{"agent-a in sb-1, another session", wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-9", User: "alice"}},
	}
	for round := range 3 {
		for _, c := range callers {
			cl := be.viaProxyAs(t, c.id)
			req, _ := http.NewRequest(http.MethodGet, "http://pkg.example/x", nil)
			req.Header.Set("X-Test-Caller", c.name)
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatalf("round %d, %s: %v", round, c.name, err)
			}
			resp.Body.Close()
			cl.CloseIdleConnections() // a new sandbox connection each time: only the gateway can reuse
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("round %d, %s: %d", round, c.name, resp.StatusCode)
			}
		}
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	perCaller := map[string]int{}
	for conn, cs := range be.conns {
		if len(cs) != 1 {
			t.Errorf("upstream connection %s carried requests of %d callers: %v", conn, len(cs), cs)
		}
		for c := range cs {
			perCaller[c]++
		}
	}
	for _, c := range callers {
		if perCaller[c.name] != 1 {
			t.Errorf("%s used %d upstream connections for 3 sequential requests, want 1 (reuse)", c.name, perCaller[c.name])
		}
	}
}

// TestUpstreamPoolEviction: a caller's idle connections are kept while
// the caller is active, closed after the idle time, bounded per host, and
// the least recently used caller goes first when the pool is full; after
// closeIdle, nothing is pooled.
func TestUpstreamPoolEviction(t *testing.T) {
	var dialled []net.Conn
	newPool := func() *upstreamPool {
		dialled = nil
		return newUpstreamPool(upstreamOptions{
			dial: func(context.Context, string) (net.Conn, error) {
				c, s := net.Pipe()
				t.Cleanup(func() { c.Close(); s.Close() })
				dialled = append(dialled, c)
				return c, nil
			},
			idle: time.Hour, maxIdlePerHost: 2, maxIdlePerCaller: 3, headerTimeout: time.Second,
		})
	}
	caller := func(i int) policy.Caller { return policy.Caller{Sandbox: fmt.Sprintf("sb-%d", i), Agent: "a"} }
	get := func(p *upstreamPool, c policy.Caller, addr string) *upConn {
		pc, err := p.get(context.Background(), c, addr)
		if err != nil {
			t.Fatal(err)
		}
		return pc
	}
	tests := []struct {
		name string
		run  func(p *upstreamPool) string // "" when the pool behaved
	}{
		{"same caller and host reuse", func(p *upstreamPool) string {
			pc := get(p, caller(1), "h:80")
			p.put(caller(1), pc)
			if again := get(p, caller(1), "h:80"); again != pc || !again.reused || len(dialled) != 1 {
				return "an idle connection of the same caller and host was not reused"
			}
			return ""
		}},
		{"callers never share", func(p *upstreamPool) string {
			p.put(caller(1), get(p, caller(1), "h:80"))
			if get(p, caller(2), "h:80").reused || len(dialled) != 2 {
				return "another caller got caller 1's connection"
			}
			return ""
		}},
		{"hosts never share", func(p *upstreamPool) string {
			p.put(caller(1), get(p, caller(1), "h:80"))
			if get(p, caller(1), "other:80").reused {
				return "a connection to h:80 was used for other:80"
			}
			return ""
		}},
		{"idle connections expire", func(p *upstreamPool) string {
			pc := get(p, caller(1), "h:80")
			p.put(caller(1), pc)
			pc.idleAt = time.Now().Add(-2 * time.Hour)
			if get(p, caller(1), "h:80") == pc {
				return "a connection idle for 2h was reused"
			}
			return ""
		}},
		{"idle bound per host", func(p *upstreamPool) string {
			a, b, c := get(p, caller(1), "h:80"), get(p, caller(1), "h:80"), get(p, caller(1), "h:80")
			p.put(caller(1), a)
			p.put(caller(1), b)
			p.put(caller(1), c)
			if p.m[caller(1)].n != 2 || p.idleN != 2 {
				return fmt.Sprintf("%d idle for one host, want 2", p.m[caller(1)].n)
			}
			return ""
		}},
		{"full pool drops the least recently used", func(p *upstreamPool) string {
			for i := range maxPooledCallers {
				p.put(caller(i), get(p, caller(i), "h:80"))
			}
			p.m[caller(7)].used = time.Now().Add(-time.Minute)
			p.put(caller(maxPooledCallers), get(p, caller(maxPooledCallers), "h:80"))
			if _, ok := p.m[caller(7)]; ok || len(p.m) != maxPooledCallers || p.idleN != maxPooledCallers {
				return fmt.Sprintf("after overflow: %d callers, %d idle, oldest kept %v", len(p.m), p.idleN, ok)
			}
			return ""
		}},
		{"closeIdle closes and pools nothing more", func(p *upstreamPool) string {
			pc, busy := get(p, caller(1), "h:80"), get(p, caller(2), "h:80")
			p.put(caller(1), pc)
			p.closeIdle()
			p.put(caller(2), busy) // a request that ended after the stop
			if len(p.m) != 0 || p.idleN != 0 {
				return "connections were pooled after closeIdle"
			}
			for _, c := range []net.Conn{pc.conn, busy.conn} {
				if _, err := c.Write([]byte("x")); !errors.Is(err, io.ErrClosedPipe) {
					return fmt.Sprintf("a connection is still open after closeIdle: %v", err)
				}
			}
			if _, err := p.get(context.Background(), caller(3), "h:80"); !errors.Is(err, errPoolClosed) {
				return fmt.Sprintf("a dial after closeIdle: %v", err)
			}
			return ""
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if msg := tc.run(newPool()); msg != "" {
				t.Fatal(msg)
			}
		})
	}
}
