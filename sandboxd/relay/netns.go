package relay

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// InNetNS runs fn on an OS thread that has joined the network namespace at
// path, then moves the thread back. Sockets fn creates belong to that
// namespace for their whole life, wherever they are used afterwards.
//
// fn must not start goroutines that need the namespace (they run on other
// threads) and must not block for long. If the thread cannot be moved back,
// it is never returned to the scheduler: the goroutine exits while still
// locked, and the Go runtime then terminates the thread, so no other
// goroutine can ever run in the sandbox's namespace by accident.
func InNetNS(path string, fn func() error) error {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("relay: open netns %s: %w", path, err)
	}
	defer unix.Close(target)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("relay: open own netns: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("relay: setns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it dies with this goroutine.
			done <- fmt.Errorf("relay: setns back from %s (thread discarded): %w", path, err)
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// loUp brings the loopback interface of the current thread's network
// namespace up; a namespace fresh from unshare or `ip netns add` has it
// down, and 127.0.0.1 cannot be bound until it is up.
func loUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("relay: lo up: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("relay: lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("relay: lo up: get flags: %w", err)
	}
	if ifr.Uint16()&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("relay: lo up: set flags: %w", err)
	}
	return nil
}

// OwnNetNS stats this process's own network namespace: the one of a thread
// that runs goroutines not locked to it. /proc/self/ns/net is the main
// thread's, and the main thread may be elsewhere: for a moment while it
// forks a sandbox's init from inside the sandbox's namespaces, or for good
// when a goroutine locked to it ended there (the runtime parks the main
// thread instead of ending it). Every thread that leaves sandboxd's
// namespaces stays locked to its goroutine until it is back, or for the
// rest of its life; so the thread running this (unlocked) goroutine is at
// home, and locking it keeps it here while it looks.
func OwnNetNS(st *unix.Stat_t) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return unix.Stat("/proc/thread-self/ns/net", st)
}

// notOwnNetNS refuses sandboxd's own network namespace: listeners there
// would let any host process connect as the sandbox.
func notOwnNetNS(path string) error {
	var target, own unix.Stat_t
	if err := unix.Stat(path, &target); err != nil {
		return fmt.Errorf("stat netns %s: %w", path, err)
	}
	if err := OwnNetNS(&own); err != nil {
		return fmt.Errorf("stat own netns: %w", err)
	}
	if target.Dev == own.Dev && target.Ino == own.Ino {
		return errors.New("netns is sandboxd's own network namespace")
	}
	return nil
}
