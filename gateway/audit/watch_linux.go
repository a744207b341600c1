package audit

import (
	"bytes"
	"path/filepath"

	"github.com/sluice-gw/sluice/internal/fswatch"
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
	w    *fswatch.Watch
	name []byte
}

const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// watchPath watches path's directory; nil when inotify is not available
// (the writer then stats the path before every batch, as without it).
func watchPath(path string) *pathWatch {
	w, err := fswatch.New()
	if err != nil {
		return nil
	}
	if err := w.Add(filepath.Dir(path), watchMask); err != nil {
		w.Close()
		return nil
	}
	return &pathWatch{w: w, name: []byte(filepath.Base(path))}
}

// changed drains the queued events and reports whether any of them may
// have changed what the log's name refers to. Without a watch, after the
// watch died, on an overflowed queue and on a read error it reports true.
func (w *pathWatch) changed() bool {
	if w == nil {
		return true
	}
	hit := false
	alive := w.w.Drain(func(mask uint32, name []byte) {
		if mask&unix.IN_Q_OVERFLOW != 0 || bytes.Equal(name, w.name) {
			hit = true
		}
	})
	return hit || !alive
}

func (w *pathWatch) close() {
	if w != nil {
		w.w.Close()
	}
}
