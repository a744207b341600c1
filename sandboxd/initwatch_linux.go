package sandboxd

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrFailed is an exec in a sandbox whose init has died: the sandbox can
// run nothing more and waits for its DELETE.
var ErrFailed = errors.New("sandbox failed")

// watchInit waits, in the runtime's poller (a pidfd, no thread of its
// own), for sb's init to exit. An init that exits while its sandbox is not
// being torn down has died (THREATS A13): the sandbox is marked failed,
// the event init_died is recorded and reported to the gateway's audit log
// (sandbox_init_died), and every later exec is refused with ErrFailed. The
// init is not reaped here: its zombie holds its pid until teardown.
func (m *Manager) watchInit(sb *sandbox) error {
	fd, err := unix.PidfdOpen(sb.info.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("sandboxd: start: watch init: %w", err)
	}
	f := os.NewFile(uintptr(fd), "init-pidfd")
	sb.watch = f
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return fmt.Errorf("sandboxd: start: watch init: %w", err)
	}
	m.watchers.Add(1)
	go func() {
		defer m.watchers.Done()
		defer f.Close()
		var ws syscall.WaitStatus
		exited := false
		_ = rc.Read(func(fd uintptr) bool {
			var info unix.Siginfo
			err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
			switch {
			case err != nil: // reaped already: only teardown reaps
				return true
			case info.Signo == 0: // still running: wait until the pidfd is readable
				return false
			}
			ws, exited = exitStatus(&info), true
			return true
		})
		if !exited || sb.ending.Load() {
			return
		}
		m.initDied(sb, ws)
	}()
	return nil
}

// initDied marks sb failed and records why.
func (m *Manager) initDied(sb *sandbox, ws syscall.WaitStatus) {
	why := fmt.Sprintf("init exited with status %d", ws.ExitStatus())
	if ws.Signaled() {
		why = fmt.Sprintf("init killed by signal %d (%s)", int(ws.Signal()), ws.Signal())
	}
	m.initGone(sb, why)
}

// initGone marks sb failed because its init ended, for the reason why.
func (m *Manager) initGone(sb *sandbox, why string) {
	m.mu.Lock()
	info := sb.info
	live := m.boxes[info.ID] == sb
	sb.failed = why
	m.mu.Unlock()
	sb.dead.Store(true)
	m.log.Error("sandbox init died", "sandbox", info.ID, "agent", info.Agent, "pid", info.Pid, "why", why)
	m.events.write(event{Event: "init_died", Sandbox: info.ID, Agent: info.Agent, Session: info.Session, User: info.User,
		Pid: info.Pid, Error: why})
	if live { // a spare has no identity yet: nothing to report it under
		m.reportEvent(sb, "init_died", 0)
	}
}
