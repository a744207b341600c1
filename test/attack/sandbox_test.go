//go:build linux

// Package attack runs hostile code inside real sandboxes made by the
// sandboxd binary and checks that every escape of THREATS.md A and B fails
// with the designed errno, each paired with a control that succeeds.
package attack

import (
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
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

var (
	bin      string // the sandboxd binary
	hostile  string // the in-sandbox helper
	skipWhy  string // why sandbox tests cannot run here
	buildDir string
)

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() != 0 {
			skipWhy = "needs root (user namespaces with an id map, cgroups)"
			return m.Run()
		}
		if _, err := os.Stat("/proc/self/ns/user"); err != nil {
			skipWhy = "kernel lacks user namespaces"
			return m.Run()
		}
		var err error
		buildDir, err = os.MkdirTemp("", "sluice-attack-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(buildDir)
		// The benchmarks exec the binary by path from inside the new user
		// namespace, as an unmapped uid: the directory must be searchable.
		if err := os.Chmod(buildDir, 0o711); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if bin, err = gwenv.BuildStatic(buildDir, "./cmd/sandboxd"); err == nil {
			hostile, err = gwenv.BuildStatic(buildDir, "./test/attack/testdata/hostile")
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

func need(t *testing.T) {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
}

// stateDir is a fresh state directory the sandbox's init can traverse
// (t.TempDir's parents are 0700).
func stateDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sluice-sbx-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}

type runResult struct {
	stdout, stderr string
	code           int
	state          string
}

// runHostile runs `sandboxd run [flags] -- /workspace/hostile args...`.
func runHostile(t *testing.T, flags []string, args ...string) runResult {
	t.Helper()
	st := stateDir(t)
	argv := append([]string{"run", "--no-gateway", "--state-dir", st, "--copy", hostile + ":/workspace/hostile"}, flags...)
	argv = append(argv, "--", "/workspace/hostile")
	argv = append(argv, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, argv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return runResult{stdout: strings.TrimSpace(out.String()), stderr: errb.String(), code: code, state: st}
}

// landlockABI is the kernel's Landlock ABI version (0 = none).
func landlockABI() int {
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, 1 /* LANDLOCK_CREATE_RULESET_VERSION */)
	if e != 0 {
		return 0
	}
	return int(v)
}

// TestSandboxEscape is THREATS A: each case runs the helper in a fresh
// sandbox and compares its one-line verdict.
func TestSandboxEscape(t *testing.T) {
	need(t)
	// Targets that would answer if isolation failed.
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	go acceptAll(tcp)
	port := strconv.Itoa(tcp.Addr().(*net.TCPAddr).Port)
	sockDir := t.TempDir()
	sock := filepath.Join(sockDir, "host.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go acceptAll(ul)
	abstract := fmt.Sprintf("sluice-attack-%d", os.Getpid())
	al, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	go acceptAll(al)
	// Controls on the host side: the targets do answer.
	for _, a := range [][2]string{{"tcp", "127.0.0.1:" + port}, {"unix", sock}, {"unix", "@" + abstract}} {
		c, err := net.DialTimeout(a[0], a[1], time.Second)
		if err != nil {
			t.Fatalf("control: host target %s does not answer: %v", a[1], err)
		}
		c.Close()
	}
	testHost := testNetNS(t)
	hostConnect := "errno=ECONNREFUSED" // nothing listens in the sandbox's own netns
	if landlockABI() >= 4 {
		hostConnect = "errno=EACCES" // Landlock: TCP connect only to 3128 and 53
	}

	// D10: an audit log where a gateway on this host keeps one (0600 in
	// a 0700 directory under /var/lib), which a sandbox must not open.
	auditDir := fmt.Sprintf("/var/lib/sluice-attack-%d", os.Getpid())
	if err := os.MkdirAll(auditDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(auditDir) })
	auditLog := filepath.Join(auditDir, "audit.log")
	if err := os.WriteFile(auditLog, []byte(`{"seq":1,"event":"decision"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// A6: a setuid-root program where the sandbox can run it (under
	// /usr, which every sandbox sees read-only).
	suidDir := fmt.Sprintf("/usr/local/lib/sluice-attack-%d", os.Getpid())
	if err := os.MkdirAll(suidDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(suidDir) })
	suid := filepath.Join(suidDir, "hostile-suid")
	if b, err := os.ReadFile(hostile); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(suid, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(suid, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(suid, 0o4755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	// Control: outside a sandbox, uid 1000 running it does become euid 0.
	ctl := exec.Command(suid, "status")
	ctl.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	if out, err := ctl.Output(); err != nil || !strings.HasPrefix(string(out), "Uid=1000,0,0,0") {
		t.Fatalf("control: the setuid copy run by uid 1000 on the host: %q %v, want euid 0", out, err)
	}
	const unprivileged = "Uid=1000,1000,1000,1000 CapInh=0000000000000000 CapPrm=0000000000000000 CapEff=0000000000000000 CapBnd=0000000000000000 CapAmb=0000000000000000 NoNewPrivs=1 Seccomp=2 core=0,0"

	cases := []struct {
		threat, name string
		args         []string
		want         []string // any of
	}{
		{"A1", "tcp to host loopback listener", []string{"connect-tcp", port}, []string{hostConnect}},
		{"A1", "tcp to a test host in the test's own namespace (port allowed by Landlock)", []string{"connect-addr", testHost}, []string{"errno=ENETUNREACH"}},
		{"A1", "control: tcp to the sandbox proxy port", []string{"dial-proxy"}, []string{"ok"}},
		{"A1", "raw socket", []string{"raw-socket"}, []string{"errno=EPERM"}},
		{"A1", "raw socket with SOCK_CLOEXEC", []string{"raw-socket-cloexec"}, []string{"errno=EPERM"}},
		{"A1", "packet socket (a family outside the allow-list, A11)", []string{"packet-socket"}, []string{"errno=EAFNOSUPPORT"}},
		{"A1", "MPTCP socket bypasses Landlock TCP rules", []string{"mptcp-socket"}, []string{"errno=EPERM"}},
		{"A1", "control: plain TCP socket", []string{"tcp-socket"}, []string{"ok"}},
		{"A2", "unshare(CLONE_NEWUSER)", []string{"unshare-user"}, []string{"errno=EPERM"}},
		{"A2", "unshare(CLONE_NEWNET)", []string{"unshare-net"}, []string{"errno=EPERM"}},
		{"A2", "clone(CLONE_NEWUSER)", []string{"clone-newuser"}, []string{"errno=EPERM"}},
		{"A2", "setns", []string{"setns"}, []string{"errno=EPERM"}},
		{"A2", "mount", []string{"mount"}, []string{"errno=EPERM"}},
		{"A2", "umount2", []string{"umount2"}, []string{"errno=EPERM"}},
		{"A2", "open_tree", []string{"open_tree"}, []string{"errno=EPERM"}},
		{"A2", "mount_setattr", []string{"mount_setattr"}, []string{"errno=EPERM"}},
		{"A2", "fsopen", []string{"fsopen"}, []string{"errno=EPERM"}},
		{"A2", "clone3 (flags unreadable by seccomp)", []string{"clone3"}, []string{"errno=ENOSYS"}},
		{"A2", "control: fork, exec and threads", []string{"fork-exec"}, []string{"ok"}},
		{"A3", "bpf", []string{"bpf"}, []string{"errno=EPERM"}},
		{"A3", "init_module", []string{"init_module"}, []string{"errno=EPERM"}},
		{"A3", "finit_module", []string{"finit_module"}, []string{"errno=EPERM"}},
		{"A3", "kexec_load", []string{"kexec_load"}, []string{"errno=EPERM"}},
		{"A3", "keyctl", []string{"keyctl"}, []string{"errno=EPERM"}},
		{"A3", "add_key", []string{"add_key"}, []string{"errno=EPERM"}},
		{"A3", "perf_event_open", []string{"perf_event_open"}, []string{"errno=EPERM"}},
		{"A3", "userfaultfd", []string{"userfaultfd"}, []string{"errno=EPERM"}},
		{"A3", "io_uring_setup", []string{"io_uring_setup"}, []string{"errno=EPERM"}},
		{"A3", "ptrace", []string{"ptrace"}, []string{"errno=EPERM"}},
		{"A3", "control: getppid", []string{"getppid"}, []string{"ok"}},
		{"A4", "TIOCSTI", []string{"tiocsti"}, []string{"errno=EPERM"}},
		{"A4", "TIOCSTI with high bits set", []string{"tiocsti-hi"}, []string{"errno=EPERM"}},
		{"A4", "TIOCLINUX", []string{"tioclinux"}, []string{"errno=EPERM"}},
		{"A4", "control: TIOCGWINSZ on the same pty", []string{"tiocgwinsz"}, []string{"ok"}},
		{"A4", "already a session leader (setsid)", []string{"setsid"}, []string{"errno=EPERM"}},
		{"A5", "create a file at / (read-only root)", []string{"write-file", "/newfile"}, []string{"errno=EROFS"}},
		{"A5", "write /etc/passwd", []string{"write-file", "/etc/passwd"}, []string{"errno=EROFS", "errno=EACCES"}},
		{"A5", "write /usr/bin/x", []string{"write-file", "/usr/bin/x"}, []string{"errno=EROFS", "errno=EACCES"}},
		{"A5", "write own /proc/self/comm outside Landlock paths", []string{"write-file", "/proc/self/comm"}, []string{"errno=EACCES"}},
		{"A5", "rename out of the workspace", []string{"rename-out"}, []string{"errno=EXDEV"}},
		{"A5", "control: write /workspace", []string{"write-file", "/workspace/ok"}, []string{"ok"}},
		{"A5", "control: write /tmp", []string{"write-file", "/tmp/ok"}, []string{"ok"}},
		{"A6", "no capabilities, no_new_privs, seccomp, no core dumps", []string{"status"}, []string{unprivileged}},
		{"A6", "run a setuid-root program: it gains nothing", []string{"exec-status", suid}, []string{unprivileged}},
		{"A7", "only fds 0-2 are open", []string{"fds"}, []string{"fds=0,1,2"}},
		{"A7", "chdir through /proc/self/fd/N of every open fd (runc CVE-2024-21626)", []string{"fd-chdir"}, []string{"fd-chdir=ENOTDIR,ENOTDIR,ENOTDIR"}},
		{"A7", "list the init's descriptors /proc/1/fd", []string{"list-dir", "/proc/1/fd"}, []string{"errno=EACCES"}},
		{"A7", "list the init's root /proc/1/root", []string{"list-dir", "/proc/1/root"}, []string{"errno=EACCES"}},
		{"A7", "control: list its own /proc/self/fd", []string{"list-dir", "/proc/self/fd"}, []string{"ok"}},
		{"A8", "write core_pattern", []string{"write-file", "/proc/sys/kernel/core_pattern"}, []string{"errno=EROFS", "errno=EACCES"}},
		{"A8", "write sysfs", []string{"write-file", "/sys/kernel/mm/transparent_hugepage/enabled"}, []string{"errno=EROFS", "errno=ENOENT" /* no sysfs */}},
		{"A8", "cgroup release_agent", []string{"write-file", "/sys/fs/cgroup/release_agent"}, []string{"errno=EROFS", "errno=ENOENT" /* no sysfs */}},
		{"A8", "signal a host pid", []string{"kill", strconv.Itoa(os.Getpid())}, []string{"errno=ESRCH"}},
		{"A8", "control: signal itself", []string{"kill-self"}, []string{"ok"}},
		{"D10", "read a gateway audit log kept on the host under /var/lib (0600 file in a 0700 dir)", []string{"read-file", auditLog}, []string{"errno=ENOENT", "errno=EACCES"}},
		{"D10", "read the default audit log path /var/lib/sluice/audit.log", []string{"read-file", "/var/lib/sluice/audit.log"}, []string{"errno=ENOENT", "errno=EACCES"}},
		{"D10", "control: read a file it wrote in /workspace", []string{"read-file", "/workspace/hostile"}, []string{"ok"}},
		{"A9", "host Unix socket path", []string{"connect-unix", sock}, []string{"errno=ENOENT"}},
		{"A9", "host abstract socket", []string{"connect-abstract", abstract}, []string{"errno=ECONNREFUSED", "errno=EPERM"}},
		{"A9", "control: the per-sandbox gateway socket", []string{"connect-unix", "/run/sluice/gateway.sock"}, []string{"ok"}},
	}
	for _, tc := range cases {
		t.Run(tc.threat+"/"+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, tc.threat, tc.name+" (in a fresh sandbox)", strings.Join(tc.want, " or "))
			r := runHostile(t, nil, tc.args...)
			c.Observe(verdict(r))
			for _, w := range tc.want {
				if r.stdout == w {
					return
				}
			}
			t.Errorf("%s: got %q (exit %d, stderr %q), want one of %q", tc.threat, r.stdout, r.code, r.stderr, tc.want)
		})
	}
}

// testNetNS makes a network namespace joined to the host by a veth pair,
// with a listener on port 3128 (a port Landlock lets the sandbox connect
// to, so only the sandbox's own network namespace can stop it). The host
// can reach it (checked); it returns "addr:port".
func testNetNS(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2) to make the test's namespace")
	}
	n := os.Getpid() % 200
	ns, vh, vn := fmt.Sprintf("sluice-atk-%d", os.Getpid()), fmt.Sprintf("sla%dh", os.Getpid()), fmt.Sprintf("sla%dn", os.Getpid())
	hostIP, nsIP := fmt.Sprintf("10.231.%d.1", n), fmt.Sprintf("10.231.%d.2", n)
	ip := func(args ...string) {
		t.Helper()
		if b, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, b)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", ns).Run()
		_ = exec.Command("ip", "link", "del", vh).Run()
	})
	ip("link", "add", vh, "type", "veth", "peer", "name", vn, "netns", ns)
	ip("addr", "add", hostIP+"/30", "dev", vh)
	ip("link", "set", vh, "up")
	ip("-n", ns, "addr", "add", nsIP+"/30", "dev", vn)
	ip("-n", ns, "link", "set", vn, "up")
	ip("-n", ns, "link", "set", "lo", "up")
	// Listen from inside the namespace: a socket stays in the namespace
	// it was made in.
	lc := make(chan net.Listener, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread changes namespace
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		l, err := net.Listen("tcp", nsIP+":3128")
		if err != nil {
			errc <- err
			return
		}
		lc <- l
	}()
	select {
	case err := <-errc:
		t.Fatalf("listen in test namespace: %v", err)
	case l := <-lc:
		t.Cleanup(func() { l.Close() })
		go acceptAll(l)
	}
	c, err := net.DialTimeout("tcp", nsIP+":3128", 2*time.Second)
	if err != nil {
		t.Fatalf("control: host cannot reach the test host %s: %v", nsIP, err)
	}
	c.Close()
	return nsIP + ":3128"
}

func acceptAll(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

// events reads the JSON lines sandboxd wrote outside the sandbox.
func events(t *testing.T, state string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("event %q: %v", l, err)
		}
		out = append(out, e)
	}
	return out
}

func hasEvent(evs []map[string]any, name string) bool {
	for _, e := range evs {
		if e["event"] == name {
			return true
		}
	}
	return false
}

// TestResourceExhaustion is THREATS B.
func TestResourceExhaustion(t *testing.T) {
	need(t)
	t.Run("B1/fork bomb stops at pids.max", func(t *testing.T) {
		c := casebook.Expect(t, "B1", "fork bomb under --pids 64; control: fork-exec under the same limit",
			"errno=EAGAIN after 0<n<64 forks, killed_by=pids, a pids_limit event; control ok")
		r := runHostile(t, []string{"--pids", "64"}, "forkbomb")
		c.Observef("%s; %s", verdict(r), eventNames(r.state))
		var n int
		if _, err := fmt.Sscanf(r.stdout, "errno=EAGAIN n=%d", &n); err != nil {
			t.Fatalf("got %q, want errno=EAGAIN n=N", r.stdout)
		}
		if n <= 0 || n >= 64 {
			t.Errorf("forked %d processes, want 0 < n < 64 (pids.max)", n)
		}
		if !strings.Contains(r.stderr, "killed_by=pids") || !hasEvent(events(t, r.state), "pids_limit") {
			t.Errorf("want killed_by=pids and a pids_limit event; stderr %q", r.stderr)
		}
		ctl := runHostile(t, []string{"--pids", "64"}, "fork-exec")
		if ctl.stdout != "ok" {
			t.Errorf("control: fork under the limit: %q", ctl.stdout)
		}
		c.Observef("%s; %s; control %s", verdict(r), eventNames(r.state), ctl.stdout)
	})
	t.Run("B2/memory bomb is OOM-killed inside only", func(t *testing.T) {
		c := casebook.Expect(t, "B2", "memory bomb under --memory 64MiB",
			"exit 137, killed_by=oom, oom and destroyed events")
		r := runHostile(t, []string{"--memory", strconv.Itoa(64 << 20)}, "membomb")
		c.Observef("%s; %s", verdict(r), eventNames(r.state))
		if r.code != 137 || !strings.Contains(r.stderr, "killed_by=oom") {
			t.Fatalf("exit %d stderr %q, want 137 and killed_by=oom", r.code, r.stderr)
		}
		evs := events(t, r.state)
		if !hasEvent(evs, "oom") || !hasEvent(evs, "destroyed") {
			t.Errorf("want oom and destroyed events, got %v", evs)
		}
	})
	t.Run("B3/sleep past the deadline is killed, nothing left", func(t *testing.T) {
		tag := strconv.Itoa(os.Getpid() % 100000)
		start := time.Now()
		c := casebook.Expect(t, "B3", "sleep with a detached grandchild past a 1s deadline",
			"killed within 10s: exit 137, killed_by=timeout, a timeout event, no process left")
		r := runHostile(t, []string{"--timeout", "1s"}, "sleep", tag)
		c.Observef("%s after %s; %s", verdict(r), time.Since(start).Round(100*time.Millisecond), eventNames(r.state))
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("took %s for a 1s deadline", d)
		}
		if r.code != 137 || !strings.Contains(r.stderr, "killed_by=timeout") {
			t.Fatalf("exit %d stderr %q, want 137 and killed_by=timeout", r.code, r.stderr)
		}
		if !hasEvent(events(t, r.state), "timeout") {
			t.Error("no timeout event")
		}
		left := findProc("1000" + tag)
		c.Observef("%s; %s; leftover grandchild pid %d (0 = none)", verdict(r), eventNames(r.state), left)
		if p := left; p != 0 {
			t.Errorf("detached grandchild %d still running", p)
		}
	})
	t.Run("B4/stdout flood is truncated with the marker", func(t *testing.T) {
		const limit = 65536
		c := casebook.Expect(t, "B4", "8 MiB to stdout under --output-bytes 65536; control: 4096 bytes",
			"at most 65536 bytes ending with [sluice: output truncated]; control returned whole")
		r := runHostile(t, []string{"--output-bytes", strconv.Itoa(limit)}, "flood", strconv.Itoa(8<<20))
		const marker = "[sluice: output truncated]"
		if !strings.HasSuffix(r.stdout, marker) || len(r.stdout) > limit+len(marker)+2 {
			t.Errorf("stdout %d bytes ending %q, want <= %d ending with the marker", len(r.stdout), tail(r.stdout), limit)
		}
		ctl := runHostile(t, []string{"--output-bytes", strconv.Itoa(limit)}, "flood", "4096")
		if strings.Contains(ctl.stdout, marker) || len(ctl.stdout) != 4096 {
			t.Errorf("control: 4096 bytes under the cap came back as %d bytes", len(ctl.stdout))
		}
		c.Observef("%d bytes ending %q; control %d bytes", len(r.stdout), tail(r.stdout), len(ctl.stdout))
	})
	t.Run("B5/filling the workspace stops at ENOSPC", func(t *testing.T) {
		c := casebook.Expect(t, "B5", "fill an 8 MiB workspace", "errno=ENOSPC")
		r := runHostile(t, []string{"--workspace", strconv.Itoa(8 << 20)}, "fill")
		c.Observe(verdict(r))
		if r.stdout != "errno=ENOSPC" {
			t.Errorf("got %q, want errno=ENOSPC", r.stdout)
		}
	})
}

// verdict is what the helper printed, with the exit status and the
// killed_by= reason sandboxd wrote, for the report.
func verdict(r runResult) string {
	v := r.stdout
	if len(v) > 240 {
		v = v[:240] + "…"
	}
	if v == "" {
		v = "(no output)"
	}
	if r.code != 0 {
		v += fmt.Sprintf(", exit %d", r.code)
	}
	for _, f := range strings.Fields(r.stderr) {
		if strings.HasPrefix(f, "killed_by=") {
			v += ", " + f
			break
		}
	}
	return v
}

// eventNames lists the events sandboxd wrote for a run, for the report.
// It never fails the test: the assertions on events are the tests' own.
func eventNames(state string) string {
	b, err := os.ReadFile(filepath.Join(state, "events.jsonl"))
	if err != nil {
		return "no events file"
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e struct{ Event string }
		if json.Unmarshal([]byte(l), &e) == nil && e.Event != "" {
			names = append(names, e.Event)
		}
	}
	return "events " + strings.Join(names, ",")
}

func tail(s string) string {
	if len(s) > 40 {
		return s[len(s)-40:]
	}
	return s
}

// findProc returns the pid of a host process whose command line contains s.
func findProc(s string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.Contains(b, []byte(s)) && !bytes.Contains(b, []byte("hostile")) {
			return pid
		}
	}
	return 0
}

// TestAPI drives `sandboxd serve` over its Unix socket: create, exec,
// files in and out (with escapes refused), list, destroy.
func TestAPI(t *testing.T) {
	need(t)
	st := stateDir(t)
	do := serveAPI(t, st, fmt.Sprintf("gateway: %s\nspares: 1\n", filepath.Join(st, "gw.sock")))
	api := filepath.Join(st, "api.sock")
	if fi, err := os.Stat(api); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("api socket mode %v, want 0600 (root only)", fi.Mode().Perm())
	}
	code, b := do("POST", "/v1/sandboxes", strings.NewReader(`{"agent":"a1","session":"s1","user":"u1","env":{"FOO":"bar"}}`))
	if code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	var info struct{ ID string }
	_ = json.Unmarshal(b, &info)
	base := "/v1/sandboxes/" + info.ID

	if code, b := do("POST", "/v1/sandboxes", strings.NewReader(`{"agent":"a1","bogus":1}`)); code != 400 || !bytes.Contains(b, []byte("bad_request")) {
		t.Errorf("unknown field: %d %s, want 400 bad_request", code, b)
	}
	if code, _ := do("PUT", base+"/files/workspace/dir/in.txt", strings.NewReader("hello")); code != 204 {
		t.Fatalf("put: %d", code)
	}
	code, b = do("POST", base+"/exec", strings.NewReader(`{"argv":["/bin/sh","-c","cat dir/in.txt; echo $FOO; ln -s /etc esc; ln -s /etc/hostname esc2; echo x >&2; exit 3"]}`))
	var res struct {
		ExitCode       int `json:"exit_code"`
		Stdout, Stderr string
	}
	_ = json.Unmarshal(b, &res)
	if code != 200 || res.ExitCode != 3 || res.Stdout != "hellobar\n" || res.Stderr != "x\n" {
		t.Fatalf("exec: %d %s", code, b)
	}
	if code, b := do("GET", base+"/files/workspace/dir/in.txt", nil); code != 200 || string(b) != "hello" {
		t.Errorf("get: %d %q", code, b)
	}
	for _, c := range []struct {
		name, method, path string
		want               int
	}{
		{"dotdot", "GET", base + "/files/workspace/dir/..%2f..%2fetc%2fpasswd", 400},
		{"outside workspace", "GET", base + "/files/etc/passwd", 400},
		{"symlinked directory", "GET", base + "/files/workspace/esc/passwd", 403},
		{"symlinked file", "GET", base + "/files/workspace/esc2", 403},
		{"write through symlink", "PUT", base + "/files/workspace/esc/x", 403},
		{"unknown sandbox", "GET", "/v1/sandboxes/nope/files/workspace/x", 404},
	} {
		t.Run("files/"+c.name, func(t *testing.T) {
			var body io.Reader
			if c.method == "PUT" {
				body = strings.NewReader("x")
			}
			if code, b := do(c.method, c.path, body); code != c.want {
				t.Errorf("%s %s: %d %s, want %d", c.method, c.path, code, b, c.want)
			}
		})
	}
	// The second sandbox comes from the spare built after the first (a
	// create waits for a spare being built): its limits are the
	// request's, not the spare's defaults.
	if _, err := os.Stat(filepath.Join(st, "state", "sandboxes", info.ID)); err != nil {
		t.Fatalf("the first sandbox's state is not under state/sandboxes: %v", err)
	}
	code, b = do("POST", "/v1/sandboxes", strings.NewReader(`{"agent":"a2","limits":{"pids":32}}`))
	var info2 struct{ ID string }
	if err := json.Unmarshal(b, &info2); code != 201 || err != nil {
		t.Fatalf("create from spare: %d %s", code, b)
	}
	pm, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/sluice-sandboxd", info2.ID, "pids.max")) // v1
	if err != nil {
		pm, err = os.ReadFile(filepath.Join("/sys/fs/cgroup/sluice-sandboxd", info2.ID, "pids.max")) // v2
	}
	if err != nil || strings.TrimSpace(string(pm)) != "32" {
		t.Errorf("spare's pids.max = %q (%v), want the request's 32", pm, err)
	}
	code, b = do("POST", "/v1/sandboxes/"+info2.ID+"/exec", strings.NewReader(`{"argv":["sh","-c","echo $SLUICE_SANDBOX"]}`))
	if code != 200 || !bytes.Contains(b, []byte(info2.ID)) {
		t.Errorf("exec in spare: %d %s", code, b)
	}
	if code, b := do("GET", "/v1/sandboxes", nil); code != 200 || !bytes.Contains(b, []byte(info.ID)) {
		t.Errorf("list: %d %s", code, b)
	}
	if code, _ := do("DELETE", base, nil); code != 204 {
		t.Errorf("delete: %d", code)
	}
	if code, _ := do("GET", base, nil); code != 404 {
		t.Errorf("get after delete: %d, want 404", code)
	}
	// State and cgroup go in the background once init is reaped.
	gone := func() bool {
		_, e1 := os.Stat(filepath.Join(st, "state", "sandboxes", info.ID))
		_, e2 := os.Stat(filepath.Join("/sys/fs/cgroup/pids/sluice-sandboxd", info.ID))
		_, e3 := os.Stat(filepath.Join("/sys/fs/cgroup/sluice-sandboxd", info.ID))
		return os.IsNotExist(e1) && os.IsNotExist(e2) && os.IsNotExist(e3)
	}
	for end := time.Now().Add(5 * time.Second); !gone() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if !gone() {
		t.Errorf("state or cgroup of destroyed sandbox %s still there after 5s", info.ID)
	}
}

// apiDo is one request to sandboxd's API: status and body.
type apiDo func(method, path string, body io.Reader) (int, []byte)

// serveAPI starts `sandboxd serve` with its API at st/api.sock and its state
// under st/state, the rest of its config from yaml, and waits for the API.
// Before the binary, prefix (e.g. nsenter into a namespace). It stops
// sandboxd (SIGTERM) when the test ends and logs its output on failure.
func serveAPI(t *testing.T, st, yaml string, prefix ...string) apiDo {
	t.Helper()
	api := filepath.Join(st, "api.sock")
	cfg := filepath.Join(st, "sandboxd.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("api: %s\nstate_dir: %s\n%s", api, filepath.Join(st, "state"), yaml)), 0o600); err != nil {
		t.Fatal(err)
	}
	argv := append(append([]string(nil), prefix...), bin, "serve", "--config", cfg)
	ctx, cancel := context.WithCancel(context.Background())
	srv := exec.CommandContext(ctx, argv[0], argv[1:]...)
	srv.Cancel = func() error { return srv.Process.Signal(syscall.SIGTERM) }
	var logs bytes.Buffer
	srv.Stderr = &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = srv.Wait()
		if t.Failed() {
			t.Logf("sandboxd log:\n%s", logs.String())
		}
	})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", api)
	}}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", api); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("api socket never appeared; log:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func(method, path string, body io.Reader) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://sandboxd"+path, body)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
}
