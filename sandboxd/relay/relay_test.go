package relay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/sandboxd/wire/wiretest"
)

// needRoot skips unless the test can make network namespaces.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: setns(CLONE_NEWNET) and ip netns need CAP_SYS_ADMIN")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2: ip netns")
	}
}

var nsSeq atomic.Int32

// newNetNS makes a named network namespace that the test removes, and
// returns its path.
func newNetNS(t *testing.T, prefix string) (name, path string) {
	t.Helper()
	name = fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), nsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del: %v: %s", err, out)
		}
	})
	return name, "/run/netns/" + name
}

// dialIn dials from inside the namespace at ns: the socket belongs to it.
func dialIn(t *testing.T, ns, network, addr string) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	err := InNetNS(ns, func() error {
		var err error
		c, err = net.DialTimeout(network, addr, 2*time.Second)
		return err
	})
	return c, err
}

// httpIn is an HTTP client whose connections start inside ns.
func httpIn(t *testing.T, ns, addr string) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) { return dialIn(t, ns, "tcp", addr) },
	}}
}

type idKey struct{}

// gateway is a test gateway: a Unix listener that reads the preamble with
// wire.Receive, the real gateway's helper, and then speaks HTTP over the
// relayed stream or the handed-off connection, like the real gateway's
// sandbox socket.
type gateway struct {
	path      string
	dnsStatus atomic.Int32
	refuse    atomic.Bool  // answer handoffs with a 400, as a gateway that predates them
	refuseOne atomic.Bool  // answer handoffs with the real gateway's handoff refusal
	refusals  atomic.Int64 // handoffs refused
	handoffs  atomic.Int64 // connections received by handoff
	identity  atomic.Int64 // connections received with an identity line
	held      chan error   // GET /hold: what reading the held connection ended with
	mu        sync.Mutex
	bad       []error
}

type idConn struct {
	net.Conn
	r     *bufio.Reader
	id    wire.Identity
	lease net.Conn // the relay's Unix connection of a handoff
}

func (c *idConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// Close closes a handed-off connection and then its lease, which tells the
// relay the gateway is done; shutting the socket down first makes the end
// visible to the sandbox at once (the relay holds a copy until then).
func (c *idConn) Close() error {
	if c.lease == nil {
		return c.Conn.Close()
	}
	if tc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
	err := c.Conn.Close()
	c.lease.Close()
	return err
}

type idListener struct {
	net.Listener
	g *gateway
}

func (l idListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uc := c.(*net.UnixConn)
		uc.SetReadDeadline(time.Now().Add(5 * time.Second))
		p, err := wire.Receive(uc)
		if err != nil {
			l.g.mu.Lock()
			l.g.bad = append(l.g.bad, err)
			l.g.mu.Unlock()
			c.Close()
			continue
		}
		uc.SetReadDeadline(time.Time{})
		if p.Conn == nil {
			l.g.identity.Add(1)
			return &idConn{Conn: c, r: p.Reader, id: p.Identity}, nil
		}
		if l.g.refuse.Load() || l.g.refuseOne.Load() {
			l.g.refusals.Add(1)
			p.Conn.Close()
			body := ""
			if l.g.refuseOne.Load() {
				body = `{"error":{"code":"identity_required","message":"a SLUICE-HANDOFF line must pass exactly one connected stream socket"}}`
			}
			fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			c.Close()
			continue
		}
		l.g.handoffs.Add(1)
		return &idConn{Conn: p.Conn, r: bufio.NewReader(p.Conn), id: p.Identity, lease: c}, nil
	}
}

func startGateway(t testing.TB) *gateway {
	t.Helper()
	dir, err := os.MkdirTemp("", "gw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	g := &gateway{path: filepath.Join(dir, "gw.sock"), held: make(chan error, 4)}
	g.dnsStatus.Store(http.StatusNotFound)
	l, err := net.Listen("unix", g.path)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /id", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(r.Context().Value(idKey{}).(wire.Identity))
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	})
	mux.HandleFunc("GET /hold", func(w http.ResponseWriter, r *http.Request) {
		// Answer, then hold the connection and read until it ends.
		c, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			g.held <- err
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.Copy(io.Discard, brw)
		g.held <- err
	})
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) {
		for range 24 { // 2.4s: longer than testLimits' IdleTimeout of 1s
			w.Write([]byte("x"))
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	})
	mux.HandleFunc("POST /v1/dns", func(w http.ResponseWriter, r *http.Request) {
		if st := int(g.dnsStatus.Load()); st != http.StatusOK {
			http.Error(w, "not found", st)
			return
		}
		// This gateway answers one question per POST: a stream is refused
		// before its body is read, as an older gateway does, and the relay
		// falls back to one POST per question.
		if r.Header.Get("Content-Type") != "application/dns-message" {
			http.Error(w, "unsupported media type", http.StatusUnsupportedMediaType)
			return
		}
		body, _ := io.ReadAll(r.Body)
		req := new(mdns.Msg)
		if err := req.Unpack(body); err != nil || r.Header.Get("Content-Type") != "application/dns-message" {
			http.Error(w, "bad dns", http.StatusBadRequest)
			return
		}
		resp := new(mdns.Msg).SetReply(req)
		// The agent name rides in a TXT-free way: as the A record's
		// owner TTL, so the test can see the identity reached /v1/dns.
		id := r.Context().Value(idKey{}).(wire.Identity)
		rr, _ := mdns.NewRR(fmt.Sprintf("%s %d IN A 192.0.2.7", req.Question[0].Name, len(id.Agent)))
		resp.Answer = append(resp.Answer, rr)
		b, _ := resp.Pack()
		w.Header().Set("Content-Type", "application/dns-message")
		w.Write(b)
	})
	srv := &http.Server{
		Handler: mux,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, idKey{}, c.(*idConn).id)
		},
	}
	go srv.Serve(idListener{l, g})
	t.Cleanup(func() {
		srv.Close()
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, err := range g.bad {
			t.Errorf("gateway got a bad preamble: %v", err)
		}
	})
	return g
}

func openRelay(t *testing.T, opts Options) *Relay {
	t.Helper()
	r, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func getID(t *testing.T, c *http.Client) (wire.Identity, error) {
	resp, err := c.Get("http://sluice/id")
	if err != nil {
		return wire.Identity{}, err
	}
	defer resp.Body.Close()
	var id wire.Identity
	err = json.NewDecoder(resp.Body).Decode(&id)
	return id, err
}

func TestRelayIdentityAndBytes(t *testing.T) {
	needRoot(t)
	g := startGateway(t)
	sockDir, err := os.MkdirTemp("", "sbx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })

	// Two sandboxes on one gateway: each connection carries the identity
	// of the listener it arrived on, never the other's.
	type sandbox struct {
		ns, sock string
		id       wire.Identity
	}
	var sbs []sandbox
	for i, agent := range []string{"agent-a", "agent-bb"} {
		_, ns := newNetNS(t, "sluice-relay")
		sb := sandbox{ns: ns, sock: filepath.Join(sockDir, fmt.Sprint(i), "gateway.sock"),
			id: wire.Identity{Sandbox: fmt.Sprintf("sbx-%d", i), Agent: agent, Session: "s1", User: "u", Host: "h"}}
		openRelay(t, Options{NetNS: ns, Identity: sb.id, Gateway: g.path, SocketPath: sb.sock})
		sbs = append(sbs, sb)
	}

	for _, sb := range sbs {
		clients := []struct {
			name string
			c    *http.Client
		}{
			{"tcp 127.0.0.1:3128 inside", httpIn(t, sb.ns, "127.0.0.1:3128")},
			{"per-sandbox unix socket", &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", sb.sock)
				}}}},
		}
		for _, cl := range clients {
			t.Run(sb.id.Agent+"/"+cl.name, func(t *testing.T) {
				id, err := getID(t, cl.c)
				if err != nil {
					t.Fatal(err)
				}
				if id != sb.id {
					t.Fatalf("gateway saw identity %+v, want %+v", id, sb.id)
				}
				// 8 MiB up and the same back down.
				body := bytes.Repeat([]byte("sluice-relay-"), 8<<20/13)
				resp, err := cl.c.Post("http://sluice/echo", "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if sha256.Sum256(got) != sha256.Sum256(body) {
					t.Fatalf("echo returned %d bytes, different from the %d sent", len(got), len(body))
				}
			})
		}
	}

	t.Run("socket mode 0666 in a 0755 dir", func(t *testing.T) {
		fi, err := os.Stat(sbs[0].sock)
		if err != nil {
			t.Fatal(err)
		}
		di, err := os.Stat(filepath.Dir(sbs[0].sock))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o666 || fi.Mode().Type() != os.ModeSocket || di.Mode().Perm() != 0o755 {
			t.Fatalf("socket %v dir %v, want socket 0666 in 0755", fi.Mode(), di.Mode())
		}
	})
	t.Run("the proxy listener lives in the sandbox's namespace", func(t *testing.T) {
		// 0100007F:0C38 is 127.0.0.1:3128 in /proc/net/tcp notation.
		if err := InNetNS(sbs[0].ns, func() error {
			b, err := os.ReadFile("/proc/thread-self/net/tcp")
			if err != nil {
				return err
			}
			if !strings.Contains(string(b), "0100007F:0C38") {
				return errors.New("no 127.0.0.1:3128 listener inside")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRelayHalfClose(t *testing.T) {
	needRoot(t)
	_, ns := newNetNS(t, "sluice-relay")
	// A raw gateway: after the preamble it reads to EOF, then answers with
	// the byte count: the answer only comes back if the client's
	// half-close reached it and the other direction stayed open.
	gwPath := wiretest.Gateway(t, func(c net.Conn, br *bufio.Reader, _ wire.Identity, err error) {
		if err != nil {
			return
		}
		n, _ := io.Copy(io.Discard, br)
		fmt.Fprintf(c, "got %d\n", n)
	})
	openRelay(t, Options{NetNS: ns, Identity: wire.Identity{Sandbox: "s", Agent: "a"}, Gateway: gwPath})
	c, err := dialIn(t, ns, "tcp", "127.0.0.1:3128")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(bytes.Repeat([]byte{'z'}, 100000)); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "got 100000\n" {
		t.Fatalf("got %q, want %q", got, "got 100000\n")
	}
}

// TestRelayLimits: MaxConns holds in both modes (a handed-off connection
// keeps its slot until the gateway is done with it); the idle timeout is
// the copy path's (a handed-off connection's timeouts are the gateway's).
func TestRelayLimits(t *testing.T) {
	needRoot(t)
	g := startGateway(t)
	for _, mode := range []string{"handoff", "copy"} {
		t.Run(mode, func(t *testing.T) {
			_, ns := newNetNS(t, "sluice-relay")
			openRelay(t, Options{NetNS: ns, Identity: wire.Identity{Sandbox: "s", Agent: "a"}, Gateway: g.path,
				MaxConns: 2, IdleTimeout: time.Second, Copy: mode == "copy"})
			testLimits(t, ns, mode == "copy")
		})
	}
}

func testLimits(t *testing.T, ns string, copyMode bool) {
	// closedSoon reports whether the relay closes c within d.
	closedSoon := func(c net.Conn, d time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(d))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}

	if copyMode {
		t.Run("idle connection is closed", func(t *testing.T) {
			c, err := dialIn(t, ns, "tcp", "127.0.0.1:3128")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			if !closedSoon(c, 5*time.Second) {
				t.Fatal("idle connection still open after 5s with IdleTimeout 1s")
			}
			if el := time.Since(start); el < 900*time.Millisecond {
				t.Fatalf("closed after %v, before the idle timeout", el)
			}
		})
	}
	t.Run("a one-way stream longer than the idle timeout survives", func(t *testing.T) {
		hc := httpIn(t, ns, "127.0.0.1:3128")
		resp, err := hc.Get("http://sluice/slow")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		// Give the slot back: a kept-alive connection holds one.
		hc.CloseIdleConnections()
		time.Sleep(100 * time.Millisecond)
		if err != nil || string(b) != strings.Repeat("x", 24) {
			t.Fatalf("slow body %q, %v; want 24 bytes over 2.4s", b, err)
		}
	})
	t.Run("connections beyond MaxConns are refused", func(t *testing.T) {
		var held []net.Conn
		for range 2 {
			c, err := dialIn(t, ns, "tcp", "127.0.0.1:3128")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// Keep it busy so the idle timeout does not free the slot.
			go func() {
				for {
					if _, err := c.Write([]byte("G")); err != nil {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}()
			held = append(held, c)
		}
		time.Sleep(100 * time.Millisecond)
		third, err := dialIn(t, ns, "tcp", "127.0.0.1:3128")
		if err != nil {
			t.Fatal(err)
		}
		defer third.Close()
		if !closedSoon(third, 2*time.Second) {
			t.Fatal("third connection open beyond MaxConns=2")
		}
		// The held connections are still served.
		for i, c := range held {
			if closedSoon(c, 100*time.Millisecond) {
				t.Fatalf("held connection %d closed", i)
			}
		}
		held[0].Close()
		time.Sleep(200 * time.Millisecond)
		c := httpIn(t, ns, "127.0.0.1:3128")
		if _, err := getID(t, c); err != nil {
			t.Fatalf("after a slot freed: %v", err)
		}
	})
}

func TestRelayDNS(t *testing.T) {
	needRoot(t)
	g := startGateway(t)
	_, ns := newNetNS(t, "sluice-relay")
	id := wire.Identity{Sandbox: "s", Agent: "agent-dns"}
	openRelay(t, Options{NetNS: ns, Identity: id, Gateway: g.path})

	q := func(qs ...string) *mdns.Msg {
		m := new(mdns.Msg).SetQuestion(qs[0], mdns.TypeA)
		for _, n := range qs[1:] {
			m.Question = append(m.Question, mdns.Question{Name: n, Qtype: mdns.TypeA, Qclass: mdns.ClassINET})
		}
		return m
	}
	tests := []struct {
		name    string
		status  int
		msg     *mdns.Msg
		raw     []byte
		rcode   int
		answers int
	}{
		{"gateway 404 (no /v1/dns yet) is REFUSED", http.StatusNotFound, q("example.com."), nil, mdns.RcodeRefused, 0},
		{"gateway 500 is REFUSED", http.StatusInternalServerError, q("example.com."), nil, mdns.RcodeRefused, 0},
		{"gateway 200 answer is relayed", http.StatusOK, q("example.com."), nil, mdns.RcodeSuccess, 1},
		{"multi-question is FORMERR (RFC 9619)", http.StatusOK, q("a.example.", "b.example."), nil, mdns.RcodeFormatError, 0},
		// Header with QDCOUNT=1 and no question.
		{"malformed is FORMERR", http.StatusOK, nil, []byte{0x77, 0x66, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}, mdns.RcodeFormatError, 0},
	}
	for _, tt := range tests {
		for _, network := range []string{"udp", "tcp"} {
			t.Run(tt.name+"/"+network, func(t *testing.T) {
				g.dnsStatus.Store(int32(tt.status))
				raw, err := dialIn(t, ns, network, "127.0.0.1:53")
				if err != nil {
					t.Fatal(err)
				}
				defer raw.Close()
				raw.SetDeadline(time.Now().Add(10 * time.Second))
				c := &mdns.Conn{Conn: raw}
				wantID := uint16(0x7766)
				if tt.msg != nil {
					tt.msg.Id = 0x4242
					wantID = 0x4242
					err = c.WriteMsg(tt.msg)
				} else {
					_, err = c.Write(tt.raw)
				}
				if err != nil {
					t.Fatal(err)
				}
				resp, err := c.ReadMsg()
				if err != nil {
					t.Fatal(err)
				}
				if resp.Id != wantID || resp.Rcode != tt.rcode || len(resp.Answer) != tt.answers {
					t.Fatalf("got id %#x rcode %s %d answers, want id %#x rcode %s %d answers",
						resp.Id, mdns.RcodeToString[resp.Rcode], len(resp.Answer), wantID, mdns.RcodeToString[tt.rcode], tt.answers)
				}
				if tt.answers > 0 {
					a, ok := resp.Answer[0].(*mdns.A)
					if !ok || a.A.String() != "192.0.2.7" || int(a.Hdr.Ttl) != len(id.Agent) {
						t.Fatalf("answer %v, want the gateway's 192.0.2.7 stamped with this identity", resp.Answer[0])
					}
				}
			})
		}
	}
}

func TestRelayClose(t *testing.T) {
	needRoot(t)
	g := startGateway(t)
	_, ns := newNetNS(t, "sluice-relay")
	dir, _ := os.MkdirTemp("", "sbx")
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gateway.sock")
	r, err := Open(context.Background(), Options{NetNS: ns, Identity: wire.Identity{Sandbox: "s", Agent: "a"}, Gateway: g.path, SocketPath: sock})
	if err != nil {
		t.Fatal(err)
	}
	open, err := dialIn(t, ns, "tcp", "127.0.0.1:3128")
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	// One keep-alive request first, so the connection is being relayed
	// (not just waiting in the backlog) when Close runs.
	open.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(open, "GET /id HTTP/1.1\r\nHost: sluice\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(open), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("relayed request before Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	t.Run("open relayed connection is cut", func(t *testing.T) {
		open.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.Copy(io.Discard, open); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after Close = %v, want EOF/reset", err)
		}
	})
	for _, a := range []string{"127.0.0.1:3128", "127.0.0.1:53"} {
		t.Run("no listener at "+a, func(t *testing.T) {
			_, err := dialIn(t, ns, "tcp", a)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("dial after Close = %v, want ECONNREFUSED", err)
			}
		})
	}
	t.Run("socket removed", func(t *testing.T) {
		if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket after Close: %v, want not exist", err)
		}
	})
}

func TestOpenFailsClosed(t *testing.T) {
	needRoot(t)
	g := startGateway(t)
	_, ns := newNetNS(t, "sluice-relay")
	good := wire.Identity{Sandbox: "s", Agent: "a"}
	// Occupy the DNS port inside so the third listener fails.
	var squat net.Listener
	if err := InNetNS(ns, func() error {
		if err := loUp(); err != nil {
			return err
		}
		var err error
		squat, err = net.Listen("tcp", "127.0.0.1:53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer squat.Close()
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no netns", Options{Identity: good, Gateway: g.path}, "netns is required"},
		{"no gateway", Options{NetNS: ns, Identity: good}, "gateway socket is required"},
		{"identity without agent", Options{NetNS: ns, Identity: wire.Identity{Sandbox: "s"}, Gateway: g.path}, "agent is required"},
		{"sandboxd's own netns", Options{NetNS: "/proc/self/ns/net", Identity: good, Gateway: g.path, ProxyPort: 39128, DNSPort: 39053}, "sandboxd's own network namespace"},
		{"netns that does not exist", Options{NetNS: "/run/netns/sluice-does-not-exist", Identity: good, Gateway: g.path}, "no such file"},
		{"dns port taken", Options{NetNS: ns, Identity: good, Gateway: g.path}, "listen dns tcp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Open(context.Background(), tt.opts)
			if err == nil {
				r.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open = %v, want an error about %q", err, tt.want)
			}
			// Nothing half-open: the proxy port is free again.
			if tt.opts.NetNS == ns {
				if c, err := dialIn(t, ns, "tcp", "127.0.0.1:3128"); err == nil {
					c.Close()
					t.Fatal("proxy listener left open after a failed Open")
				}
			}
		})
	}
}
