package sandboxd

// The filter's policy is seccompPolicy (seccomp_policy_linux.go), built
// with go-seccomp-bpf. On amd64 the binary carries the assembled program
// instead (zseccomp_linux_amd64.go, generated from the policy and checked
// against it by TestSeccompTableIsThePolicy): go-seccomp-bpf's package
// initialisation builds syscall tables for every architecture, and as
// every package linked into sandboxd it would run again in each sandbox's
// init, a re-execution of this binary.

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seccompWire is seccompProgram in the form the setup message carries it.
var seccompWire = sync.OnceValues(func() ([]byte, error) {
	prog, err := seccompProgram()
	if err != nil {
		return nil, err
	}
	return encodeSeccomp(prog), nil
})

// sockFilterSize is the size of one classic BPF instruction: code (2
// bytes), jt, jf (1 each), k (4).
const sockFilterSize = 8

// encodeSeccomp lays prog out as the kernel does, in this machine's byte
// order: sandboxd and the init are the same binary on the same host.
func encodeSeccomp(prog []unix.SockFilter) []byte {
	b := make([]byte, 0, len(prog)*sockFilterSize)
	for _, in := range prog {
		b = binary.NativeEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.NativeEndian.AppendUint32(b, in.K)
	}
	return b
}

// decodeSeccomp is the inverse of encodeSeccomp. A length that is not a
// whole number of instructions is refused (the init then fails closed);
// loadSeccomp refuses an empty or oversized program.
func decodeSeccomp(b []byte) ([]unix.SockFilter, error) {
	if len(b)%sockFilterSize != 0 {
		return nil, fmt.Errorf("seccomp: program of %d bytes is not whole instructions", len(b))
	}
	prog := make([]unix.SockFilter, len(b)/sockFilterSize)
	for i := range prog {
		in := b[i*sockFilterSize:]
		prog[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(in), Jt: in[2], Jf: in[3], K: binary.NativeEndian.Uint32(in[4:])}
	}
	return prog, nil
}

// maxSeccompInsns is the kernel's BPF_MAXINSNS.
const maxSeccompInsns = 4096

// loadSeccomp sets no_new_privs and installs prog on every thread
// (SECCOMP_FILTER_FLAG_TSYNC; the kernel sets no_new_privs on the others
// as it syncs them). An empty or oversized program is refused: a sandbox
// never runs without its filter.
func loadSeccomp(prog []unix.SockFilter) error {
	if len(prog) == 0 || len(prog) > maxSeccompInsns {
		return fmt.Errorf("seccomp: program of %d instructions", len(prog))
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	switch {
	case errno != 0:
		return fmt.Errorf("seccomp: load: %w", errno)
	case r != 0: // TSYNC: the id of a thread that could not be synced
		return fmt.Errorf("seccomp: load: thread %d not synchronised", r)
	}
	return nil
}
