//go:build linux

package sandboxd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nsID names the namespace of kind ("net", "ipc", "mnt") that pid (or
// "self", "thread-self") is in, as /proc shows it: "net:[4026532...]".
func nsID(t *testing.T, pid, kind string) string {
	t.Helper()
	l, err := os.Readlink(filepath.Join("/proc", pid, "ns", kind))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func execOut(t *testing.T, m *Manager, id string, argv ...string) string {
	t.Helper()
	res, err := m.Exec(context.Background(), id, ExecRequest{Argv: argv})
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return fmt.Sprintf("exit=%d out=%q err=%q", res.ExitCode, strings.TrimSpace(res.Stdout), strings.TrimSpace(res.Stderr))
}

// Each sandbox gets network and IPC namespaces of its own, made for it
// (ahead, by the pool) and never handed to another: what one sandbox left
// in its namespaces (a System V message queue) is not in the next one's,
// made while the first was alive, nor in one made after it was destroyed;
// the network namespace has lo up and nothing else, and belongs to
// sandboxd, so nobody inside can reconfigure it.
func TestNSSetFreshPerSandbox(t *testing.T) {
	m := realManager(t, 0)
	for _, tool := range []string{"/usr/bin/ipcmk", "/usr/bin/ipcs"} {
		if _, err := os.Stat(tool); err != nil {
			t.Skipf("the rootfs has no %s", tool)
		}
	}
	ctx := context.Background()
	a, err := m.Create(ctx, CreateRequest{Agent: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(a.ID) })
	if got := execOut(t, m, a.ID, "/bin/sh", "-c", "ipcmk -Q >/dev/null && ipcs -q | grep -c '^0x'"); got != `exit=0 out="1" err=""` {
		t.Fatalf("queue in sandbox A: %s", got)
	}
	b, err := m.Create(ctx, CreateRequest{Agent: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(b.ID) })
	aNet, aIPC := nsID(t, fmt.Sprint(a.Pid), "net"), nsID(t, fmt.Sprint(a.Pid), "ipc")
	if err := m.Destroy(a.ID); err != nil {
		t.Fatal(err)
	}
	m.pending.Wait()
	c, err := m.Create(ctx, CreateRequest{Agent: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(c.ID) })
	own := map[string]string{"net": nsID(t, "self", "net"), "ipc": nsID(t, "self", "ipc")}
	for _, in := range []Info{b, c} {
		for kind, aID := range map[string]string{"net": aNet, "ipc": aIPC} {
			if got := nsID(t, fmt.Sprint(in.Pid), kind); got == aID || got == own[kind] {
				t.Errorf("%s namespace %s: sandbox A's (%s) or sandboxd's own (%s)", kind, got, aID, own[kind])
			}
		}
	}
	if nsID(t, fmt.Sprint(b.Pid), "net") == nsID(t, fmt.Sprint(c.Pid), "net") {
		t.Errorf("sandboxes B and C share a network namespace")
	}
	// The owner of B's network namespace is sandboxd's user namespace.
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", b.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	userFD, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	owner, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", userFD))
	unix.Close(userFD)
	cases := []struct {
		name string
		in   Info
		argv []string
		want string
	}{
		{"no queue of A in B", b, []string{"/bin/sh", "-c", "ipcs -q | grep -c '^0x'"}, `exit=1 out="0" err=""`},
		{"no queue of A in C", c, []string{"/bin/sh", "-c", "ipcs -q | grep -c '^0x'"}, `exit=1 out="0" err=""`},
		{"only lo, up", c, []string{"/bin/sh", "-c", "ls /sys/class/net; cat /sys/class/net/lo/flags"}, `exit=0 out="lo\n0x9" err=""`},
		{"network namespace owned by sandboxd", c, []string{"/bin/true"}, `exit=0 out="" err=""`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := execOut(t, m, tc.in.ID, tc.argv...)
			if tc.name == "network namespace owned by sandboxd" {
				got += " owner=" + owner
				tc.want += " owner=" + nsID(t, "self", "user")
			}
			if got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// nsFDs lists this process's open descriptors of network, IPC and mount
// namespaces.
func nsFDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && (strings.HasPrefix(l, "net:[") || strings.HasPrefix(l, "ipc:[") || strings.HasPrefix(l, "mnt:[")) {
			out = append(out, e.Name()+"->"+l)
		}
	}
	return out
}

// The pool's namespaces made ahead are released when the manager closes:
// its maker stops, and no descriptor of a namespace it made (or of
// sandboxd's own, held to go back to) stays open.
func TestNSPoolClosedAtShutdown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	before := len(nsFDs(t))
	m := realManager(t, 0)
	in, err := m.Create(context.Background(), CreateRequest{Agent: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(in.ID); err != nil {
		t.Fatal(err)
	}
	// The first create started the maker; it fills the pool.
	deadline := time.Now().Add(10 * time.Second)
	for len(m.nss.ready) < nsPoolSize && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(m.nss.ready); n != nsPoolSize {
		t.Fatalf("%d sets made ahead, want %d", n, nsPoolSize)
	}
	held := nsFDs(t)
	// Each waiting set holds three, the template one, the way home three.
	if len(held) < before+3*nsPoolSize {
		t.Fatalf("namespace descriptors while sets wait: %v (before: %d)", held, before)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.nss.done:
	default:
		t.Error("the pool's maker still runs after Close")
	}
	if n := len(m.nss.ready); n != 0 {
		t.Errorf("%d sets still waiting after Close", n)
	}
	if after := nsFDs(t); len(after) != before {
		t.Errorf("namespace descriptors after Close: %v, want %d as before the manager", after, before)
	}
}

// No thread of sandboxd stays in a sandbox's network or IPC namespace:
// the threads that fork inits and make namespaces ahead go back after each.
func TestNoThreadLeftInSandboxNamespaces(t *testing.T) {
	m := realManager(t, 0)
	ctx := context.Background()
	var ids []string
	for range 3 {
		in, err := m.Create(ctx, CreateRequest{Agent: "test"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, in.ID)
	}
	defer func() {
		for _, id := range ids {
			_ = m.Destroy(id)
		}
	}()
	own := map[string]string{"net": nsID(t, "self", "net"), "ipc": nsID(t, "self", "ipc")}
	var away []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		away = nil
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			for kind, want := range own {
				l, err := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns", kind))
				if err == nil && l != want {
					away = append(away, task.Name()+" "+l)
				}
			}
		}
		if len(away) == 0 {
			return
		}
	}
	t.Errorf("threads still in other namespaces: %v", away)
}

// The init ignores the signals code inside may send it (it survives them:
// TestSandboxConfinedAndInitSurvivesSignals), but what it starts gets every
// signal at its default action.
func TestInitIgnoresSignalsCommandsDoNot(t *testing.T) {
	m := realManager(t, 0)
	in, err := m.Create(context.Background(), CreateRequest{Agent: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(in.ID) })
	var want uint64
	for _, s := range initSignals {
		want |= 1 << (uint(s) - 1)
	}
	cases := []struct {
		name string
		pid  string
		want string
	}{
		{"command", "self", "0000000000000000"},
		{"init", "1", fmt.Sprintf("%016x", want)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := execOut(t, m, in.ID, "/bin/sh", "-c", "grep SigIgn: /proc/"+tc.pid+"/status | tr -d ' \\t'")
			if w := `exit=0 out="SigIgn:` + tc.want + `" err=""`; got != w {
				t.Errorf("got %s, want %s", got, w)
			}
		})
	}
}
