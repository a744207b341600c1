//go:build linux

package sandboxd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cgroup2Mount mounts a cgroup2 hierarchy in a directory of the test's
// own and returns it with the controllers it offers. On this project's
// test hosts (hybrid: pids, memory and cpu bound to v1) it offers at most
// the controllers v1 does not hold (hugetlb, misc): a controller belongs
// to one hierarchy at a time, and v1's cannot be released while the
// host's groups live in them.
func cgroup2Mount(t *testing.T) (string, []string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount cgroup2")
	}
	dir := t.TempDir()
	if err := unix.Mount("none", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Skipf("mount -t cgroup2: %v (the kernel offers no cgroup2 here)", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	return dir, strings.Fields(string(b))
}

// useRoot points the cgroup code at root for the test.
func useRoot(t *testing.T, root string) {
	old := cgroupRoot
	cgroupRoot = root
	t.Cleanup(func() { cgroupRoot = old })
}

// TestCgroupV2Mechanics runs the v2 code that needs no controller in a
// cgroup2 hierarchy the test mounts: the child is cloned straight into
// the group (CLONE_INTO_CGROUP, startIn's v2 branch, no migration and no
// v1 tasks files), procs lists it, counters read nothing without the
// memory and pids controllers, and remove kills it through cgroup.kill
// and removes the group. The limits need pids, memory and cpu in v2:
// TestCgroupV2Limits.
func TestCgroupV2Mechanics(t *testing.T) {
	root, ctrls := cgroup2Mount(t)
	t.Logf("cgroup2 controllers here: %q", ctrls)
	parent := filepath.Join(root, "sluice-test-"+strings.ReplaceAll(t.Name(), "/", "-"))
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(parent) })
	d := filepath.Join(parent, "sb1")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := &cgroup{v2: true, dirs: map[string]string{"": d}}
	removed := false
	t.Cleanup(func() {
		if !removed {
			_ = cg.remove()
		}
	})

	threads := newForkThreads(1)
	defer threads.close()
	cmd := exec.Command("/bin/sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	var fdSet bool
	err := cg.startIn(threads, nil, func() error { return nil }, func(fd int) {
		fdSet = true
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}, cmd.Start, func() bool { return true })
	if err != nil {
		t.Fatalf("startIn on v2: %v", err)
	}
	if !fdSet {
		t.Fatal("startIn on v2 did not hand the group's fd to the fork (CLONE_INTO_CGROUP)")
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pid := cmd.Process.Pid
	// Born in the group: /proc/PID/cgroup's v2 line names it from the
	// first moment, and nothing was migrated (sandboxd's own threads are
	// not in it).
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	rel := strings.TrimPrefix(d, root)
	if !strings.Contains(string(b), "0::"+rel+"\n") {
		t.Fatalf("child's /proc/%d/cgroup has no 0::%s line:\n%s", pid, rel, b)
	}
	if got := cg.procs(); len(got) != 1 || got[0] != pid {
		t.Fatalf("procs() = %v, want [%d]", got, pid)
	}
	if oom, pmax := cg.counters(); oom != 0 || pmax != 0 {
		t.Errorf("counters() = %d, %d without the memory and pids controllers, want 0, 0", oom, pmax)
	}
	start := time.Now()
	if err := cg.remove(); err != nil {
		t.Fatalf("remove: %v", err)
	}
	removed = true
	select {
	case err := <-done:
		ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Errorf("the child ended with %v (%v), want SIGKILL from cgroup.kill", ws, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the child outlived remove by 10s")
	}
	if _, err := os.Stat(d); !os.IsNotExist(err) {
		t.Errorf("the group %s is still there after remove: %v", d, err)
	}
	t.Logf("killed and removed in %v", time.Since(start).Round(time.Microsecond))
}

// TestCgroupV2Limits: sandboxd takes the v2 path only when the unified
// hierarchy offers pids, memory and cpu, and writes every limit there;
// without them it takes v1, and with neither it refuses to make a group
// (a sandbox never runs without its limits). Where the test's own cgroup2
// mount lacks the three (every hybrid host), it asserts the refusal and
// says which controllers v1 holds.
func TestCgroupV2Limits(t *testing.T) {
	root, ctrls := cgroup2Mount(t)
	useRoot(t, root)
	have := map[string]bool{}
	for _, c := range ctrls {
		have[c] = true
	}
	if !have["pids"] || !have["memory"] || !have["cpu"] {
		if hasV2Controllers() {
			t.Fatalf("hasV2Controllers() true with controllers %q", ctrls)
		}
		// No v1 controllers under this root either: newCgroup must
		// refuse, naming what it needs.
		_, err := newCgroup("sluice-test-v2", "sb1", Limits{Pids: 64, MemoryBytes: 64 << 20, CPUMillis: 500})
		if err == nil || !strings.Contains(err.Error(), "need cgroup v2 with pids, memory, cpu or v1") {
			t.Fatalf("newCgroup with neither v2 controllers nor v1 under %s: err = %v, want the refusal naming both", root, err)
		}
		held, _ := os.ReadFile("/proc/self/cgroup")
		t.Skipf("cgroup2 here offers %q, not pids/memory/cpu (bound to v1 on this hybrid host: %s); the v2 limits cannot be written here — refusal asserted",
			ctrls, strings.ReplaceAll(strings.TrimSpace(string(held)), "\n", "; "))
	}
	// A host whose cgroup2 has the three: the whole v2 path.
	l := Limits{Pids: 64, MemoryBytes: 64 << 20, CPUMillis: 500}
	cg, err := newCgroup("sluice-test-v2", "sb1", l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cg.remove(); _ = os.Remove(filepath.Join(root, "sluice-test-v2")) })
	if !cg.v2 {
		t.Fatal("newCgroup took v1 with pids, memory and cpu in cgroup2")
	}
	for f, want := range map[string]string{"pids.max": "64", "memory.max": strconv.Itoa(64 << 20), "cpu.max": "50000 100000"} {
		b, err := os.ReadFile(filepath.Join(cg.dirs[""], f))
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q (%v), want %q", f, strings.TrimSpace(string(b)), err, want)
		}
	}
}
