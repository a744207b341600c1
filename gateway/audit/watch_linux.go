package audit

import (
	"bytes"
	"errors"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pathWatch tells the writer when the log's name may point elsewhere, so
// that it looks the path up (a stat of the whole path, the dearest part of
// the checks before each write) only then instead of before every batch.
//
// It is an inotify watch on the log's directory for the events that can
// change what the name refers to: a create, delete, rename or link at the
// name, and the directory itself being deleted, renamed or unmounted. The
// kernel queues an event before the syscall that caused it returns, so a
// rename that finished before the writer's check is always seen by it: the
// check is as exact as the stat it replaces. What inotify cannot see — a
// mount over the log's path by root — is left to the verifier's chain.
type pathWatch struct {
	fd   int
	name []byte
	dead bool // the watch is gone (directory deleted, moved or unmounted): stat every time
	buf  []byte
}

const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// watchPath watches path's directory; nil when inotify is not available
// (the writer then stats the path before every batch, as without it).
func watchPath(path string) *pathWatch {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), watchMask); err != nil {
		unix.Close(fd)
		return nil
	}
	return &pathWatch{fd: fd, name: []byte(filepath.Base(path)), buf: make([]byte, 4096)}
}

// changed drains the queued events and reports whether any of them may
// have changed what the log's name refers to. Without a watch, after the
// watch died, on an overflowed queue and on a read error it reports true.
func (w *pathWatch) changed() bool {
	if w == nil || w.dead {
		return true
	}
	hit := false
	for {
		n, err := unix.Read(w.fd, w.buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return hit
		}
		if err != nil || n <= 0 {
			w.dead = true
			return true
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&w.buf[off]))
			name := w.buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0:
				w.dead = true
				return true
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				hit = true
			case bytes.Equal(bytes.TrimRight(name, "\x00"), w.name):
				hit = true
			}
		}
	}
}

func (w *pathWatch) close() {
	if w != nil {
		unix.Close(w.fd)
	}
}
