package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/ingress/ingresstest"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// handoffClient is an HTTP client whose connections are handed off.
func handoffClient(t testing.TB, sock string, id wire.Identity, family string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: ingresstest.NewHandoffDialer(t, sock, id, family).DialContext}}
}

// TestHandoffServesIdentity: a handed-off connection (TCP from the proxy
// port, Unix from the per-sandbox socket) is served by the real sandbox
// listener with the identity from the handoff line, keep-alive included.
func TestHandoffServesIdentity(t *testing.T) {
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil)
	for _, family := range []string{"tcp", "unix"} {
		t.Run(family, func(t *testing.T) {
			a := handoffClient(t, g.cfg.Gateway.SandboxSocket, agentA, family)
			agentB := wire.Identity{Sandbox: "sb-2", Agent: "agent-b"}
			b := handoffClient(t, g.cfg.Gateway.SandboxSocket, agentB, family)
			for range 2 { // the second request reuses the connection
				if got := toolNames(t, a); !got["tickets.list_tickets"] {
					t.Fatalf("agent-a over a handoff sees %v, want its tickets tools", got)
				}
				if got := toolNames(t, b); len(got) != 0 {
					t.Fatalf("agent-b over a handoff sees %v, want no tools", got)
				}
			}
			if r := doCall(t, a, "tickets.list_tickets", `{}`); r.status != http.StatusOK {
				t.Fatalf("tool call over a handoff: %d %s", r.status, r.raw)
			}
		})
	}
}

// TestHandoffLease: closing the lease (the relay's Close, or sandboxd
// ending) ends the handed-off connection; the gateway closing the
// connection closes the lease (how the relay learns it is done).
func TestHandoffLease(t *testing.T) {
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil)
	handoff := func(t *testing.T) (client net.Conn, lease *net.UnixConn) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		client, err = net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		server, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		lease, err = wire.Handoff(context.Background(), g.cfg.Gateway.SandboxSocket, agentA, server.(syscall.Conn))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lease.Close() })
		server.Close() // not the relay's way, but shows the gateway's copy alone serves
		_ = client.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(client, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(client), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request over the handoff: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		return client, lease
	}
	t.Run("closing the lease ends the connection", func(t *testing.T) {
		client, lease := handoff(t)
		lease.Close()
		_ = client.SetReadDeadline(time.Now().Add(3 * time.Second))
		if n, err := client.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("client read after the lease closed = %d, %v; want EOF", n, err)
		}
	})
	t.Run("the gateway closing the connection closes the lease", func(t *testing.T) {
		client, lease := handoff(t)
		io.WriteString(client, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n\r\n")
		_ = lease.SetReadDeadline(time.Now().Add(3 * time.Second))
		if n, err := lease.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("lease read after Connection: close = %d, %v; want EOF", n, err)
		}
	})
}

// metricCount reads sluice_connections_refused_total for code.
func refusedCount(t *testing.T, g *testGateway, code refusal.Code) float64 {
	t.Helper()
	resp, err := http.Get("http://" + g.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "sluice_connections_refused") && strings.Contains(l, fmt.Sprintf(`code="%s"`, code)) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			return v
		}
	}
	return 0
}

// passedFD makes a descriptor of kind for a refusal case; live is the
// sandbox end of a connected socket (nil otherwise).
func passedFD(t *testing.T, kind string) (fd int, live net.Conn) {
	t.Helper()
	fdOf := func(c syscall.Conn) int {
		raw, _ := c.SyscallConn()
		var n int
		_ = raw.Control(func(f uintptr) { n = int(f) })
		return n
	}
	switch kind {
	case "tcp":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		return fdOf(s.(syscall.Conn)), c
	case "file":
		f, err := os.Open("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return int(f.Fd()), nil
	case "udp":
		c, err := net.Dial("udp", "127.0.0.1:9")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return fdOf(c.(syscall.Conn)), nil
	case "listening":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return fdOf(l.(syscall.Conn)), nil
	}
	t.Fatalf("bug: kind %q", kind)
	return -1, nil
}

// fdLink is /proc/self/fd's view of fd; refs counts descriptors showing it.
func fdLink(t *testing.T, fd int) string {
	s, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func fdRefs(t *testing.T, link string) (n, total int) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if s, _ := os.Readlink("/proc/self/fd/" + e.Name()); s == link {
			n++
		}
	}
	return n, len(ents)
}

// TestHandoffRefusals: every handoff that is not exactly one connected
// stream socket with a valid line is refused on the Unix connection with
// the existing 400 identity_required answer, counted, logged, and every
// received descriptor is closed (the gateway runs in this process, so a
// leaked one shows in /proc/self/fd). The passed socket is left untouched
// for the relay. An untrusted peer is refused before anything is received.
func TestHandoffRefusals(t *testing.T) {
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil)
	hand, _ := wire.EncodeHandoff(agentA)
	ident, _ := wire.Encode(agentA)
	cases := []struct {
		name   string
		line   string
		fds    []string
		status string
		code   refusal.Code
		log    string
	}{
		{"handoff without a descriptor", string(hand), nil, "400", refusal.IdentityRequired, "refused handoff"},
		{"handoff of a regular file", string(hand), []string{"file"}, "400", refusal.IdentityRequired, "refused handoff"},
		{"handoff of a UDP socket", string(hand), []string{"udp"}, "400", refusal.IdentityRequired, "refused handoff"},
		{"handoff of a listening socket", string(hand), []string{"listening"}, "400", refusal.IdentityRequired, "refused handoff"},
		{"handoff of two sockets", string(hand), []string{"tcp", "tcp"}, "400", refusal.IdentityRequired, "refused handoff"},
		{"identity line with a descriptor", string(ident) + "GET /v1/tools HTTP/1.1\r\nHost: x\r\n\r\n", []string{"tcp"}, "400", refusal.IdentityRequired, "refused handoff"},
		{"handoff line with an unknown field", wire.HandoffPrefix + `{"sandbox":"sb-1","agent":"agent-a","admin":"1"}` + "\n", []string{"tcp"}, "400", refusal.IdentityRequired, "without a valid identity preamble"},
		{"HTTP request with a descriptor", "GET /v1/tools HTTP/1.1\r\nHost: x\r\n\r\n", []string{"tcp"}, "400", refusal.IdentityRequired, "without a valid identity preamble"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			refusalCase(t, g, tc.line, tc.fds, tc.status, tc.code, tc.log)
		})
	}
	t.Run("untrusted peer with a handoff", func(t *testing.T) {
		g := startGateway(t, up.URL, "", func(c *config.Config) { c.Gateway.TrustedRelayUIDs = []uint32{4242} })
		refusalCase(t, g, string(hand), []string{"tcp"}, "403", refusal.UntrustedPeer, "untrusted peer")
	})
}

func refusalCase(t *testing.T, g *testGateway, line string, kinds []string, status string, code refusal.Code, logWant string) {
	t.Helper()
	before := refusedCount(t, g, code)
	logLen := len(g.logBuf.String())
	var fds []int
	var links []string
	var live []net.Conn
	for _, k := range kinds {
		fd, c := passedFD(t, k)
		fds = append(fds, fd)
		links = append(links, fdLink(t, fd))
		if c != nil {
			live = append(live, c)
		}
	}
	_, total0 := fdRefs(t, "")
	c, err := net.Dial("unix", g.cfg.Gateway.SandboxSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	// An untrusted peer may be refused before the send: a failed write
	// is expected there.
	_, _, _ = c.(*net.UnixConn).WriteMsgUnix([]byte(line), oob, nil)
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v (the gateway should answer and close)", err)
	}
	got := string(b)
	if !strings.HasPrefix(got, "HTTP/1.1 "+status) || !strings.Contains(got, fmt.Sprintf(`"%s"`, code)) {
		t.Fatalf("reply %q, want %s %s", got, status, code)
	}
	if n := refusedCount(t, g, code); n != before+1 {
		t.Errorf("refused{code=%s} = %v, want %v", code, n, before+1)
	}
	if !strings.Contains(g.logBuf.String()[logLen:], logWant) {
		t.Errorf("log has no %q line: %s", logWant, g.logBuf.String()[logLen:])
	}
	// Every received descriptor is closed: only the test's own remain.
	for _, l := range links {
		deadline := time.Now().Add(2 * time.Second)
		for {
			n, _ := fdRefs(t, l)
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s open %d times after the refusal, want 1 (the test's own)", l, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	c.Close()
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, total := fdRefs(t, ""); total <= total0 {
			break
		}
		if time.Now().After(deadline) {
			_, total := fdRefs(t, "")
			t.Fatalf("open descriptors %d → %d after the refusal", total0, total)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Nothing was written to or shut down on a passed socket.
	for _, lc := range live {
		_ = lc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, err := lc.Read(make([]byte, 1)); n != 0 || !os.IsTimeout(err) {
			t.Errorf("the sandbox end read %d, %v; want nothing", n, err)
		}
	}
}

// TestHandoffPreambleInStream: code in the sandbox writing either line as
// the first bytes of its own connection gets exactly what it gets over a
// relayed (copied) connection: malformed HTTP, a 400, and no other
// identity. The handoff line's meaning exists only on the gateway socket.
func TestHandoffPreambleInStream(t *testing.T) {
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil)
	agentB := wire.Identity{Sandbox: "sb-2", Agent: "agent-b"}
	asB, _ := wire.EncodeHandoff(agentB)
	asBIdent, _ := wire.Encode(agentB)
	for _, forged := range []string{string(asB), string(asBIdent)} {
		name := strings.Fields(forged)[0]
		t.Run(name, func(t *testing.T) {
			msg := forged + "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n"
			answers := map[string]string{}
			for _, mode := range []string{"copied", "handed off"} {
				var c net.Conn
				var err error
				if mode == "copied" {
					c, err = wire.Dial(context.Background(), g.cfg.Gateway.SandboxSocket, agentA)
				} else {
					c, err = ingresstest.NewHandoffDialer(t, g.cfg.Gateway.SandboxSocket, agentA, "tcp").DialContext(context.Background(), "", "")
				}
				if err != nil {
					t.Fatal(err)
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				io.WriteString(c, msg)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("%s: %v", mode, err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				c.Close()
				if resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("%s: %d %s, want 400", mode, resp.StatusCode, b)
				}
				if strings.Contains(string(b), "tickets") {
					t.Fatalf("%s: the forged line was served: %s", mode, b)
				}
				// The request ID differs per connection; the rest must not.
				var eb refusal.Body
				if err := json.Unmarshal(b, &eb); err != nil {
					t.Fatalf("%s: body %q: %v", mode, b, err)
				}
				answers[mode] = fmt.Sprintf("%d %s %s", resp.StatusCode, eb.Error.Code, eb.Error.Message)
			}
			if answers["copied"] != answers["handed off"] {
				t.Fatalf("copied answer %q, handed-off answer %q: want the same", answers["copied"], answers["handed off"])
			}
		})
	}
}

// TestHandoffIdle: the relay's idle timeout no longer sees a handed-off
// connection's bytes, so the listener's watchdog cuts one on which nothing
// moves (a request stalled mid-body) and leaves one that trickles alone.
func TestHandoffIdle(t *testing.T) {
	up := newUpstream(t)
	g := startGateway(t, up.URL, "", nil)
	const idle = 300 * time.Millisecond
	sock := g.dir + "/idle.sock"
	sl, err := ingress.Listen(ingress.Options{Socket: sock, TrustedUIDs: g.cfg.Gateway.TrustedRelayUIDs, Log: g.log, HandoffIdle: idle})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g.Server.sandboxHandler(), ConnContext: ingress.ConnContext, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	go func() { _ = srv.Serve(ingress.StrictHeads(sl)) }()
	t.Cleanup(func() { _ = srv.Close() })
	dial := func(t *testing.T) net.Conn {
		c, err := ingresstest.NewHandoffDialer(t, sock, agentA, "tcp").DialContext(context.Background(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	head := "POST /v1/tools/tickets.list_tickets HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"

	t.Run("a request stalled mid-body is cut", func(t *testing.T) {
		c := dial(t)
		io.WriteString(c, head+"{")
		start := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadAll(c)
		if os.IsTimeout(err) {
			t.Fatalf("stalled connection still open after 5s with idle %v", idle)
		}
		if el := time.Since(start); el < idle-50*time.Millisecond {
			t.Fatalf("cut after %v, before the idle period %v", el, idle)
		}
	})
	t.Run("a trickling request survives", func(t *testing.T) {
		// 12 bytes of JSON, one every 100ms: 1.2s, past two idle
		// periods, with bytes moving in every one.
		slow := "{" + strings.Repeat(" ", 10) + "}"
		c := dial(t)
		io.WriteString(c, fmt.Sprintf("POST /v1/tools/tickets.list_tickets HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(slow)))
		for i := range len(slow) {
			time.Sleep(100 * time.Millisecond)
			if _, err := io.WriteString(c, slow[i:i+1]); err != nil {
				t.Fatalf("byte %d: %v", i, err)
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("trickling request: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("trickling request: %d", resp.StatusCode)
		}
	})
}
