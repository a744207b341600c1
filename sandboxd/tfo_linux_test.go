//go:build linux

package sandboxd

import (
	"errors"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Every sandbox's network namespace has TCP Fast Open off (THREATS A12),
// the second layer beside the filter's refusal of MSG_FASTOPEN: in a
// namespace sandboxd made, with no filter at all, a Fast Open sendto to a
// listener there is refused by the kernel (EOPNOTSUPP) before any SYN.
func TestNSSetTCPFastOpenOff(t *testing.T) {
	m := realManager(t, 0)
	tmpl, err := m.template()
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		sysctl string
		err    error
		ctl    error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies inside the namespaces
		var r result
		defer func() { done <- r }()
		set, err := makeNSSet(tmpl)
		if err != nil {
			r.err = err
			return
		}
		defer set.close()
		b, err := os.ReadFile(tcpFastOpenPath)
		if err != nil {
			r.err = err
			return
		}
		r.sysctl = strings.TrimSpace(string(b))
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			r.err = err
			return
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		to := &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			r.err = err
			return
		}
		defer unix.Close(fd)
		r.err = unix.Sendto(fd, []byte("x"), unix.MSG_FASTOPEN, to)
		// Control: a plain connect to the same listener works.
		fd2, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			r.ctl = err
			return
		}
		defer unix.Close(fd2)
		r.ctl = unix.Connect(fd2, to)
	}()
	r := <-done
	if r.sysctl != "0" || !errors.Is(r.err, unix.EOPNOTSUPP) || r.ctl != nil {
		t.Fatalf("tcp_fastopen=%q, Fast Open sendto: %v (want 0 and EOPNOTSUPP); control connect: %v", r.sysctl, r.err, r.ctl)
	}
}
