package relay

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/sandboxd/wire/wiretest"
)

// echoGateway reads the preamble and echoes everything after it.
func echoGateway(tb testing.TB) string {
	return wiretest.Gateway(tb, func(c net.Conn, br *bufio.Reader, _ wire.Identity, err error) {
		if err == nil {
			io.Copy(c, br)
		}
	})
}

// benchTargets returns a dialer through the relay (from inside a fresh
// netns), handing off ("relay") or copying bytes ("relay-copy", on
// another port), and one straight to the gateway socket, as a baseline.
func benchTargets(b *testing.B) map[string]func() (net.Conn, error) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: setns(CLONE_NEWNET) and ip netns")
	}
	gw := echoGateway(b)
	name := "sluice-relay-bench"
	ns := "/run/netns/" + name
	mustRun(b, "ip", "netns", "add", name)
	b.Cleanup(func() { mustRun(b, "ip", "netns", "del", name) })
	id := wire.Identity{Sandbox: "s", Agent: "a"}
	r, err := Open(b.Context(), Options{NetNS: ns, Identity: id, Gateway: gw})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	rc, err := Open(b.Context(), Options{NetNS: ns, Identity: id, Gateway: gw, ProxyPort: 3129, DNSPort: 54, Copy: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rc.Close() })
	pre, _ := wire.Encode(id)
	dialIn := func(addr string) (net.Conn, error) {
		var c net.Conn
		err := InNetNS(ns, func() error {
			var err error
			c, err = net.Dial("tcp", addr)
			return err
		})
		return c, err
	}
	return map[string]func() (net.Conn, error){
		"relay":      func() (net.Conn, error) { return dialIn("127.0.0.1:3128") },
		"relay-copy": func() (net.Conn, error) { return dialIn("127.0.0.1:3129") },
		"direct": func() (net.Conn, error) {
			c, err := net.Dial("unix", gw)
			if err == nil {
				_, err = c.Write(pre)
			}
			return c, err
		},
	}
}

func mustRun(tb testing.TB, argv ...string) {
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		tb.Fatalf("%v: %v: %s", argv, err, out)
	}
}

// BenchmarkConnect is one connection set up and one byte echoed. The relay
// case includes the benchmark's own setns to dial from inside.
func BenchmarkConnect(b *testing.B) {
	for name, dial := range benchTargets(b) {
		b.Run(name, func(b *testing.B) {
			one := []byte{'x'}
			for b.Loop() {
				c, err := dial()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := c.Write(one); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, one); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// BenchmarkThroughput streams 1 MiB chunks through one connection and back.
func BenchmarkThroughput(b *testing.B) {
	for name, dial := range benchTargets(b) {
		b.Run(name, func(b *testing.B) {
			c, err := dial()
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			chunk := make([]byte, 1<<20)
			back := make([]byte, 1<<20)
			b.SetBytes(int64(len(chunk)))
			for b.Loop() {
				errc := make(chan error, 1)
				go func() { _, err := c.Write(chunk); errc <- err }()
				if _, err := io.ReadFull(c, back); err != nil {
					b.Fatal(err)
				}
				if err := <-errc; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPingPong is one small request and its answer on a kept
// connection, the shape of a keep-alive HTTP request or a TLS record
// exchange inside a CONNECT tunnel.
func BenchmarkPingPong(b *testing.B) {
	for name, dial := range benchTargets(b) {
		b.Run(name, func(b *testing.B) {
			c, err := dial()
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			msg := make([]byte, 512)
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkInNetNS is the cost of one trip into a namespace and back (what
// the Connect/relay case pays on the client side, and Open pays once).
func BenchmarkInNetNS(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: setns(CLONE_NEWNET)")
	}
	name := "sluice-relay-bench-ns"
	mustRun(b, "ip", "netns", "add", name)
	b.Cleanup(func() { mustRun(b, "ip", "netns", "del", name) })
	for b.Loop() {
		if err := InNetNS("/run/netns/"+name, func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDNSQuery is one A query from inside the sandbox's namespace over
// UDP to 127.0.0.1:53, through the stub and POST /v1/dns on a keep-alive
// connection to a test gateway that answers 200.
func BenchmarkDNSQuery(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: setns(CLONE_NEWNET) and ip netns")
	}
	g := startGateway(b)
	g.dnsStatus.Store(200)
	name := "sluice-relay-bench-dns"
	ns := "/run/netns/" + name
	mustRun(b, "ip", "netns", "add", name)
	b.Cleanup(func() { mustRun(b, "ip", "netns", "del", name) })
	r, err := Open(b.Context(), Options{NetNS: ns, Identity: wire.Identity{Sandbox: "s", Agent: "a"}, Gateway: g.path})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	var c net.Conn
	if err := InNetNS(ns, func() error {
		var err error
		c, err = net.Dial("udp", "127.0.0.1:53")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	conn := &mdns.Conn{Conn: c}
	q := new(mdns.Msg).SetQuestion("example.com.", mdns.TypeA)
	for b.Loop() {
		if err := conn.WriteMsg(q); err != nil {
			b.Fatal(err)
		}
		resp, err := conn.ReadMsg()
		if err != nil || resp.Rcode != mdns.RcodeSuccess {
			b.Fatalf("%v %v", resp, err)
		}
	}
}
