//go:build linux && (!amd64 || sluice_seccomp_policy)

package sandboxd

import (
	"fmt"
	"sync"

	seccomp "github.com/elastic/go-seccomp-bpf"
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
	add("socket",
		arg(0, eq(unix.AF_PACKET)), arg(0, hi32),
		arg(2, eq(unix.IPPROTO_MPTCP)), arg(2, hi32), arg(1, hi32))
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
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			// clone3 takes its flags in a struct the filter cannot read:
			// ENOSYS makes libcs fall back to clone, which it can.
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: []string{"clone3"}},
			{Action: seccomp.ActionErrno, Names: deniedSyscalls},
			{Action: seccomp.ActionErrno, NamesWithCondtions: cond},
		},
	}
}

// seccompProgram is the policy assembled into classic BPF, once per
// sandboxd process. It travels to each init in its setup message, so no
// init spends its start-up assembling the same program again.
var seccompProgram = sync.OnceValues(assembleSeccomp)

// assembleSeccomp assembles seccompPolicy for this machine's architecture.
func assembleSeccomp() ([]unix.SockFilter, error) {
	p := seccompPolicy()
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble: %w", err)
	}
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
