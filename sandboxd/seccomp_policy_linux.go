//go:build linux && (!amd64 || sluice_seccomp_policy)

package sandboxd

import (
	"encoding/binary"
	"fmt"
	"sync"

	seccomp "github.com/elastic/go-seccomp-bpf"
	scarch "github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// deniedSyscalls return EPERM inside every sandbox: the mount family
// (including the new mount API), namespace changes, kernel attack surface
// that no agent code needs (bpf, modules, kexec, keyrings, perf, userfaultfd,
// io_uring), cross-process inspection, and host administration.
var deniedSyscalls = []string{
	"mount", "umount2", "pivot_root", "chroot",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
	"unshare", "setns",
	"bpf", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	"keyctl", "add_key", "request_key",
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
	"perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
	"open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
	"swapon", "swapoff", "reboot", "syslog", "acct", "quotactl", "quotactl_fd",
	"settimeofday", "clock_settime", "clock_adjtime", "iopl", "ioperm", "vhangup", "uselib",
	"fanotify_init", "personality",
}

// nsFlags are the clone flags that make namespaces; a sandbox may make none.
const nsFlags = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// hi32 matches any value with a high bit set in a 32-bit argument: the kernel
// ignores those bits, so a filter comparing the full 64-bit value could be
// bypassed by setting them (TIOCSTI | 1<<32). Such calls are refused whole.
var hi32 = seccomp.Condition{Operation: seccomp.GreaterThan, Value: 0xffffffff}

func arg(n uint32, c seccomp.Condition) seccomp.ArgumentConditions {
	c.Argument = n
	return seccomp.ArgumentConditions{c}
}

func eq(v uint64) seccomp.Condition { return seccomp.Condition{Operation: seccomp.Equal, Value: v} }

// socketFamilies are the only address families a sandbox may open a socket
// in (THREATS A11): Unix sockets (the gateway's socket), IPv4 and IPv6 (its
// loopback, where the proxy and the DNS stub listen), and netlink, whose
// protocol netlinkProtocols narrows to NETLINK_ROUTE. Every other family
// (AF_VSOCK to the hypervisor, AF_ALG, AF_XDP, AF_TIPC, AF_PACKET, and any
// a newer kernel adds) fails with EAFNOSUPPORT. socketpair takes AF_UNIX
// alone. The comparison is of the whole 64-bit register: a family with a
// high bit set (which the kernel would drop) matches no entry and is
// refused.
var (
	socketFamilies     = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}
	socketpairFamilies = []uint64{unix.AF_UNIX}
)

// netlinkProtocols: NETLINK_ROUTE alone, which glibc's getifaddrs, Go's
// net.Interfaces and libuv read the interface list with. Without
// CAP_NET_ADMIN (a sandbox has none) it only reads: every change it could
// ask for is refused by the kernel with EPERM. Other netlink protocols
// (sock_diag, uevents, audit, generic netlink's families, netfilter, xfrm)
// fail with EPROTONOSUPPORT.
var netlinkProtocols = []uint64{unix.NETLINK_ROUTE}

// inetProtocols are the protocols an AF_INET or AF_INET6 socket may name:
// the default (0), TCP, UDP, and ICMP/ICMPv6 for ping sockets. Others fail
// with EPERM, among them MPTCP (262) and SCTP, whose connects Landlock's
// TCP rule does not see, and any protocol whose module a socket() call
// would have the kernel load.
var inetProtocols = []uint64{0, unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6}

// MSG_FASTOPEN and TCP_FASTOPEN_CONNECT (THREATS A12): TCP Fast Open sends
// the SYN from sendto/sendmsg/sendmmsg, past the LSM connect hook that
// Landlock's TCP rule sits on. Both are refused with EPERM; sandboxd also
// turns TFO off in every sandbox's network namespace (net.ipv4.tcp_fastopen
// = 0, nspool_linux.go).
const (
	msgFastOpen        = unix.MSG_FASTOPEN
	tcpFastOpenConnect = unix.TCP_FASTOPEN_CONNECT
)

// notIn is the condition set "argument n is none of vals": an allow-list
// turned into the match that refuses.
func notIn(n uint32, vals []uint64) seccomp.ArgumentConditions {
	cs := make(seccomp.ArgumentConditions, 0, len(vals))
	for _, v := range vals {
		cs = append(cs, seccomp.Condition{Argument: n, Operation: seccomp.NotEqual, Value: v})
	}
	return cs
}

// with is cs with one more condition (a copy).
func with(cs seccomp.ArgumentConditions, c seccomp.Condition) seccomp.ArgumentConditions {
	return append(append(seccomp.ArgumentConditions(nil), cs...), c)
}

// seccompPolicy is the filter every sandbox runs under.
func seccompPolicy() seccomp.Policy {
	var cond []seccomp.NameWithConditions
	add := func(name string, cs ...seccomp.ArgumentConditions) {
		for _, c := range cs {
			cond = append(cond, seccomp.NameWithConditions{Name: name, Conditions: c})
		}
	}
	add("clone", arg(0, seccomp.Condition{Operation: seccomp.BitsSet, Value: nsFlags}))
	add("ioctl", arg(1, eq(unix.TIOCSTI)), arg(1, eq(unix.TIOCLINUX)), arg(1, hi32))
	add("socket", arg(2, hi32), arg(1, hi32))
	for _, fam := range []uint64{unix.AF_INET, unix.AF_INET6} {
		add("socket", with(notIn(2, inetProtocols), seccomp.Condition{Argument: 0, Operation: seccomp.Equal, Value: fam}))
	}
	for _, t := range []uint64{0, unix.SOCK_NONBLOCK, unix.SOCK_CLOEXEC, unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC} {
		for _, fam := range []uint64{unix.AF_INET, unix.AF_INET6} {
			for _, typ := range []uint64{unix.SOCK_RAW, unix.SOCK_PACKET} {
				add("socket", seccomp.ArgumentConditions{
					{Argument: 0, Operation: seccomp.Equal, Value: fam},
					{Argument: 1, Operation: seccomp.Equal, Value: typ | t},
				})
			}
		}
	}
	// TCP Fast Open: the flags are unsigned int, and BitsSet looks at the
	// low 32 bits whatever the high ones hold. setsockopt's level and
	// option are ints: with a high bit set they are refused whole.
	add("sendto", arg(3, seccomp.Condition{Operation: seccomp.BitsSet, Value: msgFastOpen}))
	add("sendmsg", arg(2, seccomp.Condition{Operation: seccomp.BitsSet, Value: msgFastOpen}))
	add("sendmmsg", arg(3, seccomp.Condition{Operation: seccomp.BitsSet, Value: msgFastOpen}))
	add("setsockopt", arg(1, hi32), arg(2, hi32), seccomp.ArgumentConditions{
		{Argument: 1, Operation: seccomp.Equal, Value: unix.IPPROTO_TCP},
		{Argument: 2, Operation: seccomp.Equal, Value: tcpFastOpenConnect},
	})
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			// clone3 takes its flags in a struct the filter cannot read:
			// ENOSYS makes libcs fall back to clone, which it can.
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: []string{"clone3"}},
			{Action: seccomp.ActionErrno, Names: deniedSyscalls},
			// One group with argument conditions, and it last: after a
			// condition fails, the library's code goes on with an
			// argument, not the syscall number, in the accumulator, so a
			// later group would compare the wrong value (see
			// prefixProgram, which holds the rules needing other errnos).
			{Action: seccomp.ActionErrno, NamesWithCondtions: cond},
		},
	}
}

// seccompProgram is the policy assembled into classic BPF, once per
// sandboxd process. It travels to each init in its setup message, so no
// init spends its start-up assembling the same program again.
var seccompProgram = sync.OnceValues(assembleSeccomp)

// assembleSeccomp assembles prefixProgram and then seccompPolicy for this
// machine's architecture: one program, the prefix first.
func assembleSeccomp() ([]unix.SockFilter, error) {
	p := seccompPolicy()
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble: %w", err)
	}
	pre, err := prefixProgram()
	if err != nil {
		return nil, err
	}
	insts = append(pre, insts...)
	prog := make([]unix.SockFilter, 0, len(insts))
	for _, in := range insts {
		raw, err := in.Assemble()
		if err != nil {
			return nil, fmt.Errorf("seccomp: assemble: %w", err)
		}
		prog = append(prog, unix.SockFilter{Code: raw.Op, Jt: raw.Jt, Jf: raw.Jf, K: raw.K})
	}
	return prog, nil
}

// seccomp_data offsets and return values (include/uapi/linux/seccomp.h).
const (
	offNr   = 0
	offArch = 4
	offArgs = 16

	retErrno = 0x00050000
)

// argWords are the offsets of the low and high 32 bits of argument n.
func argWords(n uint32) (lo, hi uint32) {
	lo, hi = offArgs+8*n, offArgs+8*n+4
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 { // big-endian
		lo, hi = hi, lo
	}
	return lo, hi
}

// prefixProgram runs before the policy's program, in the same filter. It
// holds what the policy's library cannot say, each an allow-list:
//
//   - A system call of any other architecture than this one (i386's int
//     0x80 on amd64, which the library's program lets through whole) fails
//     with ENOSYS.
//   - socket: the family must be one of socketFamilies, else EAFNOSUPPORT
//     (THREATS A11); an AF_NETLINK socket's protocol one of
//     netlinkProtocols, else EPROTONOSUPPORT. socketpair: socketpairFamilies
//     only, else EAFNOSUPPORT. Each is compared as the whole 64-bit
//     register: a high bit set (which the kernel would drop) matches no
//     entry and is refused.
//
// Everything it does not refuse falls through to the policy's program,
// which starts again from the architecture.
func prefixProgram() ([]bpf.Instruction, error) {
	info, err := scarch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: arch: %w", err)
	}
	a := &blockAsm{}
	a.ld(offArch)
	a.jeq(uint32(info.ID), "", "noarch")
	a.ld(offNr)
	a.jeq(unix.SYS_SOCKET, "", "pair")
	allowList(a, 0, socketFamilies, "family", "afno")
	a.label("family")
	// The family is allowed; its low word is in A.
	a.jeq(unix.AF_NETLINK, "", "end")
	allowList(a, 2, netlinkProtocols, "end", "proto")
	a.label("pair")
	a.jeq(unix.SYS_SOCKETPAIR, "", "end")
	allowList(a, 0, socketpairFamilies, "end", "afno")
	a.label("noarch")
	a.ret(retErrno | uint32(unix.ENOSYS))
	a.label("afno")
	a.ret(retErrno | uint32(unix.EAFNOSUPPORT))
	a.label("proto")
	a.ret(retErrno | uint32(unix.EPROTONOSUPPORT))
	a.label("end")
	return a.assemble()
}

// allowList jumps to ok when argument n is one of vals (all 64 bits),
// else to bad. It leaves the argument's low word in A.
func allowList(a *blockAsm, n uint32, vals []uint64, ok, bad string) {
	lo, hi := argWords(n)
	a.ld(hi)
	a.jeq(0, "", bad)
	a.ld(lo)
	for i, v := range vals {
		if v>>32 != 0 {
			panic("bug(): allow-list value with high bits")
		}
		if i == len(vals)-1 {
			a.jeq(uint32(v), ok, bad)
		} else {
			a.jeq(uint32(v), ok, "")
		}
	}
}

// blockAsm assembles a short classic BPF block with forward jumps to named
// labels ("" = the next instruction). The block's last label may be its
// end, where the next program starts.
type blockAsm struct {
	insts  []bpf.Instruction
	jumps  []blockJump
	labels map[string]int
}

type blockJump struct {
	at     int
	jt, jf string
}

func (a *blockAsm) ld(off uint32) {
	a.insts = append(a.insts, bpf.LoadAbsolute{Off: off, Size: 4})
}

func (a *blockAsm) jeq(v uint32, jt, jf string) {
	a.jumps = append(a.jumps, blockJump{at: len(a.insts), jt: jt, jf: jf})
	a.insts = append(a.insts, bpf.JumpIf{Cond: bpf.JumpEqual, Val: v})
}

func (a *blockAsm) ret(v uint32) { a.insts = append(a.insts, bpf.RetConstant{Val: v}) }

func (a *blockAsm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.insts)
}

func (a *blockAsm) assemble() ([]bpf.Instruction, error) {
	skip := func(from int, name string) (uint8, error) {
		if name == "" {
			return 0, nil
		}
		to, ok := a.labels[name]
		if !ok || to <= from || to-from-1 > 255 {
			return 0, fmt.Errorf("seccomp: bug(): jump from %d to %q", from, name)
		}
		return uint8(to - from - 1), nil
	}
	for _, j := range a.jumps {
		in := a.insts[j.at].(bpf.JumpIf)
		var err error
		if in.SkipTrue, err = skip(j.at, j.jt); err != nil {
			return nil, err
		}
		if in.SkipFalse, err = skip(j.at, j.jf); err != nil {
			return nil, err
		}
		a.insts[j.at] = in
	}
	return a.insts, nil
}
