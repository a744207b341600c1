package sandboxd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// templateDir is the directory in state_dir where the mount template is
// mounted, in the template's own mount namespace only: on the host it
// stays an empty directory.
const templateDir = "template"

// mountTemplate is the part of every sandbox's root that is the same for
// all of them, built once per Manager instead of once per sandbox: a
// read-only tmpfs holding the mount points, the system directories of the
// rootfs bound read-only (recursively), the masks over /etc's secrets, a
// read-only /dev with the few device nodes a sandbox gets, and /etc's
// resolver file. It lives in a private mount namespace that sandboxd
// holds open (nsFD); each sandbox's nsSet starts as a copy of it (adding
// the sandbox's sysfs), its init is forked from a thread that has joined
// that copy, so the sandbox's mount namespace starts as a copy in turn,
// and the init binds the template recursively as its root (one mount
// instead of about twenty).
//
// Why this keeps every mount as safe as before: the copy the kernel makes
// for a sandbox's new mount namespace belongs to the sandbox's user
// namespace, a less privileged one, so the kernel locks every mount in it
// (MNT_LOCKED: a submount cannot be unmounted to reveal what it covers;
// MNT_LOCK_READONLY/NOSUID/NODEV/NOEXEC: its flags cannot be cleared), and
// a recursive bind copies the locks. Inside, the sandbox has in any case
// no capabilities and a seccomp filter that refuses the mount family. What
// the template does not hold is made per sandbox, as before: /proc, /sys
// and their masks, /dev/pts and /dev/shm, /workspace, /tmp, /run, and
// /etc/hosts and /etc/hostname (they name the sandbox).
type mountTemplate struct {
	nsFD int    // the template's mount namespace
	dir  string // where the template is mounted in it
}

// etcMasks are the maskedFiles and maskedDirs under etc/: the template
// covers them; the init covers the ones under proc/ and sys/.
func etcMask(p string) bool { return strings.HasPrefix(p, "etc/") }

// resolvConf is /etc/resolv.conf in every sandbox: the resolver is the
// stub that sandboxd's relay answers on 127.0.0.1.
const resolvConf = "nameserver 127.0.0.1\noptions edns0\n"

// newMountTemplate builds the template from rootfs at dir in a new private
// mount namespace. The thread that builds it goes back to its own mount
// namespace (the runtime parks the main thread, should it be the one,
// rather than ending it) and is discarded when its goroutine ends (it is
// never unlocked: its working directory is no longer the process's).
func newMountTemplate(rootfs, dir string) (*mountTemplate, error) {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("sandboxd: mount template: %w", err)
	}
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		home, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- result{-1, fmt.Errorf("open own namespace: %w", err)}
			return
		}
		defer unix.Close(home)
		fd, err := buildTemplate(rootfs, dir)
		// Should this fail, the thread (discarded anyway) stays in the
		// template's namespace.
		_ = unix.Setns(home, unix.CLONE_NEWNS)
		done <- result{fd, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("sandboxd: mount template: %w", r.err)
	}
	return &mountTemplate{nsFD: r.fd, dir: dir}, nil
}

// buildTemplate runs on a locked thread: it moves the thread into a new
// mount namespace where nothing propagates to or from the host, mounts the
// template at dir, and returns the namespace's descriptor.
func buildTemplate(rootfs, dir string) (int, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return -1, fmt.Errorf("unshare: %w", err)
	}
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return -1, err
	}
	if err := mount("tmpfs", dir, "tmpfs", tmpFlags, "size=1m,mode=755"); err != nil {
		return -1, err
	}
	in := func(p string) string { return filepath.Join(dir, p) }
	for _, d := range systemDirs {
		src := filepath.Join(rootfs, d)
		st, err := os.Lstat(src)
		switch {
		case err != nil:
			continue
		case st.Mode()&os.ModeSymlink != 0:
			t, err := os.Readlink(src)
			if err != nil {
				return -1, err
			}
			if err := os.Symlink(t, in(d)); err != nil {
				return -1, err
			}
		case st.IsDir():
			if err := os.Mkdir(in(d), 0o755); err != nil {
				return -1, err
			}
			if err := bindRO(src, in(d)); err != nil {
				return -1, err
			}
		}
	}
	for _, d := range []string{"proc", "sys", "dev", "workspace", "tmp", "run", ".sluice"} {
		if err := os.Mkdir(in(d), 0o755); err != nil {
			return -1, err
		}
	}
	if err := os.WriteFile(in(".sluice/resolv.conf"), []byte(resolvConf), 0o644); err != nil {
		return -1, err
	}
	// A regular /etc/resolv.conf is covered here; one that links into
	// /run is written into each sandbox's own /run by its init.
	if st, err := os.Lstat(in("etc/resolv.conf")); err == nil && st.Mode().IsRegular() {
		if err := bindRO(in(".sluice/resolv.conf"), in("etc/resolv.conf")); err != nil {
			return -1, err
		}
	}
	for _, p := range maskedFiles {
		if st, err := os.Lstat(in(p)); etcMask(p) && err == nil && st.Mode().IsRegular() {
			if err := mount("/dev/null", in(p), "", unix.MS_BIND, ""); err != nil {
				return -1, err
			}
		}
	}
	for _, p := range maskedDirs {
		if st, err := os.Lstat(in(p)); etcMask(p) && err == nil && st.IsDir() {
			if err := mount("tmpfs", in(p), "tmpfs", roFlags|unix.MS_NOEXEC, "size=0,mode=755"); err != nil {
				return -1, err
			}
		}
	}
	if err := buildDev(in("dev")); err != nil {
		return -1, err
	}
	if err := mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|roFlags, ""); err != nil {
		return -1, err
	}
	fd, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open namespace: %w", err)
	}
	return fd, nil
}

// enter moves the calling thread, which must be locked and must never be
// unlocked, into the template's mount namespace: a child it forks with
// CLONE_NEWNS gets a copy of that namespace.
func (t *mountTemplate) enter() error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("sandboxd: mount template: unshare fs: %w", err)
	}
	if err := unix.Setns(t.nsFD, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("sandboxd: mount template: setns: %w", err)
	}
	return nil
}

// close lets the template's namespace go (sandboxes have their own
// copies) and removes its now empty mount point.
func (t *mountTemplate) close() error {
	err := unix.Close(t.nsFD)
	if rerr := os.Remove(t.dir); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("sandboxd: mount template: %w", err)
	}
	return nil
}
