package sandboxd

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// InitArg is the hidden first argument that turns the sandboxd binary into
// a sandbox's init. cmd/sandboxd checks for it before anything else.
const InitArg = "__sluice-sandbox-init"

// ctlFD is the control socket's descriptor in the init.
const ctlFD = 3

var (
	errClosed = errors.New("closed")
	errGroups = errors.New("init must start without supplementary groups")
)

// RunInit is the sandbox's pid 1. It builds the sandbox from the setup
// message, confines itself (and so every process it will start), then
// starts commands on request and reaps every child. It never returns; it
// exits when the control socket closes, which tears the pid namespace down.
func RunInit() {
	// Privilege state is per thread: do every privileged step and every
	// fork from this one thread.
	runtime.LockOSThread()
	unix.CloseOnExec(ctlFD)
	_ = unix.CloseRange(ctlFD+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	c, err := newInitCtlConn(ctlFD)
	if err != nil {
		os.Exit(120)
	}
	// Before any code of the sandbox runs: signals it sends to its pid 1
	// must not kill it.
	if err := ignoreSignals(); err != nil {
		os.Exit(124)
	}
	var s setupMsg
	if _, err := c.recv(&s); err != nil {
		os.Exit(121)
	}
	// The re-adoption socket, bound while the init may still make files
	// (before its root and Landlock): after confinement it only accepts.
	ln := -1
	if s.CtlSock != "" {
		if ln, err = listenCtl(s.CtlSock); err != nil {
			_ = c.send(replyMsg{Error: err.Error()})
			os.Exit(122)
		}
	}
	// The network first: once lo is up sandboxd opens the sandbox's
	// listeners in its namespace while this process builds the root.
	if err := setupNet(s); err != nil {
		_ = c.send(replyMsg{Error: err.Error()})
		os.Exit(122)
	}
	if err := c.send(replyMsg{NetReady: true}); err != nil {
		os.Exit(123)
	}
	if err := setupSandbox(s); err != nil {
		_ = c.send(replyMsg{Error: err.Error()})
		os.Exit(122)
	}
	// Built and confined: sandboxd may go on (open nothing more, hand
	// the sandbox out) while this process readies itself to serve. No
	// code of the sandbox runs before the first exec message, which is
	// read only once the handlers and the reaper below are in place.
	if err := c.send(replyMsg{}); err != nil {
		os.Exit(123)
	}
	r := newReaper()
	// Started with GOGC=off: no collection during the build. From here
	// on it serves execs for as long as the sandbox lives, and collects.
	debug.SetGCPercent(100)
	for {
		var m execMsg
		fds, err := c.recv(&m)
		if err != nil {
			// sandboxd is gone: wait for the next one, or end.
			if c = reattach(c, ln, s.AdoptWaitMS); c == nil {
				os.Exit(0)
			}
			continue
		}
		pid, err := startChild(m, fds, s.UID, s.GID)
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err != nil {
			_ = c.send(replyMsg{Error: err.Error()})
			continue
		}
		_ = c.send(replyMsg{Started: true})
		ws := r.waitExit(pid)
		rep := replyMsg{Exited: true, Code: ws.ExitStatus()}
		if ws.Signaled() {
			rep.Code, rep.Signal = 128+int(ws.Signal()), int(ws.Signal())
		}
		if err := c.send(rep); err != nil {
			if c = reattach(c, ln, s.AdoptWaitMS); c == nil {
				os.Exit(0)
			}
		}
	}
}

// listenCtl binds the re-adoption socket at path.
func listenCtl(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("init: control socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("init: control socket: bind %s: %w", path, err)
	}
	if err := unix.Listen(fd, 4); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("init: control socket: %w", err)
	}
	return fd, nil
}

// reattach closes the dead control connection and waits up to waitMS for
// a new sandboxd on ln; nil when none came (or there is no ln). Only a
// peer outside this pid namespace is taken (SO_PEERCRED reports pid 0 for
// a process this namespace cannot see): no process of the sandbox, which
// can reach the same socket only if it could reach the host path, is ever
// a control peer. What a control peer can ask is no more than a confined
// process may do anyway (see ctlConn).
func reattach(c *ctlConn, ln int, waitMS int64) *ctlConn {
	unix.Close(c.fd)
	if ln < 0 || waitMS <= 0 {
		return nil
	}
	deadline := time.Now().Add(time.Duration(waitMS) * time.Millisecond)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		pfd := []unix.PollFd{{Fd: int32(ln), Events: unix.POLLIN}}
		ts := unix.NsecToTimespec(left.Nanoseconds())
		n, err := unix.Ppoll(pfd, &ts, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil, n == 0: // timed out
			return nil
		}
		nfd, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
		if err != nil {
			continue
		}
		cred, err := unix.GetsockoptUcred(nfd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil || cred.Pid != 0 {
			unix.Close(nfd)
			continue
		}
		nc, err := newInitCtlConn(nfd)
		if err != nil {
			unix.Close(nfd)
			continue
		}
		return nc
	}
}

// startChild forks and execs m.Argv with fds as 0, 1, 2, in a new session,
// as uid and gid.
func startChild(m execMsg, fds []int, uid, gid int) (int, error) {
	if len(m.Argv) == 0 || len(fds) != 3 {
		return 0, fmt.Errorf("exec: need argv and 3 fds")
	}
	path, err := lookPath(m.Argv[0], m.Env)
	if err != nil {
		return 0, err
	}
	dir := m.Dir
	if dir == "" {
		dir = "/workspace"
	}
	// The command runs as the sandbox's uid and gid (the init's are its
	// own, confine); its supplementary groups are the init's: none. The
	// init's capabilities end at exec (empty bounding set, no file
	// capabilities under no_new_privs).
	pid, err := syscall.ForkExec(path, m.Argv, &syscall.ProcAttr{
		Dir:   dir,
		Env:   m.Env,
		Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])},
		Sys: &syscall.SysProcAttr{Setsid: true,
			Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}},
	})
	if err != nil {
		return 0, fmt.Errorf("exec %s: %w", m.Argv[0], err)
	}
	return pid, nil
}

// lookPath resolves name on the PATH of env.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec %s: not found in PATH %s: %w", name, path, os.ErrNotExist)
}

// reaper waits for every child, including orphans re-parented to pid 1,
// and hands the status of the ones being waited for to their waiter.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan syscall.WaitStatus
	done    map[int]syscall.WaitStatus
	// forgotten are children whose status waitExit already has: the
	// reaper reaps them and drops the status.
	forgotten map[int]bool
}

func newReaper() *reaper {
	r := &reaper{waiting: map[int]chan syscall.WaitStatus{}, done: map[int]syscall.WaitStatus{}, forgotten: map[int]bool{}}
	go r.loop()
	return r
}

func (r *reaper) loop() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			// ECHILD: no child yet; block until the next start.
			<-childStarted
			continue
		}
		r.mu.Lock()
		if ch, ok := r.waiting[pid]; ok {
			delete(r.waiting, pid)
			ch <- ws
		} else if r.forgotten[pid] {
			delete(r.forgotten, pid)
		} else if len(r.done) < 4096 {
			r.done[pid] = ws
		}
		r.mu.Unlock()
	}
}

// waitExit waits on this thread until pid has exited and returns its
// status. It does not reap pid (waitid WNOWAIT): the reaper does, as it
// does every child, so no status goes missing and no zombie stays. Waiting
// here rather than for the reaper's hand-over saves two thread switches
// on every exec; when the reaper was faster (pid is gone: ECHILD), its
// hand-over delivers the status.
func (r *reaper) waitExit(pid int) syscall.WaitStatus {
	r.mu.Lock()
	if ws, ok := r.done[pid]; ok {
		delete(r.done, pid)
		r.mu.Unlock()
		return ws
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiting[pid] = ch
	r.mu.Unlock()
	select {
	case childStarted <- struct{}{}:
	default:
	}
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return <-ch // reaped already: the reaper hands the status over
		}
		break
	}
	r.mu.Lock()
	if _, ok := r.waiting[pid]; ok {
		// The reaper has not reaped it yet; it will find no waiter and
		// must not keep the status: mark it as forgotten.
		delete(r.waiting, pid)
		r.forgotten[pid] = true
	}
	r.mu.Unlock()
	return exitStatus(&info)
}

// si_code values of SIGCHLD (include/uapi/asm-generic/siginfo.h).
const (
	cldExited = 1
	cldDumped = 3
)

// exitStatus turns a CLD_* siginfo of waitid into a wait status.
func exitStatus(info *unix.Siginfo) syscall.WaitStatus {
	// After signo, errno, code and padding: si_pid, si_uid, si_status.
	b := (*[128]byte)(unsafe.Pointer(info))
	status := int(*(*int32)(unsafe.Pointer(&b[24])))
	switch info.Code {
	case cldExited:
		return syscall.WaitStatus(status&0xff) << 8
	case cldDumped:
		return syscall.WaitStatus(status&0x7f | 0x80)
	default: // CLD_KILLED
		return syscall.WaitStatus(status & 0x7f)
	}
}

// childStarted wakes the reaper after a fork when it had nothing to wait for.
var childStarted = make(chan struct{}, 1)

// initSignals are the signals code inside the sandbox may send its pid 1
// (SIGKILL and SIGSTOP from inside the pid namespace the kernel ignores).
var initSignals = []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP,
	syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM}

// ignoreSignals sets initSignals to be ignored, in the kernel. The Go
// runtime installs a handler for each, whose default is to exit; ignored,
// they never reach the init (or are dropped when it would take them). This
// is what signal.Notify achieved, without the thread os/signal starts and a
// hand-over to it per signal, which cost the first exec hundreds of
// microseconds. (Not the default action: the kernel drops a default-action
// signal sent to a pid namespace's init from inside, but not while one of
// the init's threads happens to block it, as the runtime does around every
// clone; then the signal kills the whole init.) The runtime still counts
// the signals as its own, so a child it forks (ForkExec) gets them back at
// the default action before it execs: commands inside see no difference.
func ignoreSignals() error {
	// A signal ignored when this process started (sandboxd run under
	// nohup, or from a shell's background job) is not the runtime's: Go
	// leaves SIGHUP and SIGINT ignored then, and a child would inherit
	// them ignored. Notify makes them the runtime's, so ForkExec resets
	// them for commands like the rest. (The channel is never read: ignored
	// in the kernel below, they are never delivered.)
	var inherited []os.Signal
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT} {
		if signal.Ignored(sig) {
			inherited = append(inherited, sig)
		}
	}
	if len(inherited) > 0 {
		signal.Notify(make(chan os.Signal, 1), inherited...)
	}
	act := [4]uint64{1} // struct sigaction: SIG_IGN, no flags, no restorer, empty mask
	for _, sig := range initSignals {
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
			return fmt.Errorf("init: signal %d: %w", sig, e)
		}
	}
	return nil
}

// setupNet names the host. The network namespace is sandboxd's (nsSet),
// made with lo up.
func setupNet(s setupMsg) error {
	if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
		return fmt.Errorf("init: hostname: %w", err)
	}
	return nil
}

// setupSandbox builds the root, pivots into it and confines this process.
func setupSandbox(s setupMsg) error {
	if err := buildRoot(s); err != nil {
		return err
	}
	return confine(s)
}

// loopbackUp brings lo up in the calling thread's network namespace: the
// sandbox's only interface, where sandboxd's listeners live.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("init: lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("init: lo: %w", err)
	}
	ifr.SetUint16(unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("init: lo up: %w", err)
	}
	return nil
}

// systemDirs are bound read-only from the rootfs (symlinks are copied).
var systemDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt"}

// maskedFiles are hidden behind /dev/null; maskedDirs behind an empty
// read-only tmpfs. Paths are relative to the new root.
var (
	maskedFiles = []string{
		"etc/shadow", "etc/shadow-", "etc/gshadow", "etc/gshadow-", "etc/sudoers", "etc/machine-id",
		"proc/kcore", "proc/sysrq-trigger", "proc/timer_list", "proc/keys", "proc/latency_stats",
		"proc/sched_debug", "proc/kallsyms", "proc/kmsg", "proc/config.gz",
	}
	maskedDirs = []string{"etc/ssh", "etc/sudoers.d", "proc/acpi", "proc/scsi", "proc/asound", "sys/firmware", "sys/kernel/security", "sys/fs/cgroup"}
	roProc     = []string{"proc/sys", "proc/irq", "proc/bus", "proc/fs"}
)

const (
	roFlags  = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV
	tmpFlags = unix.MS_NOSUID | unix.MS_NODEV
)

func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("init: mount %s on %s: %w", src, dst, err)
	}
	return nil
}

// bindRO binds src on dst recursively and makes the whole tree read-only,
// nosuid, nodev. mount_setattr(AT_RECURSIVE) is needed in a user namespace:
// the host's submounts are locked and a plain remount would fail.
func bindRO(src, dst string) error {
	if err := mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(unix.AT_FDCWD, dst, unix.AT_RECURSIVE, attr); err != nil {
		return fmt.Errorf("init: read-only %s: %w", dst, err)
	}
	return nil
}

// buildRoot makes the sandbox's root at s.RootDir: a recursive bind of the
// mount template (see mountTemplate), then what is per sandbox on top of
// it, then pivot_root into it.
func buildRoot(s setupMsg) error {
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	root := s.RootDir
	// Recursive: the template's submounts come along, still read-only and
	// now locked (this mount namespace belongs to the sandbox's user
	// namespace), so none can be unmounted to reveal what it covers.
	if err := mount(s.Template, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	in := func(p string) string { return filepath.Join(root, p) }
	if err := mount("proc", in("proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	// /sys came with the template (nsSet mounts it).
	if err := mount("devpts", in("dev/pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	if err := mount("tmpfs", in("dev/shm"), "tmpfs", tmpFlags|unix.MS_NOEXEC,
		fmt.Sprintf("size=%d,mode=1777", s.TmpBytes)); err != nil {
		return err
	}
	if err := mount("tmpfs", in("workspace"), "tmpfs", tmpFlags,
		fmt.Sprintf("size=%d,mode=755,uid=%d,gid=%d", s.WorkspaceBytes, s.UID, s.GID)); err != nil {
		return err
	}
	if err := mount("tmpfs", in("tmp"), "tmpfs", tmpFlags, fmt.Sprintf("size=%d,mode=1777", s.TmpBytes)); err != nil {
		return err
	}
	if err := mount("tmpfs", in("run"), "tmpfs", tmpFlags|unix.MS_NOEXEC, "size=64k,mode=755"); err != nil {
		return err
	}
	if err := os.Mkdir(in("run/sluice"), 0o755); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if s.RunDir != "" {
		if err := bindRO(s.RunDir, in("run/sluice")); err != nil {
			return err
		}
	}
	// /etc/hosts and /etc/hostname name this sandbox, /etc/passwd and
	// /etc/group its users (sandboxd wrote them into s.EtcDir); /etc/resolv.conf is the template's unless the
	// rootfs links it into /run, which is this sandbox's own.
	for _, f := range []struct{ name, file string }{
		{"resolv.conf", in(".sluice/resolv.conf")},
		{"hosts", filepath.Join(s.EtcDir, "hosts")},
		{"hostname", filepath.Join(s.EtcDir, "hostname")},
		{"passwd", filepath.Join(s.EtcDir, "passwd")},
		{"group", filepath.Join(s.EtcDir, "group")},
	} {
		if err := overlayEtc(root, f.name, f.file); err != nil {
			return err
		}
	}
	for _, p := range roProc {
		if _, err := os.Stat(in(p)); err == nil {
			if err := bindRO(in(p), in(p)); err != nil {
				return err
			}
		}
	}
	for _, p := range maskedFiles {
		if etcMask(p) {
			continue // in the template
		}
		if st, err := os.Lstat(in(p)); err == nil && st.Mode().IsRegular() {
			if err := mount("/dev/null", in(p), "", unix.MS_BIND, ""); err != nil {
				return err
			}
		}
	}
	for _, p := range maskedDirs {
		if etcMask(p) {
			continue // in the template
		}
		if st, err := os.Lstat(in(p)); err == nil && st.IsDir() {
			if err := mount("tmpfs", in(p), "tmpfs", roFlags|unix.MS_NOEXEC, "size=0,mode=755"); err != nil {
				return err
			}
		}
	}
	if err := os.Chdir(root); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("init: pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("init: detach old root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	// Already read-only (and locked so) from the template; said again so
	// that the root's state does not hang on the template's alone.
	if err := mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|roFlags, ""); err != nil {
		return err
	}
	return nil
}

// overlayEtc binds file over root/etc/name. When the rootfs's entry is a
// symlink (systemd-resolved's resolv.conf), the file is written at the
// link's target instead, which must lie in the sandbox's own /run.
func overlayEtc(root, name, file string) error {
	dst := filepath.Join(root, "etc", name)
	st, err := os.Lstat(dst)
	switch {
	case err != nil:
		return nil // no /etc entry: nothing to shadow
	case st.Mode().IsRegular() && name == "resolv.conf":
		return nil // the template's bind
	case st.Mode().IsRegular():
		return mount(file, dst, "", unix.MS_BIND, "")
	case st.Mode()&os.ModeSymlink != 0:
		t, err := os.Readlink(dst)
		if err != nil {
			return fmt.Errorf("init: %w", err)
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join("/etc", t)
		}
		t = filepath.Clean(t)
		if !strings.HasPrefix(t, "/run/") || strings.HasPrefix(t, "/run/sluice/") {
			return fmt.Errorf("init: /etc/%s links to %s, outside the sandbox's /run", name, t)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("init: %w", err)
		}
		p := filepath.Join(root, t)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("init: %w", err)
		}
		return os.WriteFile(p, b, 0o644)
	}
	return nil
}

// buildDev makes the template's minimal /dev: a few host device nodes
// bound in, mount points for each sandbox's private devpts and /dev/shm,
// and the usual links; then it makes it read-only.
func buildDev(dev string) error {
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,mode=755"); err != nil {
		return err
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		p := filepath.Join(dev, n)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return fmt.Errorf("init: %w", err)
		}
		if err := mount("/dev/"+n, p, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return fmt.Errorf("init: %w", err)
		}
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("init: %w", err)
		}
	}
	return mount("", dev, "", unix.MS_REMOUNT|unix.MS_BIND|roFlags|unix.MS_NOEXEC, "")
}

// confine drops every privilege: capability bounding set (this thread, the
// one that forks), groups, gid and uid (all threads; the uid is the init's
// own, s.InitUID, never the commands'), remaining capability sets (none,
// but CAP_SETUID and CAP_SETGID on this thread), then no_new_privs and
// seccomp (all threads), then Landlock (all threads), and makes this
// process undumpable so no code can read or write its memory through /proc.
//
// Each all-threads step stops the world and signals every thread of the
// init, so there are as few as the end state allows: no_new_privs reaches
// every thread with the seccomp filter (SECCOMP_FILTER_FLAG_TSYNC: one
// call, no signals), which is what landlock_restrict_self then requires of
// each thread; go-landlock's Restrict would set it with one more
// all-threads call. The filter does not refuse the Landlock calls. The end
// state: every thread has uid s.InitUID and gid s.GID, no capabilities (but
// initCaps on this thread), no_new_privs, the filter and the Landlock
// domain before anything of the sandbox runs; each command starts as
// s.UID/s.GID with no capabilities (startChild).
func confine(s setupMsg) error {
	last := 40
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &last)
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("init: drop bounding cap %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("init: clear ambient caps: %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("init: rlimit core: %w", err)
	}
	// The init was started with setgroups(0) (SysProcAttr.Credential
	// with no Groups) and nothing sets them since; threads inherit them.
	// Verified, not set again: setting them would be one more
	// all-threads call (a stop of the world and a signal to each thread).
	if gs, err := unix.Getgroups(); err != nil || len(gs) != 0 {
		return fmt.Errorf("init: supplementary groups %v: %w", gs, errors.Join(err, errGroups))
	}
	// The all-threads steps below wait, spinning, until every other
	// thread of this process has run its share; on a busy machine a
	// thread waiting for a CPU makes that wait (and the CPU it burns)
	// last milliseconds. On this thread's CPU, each yield of the wait
	// hands the CPU to them.
	if len(s.Affinity) > 0 {
		// Born on one CPU (sandboxd pinned it): every thread is there
		// already. Confined, they all get the mask they would have had.
		defer restoreAffinity(s.Affinity)
	} else {
		defer pinThreads()()
	}
	// syscall.Set* apply to every thread of the process (CGO_ENABLED=0).
	// sandboxd starts the init with the sandbox's gid already (every
	// thread inherits it), which saves one all-threads call; any other gid
	// is set here.
	if r, e, sv := unix.Getresgid(); r != s.GID || e != s.GID || sv != s.GID {
		if err := syscall.Setresgid(s.GID, s.GID, s.GID); err != nil {
			return fmt.Errorf("init: setgid: %w", err)
		}
	}
	// The init runs as a uid of its own (THREATS A13): the kernel lets a
	// process without capabilities signal, prlimit, renice, reschedule or
	// trace only processes of its own uid, so no command can reach its
	// init by pid 1 or by any of the init's thread ids. This thread (the
	// one that forks) keeps CAP_SETUID and CAP_SETGID, permitted and
	// effective, to start each command as s.UID; keep-caps and the other
	// threads' sets are per thread, so every other thread has none. The
	// bounding set is empty already: a command loses both at exec.
	if s.InitUID == s.UID || s.InitUID <= 0 {
		return fmt.Errorf("init: init uid %d must differ from the sandbox uid %d and from 0", s.InitUID, s.UID)
	}
	if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("init: keep caps: %w", err)
	}
	if err := syscall.Setresuid(s.InitUID, s.InitUID, s.InitUID); err != nil {
		return fmt.Errorf("init: setuid: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("init: keep caps: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	data[0].Permitted = initCaps
	data[0].Effective = initCaps
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("init: capset: %w", err)
	}
	prog, err := decodeSeccomp(s.Seccomp)
	if err != nil {
		return err
	}
	if err := loadSeccomp(prog); err != nil {
		return err
	}
	if err := restrictLandlock(s); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("init: dumpable: %w", err)
	}
	return nil
}

// initCaps are the capabilities the init's forking thread keeps: enough
// to start a command as the sandbox's uid and gid (startChild), nothing
// else. They hold only inside the sandbox's user namespace.
const initCaps = 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID

// restrictLandlock applies the best policy this kernel's Landlock ABI
// offers: system paths read/execute only, /workspace, /tmp and /dev/shm
// writable, device files usable, TCP connect only to the proxy and DNS
// ports, no abstract Unix sockets or signals outside the sandbox.
//
// It enforces the ruleset itself (go-landlock's Restrict would first set
// no_new_privs on every thread, one more all-threads call): with TSYNC on
// kernels that have it (Landlock ABI 8), else on each thread through
// AllThreadsSyscall. Every thread must already have no_new_privs (confine
// loads the seccomp filter first).
func restrictLandlock(s setupMsg) error {
	fd, flags, err := landlock.V7.BestEffort().NewRulesetFD(
		landlock.PathAccess(landlock.AccessFSSet(llsys.AccessFSReadDir), "/"),
		landlock.RODirs("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys", "/run", "/.sluice").IgnoreIfMissing(),
		landlock.RWDirs("/workspace", "/tmp", "/dev/shm"),
		landlock.RWFiles("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty").WithIoctlDev(),
		landlock.RWDirs("/dev/pts").WithIoctlDev(),
		landlock.ROFiles("/dev/ptmx").IgnoreIfMissing(),
		landlock.ConnectTCP(uint16(s.ProxyPort)),
		landlock.ConnectTCP(uint16(s.DNSPort)),
	)
	if err != nil {
		return fmt.Errorf("init: landlock: %w", err)
	}
	if fd < 0 {
		return nil // no Landlock on this kernel (best effort, as before)
	}
	defer unix.Close(fd)
	if abi, _ := llsys.LandlockGetABIVersion(); abi >= 8 {
		err = llsys.LandlockRestrictSelf(fd, flags|llsys.FlagRestrictSelfTSync)
	} else {
		err = llsys.AllThreadsLandlockRestrictSelf(fd, flags)
	}
	if err != nil {
		return fmt.Errorf("init: landlock: restrict: %w", err)
	}
	return nil
}

// pinThreads moves every thread of this process onto the CPU this thread
// runs on and returns the function that gives them back this thread's
// previous affinity (threads started meanwhile included). Affinity is no
// part of the confinement: it only makes confine's all-threads steps
// cheaper, and a failure leaves it as it was.
func pinThreads() (restore func()) {
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return func() {}
	}
	var cpu uint32
	if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); e != 0 {
		return func() {}
	}
	var one unix.CPUSet
	one.Set(int(cpu))
	for _, tid := range threadIDs() {
		_ = unix.SchedSetaffinity(tid, &one)
	}
	return func() {
		for _, tid := range threadIDs() {
			_ = unix.SchedSetaffinity(tid, &old)
		}
	}
}

// restoreAffinity gives every thread of this process the CPU mask words.
func restoreAffinity(words []uint64) {
	var set unix.CPUSet
	for i, w := range words {
		for b := 0; b < 64; b++ {
			if w&(1<<b) != 0 {
				set.Set(i*64 + b)
			}
		}
	}
	if set.Count() == 0 {
		return
	}
	for _, tid := range threadIDs() {
		_ = unix.SchedSetaffinity(tid, &set)
	}
}

// threadIDs lists this process's threads.
func threadIDs() []int {
	f, err := os.Open("/proc/self/task")
	if err != nil {
		return nil
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	tids := make([]int, 0, len(names))
	for _, n := range names {
		if tid, err := strconv.Atoi(n); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids
}
