package vault

import (
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"

	"github.com/sluice-gw/sluice/internal/fswatch"
	"golang.org/x/sys/unix"
)

// storeWatch tells Local when the store file may have changed, so that a
// credential lookup stats the file (the dearest part of an unchanged
// lookup) only then instead of on every call.
//
// It is one inotify instance watching the store's directory for anything
// that can change the file or what its name refers to (writes, attribute
// changes, creates, deletes, renames — any entry, so that a symlink swap
// in the directory, as Kubernetes does for a mounted Secret, counts), and
// every ancestor directory for renames, creates and deletes of entries,
// so that moving a parent aside is seen too. The kernel queues an event
// before the system call that caused it returns, and Local drains the
// queue under its lock before answering from its cache: a change that
// finished before a lookup began is seen by that lookup, as exactly as
// with the stat it replaces. A path that is not its own real path (a
// symlink anywhere on it) is not watched: its target may live anywhere.
// What inotify cannot see — a mount over the path — is not watched for
// either; that is root's, at start.
type storeWatch struct {
	w    *fswatch.Watch
	dead bool // a watched directory went (or the queue failed): stat every time
}

const (
	leafMask     = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
	ancestorMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
)

// maxWatched bounds the stores a process watches at once: each holds an
// inotify instance until it is collected, and instances are few per user
// (fs.inotify.max_user_instances, 128 by default) and shared with the
// audit log's and the policy's watches. A gateway opens one store; past
// the bound a store stats instead.
const maxWatched = 8

var watched atomic.Int32

// watchStore watches path for l; nil when inotify is not available, the
// path has a symlink on it or maxWatched stores are watched already
// (Local then stats before every lookup). The instance is closed when l
// is collected.
func watchStore(l *Local, path string) *storeWatch {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil
	}
	dir := filepath.Dir(abs)
	if real, err := filepath.EvalSymlinks(dir); err != nil || real != dir {
		return nil
	}
	if fi, err := os.Lstat(abs); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return nil
	}
	if watched.Add(1) > maxWatched {
		watched.Add(-1)
		return nil
	}
	w, err := fswatch.New()
	if err != nil {
		watched.Add(-1)
		return nil
	}
	mask := uint32(leafMask)
	for d := dir; ; d = filepath.Dir(d) {
		if err := w.Add(d, mask); err != nil {
			w.Close()
			watched.Add(-1)
			return nil
		}
		if d == filepath.Dir(d) {
			break
		}
		mask = ancestorMask
	}
	runtime.AddCleanup(l, func(w *fswatch.Watch) { w.Close(); watched.Add(-1) }, w)
	return &storeWatch{w: w}
}

// changed drains the queued events and reports whether there were any.
// Without a watch, after a watched directory went, on an overflowed queue
// and on a read error it reports true. The caller holds Local's lock.
func (w *storeWatch) changed() bool {
	if w == nil || w.dead {
		return true
	}
	hit := false
	if !w.w.Drain(func(uint32, []byte) { hit = true }) {
		w.dead = true
		return true
	}
	return hit
}
