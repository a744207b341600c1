// Package ingresstest hands connections to a gateway's sandbox socket as
// sandboxd's relay does, for the tests of the gateway's entrances (the
// root's and raw egress's): the sandbox's own socket, passed with
// wire.Handoff, so a tunnel can be relayed socket to socket.
package ingresstest

import (
	"context"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// HandoffDialer hands connections to a gateway socket as sandboxd's relay
// does: the server end of a fresh loopback TCP (or Unix) connection is
// passed with wire.Handoff, the relay's copy is kept until the gateway
// closes the lease, and the client end is what the caller speaks on, as
// the sandbox does.
type HandoffDialer struct {
	sock   string
	id     wire.Identity
	family string // "tcp" (the proxy port) or "unix" (the per-sandbox socket)
	unix   string // listening path for "unix"

	mu     sync.Mutex
	leases []*net.UnixConn
}

// NewHandoffDialer hands connections to the gateway socket sock as id;
// family is "tcp" (the proxy port) or "unix" (the per-sandbox socket).
// What it leases is closed when t ends.
func NewHandoffDialer(t testing.TB, sock string, id wire.Identity, family string) *HandoffDialer {
	d := &HandoffDialer{sock: sock, id: id, family: family}
	if family == "unix" {
		dir, err := os.MkdirTemp("", "hand")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		d.unix = dir + "/sbx.sock"
	}
	t.Cleanup(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, l := range d.leases {
			l.Close()
		}
	})
	return d
}

// DialContext hands off a fresh connection and returns its client end.
func (d *HandoffDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	network, addr := "tcp", "127.0.0.1:0"
	if d.family == "unix" {
		network, addr = "unix", d.unix
		_ = os.Remove(addr)
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	client, err := net.Dial(network, l.Addr().String())
	if err != nil {
		return nil, err
	}
	server, err := l.Accept()
	if err != nil {
		client.Close()
		return nil, err
	}
	lease, err := wire.Handoff(ctx, d.sock, d.id, server.(syscall.Conn))
	if err != nil {
		client.Close()
		server.Close()
		return nil, err
	}
	d.mu.Lock()
	d.leases = append(d.leases, lease)
	d.mu.Unlock()
	go func() {
		// As the relay: hold the copy until the gateway is done.
		_, _ = lease.Read(make([]byte, 1))
		server.Close()
		lease.Close()
	}()
	return client, nil
}
