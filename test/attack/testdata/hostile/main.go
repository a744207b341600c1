// Command hostile runs inside a sandbox during the attack tests: it takes
// a case name, tries that one thing and prints "ok" or "errno=NAME" (plus
// details for a few cases). It is built static (CGO_ENABLED=0).
package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Println("usage: hostile CASE [ARG]")
		os.Exit(2)
	}
	arg := ""
	if len(os.Args) > 2 {
		arg = os.Args[2]
	}
	fn, ok := cases[os.Args[1]]
	if !ok {
		fmt.Println("unknown case", os.Args[1])
		os.Exit(2)
	}
	fmt.Println(fn(arg))
}

// result turns an error into the line the tests compare.
func result(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return "errno=" + unix.ErrnoName(errno)
	}
	return "error=" + err.Error()
}

func raw(r1 uintptr, e syscall.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

func sys(nr uintptr, a ...uintptr) error {
	for len(a) < 6 {
		a = append(a, 0)
	}
	_, _, e := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
	return raw(0, e)
}

func connectTCP(port string) error {
	p, _ := strconv.Atoi(port)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrInet4{Port: p, Addr: [4]byte{127, 0, 0, 1}})
}

func socket(domain, typ, proto int) error {
	fd, err := unix.Socket(domain, typ, proto)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

func connectUnix(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrUnix{Name: path})
}

// pty opens a pseudo-terminal master: a tty fd to aim ioctls at.
func pty() (int, error) { return unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY, 0) }

func ioctlPty(cmd uint64) error {
	fd, err := pty()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	c := byte('x')
	return sys(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), uintptr(unsafe.Pointer(&c)))
}

var cases = map[string]func(arg string) string{
	// A1: network
	"connect-tcp": func(port string) string { return result(connectTCP(port)) },
	"connect-addr": func(hostport string) string {
		ap, err := netip.ParseAddrPort(hostport)
		if err != nil {
			return result(err)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return result(err)
		}
		defer unix.Close(fd)
		return result(unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}))
	},
	"raw-socket": func(string) string { return result(socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)) },
	"raw-socket-cloexec": func(string) string {
		return result(socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6))
	},
	"packet-socket": func(string) string { return result(socket(unix.AF_PACKET, unix.SOCK_RAW, 0)) },
	"mptcp-socket":  func(string) string { return result(socket(unix.AF_INET, unix.SOCK_STREAM, 262)) },
	"tcp-socket":    func(string) string { return result(socket(unix.AF_INET, unix.SOCK_STREAM, 0)) },
	"dial-proxy": func(string) string {
		c, err := net.DialTimeout("tcp", "127.0.0.1:3128", 2*time.Second)
		if err == nil {
			c.Close()
		}
		return result(err)
	},
	// A2: namespaces and mounts
	"unshare-user": func(string) string { return result(unix.Unshare(unix.CLONE_NEWUSER)) },
	"unshare-net":  func(string) string { return result(unix.Unshare(unix.CLONE_NEWNET)) },
	"clone-newuser": func(string) string {
		r, _, e := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
		if e == 0 && r == 0 {
			unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
		}
		return result(raw(r, e))
	},
	"setns": func(string) string {
		fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY, 0)
		if err != nil {
			return result(err)
		}
		return result(unix.Setns(fd, unix.CLONE_NEWNET))
	},
	"mount":   func(string) string { return result(unix.Mount("tmpfs", "/tmp", "tmpfs", 0, "")) },
	"umount2": func(string) string { return result(unix.Unmount("/proc", unix.MNT_DETACH)) },
	"open_tree": func(string) string {
		fd, err := unix.OpenTree(unix.AT_FDCWD, "/workspace", unix.OPEN_TREE_CLONE)
		if err == nil {
			unix.Close(fd)
		}
		return result(err)
	},
	"mount_setattr": func(string) string {
		return result(unix.MountSetattr(unix.AT_FDCWD, "/workspace", 0, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}))
	},
	"fsopen": func(string) string {
		fd, err := unix.Fsopen("tmpfs", 0)
		if err == nil {
			unix.Close(fd)
		}
		return result(err)
	},
	"clone3": func(string) string { return result(sys(unix.SYS_CLONE3, 0, 0)) },
	"fork-exec": func(string) string {
		if err := exec.Command("/bin/true").Run(); err != nil {
			return result(err)
		}
		done := make(chan struct{})
		for range 8 {
			go func() { time.Sleep(10 * time.Millisecond); done <- struct{}{} }()
		}
		for range 8 {
			<-done
		}
		return "ok"
	},
	// A3: kernel attack surface
	"bpf":             func(string) string { return result(sys(unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0)) },
	"init_module":     func(string) string { return result(sys(unix.SYS_INIT_MODULE, 0, 0, 0)) },
	"finit_module":    func(string) string { return result(sys(unix.SYS_FINIT_MODULE, 0, 0, 0)) },
	"kexec_load":      func(string) string { return result(sys(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0)) },
	"keyctl":          func(string) string { return result(sys(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, ^uintptr(0)-2, 0)) },
	"add_key":         func(string) string { return result(sys(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0)) },
	"perf_event_open": func(string) string { return result(sys(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0)) },
	"userfaultfd":     func(string) string { return result(sys(unix.SYS_USERFAULTFD, 0)) },
	"io_uring_setup":  func(string) string { return result(sys(unix.SYS_IO_URING_SETUP, 1, 0)) },
	"ptrace":          func(string) string { return result(sys(unix.SYS_PTRACE, unix.PTRACE_TRACEME)) },
	"getppid":         func(string) string { return result(sys(unix.SYS_GETPPID)) },
	// A4: terminal injection
	"tiocsti":    func(string) string { return result(ioctlPty(unix.TIOCSTI)) },
	"tiocsti-hi": func(string) string { return result(ioctlPty(1<<32 | unix.TIOCSTI)) },
	"tioclinux":  func(string) string { return result(ioctlPty(unix.TIOCLINUX)) },
	"tiocgwinsz": func(string) string {
		fd, err := pty()
		if err != nil {
			return result(err)
		}
		_, err = unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
		return result(err)
	},
	"setsid": func(string) string {
		_, err := unix.Setsid() // already a session leader: EPERM is the proof
		return result(err)
	},
	// A5: filesystem
	"write-file": func(p string) string {
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		return result(err)
	},
	"read-file": func(p string) string {
		_, err := os.ReadFile(p)
		return result(err)
	},
	"rename-out": func(string) string {
		if err := os.WriteFile("/workspace/r", []byte("x"), 0o644); err != nil {
			return result(err)
		}
		return result(unix.Rename("/workspace/r", "/tmp/r"))
	},
	// A6: privileges
	"status": func(string) string {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return result(err)
		}
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			switch k {
			case "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid":
				out = append(out, k+"="+strings.Join(strings.Fields(v), ","))
			}
		}
		var rl unix.Rlimit
		_ = unix.Getrlimit(unix.RLIMIT_CORE, &rl)
		out = append(out, fmt.Sprintf("core=%d,%d", rl.Cur, rl.Max))
		return strings.Join(out, " ")
	},
	// A6: run a setuid-root program (a copy of this one) and report what
	// it got: its "status" line.
	"exec-status": func(p string) string {
		out, err := exec.Command(p, "status").Output()
		if err != nil {
			return result(err)
		}
		return strings.TrimSpace(string(out))
	},
	// A7: descriptors
	"fds": func(string) string {
		// Raw calls: os.Open would add the runtime poller's own fds.
		d, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return result(err)
		}
		buf := make([]byte, 8192)
		n, err := unix.ReadDirent(d, buf)
		if err != nil {
			return result(err)
		}
		_, _, names := unix.ParseDirent(buf[:n], -1, nil)
		var fds []string
		for _, name := range names {
			if name != strconv.Itoa(d) { // the directory being read
				fds = append(fds, name)
			}
		}
		return "fds=" + strings.Join(fds, ",")
	},
	// A7: runc CVE-2024-21626 reached a host directory by chdir to
	// /proc/self/fd/N of a leaked descriptor. Every open descriptor is
	// tried; each must refuse (ENOTDIR: none is a directory).
	"fd-chdir": func(string) string {
		var out []string
		for fd := 0; fd < 64; fd++ {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
				continue // not open
			}
			out = append(out, strings.TrimPrefix(result(unix.Chdir(fmt.Sprintf("/proc/self/fd/%d", fd))), "errno="))
		}
		return "fd-chdir=" + strings.Join(out, ",")
	},
	// A7: the init's descriptors and root (/proc/1/fd, /proc/1/root).
	"list-dir": func(path string) string {
		_, err := os.ReadDir(path)
		return result(err)
	},
	// A8: host reach
	"kill": func(pid string) string {
		p, _ := strconv.Atoi(pid)
		return result(unix.Kill(p, 0))
	},
	"kill-self": func(string) string { return result(unix.Kill(os.Getpid(), 0)) },
	// A9: other Unix sockets
	"connect-unix":     func(p string) string { return result(connectUnix(p)) },
	"connect-abstract": func(name string) string { return result(connectUnix("@" + name)) },
	// B1: fork bomb
	"forkbomb": func(string) string {
		n := 0
		for {
			c := exec.Command("/bin/sleep", "60")
			if err := c.Start(); err != nil {
				return fmt.Sprintf("%s n=%d", result(err), n)
			}
			n++
			if n > 100000 {
				return "ok"
			}
		}
	},
	// B2: memory bomb
	"membomb": func(string) string {
		var keep [][]byte
		for {
			b := make([]byte, 8<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
		}
	},
	// B3: outlive the deadline, with a detached grandchild
	"sleep": func(tag string) string {
		c := exec.Command("/bin/sh", "-c", "setsid /bin/sleep 1000"+tag+" &")
		_ = c.Run()
		time.Sleep(time.Hour)
		return "ok"
	},
	// B4: output flood
	"flood": func(n string) string {
		size, _ := strconv.Atoi(n)
		buf := []byte(strings.Repeat("A", 4096))
		for w := 0; w < size; w += len(buf) {
			os.Stdout.Write(buf)
		}
		return ""
	},
	// B5: fill the workspace
	"fill": func(string) string {
		f, err := os.Create("/workspace/fill")
		if err != nil {
			return result(err)
		}
		buf := make([]byte, 1<<20)
		for {
			if _, err := f.Write(buf); err != nil {
				return result(err)
			}
		}
	},
}
