//go:build linux && amd64

package sandboxd

import (
	"encoding/binary"
	"fmt"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompVerdict runs the program every sandbox gets over one system call
// (nr, args) as the kernel would present it on amd64, in x/net/bpf's
// interpreter, and returns the action it chose.
func seccompVerdict(t *testing.T, vm *bpf.VM, nr uint32, args ...uint64) string {
	t.Helper()
	// struct seccomp_data: nr, arch, instruction_pointer, args[6]. The
	// interpreter loads words big-endian; the filter reads each 64-bit
	// argument as two words, the low one first on this little-endian
	// machine, so each word is laid out where the filter looks for it.
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], 0xc000003e) // AUDIT_ARCH_X86_64
	for i, a := range args {
		binary.BigEndian.PutUint32(data[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[20+8*i:], uint32(a>>32))
	}
	ret, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	switch r := uint32(ret); {
	case r == 0x7fff0000:
		return "allow"
	case r&0xffff0000 == 0x00050000:
		return "errno=" + unix.ErrnoName(unix.Errno(r&0xffff))
	default:
		return fmt.Sprintf("ret=%#x", r)
	}
}

func shippedFilter(t *testing.T) *bpf.VM {
	t.Helper()
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]bpf.RawInstruction, len(prog))
	for i, in := range prog {
		raw[i] = bpf.RawInstruction{Op: in.Code, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	insts, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the filter does not disassemble")
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatal(err)
	}
	return vm
}

// The socket rules of the shipped filter are allow-lists (THREATS A11):
// every address family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK is
// EAFNOSUPPORT, checked over every family number up to 255 and over values
// whose high 32 bits are set (the kernel drops them: AF_VSOCK | 1<<32 would
// be AF_VSOCK); netlink is NETLINK_ROUTE only; socketpair is AF_UNIX only.
// The attack suite runs the same in real sandboxes (TestSocketFamilies).
func TestSeccompSocketAllowList(t *testing.T) {
	vm := shippedFilter(t)
	allowed := map[uint64]bool{unix.AF_UNIX: true, unix.AF_INET: true, unix.AF_INET6: true, unix.AF_NETLINK: true}
	fams := []uint64{1<<32 | unix.AF_VSOCK, 1<<32 | unix.AF_INET, 1<<63 | unix.AF_UNIX, 0xffffffff, 1<<31 | unix.AF_VSOCK, ^uint64(0)}
	for f := uint64(0); f < 256; f++ {
		fams = append(fams, f)
	}
	for _, f := range fams {
		want := "errno=EAFNOSUPPORT"
		if allowed[f] {
			want = "allow"
		}
		if got := seccompVerdict(t, vm, unix.SYS_SOCKET, f, unix.SOCK_DGRAM, 0); got != want {
			t.Errorf("socket(%#x, SOCK_DGRAM, 0): %s, want %s", f, got, want)
		}
		if f != unix.AF_UNIX {
			want = "errno=EAFNOSUPPORT"
		}
		if got := seccompVerdict(t, vm, unix.SYS_SOCKETPAIR, f, unix.SOCK_STREAM, 0); got != want {
			t.Errorf("socketpair(%#x, SOCK_STREAM, 0): %s, want %s", f, got, want)
		}
	}
	for _, tc := range []struct {
		name            string
		fam, typ, proto uint64
		want            string
	}{
		{"netlink route", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE, "allow"},
		{"netlink sock_diag", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG, "errno=EPROTONOSUPPORT"},
		{"netlink uevents", unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT, "errno=EPROTONOSUPPORT"},
		{"netlink generic", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC, "errno=EPROTONOSUPPORT"},
		{"netlink route with a high bit", unix.AF_NETLINK, unix.SOCK_RAW, 1 << 32, "errno=EPROTONOSUPPORT"},
		{"tcp", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_TCP, "allow"},
		{"udp6", unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_UDP, "allow"},
		{"ping", unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP, "allow"},
		{"sctp (Landlock's TCP rule does not see it)", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP, "errno=EPERM"},
		{"sctp6 seqpacket", unix.AF_INET6, unix.SOCK_SEQPACKET, unix.IPPROTO_SCTP, "errno=EPERM"},
		{"mptcp", unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_MPTCP, "errno=EPERM"},
		{"udplite", unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_UDPLITE, "errno=EPERM"},
		{"raw", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP, "errno=EPERM"},
		{"unix stream", unix.AF_UNIX, unix.SOCK_STREAM, 0, "allow"},
	} {
		if got := seccompVerdict(t, vm, unix.SYS_SOCKET, tc.fam, tc.typ, tc.proto); got != tc.want {
			t.Errorf("%s: socket(%d, %d, %#x): %s, want %s", tc.name, tc.fam, tc.typ, tc.proto, got, tc.want)
		}
	}
}

// TCP Fast Open is refused in every form that would send a SYN from a
// send call (THREATS A12), high bits or not; plain sends and other socket
// options pass.
func TestSeccompTCPFastOpen(t *testing.T) {
	vm := shippedFilter(t)
	const fo = unix.MSG_FASTOPEN
	for _, tc := range []struct {
		name string
		nr   uint32
		args []uint64
		want string
	}{
		{"sendto MSG_FASTOPEN", unix.SYS_SENDTO, []uint64{3, 0, 1, fo, 0, 16}, "errno=EPERM"},
		{"sendto MSG_FASTOPEN|MSG_DONTWAIT|high bit", unix.SYS_SENDTO, []uint64{3, 0, 1, 1<<32 | fo | unix.MSG_DONTWAIT, 0, 16}, "errno=EPERM"},
		{"sendmsg MSG_FASTOPEN", unix.SYS_SENDMSG, []uint64{3, 0, fo}, "errno=EPERM"},
		{"sendmmsg MSG_FASTOPEN", unix.SYS_SENDMMSG, []uint64{3, 0, 1, fo}, "errno=EPERM"},
		{"setsockopt TCP_FASTOPEN_CONNECT", unix.SYS_SETSOCKOPT, []uint64{3, unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 0, 4}, "errno=EPERM"},
		{"setsockopt level with a high bit", unix.SYS_SETSOCKOPT, []uint64{3, 1<<32 | unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 0, 4}, "errno=EPERM"},
		{"setsockopt option with a high bit", unix.SYS_SETSOCKOPT, []uint64{3, unix.IPPROTO_TCP, 1<<32 | unix.TCP_FASTOPEN_CONNECT, 0, 4}, "errno=EPERM"},
		{"control: sendto flags 0", unix.SYS_SENDTO, []uint64{3, 0, 1, 0, 0, 0}, "allow"},
		{"control: sendmsg MSG_NOSIGNAL", unix.SYS_SENDMSG, []uint64{3, 0, unix.MSG_NOSIGNAL}, "allow"},
		{"control: setsockopt TCP_NODELAY", unix.SYS_SETSOCKOPT, []uint64{3, unix.IPPROTO_TCP, unix.TCP_NODELAY, 0, 4}, "allow"},
	} {
		if got := seccompVerdict(t, vm, tc.nr, tc.args...); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// A system call of another architecture (i386's int 0x80, which amd64
// kernels with IA32 emulation serve) is refused whole with ENOSYS: before
// the prefix block the library's program let every one of them through,
// its unshare and its socketcall included.
func TestSeccompForeignArch(t *testing.T) {
	vm := shippedFilter(t)
	for _, nr := range []uint32{20 /* getpid */, 310 /* unshare */, 359 /* socket */, 102 /* socketcall */} {
		data := make([]byte, 64)
		binary.BigEndian.PutUint32(data[0:], nr)
		binary.BigEndian.PutUint32(data[4:], 0x40000003) // AUDIT_ARCH_I386
		ret, err := vm.Run(data)
		if err != nil {
			t.Fatal(err)
		}
		if want := 0x00050000 | int(unix.ENOSYS); ret != want {
			t.Errorf("i386 syscall %d: %#x, want %#x (ENOSYS)", nr, ret, want)
		}
	}
}
