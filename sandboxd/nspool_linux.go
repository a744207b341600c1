package sandboxd

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// nsSet is what a sandbox's init is forked inside, made for that one
// sandbox and never for another: a fresh network namespace with lo up and
// nothing else, a fresh IPC namespace, and a private copy of the mount
// template's namespace with a sysfs of that network namespace on the
// template's /sys. The init's own user, mount, pid, UTS and cgroup
// namespaces are created by its clone as before; its mount namespace
// starts as a copy of this one.
//
// Creating a network namespace costs the kernel about a millisecond (and
// an IPC namespace a fraction of one), which is why they are made ahead
// (nsPool), off the path of a create. They belong to the host's user
// namespace, not the sandbox's: nobody inside, not even the init before it
// drops its capabilities, can reconfigure the network (interfaces, routes,
// addresses, nftables, sysctls) or own its IPC objects by capability; what
// the sandbox can do there is what any unprivileged process may. For the
// same reason the init can no longer mount a sysfs (the kernel ties that
// to the network namespace's owner), so it is mounted here, read-only,
// and arrives in the sandbox locked with the rest of the template.
type nsSet struct {
	mnt, net, ipc int
}

// close closes the descriptors; the namespaces live on in a process that
// joined them, or go.
func (s *nsSet) close() {
	for _, fd := range []*int{&s.mnt, &s.net, &s.ipc} {
		if *fd >= 0 {
			_ = unix.Close(*fd)
			*fd = -1
		}
	}
}

// enter moves the calling thread into s: a child it forks with
// CLONE_NEWNS (and without CLONE_NEWNET or CLONE_NEWIPC) starts from s.
// The thread must be locked to its goroutine until it is back (entering
// sandboxd's own set, openHomeNS) or for the rest of its life.
func (s *nsSet) enter() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("sandboxd: namespaces: unshare fs: %w", err)
	}
	for _, ns := range []struct {
		fd   int
		kind int
	}{{s.mnt, unix.CLONE_NEWNS}, {s.net, unix.CLONE_NEWNET}, {s.ipc, unix.CLONE_NEWIPC}} {
		if err := unix.Setns(ns.fd, ns.kind); err != nil {
			return fmt.Errorf("sandboxd: namespaces: setns: %w", err)
		}
	}
	return nil
}

// makeNSSet makes a new nsSet from t. It runs on a locked thread, which
// it leaves inside the new namespaces (the caller takes it home).
func makeNSSet(t *mountTemplate) (_ *nsSet, err error) {
	if err := t.enter(); err != nil {
		return nil, err
	}
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWNET | unix.CLONE_NEWIPC); err != nil {
		return nil, fmt.Errorf("sandboxd: namespaces: unshare: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return nil, fmt.Errorf("sandboxd: namespaces: %w", err)
	}
	if err := tcpFastOpenOff(); err != nil {
		return nil, fmt.Errorf("sandboxd: namespaces: %w", err)
	}
	// Optional, as it always was: without it /sys stays an empty
	// directory. The mounting thread's network namespace is the one this
	// sysfs shows.
	_ = unix.Mount("sysfs", filepath.Join(t.dir, "sys"), "sysfs", roFlags|unix.MS_NOEXEC, "")
	s := &nsSet{mnt: -1, net: -1, ipc: -1}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	for _, ns := range []struct {
		fd   *int
		name string
	}{{&s.mnt, "mnt"}, {&s.net, "net"}, {&s.ipc, "ipc"}} {
		fd, err := unix.Open("/proc/thread-self/ns/"+ns.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("sandboxd: namespaces: open %s: %w", ns.name, err)
		}
		*ns.fd = fd
	}
	return s, nil
}

// tcpFastOpenPath is net.ipv4.tcp_fastopen of the opening thread's network
// namespace (net sysctls are per namespace, chosen at open).
const tcpFastOpenPath = "/proc/sys/net/ipv4/tcp_fastopen"

// tcpFastOpenOff turns TCP Fast Open off in the calling thread's network
// namespace (THREATS A12): a TFO connect sends its SYN from sendto/sendmsg,
// past the LSM connect hook Landlock's TCP rule sits on. The seccomp filter
// refuses MSG_FASTOPEN and TCP_FASTOPEN_CONNECT too; this holds should the
// filter ever let one through. A namespace where it cannot be set is not
// used (fail closed).
func tcpFastOpenOff() error {
	fd, err := unix.Open(tcpFastOpenPath, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("tcp_fastopen: %w", err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte("0\n")); err != nil {
		return fmt.Errorf("tcp_fastopen: %w", err)
	}
	return nil
}

// nsPoolSize is how many nsSets wait, made ahead.
const nsPoolSize = 2

// nsPool makes nsSets ahead on one thread of its own. Each set it hands
// out is fresh (made for the taker alone) and is never taken back: a
// sandbox's namespaces end with it, so nothing of one sandbox can reach
// another. Sets still waiting when the pool closes are released.
type nsPool struct {
	tmpl func() (*mountTemplate, error)
	home *nsSet   // the process's own namespaces
	keep []string // paths the init needs before it pivots (see makeNSSet)

	ready chan *nsSet
	kick  chan struct{}

	mu      sync.Mutex
	started bool
	closed  bool
	stop    chan struct{}
	done    chan struct{}
}

func newNSPool(tmpl func() (*mountTemplate, error), home *nsSet) *nsPool {
	return &nsPool{tmpl: tmpl, home: home, ready: make(chan *nsSet, nsPoolSize), kick: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
}

// take returns a set made ahead, or nil when none waits (the caller makes
// its own with makeNSSet). It starts the maker on first use and asks it to
// make up for what was taken.
func (p *nsPool) take() *nsSet {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	if !p.started {
		p.started = true
		go p.maker()
	}
	p.mu.Unlock()
	var s *nsSet
	select {
	case s = <-p.ready:
	default:
	}
	select {
	case p.kick <- struct{}{}:
	default:
	}
	return s
}

// maker fills the pool until it is closed. Its thread is locked and never
// unlocked: it holds namespaces it made, and it dies with the goroutine.
// After each set it goes back to the namespaces it started in, so it never
// keeps one alive that the pool has handed out.
func (p *nsPool) maker() {
	defer close(p.done)
	runtime.LockOSThread()
	// Making namespaces ahead must not take CPU from a create that is
	// running now: this thread yields to every other (failing to lower
	// it only costs speed).
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
	for {
		for len(p.ready) < cap(p.ready) {
			select {
			case <-p.stop:
				return
			default:
			}
			t, err := p.tmpl()
			if err != nil {
				break // retried on the next kick
			}
			s, err := makeNSSet(t)
			if herr := p.home.enter(); herr != nil {
				if s != nil {
					s.close()
				}
				return // the thread is discarded: nothing more is made
			}
			if err != nil {
				break
			}
			p.ready <- s // only this goroutine adds, and there is room
		}
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
	}
}

// openHomeNS opens the process's own mount, network and IPC namespaces:
// those of a thread that runs goroutines not locked to it. (/proc/self
// names the main thread, which may be inside a sandbox's namespaces for a
// moment while it forks an init, or for good if a locked goroutine ended
// on it: the runtime parks the main thread rather than ending it.) Threads
// that leave home are locked to their goroutine until they are back, or
// for the rest of their life.
func openHomeNS() (*nsSet, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := &nsSet{mnt: -1, net: -1, ipc: -1}
	for _, ns := range []struct {
		fd   *int
		name string
	}{{&s.mnt, "mnt"}, {&s.net, "net"}, {&s.ipc, "ipc"}} {
		fd, err := unix.Open("/proc/thread-self/ns/"+ns.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("sandboxd: namespaces: open own %s: %w", ns.name, err)
		}
		*ns.fd = fd
	}
	return s, nil
}

// close stops the maker and releases every set still waiting.
func (p *nsPool) close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	started := p.started
	p.mu.Unlock()
	close(p.stop)
	if started {
		<-p.done
	}
	for {
		select {
		case s := <-p.ready:
			s.close()
		default:
			return nil
		}
	}
}
