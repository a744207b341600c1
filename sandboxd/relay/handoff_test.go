package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// unixIn is an HTTP client over the per-sandbox Unix socket at path.
func unixIn(path string) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
}

// TestRelayHandsOff: by default both exits hand their connections to the
// gateway (received with wire.Receive, served on the passed socket) with
// the relay's identity; with Copy the bytes are relayed as before.
func TestRelayHandsOff(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name        string
		copy        bool
		wantHandoff bool
	}{
		{"default hands off", false, true},
		{"Copy relays bytes", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t)
			_, ns := newNetNS(t, "sluice-relay")
			dir, err := os.MkdirTemp("", "sbx")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			sock := filepath.Join(dir, "gateway.sock")
			want := wire.Identity{Sandbox: "sb-h", Agent: "agent-h", Session: "s", User: "u", Host: "h"}
			openRelay(t, Options{NetNS: ns, Identity: want, Gateway: g.path, SocketPath: sock, Copy: tc.copy})
			for name, c := range map[string]*http.Client{"proxy port": httpIn(t, ns, "127.0.0.1:3128"), "unix socket": unixIn(sock)} {
				h0, i0 := g.handoffs.Load(), g.identity.Load()
				for range 3 { // keep-alive: one connection, three requests
					id, err := getID(t, c)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if id != want {
						t.Fatalf("%s: gateway saw %+v, want %+v", name, id, want)
					}
				}
				c.CloseIdleConnections()
				dh, di := g.handoffs.Load()-h0, g.identity.Load()-i0
				if tc.wantHandoff && (dh != 1 || di != 0) {
					t.Errorf("%s: %d handoffs and %d identity connections, want 1 and 0", name, dh, di)
				}
				if !tc.wantHandoff && (dh != 0 || di != 1) {
					t.Errorf("%s: %d handoffs and %d identity connections, want 0 and 1", name, dh, di)
				}
			}
		})
	}
}

// TestRelayCloseCutsHandoff: Close shuts a handed-off socket down, so both
// the sandbox's end and the gateway's copy see the connection end, though
// the gateway still holds a descriptor of it.
func TestRelayCloseCutsHandoff(t *testing.T) {
	needRoot(t)
	g := startGateway(t)
	_, ns := newNetNS(t, "sluice-relay")
	r, err := Open(context.Background(), Options{NetNS: ns, Identity: wire.Identity{Sandbox: "s", Agent: "a"}, Gateway: g.path})
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialIn(t, ns, "tcp", "127.0.0.1:3128")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: sluice\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /hold: %v", err)
	}
	if g.handoffs.Load() != 1 {
		t.Fatalf("%d handoffs, want 1", g.handoffs.Load())
	}
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v", d)
	}
	t.Run("the sandbox sees the end", func(t *testing.T) {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after Close = %v, want EOF/reset", err)
		}
	})
	t.Run("the gateway sees EOF", func(t *testing.T) {
		select {
		case err := <-g.held:
			if err != nil {
				t.Fatalf("gateway read ended with %v, want EOF", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("the gateway's copy of the connection is still open after Close")
		}
	})
}

// TestRelayHandoffGatewayDone: when the gateway closes its side (the
// passed connection and the lease), the sandbox sees the end and the
// relay gives the slot back.
func TestRelayHandoffGatewayDone(t *testing.T) {
	needRoot(t)
	g := startGateway(t)
	_, ns := newNetNS(t, "sluice-relay")
	openRelay(t, Options{NetNS: ns, Identity: wire.Identity{Sandbox: "s", Agent: "a"}, Gateway: g.path, MaxConns: 1})
	for i := range 3 { // with MaxConns 1, each needs the previous slot back
		c, err := dialIn(t, ns, "tcp", "127.0.0.1:3128")
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "GET /id HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n\r\n")
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Fatalf("connection %d: %v (want the gateway's close to end it)", i, err)
		}
		if len(b) == 0 {
			t.Fatalf("connection %d: no answer", i)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := g.handoffs.Load(); n != 3 {
		t.Fatalf("%d handoffs, want 3", n)
	}
}

// TestRelayFallsBackToCopy: a refused handoff leaves the connection
// untouched, and the relay copies its bytes instead. A gateway that
// predates handoff (its refusal does not name it) gets every later
// connection copied straight away; a gateway that refuses one handoff
// (naming it) still gets the next one handed off.
func TestRelayFallsBackToCopy(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name         string
		aware        bool
		wantRefusals int64
	}{
		{"gateway without handoff: sticky", false, 1},
		{"handoff-aware refusal: per connection", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t)
			if tc.aware {
				g.refuseOne.Store(true)
			} else {
				g.refuse.Store(true)
			}
			_, ns := newNetNS(t, "sluice-relay")
			want := wire.Identity{Sandbox: "s", Agent: "a"}
			openRelay(t, Options{NetNS: ns, Identity: want, Gateway: g.path})
			for i := range 2 {
				c := httpIn(t, ns, "127.0.0.1:3128")
				id, err := getID(t, c)
				if err != nil || id != want {
					t.Fatalf("request %d: %+v, %v; want %+v", i, id, err, want)
				}
				c.CloseIdleConnections()
			}
			if h, i, r := g.handoffs.Load(), g.identity.Load(), g.refusals.Load(); h != 0 || i != 2 || r != tc.wantRefusals {
				t.Fatalf("%d handoffs served, %d identity connections, %d refusals; want 0, 2, %d", h, i, r, tc.wantRefusals)
			}
		})
	}
}

// TestRelayHandoffLeavesPoller: once a connection is handed off, the
// relay's descriptor of it is out of the process's poller, so the bytes
// the gateway moves on the socket wake only the gateway. The relay and the
// test's gateway share this process (and its one epoll set), so the socket
// is registered once, by the gateway; before, the relay's registration
// made it twice and woke the relay for every request (test/bench).
func TestRelayHandoffLeavesPoller(t *testing.T) {
	needRoot(t)
	g := startGateway(t)
	_, ns := newNetNS(t, "sluice-relay")
	openRelay(t, Options{NetNS: ns, Identity: wire.Identity{Sandbox: "s", Agent: "a"}, Gateway: g.path})
	c, err := dialIn(t, ns, "tcp", "127.0.0.1:3128")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	for range 2 { // kept alive: the gateway still serves the socket below
		io.WriteString(c, "GET /id HTTP/1.1\r\nHost: sluice\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	client := c.LocalAddr().(*net.TCPAddr).Port
	if n := g.handoffs.Load(); n != 1 {
		t.Fatalf("%d handoffs, want 1", n)
	}
	if n := polled(t, 3128, client); n != 1 {
		t.Fatalf("the handed-off socket is registered %d times in the process's epoll set, want 1 (the gateway's)", n)
	}
}

// polled counts the registrations in this process's epoll sets of
// sockets bound to port local and connected to port peer.
func polled(t *testing.T, local, peer int) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range fds {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(info), "\n") {
			var tfd int
			if _, err := fmt.Sscanf(line, "tfd: %d", &tfd); err != nil {
				continue
			}
			sa, err1 := unix.Getsockname(tfd)
			pa, err2 := unix.Getpeername(tfd)
			if err1 != nil || err2 != nil {
				continue
			}
			s4, ok1 := sa.(*unix.SockaddrInet4)
			p4, ok2 := pa.(*unix.SockaddrInet4)
			if ok1 && ok2 && s4.Port == local && p4.Port == peer {
				n++
			}
		}
	}
	return n
}
