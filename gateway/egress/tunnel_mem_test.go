package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/ingress/ingresstest"
)

// heldBytes is the heap and stack in use after a collection.
func heldBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// TestEgressHeldTunnelMemory: a held, idle CONNECT tunnel costs the
// gateway less than half of the 62 KiB it cost with a 32 KiB read buffer
// per direction (issue 22): idle directions wait for data holding no
// buffer (socket to socket) or a 1 KiB one (copy loop, which also lets the server's reader go). The tunnels'
// clients are bare sockets that sent a ClientHello and the upstream only
// accepts and holds its connections, so what grows is the gateway's side.
func TestEgressHeldTunnelMemory(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	hello := clientHello(t, "pkg.example")
	for _, tc := range tunnelRelays {
		t.Run(tc.name, func(t *testing.T) {
			be := startBenchEgress(t, "", func(c *config.Config) { c.Egress.MaxTunnelsPerCaller = n + 64 })
			be.eg.copyLoop.Store(tc.copyLoop)
			// The upstream: accepts, reads the replayed hello, holds.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			var mu sync.Mutex
			var ups []net.Conn
			got := make(chan struct{}, n)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					ups = append(ups, c)
					mu.Unlock()
					got <- struct{}{}
				}
			}()
			t.Cleanup(func() {
				mu.Lock()
				defer mu.Unlock()
				for _, c := range ups {
					c.Close()
				}
			})
			be.eg.dialer = guard.New(guard.Options{Resolver: be.eg.res, DialFunc: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, ln.Addr().String())
			}})
			d := ingresstest.NewHandoffDialer(t, be.sock, agentA, "tcp")
			var clients []net.Conn
			open := func() net.Conn {
				c, err := d.DialContext(context.Background(), "", "")
				if err != nil {
					t.Fatal(err)
				}
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				if _, err := io.WriteString(c, "CONNECT pkg.example:443 HTTP/1.1\r\nHost: pkg.example:443\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReaderSize(c, 64), nil)
				if err != nil || resp.StatusCode != http.StatusOK {
					var body []byte
					if resp != nil {
						body, _ = io.ReadAll(resp.Body)
					}
					t.Fatalf("CONNECT after %d tunnels: %v %s", len(clients), err, body)
				}
				if _, err := c.Write(hello); err != nil {
					t.Fatal(err)
				}
				_ = c.SetDeadline(time.Time{})
				return c
			}
			// Warm up: the first tunnels grow pools and maps once.
			for range 20 {
				clients = append(clients, open())
			}
			waitN(t, got, 20)
			before := heldBytes()
			for range n {
				clients = append(clients, open())
			}
			waitN(t, got, n)
			time.Sleep(200 * time.Millisecond) // every relay is parked in its read
			after := heldBytes()
			for _, c := range clients {
				c.Close()
			}
			per := float64(after-before) / float64(n)
			t.Logf("%d held tunnels (%s): %.1f KiB heap+stack per tunnel (issue 22 measured 62–71 KiB; goal ≤ 31 KiB)", n, tc.name, per/1024)
			// The figure includes the test's own share (the handoff
			// dialer's goroutine and the sockets of both ends).
			const limit = 31.0
			if raceEnabled {
				t.Skipf("memory is not judged under the race detector (%.1f KiB per tunnel measured)", per/1024)
			}
			if per > limit*1024 {
				t.Fatalf("a held tunnel costs %.1f KiB, want at most %.0f KiB (about half of 62)", per/1024, limit)
			}
		})
	}
}

func waitN(t *testing.T, ch <-chan struct{}, n int) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for i := range n {
		select {
		case <-ch:
		case <-timeout:
			t.Fatal(fmt.Sprintf("%d of %d upstream connections", i, n))
		}
	}
}
