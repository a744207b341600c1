//go:build linux

package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestGatewayDescriptorExhaustion is THREATS B6's EMFILE case: sandboxes
// keep connecting until the gateway has no file descriptor left. The
// gateway must neither exit nor spin: its accept loop backs off (with a
// warning naming the cause), connections wait in the listen backlog, and
// they are served once descriptors are freed.
func TestGatewayDescriptorExhaustion(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	d := e.BaseConfig("fd")
	g := e.Start(d, e.Write(d))
	pid := g.Pid()

	// get sends GET /v1/tools on c and waits up to wait for the status.
	get := func(c net.Conn, wait time.Duration) (int, error) {
		_ = c.SetDeadline(time.Now().Add(wait))
		if _, err := io.WriteString(c, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n"); err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		_ = c.SetDeadline(time.Time{})
		return resp.StatusCode, nil
	}
	// Warm: the caller's session and tools are looked up once.
	if c, err := g.Dial(agentA); err != nil {
		t.Fatal(err)
	} else if st, err := get(c, 10*time.Second); err != nil || st != 200 {
		t.Fatalf("warm-up: %d %v", st, err)
	} else {
		c.Close()
	}

	open, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	var old unix.Rlimit
	limit := uint64(len(open) + 8)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, &old); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	cb := casebook.Expect(t, "B6", fmt.Sprintf("sandboxes keep connecting until the gateway is out of file descriptors (RLIMIT_NOFILE lowered to %d, %d open)", limit, len(open)),
		"the gateway keeps running; the accept loop backs off with a warning; waiting connections are answered 200 once descriptors are freed")

	var hogs []net.Conn
	defer func() {
		for _, h := range hogs {
			h.Close()
		}
	}()
	var pending net.Conn
	for i := 0; i < 64 && pending == nil; i++ {
		c, err := g.Dial(agentA)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if _, err := get(c, 2*time.Second); err != nil {
			pending = c // not accepted: the gateway is out of descriptors
			break
		}
		hogs = append(hogs, c) // kept alive: it holds a descriptor
	}
	if pending == nil {
		t.Fatalf("64 connections were all served with RLIMIT_NOFILE %d: the limit did not bite", limit)
	}
	defer pending.Close()
	warned := g.AwaitLog("out of file descriptors warning", func(m map[string]any) bool {
		s, _ := m["msg"].(string)
		return strings.Contains(s, "out of file descriptors")
	})
	select {
	case <-g.Exited():
		t.Fatalf("the gateway exited when it ran out of descriptors: %v", g.ExitErr())
	default:
	}

	// Free the descriptors: the waiting request is answered.
	for _, h := range hogs {
		h.Close()
	}
	served := len(hogs)
	hogs = nil
	_ = pending.SetDeadline(time.Now().Add(15 * time.Second))
	status := 0
	resp, err := http.ReadResponse(bufio.NewReader(pending), nil)
	if err == nil {
		status = resp.StatusCode
	}
	// And new connections are served again.
	fresh := 0
	if c, err := g.Dial(agentA); err == nil {
		fresh, _ = get(c, 10*time.Second)
		c.Close()
	}
	g.AwaitLog("accepting again", func(m map[string]any) bool {
		s, _ := m["msg"].(string)
		return strings.Contains(s, "accepting again")
	})
	cb.Observef("%d connections served, the next waited; warning %q; after closing them the waiting request got %d (%v), a new one %d; gateway running",
		served, warned["msg"], status, err, fresh)
	if err != nil || status != 200 {
		t.Fatalf("the waiting request after descriptors were freed: %d %v", status, err)
	}
	if fresh != 200 {
		t.Fatalf("a new connection after recovery: %d", fresh)
	}
	_ = unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil)
}
