package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// unixPair returns both ends of a connected Unix stream socketpair.
func unixPair(t testing.TB) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// tcpPair returns a connected loopback TCP connection's two ends.
func tcpPair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
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
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// fdOf returns c's descriptor number (valid while c is open).
func fdOf(t testing.TB, c syscall.Conn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := raw.Control(func(fd uintptr) { n = int(fd) }); err != nil {
		t.Fatal(err)
	}
	return n
}

// fdTarget is what /proc/self/fd shows for fd ("socket:[inode]", a path).
func fdTarget(t testing.TB, fd int) string {
	t.Helper()
	s, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// openRefs counts this process's descriptors that refer to target; a
// received descriptor that was not closed shows up here once the test has
// closed its own.
func openRefs(t testing.TB, target string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if s, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && s == target {
			n++
		}
	}
	return n
}

// fdCount is the number of open descriptors of this process.
func fdCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestHandoffRoundTrip passes the server end of a real loopback TCP
// connection (and of a Unix one) through a real Unix socket: Receive
// returns the identity and a connection to the same socket, which carries
// bytes both ways with the client, and no descriptor is left behind.
func TestHandoffRoundTrip(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "gw.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	id := Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "alice", Host: "h1"}

	for _, family := range []string{"tcp", "unix"} {
		t.Run(family, func(t *testing.T) {
			before := fdCount(t)
			var client, server net.Conn
			if family == "tcp" {
				client, server = tcpPair(t)
			} else {
				client, server = unixPair(t)
			}
			target := fdTarget(t, fdOf(t, server.(syscall.Conn)))
			type got struct {
				p     Preamble
				lease *net.UnixConn
				err   error
			}
			ch := make(chan got, 1)
			go func() {
				c, err := l.AcceptUnix()
				if err != nil {
					ch <- got{err: err}
					return
				}
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				p, err := Receive(c)
				ch <- got{p, c, err}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			lease, err := Handoff(ctx, sock, id, server.(syscall.Conn))
			if err != nil {
				t.Fatalf("Handoff: %v", err)
			}
			g := <-ch
			if g.err != nil {
				t.Fatalf("Receive: %v", g.err)
			}
			if g.p.Identity != id || g.p.Reader != nil {
				t.Fatalf("Receive = %+v, want identity %+v and no reader", g.p, id)
			}
			switch family {
			case "tcp":
				if _, ok := g.p.Conn.(*net.TCPConn); !ok {
					t.Fatalf("passed conn is %T, want *net.TCPConn", g.p.Conn)
				}
			case "unix":
				if _, ok := g.p.Conn.(*net.UnixConn); !ok {
					t.Fatalf("passed conn is %T, want *net.UnixConn", g.p.Conn)
				}
			}
			// The relay's copy is no longer needed for bytes to move.
			server.Close()
			if _, err := io.WriteString(client, "ping\n"); err != nil {
				t.Fatal(err)
			}
			_ = g.p.Conn.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(g.p.Conn).ReadString('\n')
			if err != nil || line != "ping\n" {
				t.Fatalf("gateway read %q, %v; want ping", line, err)
			}
			if _, err := io.WriteString(g.p.Conn, "pong\n"); err != nil {
				t.Fatal(err)
			}
			_ = client.SetDeadline(time.Now().Add(5 * time.Second))
			line, err = bufio.NewReader(client).ReadString('\n')
			if err != nil || line != "pong\n" {
				t.Fatalf("client read %q, %v; want pong", line, err)
			}
			// The gateway closing the lease is what the relay waits for.
			g.lease.Close()
			_ = lease.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := lease.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("lease read = %d, %v; want EOF", n, err)
			}
			g.p.Conn.Close()
			lease.Close()
			if n := openRefs(t, target); n != 0 {
				t.Errorf("%d descriptors of the passed socket still open", n)
			}
			client.Close()
			if after := fdCount(t); after > before {
				t.Errorf("open descriptors %d → %d: leaked", before, after)
			}
		})
	}
}

// TestReceiveIdentityLine: an identity line without descriptors is
// received as wire.Read would read it, and the bytes after it (read in the
// same recvmsg) are not lost.
func TestReceiveIdentityLine(t *testing.T) {
	a, b := unixPair(t)
	id := Identity{Sandbox: "sb", Agent: "a"}
	line, _ := Encode(id)
	const follow = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	if _, err := b.Write(append(line, follow...)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	p, err := Receive(a)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	if p.Identity != id || p.Conn != nil || p.Reader == nil {
		t.Fatalf("Receive = %+v, want the identity and a reader", p)
	}
	rest, _ := io.ReadAll(p.Reader)
	if string(rest) != follow {
		t.Fatalf("after the line: %q, want %q", rest, follow)
	}
}

// sendRaw writes data with fds as SCM_RIGHTS in one sendmsg (none if fds
// is empty) and closes the sending end's write side.
func sendRaw(t *testing.T, c *net.UnixConn, data string, fds ...int) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix([]byte(data), oob, nil); err != nil {
		t.Fatalf("sendmsg: %v", err)
	}
	_ = c.CloseWrite()
}

// TestReceiveRefuses covers every way a line and its descriptors can fail
// to match, and the handoff line's strict parsing (the identity line's
// rules, cases from TestReadRejects). Each case passes real descriptors
// and checks that Receive closed every one it received.
func TestReceiveRefuses(t *testing.T) {
	id := Identity{Sandbox: "sb", Agent: "a"}
	hand, _ := EncodeHandoff(id)
	ident, _ := Encode(id)
	valid := `{"sandbox":"sb","agent":"a","session":"","user":"","host":""}`

	type fdKind int
	const (
		none fdKind = iota
		tcpConn
		twoTCP
		regular
		udp
		listening
		unconnected
		unixDgram
	)
	cases := []struct {
		name  string
		input string
		fds   fdKind
		is    error // errors.Is must hold when set
		want  string
	}{
		{"handoff without a descriptor", string(hand), none, ErrHandoff, "carried 0 descriptors"},
		{"handoff with two descriptors", string(hand), twoTCP, ErrHandoff, "carried 2 descriptors"},
		{"handoff of a regular file", string(hand), regular, ErrHandoff, "not a socket"},
		{"handoff of a UDP socket", string(hand), udp, ErrHandoff, "want a stream socket"},
		{"handoff of a Unix datagram socket", string(hand), unixDgram, ErrHandoff, "want a stream socket"},
		{"handoff of a listening TCP socket", string(hand), listening, ErrHandoff, "listening socket"},
		{"handoff of an unconnected TCP socket", string(hand), unconnected, ErrHandoff, "not connected"},
		{"handoff with bytes after the line", string(hand) + "GET / HTTP/1.1\r\n\r\n", tcpConn, ErrHandoff, "after the handoff line"},
		{"identity line with a descriptor", string(ident), tcpConn, ErrHandoff, "identity line carried 1 descriptors"},
		{"identity line and request with a descriptor", string(ident) + "GET / HTTP/1.1\r\n\r\n", tcpConn, ErrHandoff, "identity line carried"},
		{"lowercase handoff prefix", "sluice-handoff " + valid + "\n", tcpConn, ErrMissingPrefix, "missing prefix"},
		{"handoff prefix without its space", "SLUICE-HANDOFF" + valid + "\n", tcpConn, ErrMissingPrefix, "missing prefix"},
		{"HTTP request with a descriptor", "GET / HTTP/1.1\r\n\r\n", tcpConn, ErrMissingPrefix, "missing prefix"},
		{"too long", HandoffPrefix + `{"sandbox":"` + strings.Repeat("x", MaxLine) + "\"}\n", tcpConn, ErrTooLong, "too long"},
		{"unknown field", HandoffPrefix + `{"sandbox":"sb","agent":"a","admin":"true"}` + "\n", tcpConn, nil, `unknown field "admin"`},
		{"case-folded key", HandoffPrefix + `{"sandbox":"sb","AGENT":"a"}` + "\n", tcpConn, nil, `unknown field "AGENT"`},
		{"duplicate key", HandoffPrefix + `{"sandbox":"sb","agent":"a","agent":"root"}` + "\n", tcpConn, nil, `duplicate field "agent"`},
		{"missing agent", HandoffPrefix + `{"sandbox":"sb"}` + "\n", tcpConn, nil, "agent is required"},
		{"null agent", HandoffPrefix + `{"sandbox":"sb","agent":null}` + "\n", tcpConn, nil, "not a string"},
		{"CR in field", HandoffPrefix + `{"sandbox":"sb","agent":"a\rb"}` + "\n", tcpConn, nil, "non-printable"},
		{"trailing CR", HandoffPrefix + valid + "\r\n", tcpConn, nil, "trailing data"},
		{"second object", HandoffPrefix + valid + valid + "\n", tcpConn, nil, "trailing data"},
		{"invalid UTF-8", HandoffPrefix + `{"sandbox":"sb","agent":"a` + "\xff" + `"}` + "\n", tcpConn, nil, "not valid UTF-8"},
		{"no newline before EOF", HandoffPrefix + valid, tcpConn, ErrNoNewline, "not terminated"},
		{"empty", "", none, io.ErrUnexpectedEOF, "unexpected EOF"},
	}
	before := fdCount(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var fds []int
			var live net.Conn // the sandbox end of a passed connection
			switch tc.fds {
			case tcpConn, twoTCP:
				c, s := tcpPair(t)
				fds = append(fds, fdOf(t, s))
				live = c
				if tc.fds == twoTCP {
					_, s2 := tcpPair(t)
					fds = append(fds, fdOf(t, s2))
				}
			case regular:
				f, err := os.Open("/proc/self/status")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				fds = append(fds, int(f.Fd()))
			case udp:
				pc, err := net.Dial("udp", "127.0.0.1:9")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { pc.Close() })
				fds = append(fds, fdOf(t, pc.(syscall.Conn)))
			case listening:
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				fds = append(fds, fdOf(t, l.(syscall.Conn)))
			case unconnected:
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { unix.Close(fd) })
				fds = append(fds, fd)
			case unixDgram:
				p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
				fds = append(fds, p[0])
			}
			var targets []string
			for _, fd := range fds {
				targets = append(targets, fdTarget(t, fd))
			}
			a, b := unixPair(t)
			done := make(chan struct{})
			go func() {
				defer close(done)
				if tc.input == "" {
					b.CloseWrite()
					return
				}
				sendRaw(t, b, tc.input, fds...)
			}()
			_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
			p, err := Receive(a)
			<-done
			if err == nil {
				t.Fatalf("Receive = %+v, want error", p)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("Receive error = %v, want errors.Is %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "wire: ") {
				t.Errorf("Receive error = %q, want \"wire: …%s…\"", err, tc.want)
			}
			// Receive closed what it received: only the test's own copy
			// of each passed descriptor is open.
			for _, target := range targets {
				if n := openRefs(t, target); n != 1 {
					t.Errorf("%s is open %d times, want 1 (the test's own)", target, n)
				}
			}
			// Nothing was written to or shut down on the passed socket:
			// the relay could still serve it another way.
			if live != nil {
				_ = live.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				if n, err := live.Read(make([]byte, 1)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("the sandbox end read %d, %v; want nothing (timeout)", n, err)
				}
			}
		})
	}
	// Every case's own descriptors were closed by its cleanups.
	if after := fdCount(t); after > before {
		t.Errorf("open descriptors %d → %d across the cases: leaked", before, after)
	}
}

// TestReceiveBoundsAndDeadline: a peer that never finishes its line does
// not hold Receive past the caller's read deadline.
func TestReceiveBoundsAndDeadline(t *testing.T) {
	a, b := unixPair(t)
	if _, err := io.WriteString(b, HandoffPrefix+`{"sandbox":"sb"`); err != nil {
		t.Fatal(err)
	}
	_ = a.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	start := time.Now()
	_, err := Receive(a)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Receive error = %v, want the deadline", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Receive took %v past a 200ms deadline", d)
	}
}

// TestReceiveNoLeak repeats refused and accepted handoffs and checks the
// process's descriptor count returns to where it was.
func TestReceiveNoLeak(t *testing.T) {
	id := Identity{Sandbox: "sb", Agent: "a"}
	hand, _ := EncodeHandoff(id)
	run := func() {
		a, b, err := socketpair()
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		defer b.Close()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sfd := fdOf(t, s.(syscall.Conn))
		lfd := fdOf(t, l.(syscall.Conn))
		// Accepted: one connected socket.
		go func() { _, _, _ = b.WriteMsgUnix(hand, unix.UnixRights(sfd), nil) }()
		p, err := Receive(a)
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		p.Conn.Close()
		// Refused: a connected socket and a listening one.
		go func() { _, _, _ = b.WriteMsgUnix(hand, unix.UnixRights(sfd, lfd), nil) }()
		if _, err := Receive(a); !errors.Is(err, ErrHandoff) {
			t.Fatalf("Receive of two descriptors: %v, want ErrHandoff", err)
		}
	}
	run() // warm up: the runtime's own descriptors (epoll, pipes) exist now
	before := fdCount(t)
	for range 20 {
		run()
	}
	if after := fdCount(t); after != before {
		t.Fatalf("open descriptors %d → %d after 20 rounds", before, after)
	}
}

func socketpair() (a, b *net.UnixConn, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, _ := net.FileConn(f)
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1]), nil
}

// FuzzReceive feeds arbitrary first bytes (no descriptors) through a real
// socketpair: Receive must never accept a handoff without a descriptor,
// and whatever identity line it accepts must survive Encode.
func FuzzReceive(f *testing.F) {
	// A valid identity line followed by a request.
	f.Add([]byte(Prefix + `{"sandbox":"sb","agent":"a"}` + "\nGET / HTTP/1.1\r\n\r\n"))
	// A valid handoff line, but no descriptor comes with it.
	f.Add([]byte(HandoffPrefix + `{"sandbox":"sb","agent":"a"}` + "\n"))
	// The two prefixes run together.
	f.Add([]byte("SLUICE-HANDOFF SLUICE-IDENTITY {}\n"))
	// An HTTP request where a line should be.
	f.Add([]byte("CONNECT example.com:443 HTTP/1.1\r\n\r\n"))
	// A prefix cut off at the shared "SLUICE-".
	f.Add([]byte("SLUICE-"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 2*MaxLine {
			return
		}
		a, b, err := socketpair()
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		defer b.Close()
		go func() { _, _ = b.Write(data); _ = b.CloseWrite() }()
		_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
		p, err := Receive(a)
		if err != nil {
			return
		}
		if p.Conn != nil {
			t.Fatalf("accepted a handoff without a descriptor: %+v", p)
		}
		if _, err := Encode(p.Identity); err != nil {
			t.Fatalf("Receive accepted %+v but Encode refuses it: %v", p.Identity, err)
		}
		if !strings.HasPrefix(string(data), Prefix) {
			t.Fatalf("accepted %q without the identity prefix", data)
		}
	})
}

func ExampleEncodeHandoff() {
	line, err := EncodeHandoff(Identity{Sandbox: "sb-1", Agent: "billing-bot", User: "alice"})
	if err != nil {
		panic(err)
	}
	// Handoff sends this line and the connection's descriptor in one
	// sendmsg; the gateway reads both with Receive.
	fmt.Print(string(line))
	// Output: SLUICE-HANDOFF {"sandbox":"sb-1","agent":"billing-bot","session":"","user":"alice","host":""}
}
