//go:build linux

package sandboxd

import (
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A fork thread that came back clean serves the next fork; one that did
// not is never handed out again; closing ends the idle ones.
func TestForkThreads(t *testing.T) {
	cases := []struct {
		name     string
		clean    bool
		wantIdle int
	}{
		{"back clean: kept", true, 1},
		{"not back: discarded", false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newForkThreads(2)
			defer p.close()
			tids := make(chan int, 1)
			p.run(func() bool {
				tids <- unix.Gettid()
				return tc.clean
			})
			first := <-tids
			deadline := time.Now().Add(5 * time.Second)
			for len(p.idle) != tc.wantIdle && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(10 * time.Millisecond) // a wrong put-back would show by now
			if n := len(p.idle); n != tc.wantIdle {
				t.Fatalf("%d idle threads, want %d", n, tc.wantIdle)
			}
			p.run(func() bool { tids <- unix.Gettid(); return true })
			if second := <-tids; (second == first) != tc.clean {
				t.Errorf("second fork on thread %d, first on %d; reuse want %v", second, first, tc.clean)
			}
		})
	}
}

// waitid's siginfo becomes the wait status wait4 would have given.
func TestExitStatus(t *testing.T) {
	cases := []struct {
		name   string
		code   int32
		status int32
		want   func(syscall.WaitStatus) bool
	}{
		{"exited 3", cldExited, 3, func(ws syscall.WaitStatus) bool { return ws.Exited() && ws.ExitStatus() == 3 }},
		{"exited 0", cldExited, 0, func(ws syscall.WaitStatus) bool { return ws.Exited() && ws.ExitStatus() == 0 }},
		{"killed by SIGKILL", 2, int32(syscall.SIGKILL), func(ws syscall.WaitStatus) bool {
			return ws.Signaled() && ws.Signal() == syscall.SIGKILL && !ws.CoreDump()
		}},
		{"dumped on SIGSEGV", cldDumped, int32(syscall.SIGSEGV), func(ws syscall.WaitStatus) bool {
			return ws.Signaled() && ws.Signal() == syscall.SIGSEGV && ws.CoreDump()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var info unix.Siginfo
			info.Signo, info.Code = int32(syscall.SIGCHLD), tc.code
			*(*int32)(unsafe.Add(unsafe.Pointer(&info), 24)) = tc.status
			if ws := exitStatus(&info); !tc.want(ws) {
				t.Errorf("status %#x", uint32(ws))
			}
		})
	}
}
