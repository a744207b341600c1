package sandboxd

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// stateLock is the file in state_dir a Manager holds an exclusive flock on:
// two Managers on one state_dir would hand out the same uid ranges and
// unmount each other's sandbox directories.
const stateLock = "sandboxd.lock"

// boxesDir is the directory under state_dir that holds one directory per
// sandbox (its root mount point, its run/ directory with the gateway socket
// and trust files, its init.log). It is a tmpfs that sandboxd mounts: each
// sandbox creates and removes five inodes there, and on a disk file system
// (ext4 here) creating inodes while others were just deleted was about a
// seventh of the whole CPU cost of a sandbox. Events stay on disk in
// state_dir itself. Only sandboxd writes here: run/ is bound read-only into
// its sandbox and root/ is covered by the sandbox's own root.
const boxesDir = "sandboxes"

// stateDir is a Manager's hold on its state_dir.
type stateDir struct {
	lock    *os.File
	boxes   string // where sandbox directories go
	mounted bool   // boxes is a tmpfs this Manager unmounts on close
}

// openStateDir locks dir and prepares its sandbox directory: an empty
// tmpfs, or, where mounting is not allowed, a plain directory.
func openStateDir(dir string, log *slog.Logger, keep map[string]bool) (_ *stateDir, err error) {
	f, err := os.OpenFile(filepath.Join(dir, stateLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandboxd: state dir: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("sandboxd: state dir %s is in use by another sandboxd", dir)
		}
		return nil, fmt.Errorf("sandboxd: state dir: lock: %w", err)
	}
	sd := &stateDir{lock: f, boxes: filepath.Join(dir, boxesDir)}
	if err := os.Mkdir(sd.boxes, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("sandboxd: state dir: %w", err)
	}
	// Entries left by a sandboxd that died go first, from the disk or from
	// the tmpfs it left mounted, except those of sandboxes it left
	// running for re-adoption (keep, by directory name).
	ents, err := os.ReadDir(sd.boxes)
	if err != nil {
		return nil, fmt.Errorf("sandboxd: state dir: %w", err)
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			_ = os.RemoveAll(filepath.Join(sd.boxes, e.Name()))
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(sd.boxes, &st); err != nil {
		return nil, fmt.Errorf("sandboxd: state dir: %w", err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		sd.mounted = true // left mounted by a sandboxd that died
	} else if err := unix.Mount("tmpfs", sd.boxes, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0711"); err != nil {
		log.Warn("sandboxd: sandbox directories stay on the state_dir's file system (slower)", "err", err)
	} else {
		sd.mounted = true
	}
	// 0711 on the directory (or the tmpfs root): each init, an unmapped
	// uid on the host, reaches its own directory but lists none.
	if err := os.Chmod(sd.boxes, 0o711); err != nil {
		sd.close()
		return nil, fmt.Errorf("sandboxd: state dir: %w", err)
	}
	return sd, nil
}

// close unmounts the sandbox directory's tmpfs (after every sandbox is
// gone), removes the directory and releases the lock.
func (sd *stateDir) close() error {
	return sd.closeKeeping(false)
}

// closeKeeping is close; with kept, sandboxes were left running for the
// next sandboxd, so their directories stay (mounted) and only the lock is
// released.
func (sd *stateDir) closeKeeping(kept bool) error {
	if kept {
		return sd.lock.Close()
	}
	var errs []error
	if sd.mounted {
		if err := unix.Unmount(sd.boxes, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("sandboxd: unmount %s: %w", sd.boxes, err))
		}
		sd.mounted = false
	}
	if err := os.Remove(sd.boxes); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("sandboxd: state dir: %w", err))
	}
	errs = append(errs, sd.lock.Close()) // releases the flock
	return errors.Join(errs...)
}
