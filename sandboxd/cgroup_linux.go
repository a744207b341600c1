package sandboxd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the controllers are mounted (a variable only so
// that tests can run the v2 code in a cgroup2 hierarchy of their own).
var cgroupRoot = "/sys/fs/cgroup"

// cgroup is one sandbox's group: a v2 directory, or one directory per v1
// controller (pids, memory, cpu) on hybrid hosts.
type cgroup struct {
	v2   bool
	dirs map[string]string // controller -> directory; v2 uses key ""
	// set are the limits last written in full (nil: unknown). Only
	// sandboxd writes a group's files (a sandbox sees none of them), so
	// a pooled group that already has a sandbox's limits keeps them.
	set *cgroupLimits

	// files are the group's files sandboxd uses on every fork and exec,
	// opened once (they stay valid when the group is renamed and when
	// it is pooled) and closed when it is removed.
	mu    sync.Mutex
	files map[string]*os.File // by path key (see path)
}

// file returns the group's file k (see path), opened once with flag.
func (cg *cgroup) file(k string, flag int) (*os.File, error) {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if f, ok := cg.files[k]; ok {
		return f, nil
	}
	f, err := os.OpenFile(cg.path(k), flag|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	if cg.files == nil {
		cg.files = map[string]*os.File{}
	}
	cg.files[k] = f
	return f, nil
}

// closeFiles closes what file opened.
func (cg *cgroup) closeFiles() {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	for k, f := range cg.files {
		f.Close()
		delete(cg.files, k)
	}
}

// openTasks opens each controller's tasks file (v1), for enter.
func (cg *cgroup) openTasks() error {
	for c := range cg.dirs {
		if _, err := cg.file(c+"/tasks", os.O_WRONLY); err != nil {
			return err
		}
	}
	return nil
}

// enter moves the calling thread into the group (v1: "0" into each
// controller's tasks). Its files are opened already (openTasks) or now,
// in the calling thread's mount namespace.
func (cg *cgroup) enter() error {
	for c := range cg.dirs {
		f, err := cg.file(c+"/tasks", os.O_WRONLY)
		if err != nil {
			return err
		}
		if _, err := f.WriteAt([]byte("0"), 0); err != nil {
			return fmt.Errorf("cgroup: enter %s: %w", cg.dirs[c], err)
		}
	}
	return nil
}

// cgroupLimits are the parts of Limits a group's files hold.
type cgroupLimits struct {
	pids      int
	memory    int64
	cpuMillis int
}

// hasV2Controllers reports whether the unified hierarchy at cgroupRoot
// offers pids, memory and cpu.
func hasV2Controllers() bool {
	b, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers"))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	need := map[string]bool{"pids": true, "memory": true, "cpu": true}
	for _, c := range f {
		delete(need, c)
	}
	return len(need) == 0
}

// newCgroup creates parent/id under every controller and writes the limits.
// On error it removes what it made.
func newCgroup(parent, id string, l Limits) (cg *cgroup, err error) {
	cg = &cgroup{dirs: map[string]string{}}
	defer func() {
		if err != nil {
			cg.remove()
		}
	}()
	if hasV2Controllers() {
		cg.v2 = true
		p := filepath.Join(cgroupRoot, parent)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return cg, fmt.Errorf("cgroup: %w", err)
		}
		if err := os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), []byte("+pids +memory +cpu"), 0); err != nil {
			return cg, fmt.Errorf("cgroup: enable controllers: %w", err)
		}
		d := filepath.Join(p, id)
		if err := os.Mkdir(d, 0o755); err != nil {
			return cg, fmt.Errorf("cgroup: %w", err)
		}
		cg.dirs[""] = d
		return cg, cg.setLimits(l)
	}
	for _, c := range []string{"pids", "memory", "cpu"} {
		root := filepath.Join(cgroupRoot, c)
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
			return cg, fmt.Errorf("cgroup: controller %s not mounted at %s (need cgroup v2 with pids, memory, cpu or v1): %w", c, root, err)
		}
		p := filepath.Join(root, parent)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return cg, fmt.Errorf("cgroup: %w", err)
		}
		d := filepath.Join(p, id)
		if err := os.Mkdir(d, 0o755); err != nil {
			return cg, fmt.Errorf("cgroup: %w", err)
		}
		cg.dirs[c] = d
	}
	return cg, cg.setLimits(l)
}

// setLimits writes l into the group's controller files, unless they
// hold it already.
func (cg *cgroup) setLimits(l Limits) error {
	want := cgroupLimits{pids: l.Pids, memory: l.MemoryBytes, cpuMillis: l.CPUMillis}
	if cg.set != nil && *cg.set == want {
		return nil
	}
	cg.set = nil
	if err := cg.writeLimits(l); err != nil {
		return err
	}
	cg.set = &want
	return nil
}

// writeLimits writes l into the group's controller files.
func (cg *cgroup) writeLimits(l Limits) error {
	if cg.v2 {
		return cg.write([][2]string{
			{"pids.max", strconv.Itoa(l.Pids)},
			{"memory.max", strconv.FormatInt(l.MemoryBytes, 10)},
			{"memory.swap.max", "0"},
			{"cpu.max", fmt.Sprintf("%d 100000", l.CPUMillis*100)},
		}, "memory.swap.max")
	}
	mem := strconv.FormatInt(l.MemoryBytes, 10)
	// memsw (memory+swap) must stay >= the memory limit at every step:
	// lift it, set the limit, then bring it down to the limit (no swap).
	return cg.write([][2]string{
		{"pids/pids.max", strconv.Itoa(l.Pids)},
		{"memory/memory.memsw.limit_in_bytes", "-1"},
		{"memory/memory.limit_in_bytes", mem},
		{"memory/memory.memsw.limit_in_bytes", mem},
		{"memory/memory.swappiness", "0"},
		{"cpu/cpu.cfs_period_us", "100000"},
		{"cpu/cpu.cfs_quota_us", strconv.Itoa(l.CPUMillis * 100)},
	}, "memory/memory.memsw.limit_in_bytes", "memory/memory.swappiness")
}

// write sets each "controller/file" (v1) or "file" (v2); files named in
// optional may be missing (no swap accounting on this kernel).
func (cg *cgroup) write(kv [][2]string, optional ...string) error {
	for _, p := range kv {
		k, v := p[0], p[1]
		p := cg.path(k)
		if err := os.WriteFile(p, []byte(v), 0); err != nil {
			opt := false
			for _, o := range optional {
				opt = opt || o == k
			}
			if opt && (errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EACCES)) {
				continue
			}
			return fmt.Errorf("cgroup: write %s: %w", p, err)
		}
	}
	return nil
}

// path maps "controller/file" to its file.
func (cg *cgroup) path(k string) string {
	if cg.v2 {
		return filepath.Join(cg.dirs[""], filepath.Base(k))
	}
	c, f, _ := strings.Cut(k, "/")
	return filepath.Join(cg.dirs[c], f)
}

// startIn runs start (a fork) so that the child is born inside the group,
// with no migration afterwards. Migrating a process takes the global
// threadgroup lock, whose write side waits for an RCU grace period (~5-10
// ms on small VMs); moving only the current thread (v1: "0" into tasks)
// does not take it, and a child inherits the forking thread's groups. On
// v2 the child is cloned straight into the group (CLONE_INTO_CGROUP via
// set). The thread used is one of threads' (a thread locked to its
// goroutine); leave runs on it last, after the caller has its result, to
// take it back to sandboxd's own namespaces and CPUs, and reports whether
// it could. A thread left in a sandbox's group or namespaces is discarded,
// never reused.
func (cg *cgroup) startIn(threads *forkThreads, home *cgroup, prepare func() error, set func(cgroupFD int), start func() error, leave func() bool) error {
	errc := make(chan error, 1)
	threads.run(func() (clean bool) {
		defer func() { clean = leave() && clean }()
		// The groups' files first, from sandboxd's own mount namespace
		// (prepare moves this thread into the sandbox's).
		if !cg.v2 {
			if home == nil {
				errc <- errors.New("cgroup: sandboxd's own groups are unknown")
				return true
			}
			if err := errors.Join(cg.openTasks(), home.openTasks()); err != nil {
				errc <- err
				return true
			}
		}
		if err := prepare(); err != nil {
			errc <- err
			return true
		}
		if cg.v2 {
			fd, err := unix.Open(cg.dirs[""], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				errc <- fmt.Errorf("cgroup: open %s: %w", cg.dirs[""], err)
				return true
			}
			defer unix.Close(fd)
			set(fd)
			errc <- start()
			return true
		}
		if err := cg.enter(); err != nil {
			errc <- err
			return false
		}
		errc <- start()
		// Go home, so the group can be removed as soon as the sandbox
		// is gone; after the caller has gone on: the child is born
		// already.
		return home.enter() == nil
	})
	return <-errc
}

// threadGroups maps each v1 controller to this thread's group in it.
func threadGroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// procs lists the pids in the group (from the pids controller on v1).
func (cg *cgroup) procs() []int {
	d := cg.dirs["pids"]
	if cg.v2 {
		d = cg.dirs[""]
	}
	b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// killAllBut SIGKILLs every process in the group except keep, repeating
// until none is left (a process may fork while the list is read; pids.max
// bounds how long that can go on). sandboxd itself is never a target: for
// a moment after startIn, one of its threads is in the group.
func (cg *cgroup) killAllBut(keep int) {
	self := os.Getpid()
	for range 200 {
		n := 0
		for _, p := range cg.procs() {
			if p != keep && p != self {
				_ = syscall.Kill(p, syscall.SIGKILL)
				n++
			}
		}
		if n == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// counters reads the OOM-kill and pids-limit-hit counters.
func (cg *cgroup) counters() (oomKills, pidsMax int64) {
	if cg.v2 {
		return cg.readKey("memory.events", "oom_kill"), cg.readKey("pids.events", "max")
	}
	return cg.readKey("memory/memory.oom_control", "oom_kill"), cg.readKey("pids/pids.events", "max")
}

// readKey returns the value of "key N" in the group's flat-keyed file k.
func (cg *cgroup) readKey(k, key string) int64 {
	f, err := cg.file(k, os.O_RDONLY)
	if err != nil {
		return 0
	}
	var buf [1024]byte
	n, err := f.ReadAt(buf[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0
	}
	return parseKey(string(buf[:n]), key)
}

// parseKey returns the value of "key N" in a flat-keyed file's content.
func parseKey(b, key string) int64 {
	for l := range strings.SplitSeq(b, "\n") {
		k, v, ok := strings.Cut(l, " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// remove kills everything left and removes the directories, retrying while
// the kernel finishes tearing the processes down.
func (cg *cgroup) remove() error {
	cg.closeFiles()
	if cg.v2 && cg.dirs[""] != "" {
		_ = os.WriteFile(filepath.Join(cg.dirs[""], "cgroup.kill"), []byte("1"), 0)
	}
	cg.killAllBut(-1)
	var errs []error
	for _, d := range cg.dirs {
		var err error
		for range 500 {
			if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("cgroup: remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// sweepStale removes empty sandbox groups under parent left by a sandboxd
// that died (its sandboxes died with it: init exits when its control
// socket closes). Groups younger than a minute are left alone in case
// another sandboxd is filling them right now; a group with processes
// cannot be removed at all.
func sweepStale(parent string) {
	var roots []string
	if hasV2Controllers() {
		roots = []string{filepath.Join(cgroupRoot, parent)}
	} else {
		for _, c := range []string{"pids", "memory", "cpu"} {
			roots = append(roots, filepath.Join(cgroupRoot, c, parent))
		}
	}
	for _, r := range roots {
		ents, _ := os.ReadDir(r)
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute {
				_ = os.Remove(filepath.Join(r, e.Name()))
			}
		}
	}
}

// cgroupPool keeps the groups of destroyed sandboxes, emptied, for the next
// ones: creating a group (a directory under each controller, and with it
// the kernel's per-group state, memcg's above all) and removing it again
// costs more than renaming one and rewriting its limits. A group is pooled
// only once every process of its sandbox is gone (its init was reaped: the
// kernel empties a pid namespace before its pid 1 is reaped) and its
// process list is seen empty. What a group carries over is harmless: its
// event counters only grow (an Exec compares them before and after), and
// page cache it was charged for can be reclaimed under the next sandbox's
// limit. No sandbox can read its group's files (/sys/fs/cgroup is masked).
type cgroupPool struct {
	parent string
	max    int // idle groups kept; more are removed

	mu   sync.Mutex
	idle []*cgroup
	own  *cgroup // sandboxd's own groups (v1), where forking threads go back
}

// home returns sandboxd's own v1 groups (those of a thread running an
// unlocked goroutine: see openHomeNS), read once; nil if unknown.
func (p *cgroupPool) home() *cgroup {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.own != nil {
		return p.own
	}
	runtime.LockOSThread()
	groups, err := threadGroups()
	runtime.UnlockOSThread()
	if err != nil {
		return nil
	}
	own := &cgroup{dirs: map[string]string{}}
	for _, c := range []string{"pids", "memory", "cpu"} {
		g, ok := groups[c]
		if !ok {
			return nil
		}
		own.dirs[c] = filepath.Join(cgroupRoot, c, g)
	}
	p.own = own
	return own
}

// get returns a group named id with limits l: a pooled one renamed, or a
// new one.
func (p *cgroupPool) get(id string, l Limits) (*cgroup, error) {
	p.mu.Lock()
	var cg *cgroup
	if n := len(p.idle); n > 0 {
		cg, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if cg != nil {
		if err := cg.reuse(id, l); err == nil {
			return cg, nil
		}
		_ = cg.remove()
	}
	return newCgroup(p.parent, id, l)
}

// put takes back the group of a sandbox whose init has been reaped; a group
// that is not empty, or one more than the pool keeps, is removed (remove
// kills what is left first). A pooled group is renamed at once: no group
// goes by the ID of a destroyed sandbox.
func (p *cgroupPool) put(cg *cgroup) error {
	if !cg.empty() || cg.rename("idle-"+newID()) != nil {
		return cg.remove()
	}
	p.mu.Lock()
	if len(p.idle) < p.max {
		p.idle = append(p.idle, cg)
		cg = nil
	}
	p.mu.Unlock()
	if cg != nil {
		return cg.remove()
	}
	return nil
}

// close removes every idle group.
func (p *cgroupPool) close() error {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	if p.own != nil {
		p.own.closeFiles()
		p.own = nil
	}
	p.mu.Unlock()
	var errs []error
	for _, cg := range idle {
		errs = append(errs, cg.remove())
	}
	return errors.Join(errs...)
}

// reuse renames the group to id (its directories carry the sandbox's ID)
// and writes the limits.
func (cg *cgroup) reuse(id string, l Limits) error {
	if err := cg.rename(id); err != nil {
		return err
	}
	return cg.setLimits(l)
}

// rename renames the group's directory under every controller.
func (cg *cgroup) rename(name string) error {
	for c, d := range cg.dirs {
		nd := filepath.Join(filepath.Dir(d), name)
		if err := os.Rename(d, nd); err != nil {
			return fmt.Errorf("cgroup: rename %s: %w", d, err)
		}
		cg.dirs[c] = nd
	}
	return nil
}

// empty reports whether no process is in the group under any controller.
func (cg *cgroup) empty() bool {
	for _, d := range cg.dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil || len(strings.TrimSpace(string(b))) != 0 {
			return false
		}
	}
	return true
}
