// Package fswatch is an inotify instance that is polled, not waited on:
// the audit writer and the local secret store drain it before they trust
// what they read last, so that they look a path up only after something
// may have changed it. The kernel queues an event before the system call
// that caused it returns, so a drain after that call always sees it.
package fswatch

import (
	"bytes"
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watch is one non-blocking inotify instance.
type Watch struct {
	fd   int
	dead bool
	buf  []byte
}

// New makes a watch with nothing watched yet.
func New() (*Watch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &Watch{fd: fd, buf: make([]byte, 4096)}, nil
}

// Add watches dir for the events in mask.
func (w *Watch) Add(dir string, mask uint32) error {
	_, err := unix.InotifyAddWatch(w.fd, dir, mask)
	return err
}

// Drain reads every queued event without blocking and calls each with
// its mask and the name it is about (NULs trimmed; empty for the watched
// directory itself). It reports false, then and from then on, once the
// watch is dead: a watched directory deleted, moved or unmounted, or a
// read that failed. A dead watch can no longer say nothing changed.
func (w *Watch) Drain(each func(mask uint32, name []byte)) bool {
	for !w.dead {
		n, err := unix.Read(w.fd, w.buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return true
		}
		if err != nil || n <= 0 {
			w.dead = true
			break
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&w.buf[off]))
			name := w.buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0 {
				w.dead = true
				break
			}
			each(ev.Mask, bytes.TrimRight(name, "\x00"))
		}
	}
	return false
}

// Close releases the instance.
func (w *Watch) Close() {
	if w != nil {
		unix.Close(w.fd)
	}
}
