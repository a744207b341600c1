//go:build linux

package attack

import (
	"bufio"
	"bytes"
	"context"
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
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/relay"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/sandboxd/wire/wiretest"
	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// identityGateway is a gateway stand-in on a Unix socket: it reads the
// SLUICE-IDENTITY preamble, then one HTTP request, and answers 200 with the
// identity it saw as JSON. It returns the socket's path.
func identityGateway(t *testing.T) string {
	t.Helper()
	return wiretest.Gateway(t, func(c net.Conn, br *bufio.Reader, id wire.Identity, err error) {
		if err != nil {
			fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			return
		}
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		b, _ := json.Marshal(id)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(b), b)
	})
}

// daemon is a running `sandboxd serve` with its API client.
type daemon struct {
	cfg, api, state string
	pid             int
	hc              *http.Client
	stop            func()
}

func startDaemon(t *testing.T) *daemon {
	t.Helper()
	return startDaemonWith(t, "")
}

// startDaemonWith is startDaemon with extra lines appended to sandboxd.yaml.
func startDaemonWith(t *testing.T, extra string) *daemon {
	t.Helper()
	st := stateDir(t)
	d := &daemon{api: filepath.Join(st, "api.sock"), cfg: filepath.Join(st, "sandboxd.yaml"), state: filepath.Join(st, "state")}
	gw := identityGateway(t)
	if err := os.WriteFile(d.cfg, []byte(fmt.Sprintf("api: %s\nstate_dir: %s\ngateway: %s\n", d.api, d.state, gw)+extra), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := exec.CommandContext(ctx, bin, "serve", "--config", d.cfg)
	srv.Cancel = func() error { return srv.Process.Signal(syscall.SIGTERM) }
	var logs bytes.Buffer
	srv.Stderr = &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	d.pid = srv.Process.Pid
	stopped := false
	d.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			_ = srv.Wait()
		}
	}
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("sandboxd log:\n%s", logs.String())
		}
	})
	d.hc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.api)
	}}}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", d.api); err == nil {
			c.Close()
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("api socket never appeared; log:\n%s", logs.String())
		}
	}
}

func (d *daemon) do(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://sandboxd"+path, strings.NewReader(body))
	resp, err := d.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// cli runs the sandboxd binary against the daemon's config.
func (d *daemon) cli(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, append(args, "--config", d.cfg)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return strings.TrimSpace(out.String()), errb.String(), err
}

// pinNetNS makes the namespace to pin and a second namespace joined to it
// by a veth pair, where a TCP server says hello on the peer address. The
// host's own namespace is never on the path. It returns the pinned
// namespace's name and path and the server's address.
func pinNetNS(t *testing.T) (name, path, server string) {
	t.Helper()
	for _, tool := range []string{"ip", "nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("pinning needs %s (iproute2, nftables, util-linux)", tool)
		}
	}
	name, peer := fmt.Sprintf("sluice-pinx-%d", os.Getpid()), fmt.Sprintf("sluice-piny-%d", os.Getpid())
	va, vb := fmt.Sprintf("slp%da", os.Getpid()), fmt.Sprintf("slp%db", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if b, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, b)
		}
	}
	for _, ns := range []string{name, peer} {
		ip("netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	}
	ip("link", "add", va, "netns", name, "type", "veth", "peer", "name", vb, "netns", peer)
	ip("-n", name, "link", "set", "lo", "up")
	ip("-n", name, "addr", "add", "10.233.0.1/24", "dev", va)
	ip("-n", name, "link", "set", va, "up")
	ip("-n", name, "route", "add", "default", "via", "10.233.0.2")
	ip("-n", peer, "link", "set", "lo", "up")
	ip("-n", peer, "addr", "add", "10.233.0.2/24", "dev", vb)
	ip("-n", peer, "link", "set", vb, "up")
	server = "10.233.0.2:8080"
	var l net.Listener
	if err := relay.InNetNS("/run/netns/"+peer, func() error {
		var err error
		l, err = net.Listen("tcp", server)
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
			_, _ = io.WriteString(c, "hello\n")
			c.Close()
		}
	}()
	return name, "/run/netns/" + name, server
}

func dialFrom(ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := relay.InNetNS(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	})
	return c, err
}

// helloFrom dials addr from inside ns and expects the server's hello.
func helloFrom(ns, addr string) error {
	c, err := dialFrom(ns, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(b) != "hello\n" {
		return fmt.Errorf("got %q, want hello", b)
	}
	return nil
}

// identityFrom sends an HTTP request to 127.0.0.1:3128 from inside ns and
// returns the identity the gateway saw.
func identityFrom(ns string) (wire.Identity, error) {
	c, err := dialFrom(ns, "127.0.0.1:3128")
	if err != nil {
		return wire.Identity{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n"); err != nil {
		return wire.Identity{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return wire.Identity{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return wire.Identity{}, fmt.Errorf("gateway answered %s", resp.Status)
	}
	var id wire.Identity
	err = json.NewDecoder(resp.Body).Decode(&id)
	return id, err
}

// TestPinExisting pins a namespace another runtime made through a real
// `sandboxd serve`: its veth peer answers before and is unreachable after,
// the only exit left is the gateway with the pinned identity, and unpin or
// the daemon stopping closes that exit.
func TestPinExisting(t *testing.T) {
	need(t)
	name, nsPath, server := pinNetNS(t)
	d := startDaemon(t)

	// A fresh veth may drop the first packets while its link comes up, so
	// the control retries briefly; the refusals after pinning do not.
	err := helloFrom(nsPath, server)
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		err = helloFrom(nsPath, server)
	}
	if err != nil {
		t.Fatalf("control: the peer server %s is unreachable before pinning: %v", server, err)
	}
	if _, err := dialFrom(nsPath, "127.0.0.1:3128"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("control: 127.0.0.1:3128 before pinning = %v, want ECONNREFUSED", err)
	}

	id, stderr, err := d.cli(t, "pin", "--netns", nsPath, "--agent", "pinned-agent", "--session", "s1", "--user", "u1")
	if err != nil {
		t.Fatalf("sandboxd pin: %v: %s", err, stderr)
	}
	if !strings.HasPrefix(id, "pin-") {
		t.Fatalf("sandboxd pin printed %q, want a pin-… id", id)
	}

	t.Run("peer unreachable after pin", func(t *testing.T) {
		c := casebook.Expect(t, "A1", "pinned namespace (made by another runtime) dials its veth peer, which answered before the pin",
			"ENETUNREACH, EPERM or a timeout")
		err := helloFrom(nsPath, server)
		c.Observef("%v", err)
		var ne net.Error
		if !errors.Is(err, syscall.ENETUNREACH) && !errors.Is(err, syscall.EPERM) && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("dial %s after pin = %v, want ENETUNREACH, EPERM or a timeout", server, err)
		}
	})
	t.Run("only lo is left", func(t *testing.T) {
		out, err := exec.Command("ip", "-n", name, "-o", "link", "show").CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], ": lo:") {
			t.Fatalf("links after pin:\n%s", out)
		}
	})
	t.Run("3128 reaches the gateway with the pinned identity", func(t *testing.T) {
		got, err := identityFrom(nsPath)
		if err != nil {
			t.Fatal(err)
		}
		want := wire.Identity{Sandbox: id, Agent: "pinned-agent", Session: "s1", User: "u1"}
		if got != want {
			t.Fatalf("gateway saw %+v, want %+v", got, want)
		}
	})
	t.Run("GET /v1/pins lists it", func(t *testing.T) {
		code, b := d.do(t, "GET", "/v1/pins", "")
		var pins []struct{ ID, NetNS, Agent string }
		if err := json.Unmarshal(b, &pins); code != 200 || err != nil {
			t.Fatalf("list: %d %s", code, b)
		}
		if len(pins) != 1 || pins[0].ID != id || pins[0].NetNS != nsPath || pins[0].Agent != "pinned-agent" {
			t.Fatalf("pins = %+v, want %s on %s", pins, id, nsPath)
		}
	})

	// A process inside the pinned namespace, to name it by pid.
	inside := exec.Command("ip", "netns", "exec", name, "sleep", "60")
	if err := inside.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = inside.Process.Kill(); _ = inside.Wait() }()
	for range 200 {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", inside.Process.Pid)); strings.HasSuffix(l, "sleep") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	refusals := []struct {
		name, body string
		code       int
		want       string // in the error message
	}{
		{"same netns twice", `{"netns":"` + nsPath + `","agent":"a"}`, 409, "already pinned"},
		{"same netns by the pid of a process in it", fmt.Sprintf(`{"pid":%d,"agent":"a"}`, inside.Process.Pid), 409, "already pinned"},
		{"pid that does not exist", `{"pid":1073741824,"agent":"a"}`, 400, "pid"},
		{"negative pid", `{"pid":-1,"agent":"a"}`, 400, "pid"},
		{"pid as a string", `{"pid":"1","agent":"a"}`, 400, "pid"},
		{"the daemon's own netns by path", `{"netns":"/proc/self/ns/net","agent":"a"}`, 400, "own network namespace"},
		{"the daemon's own netns by its pid", fmt.Sprintf(`{"pid":%d,"agent":"a"}`, d.pid), 400, "own network namespace"},
		{"the host's netns by the test's path", fmt.Sprintf(`{"netns":"/proc/%d/ns/net","agent":"a"}`, os.Getpid()), 400, "own network namespace"},
		{"not a network namespace", `{"netns":"/proc/self/ns/uts","agent":"a"}`, 400, "netns"},
		{"not a namespace", `{"netns":"/etc/hostname","agent":"a"}`, 400, "netns"},
		{"relative netns path", `{"netns":"run/netns/x","agent":"a"}`, 400, "netns"},
		{"neither netns nor pid", `{"agent":"a"}`, 400, "netns or pid"},
		{"both netns and pid", `{"netns":"` + nsPath + `","pid":1,"agent":"a"}`, 400, "netns, pid"},
		{"no agent", `{"netns":"` + nsPath + `"}`, 400, "agent"},
		{"agent with a newline (preamble injection)", `{"netns":"` + nsPath + `","agent":"a\nx"}`, 400, "agent"},
		{"unknown field", `{"netns":"` + nsPath + `","agent":"a","sandbox":"forged"}`, 400, "sandbox"},
	}
	for _, tc := range refusals {
		t.Run("refuses/"+tc.name, func(t *testing.T) {
			code, b := d.do(t, "POST", "/v1/pin", tc.body)
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			if err := json.Unmarshal(b, &e); err != nil || code != tc.code || !strings.Contains(e.Error.Message, tc.want) {
				t.Fatalf("POST /v1/pin %s = %d %s, want %d naming %q", tc.body, code, b, tc.code, tc.want)
			}
		})
	}
	t.Run("refuses/cli pin twice and a bad pid", func(t *testing.T) {
		if _, stderr, err := d.cli(t, "pin", "--netns", nsPath, "--agent", "a"); err == nil || !strings.Contains(stderr, "409 conflict") {
			t.Errorf("second cli pin: err %v stderr %q, want a failure with 409 conflict", err, stderr)
		}
		if _, stderr, err := d.cli(t, "pin", "--pid", "1073741824", "--agent", "a"); err == nil || !strings.Contains(stderr, "400 bad_request") || !strings.Contains(stderr, "pid") {
			t.Errorf("cli pin of a bad pid: err %v stderr %q, want a failure with 400 bad_request naming pid", err, stderr)
		}
	})
	t.Run("a refusal leaves the pin working", func(t *testing.T) {
		if got, err := identityFrom(nsPath); err != nil || got.Agent != "pinned-agent" {
			t.Fatalf("after refusals: %+v %v", got, err)
		}
	})

	if _, stderr, err := d.cli(t, "unpin", id); err != nil {
		t.Fatalf("sandboxd unpin: %v: %s", err, stderr)
	}
	t.Run("unpin closes 3128", func(t *testing.T) {
		if _, err := dialFrom(nsPath, "127.0.0.1:3128"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial 3128 after unpin = %v, want ECONNREFUSED", err)
		}
	})
	t.Run("the namespace stays closed after unpin", func(t *testing.T) {
		if err := helloFrom(nsPath, server); err == nil {
			t.Fatal("the peer answers after unpin")
		}
	})
	t.Run("unpin again is not found", func(t *testing.T) {
		if code, b := d.do(t, "DELETE", "/v1/pins/"+id, ""); code != 404 {
			t.Fatalf("second unpin: %d %s, want 404", code, b)
		}
		if code, b := d.do(t, "GET", "/v1/pins", ""); code != 200 || strings.TrimSpace(string(b)) != "[]" {
			t.Fatalf("list after unpin: %d %s, want []", code, b)
		}
	})

	// Pinned again (allowed once unpinned), then the daemon stops.
	byPid := fmt.Sprintf("/proc/%d/ns/net", inside.Process.Pid)
	// With an egress narrowing: it rides in every connection's preamble.
	code, b := d.do(t, "POST", "/v1/pin", fmt.Sprintf(`{"pid":%d,"agent":"again","egress":["PyPI.org","*.pythonhosted.org"]}`, inside.Process.Pid))
	if code != 201 || !strings.Contains(string(b), `"egress":["*.pythonhosted.org","pypi.org"]`) {
		t.Fatalf("re-pin after unpin: %d %s", code, b)
	}
	if got, err := identityFrom(nsPath); err != nil || got.Agent != "again" || got.Egress != "*.pythonhosted.org,pypi.org" {
		t.Fatalf("re-pinned: %+v %v", got, err)
	}
	d.stop()
	t.Run("stopping the daemon closes its pins", func(t *testing.T) {
		if _, err := dialFrom(nsPath, "127.0.0.1:3128"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial 3128 after the daemon stopped = %v, want ECONNREFUSED", err)
		}
	})
	t.Run("events", func(t *testing.T) {
		var got []string
		for _, e := range events(t, d.state) {
			got = append(got, fmt.Sprint(e["event"], " ", e["sandbox"] == id, " ", e["netns"] == nsPath || e["netns"] == byPid))
		}
		// The second pair is the re-pin by pid, closed when the daemon stopped.
		want := []string{"pinned true true", "unpinned true true", "pinned false true", "unpinned false true"}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("events %q, want %q", got, want)
		}
	})
}
