package main

// Cases for THREATS A11 (socket families), A12 (TCP Fast Open) and A13 (the
// sandbox's init), registered into cases.

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func init() {
	for k, v := range reachCases {
		cases[k] = v
	}
}

// highBits are family (or protocol) values whose low 32 bits name
// something and whose high bits are set: the kernel takes an int, so
// without a 64-bit check they would be AF_VSOCK, AF_INET, AF_UNIX, -1.
var highBits = []uint64{1<<32 | unix.AF_VSOCK, 1<<32 | unix.AF_INET, 1<<63 | unix.AF_UNIX, 0xffffffff, 1<<31 | unix.AF_VSOCK}

// sweep calls open(v) for each v and reports which opened and which failed
// with anything but want: "open=1,2 other=none n=56".
func sweep(vals []uint64, want syscall.Errno, open func(v uint64) error) string {
	var opened, other []string
	for _, v := range vals {
		err := open(v)
		switch {
		case err == nil:
			opened = append(opened, strconv.FormatUint(v, 10))
		case err != want:
			other = append(other, fmt.Sprintf("%#x:%s", v, result(err)))
		}
	}
	if len(other) == 0 {
		other = []string{"none"}
	}
	return fmt.Sprintf("open=%s other=%s n=%d", strings.Join(opened, ","), strings.Join(other, ","), len(vals))
}

func rawSocket(nr uintptr, fam, typ, proto uint64) error {
	if nr == unix.SYS_SOCKETPAIR {
		var fds [2]int32
		_, _, e := unix.RawSyscall6(nr, uintptr(fam), uintptr(typ), uintptr(proto), uintptr(unsafe.Pointer(&fds)), 0, 0)
		if e != 0 {
			return e
		}
		unix.Close(int(fds[0]))
		unix.Close(int(fds[1]))
		return nil
	}
	fd, _, e := unix.RawSyscall(nr, uintptr(fam), uintptr(typ), uintptr(proto))
	if e != 0 {
		return e
	}
	unix.Close(int(fd))
	return nil
}

func families() []uint64 {
	var fams []uint64
	for f := uint64(0); f <= unix.AF_MAX+3; f++ {
		fams = append(fams, f)
	}
	return append(fams, highBits...)
}

// withTCP runs op on a fresh TCP socket with the loopback address of port
// and reports its result.
func withTCP(port string, op func(fd int, to *unix.SockaddrInet4) error) string {
	p, _ := strconv.Atoi(port)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return result(err)
	}
	defer unix.Close(fd)
	return result(op(fd, &unix.SockaddrInet4{Port: p, Addr: [4]byte{127, 0, 0, 1}}))
}

// rawSockaddr is sa as the kernel reads it.
func rawSockaddr(sa *unix.SockaddrInet4) unix.RawSockaddrInet4 {
	r := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: sa.Addr}
	r.Port = uint16(sa.Port>>8) | uint16(sa.Port&0xff)<<8
	return r
}

// initThreads are the thread ids of pid 1 (as this pid namespace numbers them).
func initThreads() []int {
	ents, _ := os.ReadDir("/proc/1/task")
	var tids []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, n)
		}
	}
	return tids
}

// all runs f on each tid and reports the one result they share, or each.
func all(tids []int, f func(tid int) error) string {
	seen := map[string][]string{}
	var order []string
	for _, t := range tids {
		r := strings.TrimPrefix(result(f(t)), "errno=")
		if _, ok := seen[r]; !ok {
			order = append(order, r)
		}
		seen[r] = append(seen[r], strconv.Itoa(t))
	}
	if len(order) == 1 {
		return order[0]
	}
	var out []string
	for _, r := range order {
		out = append(out, r+"@"+strings.Join(seen[r], "+"))
	}
	return strings.Join(out, ",")
}

var reachCases = map[string]func(arg string) string{
	// A11: every family number 0..AF_MAX+3 and high-bit values; only
	// AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK open, the rest EAFNOSUPPORT.
	"socket-families": func(string) string {
		return sweep(families(), unix.EAFNOSUPPORT, func(f uint64) error {
			return rawSocket(unix.SYS_SOCKET, f, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		})
	},
	"socketpair-families": func(string) string {
		return sweep(families(), unix.EAFNOSUPPORT, func(f uint64) error {
			return rawSocket(unix.SYS_SOCKETPAIR, f, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		})
	},
	// A11: netlink protocols 0..31 and high-bit values: NETLINK_ROUTE only.
	"netlink-protocols": func(string) string {
		var ps []uint64
		for p := uint64(0); p < 32; p++ {
			ps = append(ps, p)
		}
		ps = append(ps, 1<<32|unix.NETLINK_ROUTE, 1<<32|unix.NETLINK_SOCK_DIAG)
		return sweep(ps, unix.EPROTONOSUPPORT, func(p uint64) error {
			return rawSocket(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, p)
		})
	},
	// A11: NETLINK_ROUTE reads the interface list (net.Interfaces), but a
	// change (add an address to lo) is refused by the kernel: no
	// CAP_NET_ADMIN.
	"netlink-route": func(string) string {
		ifs, err := net.Interfaces()
		if err != nil {
			return "read " + result(err)
		}
		var names []string
		for _, i := range ifs {
			names = append(names, i.Name)
		}
		return "read=" + strings.Join(names, ",") + " write=" + result(addLoopbackAddr())
	},
	// "FAM,TYPE,PROTO": one socket() call.
	"socket": func(spec string) string {
		var v [3]uint64
		for i, s := range strings.SplitN(spec, ",", 3) {
			v[i], _ = strconv.ParseUint(s, 0, 64)
		}
		return result(rawSocket(unix.SYS_SOCKET, v[0], v[1], v[2]))
	},
	// "NR,A1,A2,A3": one i386 system call through int $0x80.
	"int80": func(spec string) string {
		if !haveInt80 {
			return "error=no int80 on this architecture"
		}
		var v [4]uintptr
		for i, s := range strings.SplitN(spec, ",", 4) {
			n, _ := strconv.ParseUint(s, 0, 64)
			v[i] = uintptr(n)
		}
		r := int64(int80(v[0], v[1], v[2], v[3]))
		if r < 0 && r > -4096 {
			return result(syscall.Errno(-r))
		}
		return "ok"
	},
	// A12: TCP Fast Open to PORT on loopback, by each call that can send
	// a SYN.
	"tfo-sendto": func(port string) string {
		return withTCP(port, func(fd int, to *unix.SockaddrInet4) error {
			return unix.Sendto(fd, []byte("x"), unix.MSG_FASTOPEN, to)
		})
	},
	"tfo-sendto-hi": func(port string) string {
		return withTCP(port, func(fd int, to *unix.SockaddrInet4) error {
			sa := rawSockaddr(to)
			b := []byte("x")
			_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
				1<<32|unix.MSG_FASTOPEN|unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&sa)), unix.SizeofSockaddrInet4)
			return raw(0, e)
		})
	},
	"tfo-sendmsg": func(port string) string {
		return withTCP(port, func(fd int, to *unix.SockaddrInet4) error {
			return unix.Sendmsg(fd, []byte("x"), nil, to, unix.MSG_FASTOPEN)
		})
	},
	"tfo-sendmmsg": func(port string) string {
		return withTCP(port, func(fd int, to *unix.SockaddrInet4) error {
			sa := rawSockaddr(to)
			b := []byte("x")
			iov := unix.Iovec{Base: &b[0], Len: 1}
			var m struct {
				hdr unix.Msghdr
				n   uint32
				_   uint32
			}
			m.hdr.Name = (*byte)(unsafe.Pointer(&sa))
			m.hdr.Namelen = unix.SizeofSockaddrInet4
			m.hdr.Iov = &iov
			m.hdr.Iovlen = 1
			_, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&m)), 1, unix.MSG_FASTOPEN, 0, 0)
			return raw(0, e)
		})
	},
	"tfo-connect-opt": func(string) string {
		return withTCP("0", func(fd int, _ *unix.SockaddrInet4) error {
			return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1)
		})
	},
	"tfo-connect-opt-hi": func(string) string {
		return withTCP("0", func(fd int, _ *unix.SockaddrInet4) error {
			one := int32(1)
			_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), 1<<32|unix.IPPROTO_TCP, 1<<32|unix.TCP_FASTOPEN_CONNECT,
				uintptr(unsafe.Pointer(&one)), 4, 0)
			return raw(0, e)
		})
	},
	"control-nodelay": func(string) string {
		return withTCP("0", func(fd int, _ *unix.SockaddrInet4) error {
			return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		})
	},
	// The contents of a (small) file, trimmed.
	"cat": func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return result(err)
		}
		return strings.TrimSpace(string(b))
	},
	// A13: every signal 0..64 to pid 1, by kill, by tgkill to each of its
	// threads, by pidfd_send_signal and rt_sigqueueinfo; and SIGSEGV as
	// pid 1's SIGIO (F_SETOWN), which the kernel drops unsent.
	"signal-init": func(string) string {
		var sigs []int
		for s := 0; s <= 64; s++ {
			sigs = append(sigs, s)
		}
		out := []string{"kill=" + all(sigs, func(s int) error { return unix.Kill(1, syscall.Signal(s)) })}
		tids := initThreads()
		for _, s := range []syscall.Signal{unix.SIGSEGV, unix.SIGABRT, unix.SIGTRAP, unix.SIGSYS, unix.SIGBUS, unix.SIGFPE, unix.SIGILL, unix.SIGTERM} {
			out = append(out, fmt.Sprintf("tgkill%d=%s", s, all(tids, func(t int) error { return unix.Tgkill(1, t, s) })))
		}
		pfd, err := unix.PidfdOpen(1, 0)
		if err != nil {
			out = append(out, "pidfd_open="+result(err))
		} else {
			out = append(out, "pidfd_send_signal="+strings.TrimPrefix(result(unix.PidfdSendSignal(pfd, unix.SIGSEGV, nil, 0)), "errno="))
			unix.Close(pfd)
		}
		info := make([]byte, 128)
		*(*int32)(unsafe.Pointer(&info[0])) = int32(unix.SIGSEGV)
		*(*int32)(unsafe.Pointer(&info[8])) = -1 // SI_QUEUE
		out = append(out, "rt_sigqueueinfo="+strings.TrimPrefix(result(sys(unix.SYS_RT_SIGQUEUEINFO, 1, uintptr(unix.SIGSEGV), uintptr(unsafe.Pointer(&info[0])))), "errno="))
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err == nil {
			_, _ = unix.FcntlInt(uintptr(p[0]), unix.F_SETOWN, 1)
			_, _ = unix.FcntlInt(uintptr(p[0]), unix.F_SETSIG, int(unix.SIGSEGV))
			fl, _ := unix.FcntlInt(uintptr(p[0]), unix.F_GETFL, 0)
			_, _ = unix.FcntlInt(uintptr(p[0]), unix.F_SETFL, fl|unix.O_ASYNC)
			_, _ = unix.Write(p[1], []byte("x"))
			out = append(out, "sigio=written")
		}
		return strings.Join(out, " ")
	},
	// A13: limits, priority, scheduling and affinity of pid 1 and of each
	// of its threads, ptrace and /proc/1/mem; PRIO_USER of the command's
	// own uid (allowed) leaves the init's nice value alone.
	"limit-init": func(string) string {
		tids := initThreads()
		zero := unix.Rlimit{}
		out := []string{
			"prlimit=" + all(tids, func(t int) error { return unix.Prlimit(t, unix.RLIMIT_NOFILE, &zero, nil) }),
			"prlimit_cpu=" + all([]int{1}, func(t int) error { return unix.Prlimit(t, unix.RLIMIT_CPU, &unix.Rlimit{Cur: 1, Max: 1}, nil) }),
			"setpriority=" + all(tids, func(t int) error { return unix.Setpriority(unix.PRIO_PROCESS, t, 19) }),
			"prio_pgrp=" + all([]int{1}, func(t int) error { return unix.Setpriority(unix.PRIO_PGRP, t, 19) }),
			"sched_setaffinity=" + all(tids, func(t int) error {
				var set unix.CPUSet
				set.Set(0)
				return unix.SchedSetaffinity(t, &set)
			}),
			"sched_setscheduler=" + all(tids, func(t int) error {
				param := struct{ prio int32 }{}
				return sys(unix.SYS_SCHED_SETSCHEDULER, uintptr(t), 5 /* SCHED_IDLE */, uintptr(unsafe.Pointer(&param)))
			}),
			"ioprio_set=" + all(tids, func(t int) error {
				return sys(unix.SYS_IOPRIO_SET, 1 /* IOPRIO_WHO_PROCESS */, uintptr(t), 3<<13 /* IDLE */)
			}),
			"prio_user=" + strings.TrimPrefix(result(unix.Setpriority(unix.PRIO_USER, 0, 19)), "errno="),
			"ptrace=" + all([]int{1}, func(t int) error { return sys(unix.SYS_PTRACE, unix.PTRACE_ATTACH, uintptr(t)) }),
			"proc_mem=" + all([]int{1}, func(t int) error {
				fd, err := unix.Open(fmt.Sprintf("/proc/%d/mem", t), unix.O_RDWR|unix.O_CLOEXEC, 0)
				if err == nil {
					unix.Close(fd)
				}
				return err
			}),
		}
		if b, err := os.ReadFile("/proc/1/stat"); err == nil {
			if i := strings.LastIndexByte(string(b), ')'); i > 0 {
				if f := strings.Fields(string(b)[i+1:]); len(f) > 16 {
					out = append(out, "init_nice="+f[16])
				}
			}
		}
		return strings.Join(out, " ")
	},
}

// addLoopbackAddr asks NETLINK_ROUTE to add 127.0.0.9/8 to lo
// (RTM_NEWADDR with an ack) and returns the kernel's answer.
func addLoopbackAddr() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return err
	}
	msg := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofIfAddrmsg+8)
	h := (*unix.NlMsghdr)(unsafe.Pointer(&msg[0]))
	*h = unix.NlMsghdr{Len: uint32(len(msg)), Type: unix.RTM_NEWADDR, Flags: unix.NLM_F_REQUEST | unix.NLM_F_ACK | unix.NLM_F_CREATE | unix.NLM_F_EXCL, Seq: 1}
	ifa := (*unix.IfAddrmsg)(unsafe.Pointer(&msg[unix.NLMSG_HDRLEN]))
	*ifa = unix.IfAddrmsg{Family: unix.AF_INET, Prefixlen: 8, Index: uint32(lo.Index)}
	at := msg[unix.NLMSG_HDRLEN+unix.SizeofIfAddrmsg:]
	*(*unix.RtAttr)(unsafe.Pointer(&at[0])) = unix.RtAttr{Len: 8, Type: unix.IFA_LOCAL}
	copy(at[4:], []byte{127, 0, 0, 9})
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
			if e := -*(*int32)(unsafe.Pointer(&m.Data[0])); e != 0 {
				return syscall.Errno(e)
			}
			return nil
		}
	}
	return fmt.Errorf("no netlink ack")
}
