package pin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/sandboxd/relay"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/sandboxd/wire/wiretest"
)

func needTools(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, veth and nftables need CAP_SYS_ADMIN and CAP_NET_ADMIN")
	}
	for _, tool := range []string{"ip", "nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (iproute2, nftables, util-linux)", tool)
		}
	}
}

var seq atomic.Int32

func sh(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

func newNetNS(t *testing.T, prefix string) (name, path string) {
	t.Helper()
	name = fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
	sh(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return name, "/run/netns/" + name
}

func dialIn(ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := relay.InNetNS(ns, func() error {
		var err error
		c, err = net.DialTimeout(network, addr, 2*time.Second)
		return err
	})
	return c, err
}

// rawGateway reads the preamble and answers with the identity as JSON.
func rawGateway(t *testing.T) string {
	return wiretest.Gateway(t, func(c net.Conn, _ *bufio.Reader, id wire.Identity, err error) {
		if err != nil {
			fmt.Fprintf(c, "bad preamble: %v", err)
			return
		}
		json.NewEncoder(c).Encode(id)
	})
}

// peer is a namespace joined to the sandbox's by a veth pair, with a TCP
// server that says hello on its IPv4 and IPv6 addresses. The host's own
// namespace is never on the path.
type peer struct{ v4, v6 string }

func newPeer(t *testing.T, sbxName string) peer {
	t.Helper()
	peerName, peerPath := newNetNS(t, "sluice-pin-peer")
	n := seq.Add(1)
	va, vb := fmt.Sprintf("vpa%d", n), fmt.Sprintf("vpb%d", n)
	sh(t, "ip", "link", "add", va, "netns", sbxName, "type", "veth", "peer", "name", vb, "netns", peerName)
	for _, c := range [][]string{
		{"ip", "-n", sbxName, "link", "set", "lo", "up"},
		{"ip", "-n", sbxName, "addr", "add", "10.231.0.1/24", "dev", va},
		{"ip", "-n", sbxName, "addr", "add", "fd31::1/64", "dev", va, "nodad"},
		{"ip", "-n", sbxName, "link", "set", va, "up"},
		{"ip", "-n", peerName, "link", "set", "lo", "up"},
		{"ip", "-n", peerName, "addr", "add", "10.231.0.2/24", "dev", vb},
		{"ip", "-n", peerName, "addr", "add", "fd31::2/64", "dev", vb, "nodad"},
		{"ip", "-n", peerName, "link", "set", vb, "up"},
		// A default route and a route in another table: both must go.
		{"ip", "-n", sbxName, "route", "add", "default", "via", "10.231.0.2"},
		{"ip", "-n", sbxName, "route", "add", "10.99.0.0/16", "via", "10.231.0.2", "table", "100"},
		// Routes on lo outlive the veth: Pin must flush them itself.
		{"ip", "-n", sbxName, "route", "add", "10.98.0.0/16", "dev", "lo"},
		{"ip", "-n", sbxName, "route", "add", "10.97.0.0/16", "dev", "lo", "table", "101"},
		{"ip", "-n", sbxName, "-6", "route", "add", "fd97::/64", "dev", "lo", "table", "101"},
	} {
		sh(t, c...)
	}
	p := peer{v4: "10.231.0.2:8080", v6: "[fd31::2]:8080"}
	for _, a := range []string{p.v4, p.v6} {
		var l net.Listener
		if err := relay.InNetNS(peerPath, func() error {
			var err error
			l, err = net.Listen("tcp", a)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				io.WriteString(c, "hello\n")
				c.Close()
			}
		}()
	}
	return p
}

// eventually retries fn until it succeeds or d has passed.
func eventually(d time.Duration, fn func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func hello(ns, addr string) error {
	c, err := dialIn(ns, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(b) != "hello\n" {
		return fmt.Errorf("got %q", b)
	}
	return nil
}

func TestPin(t *testing.T) {
	needTools(t)
	gw := rawGateway(t)
	tests := []struct {
		name string
		opts func(nsPath string, t *testing.T) Options
	}{
		{"by netns path", func(nsPath string, t *testing.T) Options { return Options{NetNS: nsPath} }},
		{"by pid of a process in it", func(nsPath string, t *testing.T) Options {
			cmd := exec.Command("nsenter", "--net="+nsPath, "--", "sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			// Wait until nsenter has joined and exec'd.
			for range 100 {
				if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid)); strings.HasSuffix(l, "sleep") {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			return Options{PID: cmd.Process.Pid}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, nsPath := newNetNS(t, "sluice-pin")
			p := newPeer(t, name)

			// Control: before pinning the peer answers on both families.
			// A fresh veth may drop the first packets while its link
			// comes up (IPv6 neighbour discovery especially), so the
			// control retries; the refusals after pinning do not.
			for _, a := range []string{p.v4, p.v6} {
				if err := eventually(10*time.Second, func() error { return hello(nsPath, a) }); err != nil {
					t.Fatalf("control: peer %s unreachable before pinning: %v", a, err)
				}
			}

			id := wire.Identity{Sandbox: "pod-1", Agent: "agent-pin", Session: "s"}
			opts := tt.opts(nsPath, t)
			opts.Identity, opts.Gateway = id, gw
			pinned, err := Pin(context.Background(), opts)
			if err != nil {
				t.Fatalf("Pin: %v", err)
			}
			closed := false
			t.Cleanup(func() {
				if !closed {
					pinned.Close()
				}
			})

			for _, a := range []string{p.v4, p.v6} {
				t.Run("peer unreachable after pin "+a, func(t *testing.T) {
					err := hello(nsPath, a)
					if !errors.Is(err, syscall.ENETUNREACH) && !errors.Is(err, syscall.EPERM) {
						t.Fatalf("dial %s after pin = %v, want ENETUNREACH or EPERM", a, err)
					}
				})
			}
			t.Run("only lo remains, no routes off lo", func(t *testing.T) {
				var links []struct {
					Name string `json:"ifname"`
				}
				if err := json.Unmarshal([]byte(sh(t, "ip", "-n", name, "-j", "link", "show")), &links); err != nil {
					t.Fatal(err)
				}
				if len(links) != 1 || links[0].Name != "lo" {
					t.Fatalf("links %+v, want only lo", links)
				}
				for _, fam := range []string{"-4", "-6"} {
					out := sh(t, "ip", "-n", name, fam, "route", "show", "table", "all")
					for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
						if line != "" && (!strings.Contains(line, "dev lo") || !strings.Contains(line, "table local")) {
							t.Errorf("route left: %q", line)
						}
					}
				}
			})
			t.Run("nft ruleset drops all but lo", func(t *testing.T) {
				out := sh(t, "ip", "netns", "exec", name, "nft", "list", "ruleset")
				for _, want := range []string{"table inet " + Table, "hook input", "hook output", "hook forward", "policy drop", `iif "lo" accept`, `oif "lo" accept`} {
					if !strings.Contains(out, want) {
						t.Errorf("ruleset lacks %q:\n%s", want, out)
					}
				}
			})
			t.Run("relay listeners work inside", func(t *testing.T) {
				c, err := dialIn(nsPath, "tcp", "127.0.0.1:3128")
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				var got wire.Identity
				if err := json.NewDecoder(c).Decode(&got); err != nil {
					t.Fatal(err)
				}
				if got != id {
					t.Fatalf("gateway saw %+v, want %+v", got, id)
				}
				dc, err := dialIn(nsPath, "udp", "127.0.0.1:53")
				if err != nil {
					t.Fatal(err)
				}
				defer dc.Close()
				dc.SetDeadline(time.Now().Add(10 * time.Second))
				conn := &mdns.Conn{Conn: dc}
				if err := conn.WriteMsg(new(mdns.Msg).SetQuestion("example.com.", mdns.TypeA)); err != nil {
					t.Fatal(err)
				}
				resp, err := conn.ReadMsg()
				if err != nil {
					t.Fatal(err)
				}
				// This gateway does not speak /v1/dns: the stub refuses.
				if resp.Rcode != mdns.RcodeRefused {
					t.Fatalf("dns rcode %s, want REFUSED", mdns.RcodeToString[resp.Rcode])
				}
			})

			if err := pinned.Close(); err != nil {
				t.Fatal(err)
			}
			closed = true
			t.Run("Close unpins the listeners", func(t *testing.T) {
				_, err := dialIn(nsPath, "tcp", "127.0.0.1:3128")
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Fatalf("dial after Close = %v, want ECONNREFUSED", err)
				}
			})
			t.Run("namespace stays closed after unpin", func(t *testing.T) {
				if out := sh(t, "ip", "netns", "exec", name, "nft", "list", "tables"); !strings.Contains(out, Table) {
					t.Fatalf("ruleset gone after Close: %s", out)
				}
			})
		})
	}
}

func TestPinRefuses(t *testing.T) {
	needTools(t)
	gw := rawGateway(t)
	_, nsPath := newNetNS(t, "sluice-pin")
	good := wire.Identity{Sandbox: "s", Agent: "a"}
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"neither netns nor pid", Options{Identity: good, Gateway: gw}, "netns path or pid is required"},
		{"both netns and pid", Options{NetNS: nsPath, PID: 1, Identity: good, Gateway: gw}, "not both"},
		{"not a network namespace", Options{NetNS: "/proc/self/ns/uts", Identity: good, Gateway: gw}, "not a network namespace"},
		{"not a namespace at all", Options{NetNS: "/etc/hostname", Identity: good, Gateway: gw}, "not a namespace"},
		{"identity without agent", Options{NetNS: nsPath, Identity: wire.Identity{Sandbox: "s"}, Gateway: gw}, "agent is required"},
		{"no gateway", Options{NetNS: nsPath, Identity: good}, "gateway socket is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Pin(context.Background(), tt.opts)
			if err == nil {
				p.Close()
				t.Fatal("Pin succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Pin = %v, want an error about %q", err, tt.want)
			}
		})
	}
	t.Run("nothing was loaded into the namespace", func(t *testing.T) {
		if out := sh(t, "ip", "netns", "exec", filepath.Base(nsPath), "nft", "list", "tables"); strings.Contains(out, Table) {
			t.Fatalf("a refused Pin loaded the ruleset: %s", out)
		}
	})
}

// TestCheckNetNSRefusesHost checks the guard directly rather than through
// Pin, so that a broken guard can never strip the host's interfaces.
func TestCheckNetNSRefusesHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: NS_GET_NSTYPE on /proc/1/ns/net")
	}
	for _, path := range []string{"/proc/self/ns/net", "/proc/1/ns/net", fmt.Sprintf("/proc/%d/ns/net", os.Getpid())} {
		t.Run(path, func(t *testing.T) {
			f, err := os.Open(path)
			if errors.Is(err, os.ErrPermission) {
				t.Skipf("%s hidden here: %v", path, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			err = checkNetNS(f)
			if err == nil || !strings.Contains(err.Error(), "host's own network namespace") {
				t.Fatalf("checkNetNS(%s) = %v, want the host refusal", path, err)
			}
		})
	}
}

// TestRulesetAlone shows the second layer holds by itself: with the veth
// and routes still in place, the ruleset alone stops the peer while
// loopback keeps working. The output chain drops silently, so a TCP SYN
// never leaves (the dial times out: no handshake with the peer) and a UDP
// send fails with EPERM at once.
func TestRulesetAlone(t *testing.T) {
	needTools(t)
	name, nsPath := newNetNS(t, "sluice-pin")
	peer := newPeer(t, name)
	for _, a := range []string{peer.v4, peer.v6} {
		if err := eventually(10*time.Second, func() error { return hello(nsPath, a) }); err != nil {
			t.Fatalf("control: peer %s unreachable before the ruleset: %v", a, err)
		}
	}
	f, err := os.Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := &Pinned{ns: f}
	if err := p.run(context.Background(), strings.NewReader(Ruleset), "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	// Loading twice replaces the table (re-pinning is idempotent).
	if err := p.run(context.Background(), strings.NewReader(Ruleset), "nft", "-f", "-"); err != nil {
		t.Fatalf("reload: %v", err)
	}
	for _, a := range []string{peer.v4, peer.v6} {
		t.Run("tcp peer "+a, func(t *testing.T) {
			err := hello(nsPath, a)
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("dial %s with the ruleset = %v, want a timeout (SYN dropped)", a, err)
			}
		})
		t.Run("udp peer "+a, func(t *testing.T) {
			c, err := dialIn(nsPath, "udp", a)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.EPERM) {
				t.Fatalf("udp send to %s with the ruleset = %v, want EPERM", a, err)
			}
		})
	}
	t.Run("loopback still works", func(t *testing.T) {
		var l net.Listener
		if err := relay.InNetNS(nsPath, func() error {
			var err error
			l, err = net.Listen("tcp", "127.0.0.1:0")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			if c, err := l.Accept(); err == nil {
				io.WriteString(c, "hello\n")
				c.Close()
			}
		}()
		if err := hello(nsPath, l.Addr().String()); err != nil {
			t.Fatal(err)
		}
	})
}
