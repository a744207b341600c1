package sandboxd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// boxStateDir is the directory under state_dir with one JSON file per live
// sandbox (on the state_dir's own file system, not the sandboxes tmpfs):
// what a new sandboxd needs to re-adopt a sandbox whose sandboxd died
// (kill -9, a crash, an upgrade). The sandbox's init outlives its sandboxd
// for adopt_wait, listening on ctl/init.sock in the sandbox's directory;
// the new sandboxd connects there, opens the sandbox's exits again in its
// network namespace (/proc/PID/ns/net), and takes back its cgroup, uid
// slot and deadline, so exec, destroy, limits and timeouts work as before.
const boxStateDir = "boxes"

// boxRecord is a sandbox's state file.
type boxRecord struct {
	Info  Info          `json:"info"`
	Ident wire.Identity `json:"identity"`
	Slot  int           `json:"slot"`
	Dir   string        `json:"dir"`
	Env   []string      `json:"env"`
	CG    struct {
		V2   bool              `json:"v2"`
		Dirs map[string]string `json:"dirs"`
	} `json:"cgroup"`
	// Deadline is when the sandbox's lifetime ends (zero: none).
	Deadline time.Time `json:"deadline,omitzero"`
	// StartTime is the init's start time (/proc/PID/stat field 22), so a
	// reused pid is never taken for the init.
	StartTime uint64 `json:"start_time"`
	// Spare: a pooled sandbox no create has taken yet (no identity, no
	// exits); a new sandboxd puts it back into its template's pool.
	Spare bool `json:"spare,omitempty"`
}

func (m *Manager) boxFile(id string) string {
	return filepath.Join(m.cfg.StateDir, boxStateDir, id+".json")
}

// ctlSock is where sb's init listens for a new sandboxd (setupMsg.CtlSock).
func ctlSock(dir string) string { return filepath.Join(dir, "ctl", "init.sock") }

// procStartTime reads field 22 of /proc/PID/stat.
func procStartTime(pid int) (uint64, error) {
	st, _, err := procStat(pid)
	return st, err
}

// procStat reads the start time (field 22) and state (field 3) of
// /proc/PID/stat.
func procStat(pid int) (uint64, byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after its last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, errors.New("bad /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, errors.New("bad /proc stat")
	}
	st, err := strconv.ParseUint(f[19], 10, 64) // field 22 = index 19 after the name
	return st, f[0][0], err
}

// saveBox writes sb's state file whole (temporary file, rename).
func (m *Manager) saveBox(sb *sandbox, ident wire.Identity) error {
	if m.cfg.AdoptWait <= 0 {
		return nil
	}
	st, err := procStartTime(sb.info.Pid)
	if err != nil {
		return fmt.Errorf("state: init start time: %w", err)
	}
	rec := boxRecord{Info: sb.info, Ident: ident, Slot: sb.slot, Dir: sb.dir, Env: sb.env, StartTime: st, Spare: sb.info.Agent == ""}
	rec.CG.V2, rec.CG.Dirs = sb.cg.v2, sb.cg.dirs
	if sb.info.Limits.Lifetime > 0 {
		rec.Deadline = sb.info.Created.Add(sb.info.Limits.Lifetime)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(m.cfg.StateDir, boxStateDir), 0o700); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	tmp := m.boxFile(sb.info.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := os.Rename(tmp, m.boxFile(sb.info.ID)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("state: %w", err)
	}
	return nil
}

// saveSpare writes a pooled sandbox's state file, so that a sandboxd
// that dies leaves it to the next one's pool instead of to the kernel.
func (m *Manager) saveSpare(sb *sandbox) {
	if err := m.saveBox(sb, wire.Identity{}); err != nil {
		m.log.Warn("pooled sandbox's state not saved: a restarted sandboxd cannot re-adopt it", "sandbox", sb.info.ID, "err", err)
		m.events.write(event{Event: "state_not_saved", Sandbox: sb.info.ID, Error: err.Error()})
	}
}

// forgetBox removes a sandbox's state file.
func (m *Manager) forgetBox(id string) {
	if id == "" {
		return
	}
	if err := os.Remove(m.boxFile(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("sandbox state not removed", "sandbox", id, "err", err)
	}
}

// loadBoxRecords reads every state file; a bad one is reported and
// removed, never stopping the others.
func loadBoxRecords(stateDir string) (recs []boxRecord, bad []string) {
	dir := filepath.Join(stateDir, boxStateDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil
	}
	for _, e := range ents {
		name := e.Name()
		id, ok := strings.CutSuffix(name, ".json")
		if !ok {
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		var r boxRecord
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err == nil && (r.Info.ID != id || r.Dir == "" || r.Info.Pid <= 0) {
			err = errors.New("incomplete")
		}
		if err != nil {
			bad = append(bad, name+": "+err.Error())
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		recs = append(recs, r)
	}
	return recs, bad
}

// readoptBoxes re-adopts every sandbox a previous sandboxd left: each
// one's init is checked (same pid and start time), connected to on its
// control socket, and its exits opened again. A sandbox whose init died
// meanwhile, or that cannot be re-adopted, is cleaned up (its processes
// killed, cgroup, directory and state removed, its session ended) and
// reported: event sandbox_lost, and init_died to the gateway's audit.
func (m *Manager) readoptBoxes(ctx context.Context, recs []boxRecord, bad []string) {
	for _, b := range bad {
		m.events.write(event{Event: "sandbox_lost", Error: "state file " + b})
	}
	for _, r := range recs {
		if r.Spare {
			m.readoptSpare(r)
			continue
		}
		sb, err := m.readoptBox(ctx, r)
		if err == nil {
			m.events.write(event{Event: "sandbox_readopted", Sandbox: r.Info.ID, Agent: r.Info.Agent, Session: r.Info.Session, User: r.Info.User, Pid: r.Info.Pid})
			m.log.Info("sandbox re-adopted", "sandbox", r.Info.ID, "pid", r.Info.Pid)
			if r.Deadline.IsZero() || time.Until(r.Deadline) > 0 {
				continue
			}
			// Its lifetime ended while no sandboxd ran.
			_ = m.Destroy(sb.info.ID)
			continue
		}
		m.log.Error("sandbox lost across the restart", "sandbox", r.Info.ID, "pid", r.Info.Pid, "err", err)
		m.events.write(event{Event: "sandbox_lost", Sandbox: r.Info.ID, Agent: r.Info.Agent, Session: r.Info.Session, User: r.Info.User, Pid: r.Info.Pid, Error: err.Error()})
		lost := &sandbox{info: r.Info, slot: -1, dir: r.Dir, cg: &cgroup{v2: r.CG.V2, dirs: r.CG.Dirs, files: map[string]*os.File{}}}
		lost.cg.killAllBut(-1)
		_ = m.cleanup(lost)
		m.reportEvent(lost, "init_died", 0)
		m.endSession(r.Info)
	}
}

// readoptBox takes back one sandbox, or says why it cannot.
func (m *Manager) readoptBox(ctx context.Context, r boxRecord) (_ *sandbox, err error) {
	sb, err := m.adoptInit(r)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			sb.abandon()
		}
	}()
	pid := r.Info.Pid
	if m.exits != nil {
		sock := filepath.Join(r.Dir, "run", "gateway.sock")
		_ = os.Remove(sock) // the dead sandboxd's listener
		if sb.exit, err = m.exits(ctx, Exit{
			NetNS: fmt.Sprintf("/proc/%d/ns/net", pid), Identity: r.Ident, Gateway: m.cfg.Gateway,
			GatewayAddr: m.cfg.GatewayTLS.Address, GatewayTLS: m.gwTLS,
			SocketPath: sock, ProxyPort: ProxyPort, DNSPort: DNSPort, DNSCacheFor: m.cfg.relayDNSCache(),
		}); err != nil {
			m.freeSlot(sb)
			return nil, fmt.Errorf("open exits: %w", err)
		}
	}
	m.mu.Lock()
	m.boxes[r.Info.ID] = sb
	if d := time.Until(r.Deadline); !r.Deadline.IsZero() && d > 0 {
		id := r.Info.ID
		sb.timer = time.AfterFunc(d, func() { _ = m.Destroy(id) })
	}
	m.mu.Unlock()
	if err := m.watchAdopted(sb); err != nil {
		m.log.Warn("re-adopted sandbox's init is not watched", "sandbox", r.Info.ID, "err", err)
	}
	return sb, nil
}

// freeSlot gives back the uid slot of a sandbox that is not kept.
func (m *Manager) freeSlot(sb *sandbox) {
	m.mu.Lock()
	if sb.slot >= 0 {
		m.slots[sb.slot] = false
		sb.slot = -1
	}
	m.mu.Unlock()
}

// abandon kills an init that was being adopted and failed to be, and
// waits for it.
func (sb *sandbox) abandon() {
	_ = unix.PidfdSendSignal(int(sb.pidfd.Fd()), unix.SIGKILL, nil, 0)
	if sb.ctl != nil {
		sb.ctl.Close()
	}
	if sb.exit != nil {
		sb.exit.Close()
	}
	waitPidfd(sb.pidfd, 10*time.Second)
	sb.pidfd.Close()
}

// adoptInit takes back the init of record r: it checks it is the same
// process (pid and start time, through a pidfd), claims its uid slot and
// connects to its control socket.
func (m *Manager) adoptInit(r boxRecord) (_ *sandbox, err error) {
	pid := r.Info.Pid
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("init %d is gone: %w", pid, err)
	}
	pidfd := os.NewFile(uintptr(fd), "init-pidfd")
	// After the pidfd is open, the pid cannot be reused under it.
	switch st, state, err := procStat(pid); {
	case err != nil || st != r.StartTime:
		pidfd.Close()
		return nil, fmt.Errorf("init %d is gone (its pid names another process)", pid)
	case state == 'Z' || state == 'X':
		pidfd.Close()
		return nil, fmt.Errorf("init %d has exited", pid)
	}
	sb := &sandbox{info: r.Info, slot: -1, dir: r.Dir, env: r.Env, built: true, pidfd: pidfd,
		cg: &cgroup{v2: r.CG.V2, dirs: r.CG.Dirs, files: map[string]*os.File{}}}
	defer func() {
		if err != nil {
			m.freeSlot(sb)
			sb.abandon()
		}
	}()
	m.mu.Lock()
	if r.Slot < 0 || r.Slot >= len(m.slots) || m.slots[r.Slot] {
		m.mu.Unlock()
		return nil, fmt.Errorf("uid slot %d is not free here (uids.count changed?)", r.Slot)
	}
	m.slots[r.Slot], sb.slot = true, r.Slot
	m.mu.Unlock()
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	f := os.NewFile(uintptr(s), "ctl")
	if err := unix.Connect(s, &unix.SockaddrUnix{Name: ctlSock(r.Dir)}); err != nil {
		f.Close()
		return nil, fmt.Errorf("init does not answer on %s: %w", ctlSock(r.Dir), err)
	}
	sb.ctl, err = newCtlConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	sb.ctl.max = maxReply
	return sb, nil
}

// waitPidfd waits until the process behind pidfd has exited, at most d.
func waitPidfd(pidfd *os.File, d time.Duration) bool {
	pfd := []unix.PollFd{{Fd: int32(pidfd.Fd()), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		n, err := unix.Poll(pfd, int(left/time.Millisecond)+1)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

// watchAdopted is watchInit for an init this sandboxd did not start (not
// its child: no exit status to read). Its pidfd turns readable when it
// exits; an exit while the sandbox is not being torn down is its death.
func (m *Manager) watchAdopted(sb *sandbox) error {
	fd, err := unix.PidfdOpen(sb.info.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watch init: %w", err)
	}
	f := os.NewFile(uintptr(fd), "init-pidfd-watch")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return fmt.Errorf("watch init: %w", err)
	}
	sb.watch = f
	m.watchers.Add(1)
	go func() {
		defer m.watchers.Done()
		defer f.Close()
		exited := false
		err := rc.Read(func(fd uintptr) bool {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, 0)
			exited = err == nil && n > 0
			return exited
		})
		if err != nil || !exited || sb.ending.Load() {
			return // released (f closed) or torn down
		}
		m.initGone(sb, "init exited (re-adopted: status unknown)")
	}()
	return nil
}

// release lets go of a live sandbox when sandboxd stops with on_stop:
// keep: its lifetime timer stops, its exits close, its control socket
// closes (the init then waits adopt_wait for the next sandboxd) and its
// state file stays. Nothing of it is killed or removed.
func (m *Manager) release(id string) error {
	m.mu.Lock()
	sb, ok := m.boxes[id]
	delete(m.boxes, id)
	m.mu.Unlock()
	if !ok {
		return nil
	}
	return m.releaseSandbox(sb)
}

// releaseSandbox is release for sb, a live sandbox or a pooled one.
func (m *Manager) releaseSandbox(sb *sandbox) error {
	id := sb.info.ID
	sb.ending.Store(true) // the watcher ends without reporting a death
	if sb.timer != nil {
		sb.timer.Stop()
	}
	var errs []error
	if sb.exit != nil {
		errs = append(errs, sb.exit.Close())
	}
	sb.execMu.Lock() // an exec in flight finishes first
	if sb.ctl != nil {
		errs = append(errs, sb.ctl.Close())
	}
	sb.execMu.Unlock()
	if sb.watch != nil {
		sb.watch.Close()
	}
	if sb.pidfd != nil {
		sb.pidfd.Close()
	}
	m.mu.Lock()
	if sb.slot >= 0 {
		m.slots[sb.slot] = false
	}
	m.mu.Unlock()
	m.events.write(event{Event: "sandbox_released", Sandbox: id, Agent: sb.info.Agent, Session: sb.info.Session, User: sb.info.User, Pid: sb.info.Pid})
	return errors.Join(errs...)
}

// killAdopted ends an adopted sandbox: SIGKILL to its init through the
// pidfd (the kernel kills its whole pid namespace), then it waits for the
// init to go and its cgroup to empty, so cleanup finds an empty group.
func (sb *sandbox) killAdopted() {
	_ = unix.PidfdSendSignal(int(sb.pidfd.Fd()), unix.SIGKILL, nil, 0)
}

func (sb *sandbox) reapAdopted() {
	waitPidfd(sb.pidfd, 10*time.Second)
	for range 500 {
		if len(sb.cg.procs()) == 0 {
			break
		}
		sb.cg.killAllBut(-1)
		time.Sleep(10 * time.Millisecond)
	}
	sb.pidfd.Close()
}
