package sandboxd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Files move between the host and a sandbox's /workspace through its
// init's root (/proc/PID/root), never through a path the code inside can
// redirect: every component is opened with openat2 RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV, and only
// regular files are read or written.

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// WorkspacePath checks p, a path inside the sandbox ("/workspace/a/b" or
// "workspace/a/b"), and returns its components below /workspace.
func WorkspacePath(p string) ([]string, error) {
	rel, ok := strings.CutPrefix(strings.TrimPrefix(p, "/"), "workspace/")
	if !ok || rel == "" || len(p) > 4096 {
		return nil, fmt.Errorf("%w: path must be a file under /workspace", ErrInvalid)
	}
	parts := strings.Split(rel, "/")
	for _, c := range parts {
		if c == "" || c == "." || c == ".." || strings.IndexByte(c, 0) >= 0 || len(c) > 255 {
			return nil, fmt.Errorf("%w: path component %q", ErrInvalid, c)
		}
	}
	return parts, nil
}

// openat2 opens name beneath dir. A path that tries to leave the
// workspace (a symlink, a magic link, another mount) fails with ErrDenied.
func openat2(dir int, name string, flags uint64, mode uint64) (int, error) {
	fd, err := openat2Raw(dir, name, flags, mode)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return -1, fmt.Errorf("%w: %s: %w", ErrDenied, name, err)
	}
	return fd, err
}

func openat2Raw(dir int, name string, flags uint64, mode uint64) (int, error) {
	if flags&unix.O_PATH == 0 {
		flags |= oLargefile // O_PATH takes no other flags
	}
	for {
		fd, err := unix.Openat2(dir, name, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Mode: mode, Resolve: resolveFlags})
		if err != unix.EINTR && err != unix.EAGAIN {
			return fd, err
		}
	}
}

// workspaceDir opens the sandbox's /workspace as an O_PATH directory. The
// init's pid cannot name another process: sandboxd is its parent and reaps
// it only in teardown, so until then a dead init stays a zombie holding its
// pid (and /proc/PID/root of a zombie does not resolve).
func (sb *sandbox) workspaceDir() (int, error) {
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/root/workspace", sb.info.Pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("sandboxd: files: open workspace: %w", err)
	}
	return fd, nil
}

// PutFile writes r (at most the sandbox's file_bytes) to path under
// /workspace, creating parent directories, owned by the sandbox user.
func (m *Manager) PutFile(id, path string, r io.Reader, mode os.FileMode) error {
	sb, err := m.get(id)
	if err != nil {
		return err
	}
	parts, err := WorkspacePath(path)
	if err != nil {
		return err
	}
	if mode&^0o777 != 0 {
		return fmt.Errorf("%w: mode %o", ErrInvalid, mode)
	}
	mode &= 0o755 // nothing setuid, nothing writable by others
	uid := m.hostUID(sb)
	dir, err := sb.workspaceDir()
	if err != nil {
		return err
	}
	defer func() { unix.Close(dir) }()
	return asUser(uid, func() error { return putFile(sb, &dir, parts, path, r, mode) })
}

// putFile runs with the sandbox user's filesystem credentials.
func putFile(sb *sandbox, dirp *int, parts []string, path string, r io.Reader, mode os.FileMode) error {
	dir := *dirp
	defer func() { *dirp = dir }()
	for _, c := range parts[:len(parts)-1] {
		next, err := openat2(dir, c, unix.O_PATH|unix.O_DIRECTORY, 0)
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdirat(dir, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("sandboxd: files: mkdir %s: %w", c, err)
			}
			next, err = openat2(dir, c, unix.O_PATH|unix.O_DIRECTORY, 0)
		}
		if err != nil {
			return fmt.Errorf("sandboxd: files: open %s: %w", c, err)
		}
		unix.Close(dir)
		dir = next
	}
	name := parts[len(parts)-1]
	fd, err := openat2(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return fmt.Errorf("sandboxd: files: open %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: %s is not a regular file", ErrInvalid, path)
	}
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("sandboxd: files: %w", err)
	}
	limit := sb.info.Limits.FileBytes
	n, err := io.Copy(f, io.LimitReader(r, limit+1))
	if err != nil {
		_ = f.Truncate(0)
		return fmt.Errorf("sandboxd: files: write: %w", err)
	}
	if n > limit {
		_ = unix.Unlinkat(dir, name, 0)
		return fmt.Errorf("%w: file larger than %d bytes", ErrTooLarge, limit)
	}
	if err := unix.Fchmod(fd, uint32(mode)); err != nil {
		return fmt.Errorf("sandboxd: files: chmod: %w", err)
	}
	return nil
}

// GetFile copies the regular file at path under /workspace (at most the
// sandbox's file_bytes) to w.
func (m *Manager) GetFile(id, path string, w io.Writer) error {
	sb, err := m.get(id)
	if err != nil {
		return err
	}
	parts, err := WorkspacePath(path)
	if err != nil {
		return err
	}
	dir, err := sb.workspaceDir()
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	return asUser(m.hostUID(sb), func() error { return getFile(sb, dir, parts, path, w) })
}

// getFile runs with the sandbox user's filesystem credentials.
func getFile(sb *sandbox, dir int, parts []string, path string, w io.Writer) error {
	fd, err := openat2(dir, strings.Join(parts, "/"), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%w: %s", ErrNotFound, path)
	}
	if err != nil {
		return fmt.Errorf("sandboxd: files: open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: %s is not a regular file", ErrInvalid, path)
	}
	if st.Size > sb.info.Limits.FileBytes {
		return fmt.Errorf("%w: file larger than %d bytes", ErrTooLarge, sb.info.Limits.FileBytes)
	}
	_, err = io.Copy(w, io.LimitReader(f, sb.info.Limits.FileBytes))
	return err
}

// hostUID is the host uid of the sandbox user.
func (m *Manager) hostUID(sb *sandbox) int { return m.cfg.UIDs.Base + sb.slot*65536 + SandboxUID }

// asUser runs fn on one thread whose filesystem uid and gid are the
// sandbox user's: files are created as that user (the sandbox's tmpfs has
// no mapping for host root), and every permission check is the one the
// sandbox's own code would get. Dropping fsuid also drops this thread's
// DAC-override capabilities. If restoring fails, the thread is left
// locked so the runtime discards it.
func asUser(uid int, fn func() error) error {
	runtime.LockOSThread()
	oldGID, _ := unix.SetfsgidRetGid(uid)
	oldUID, _ := unix.SetfsuidRetUid(uid)
	if cur, _ := unix.SetfsuidRetUid(-1); cur != uid {
		_, _ = unix.SetfsuidRetUid(oldUID)
		_, _ = unix.SetfsgidRetGid(oldGID)
		return fmt.Errorf("sandboxd: files: setfsuid %d failed", uid)
	}
	err := fn()
	_, _ = unix.SetfsuidRetUid(oldUID)
	_, _ = unix.SetfsgidRetGid(oldGID)
	curUID, _ := unix.SetfsuidRetUid(-1)
	curGID, _ := unix.SetfsgidRetGid(-1)
	if curUID == oldUID && curGID == oldGID {
		runtime.UnlockOSThread()
	}
	return err
}

// oLargefile is the kernel's O_LARGEFILE: openat2 does not add it on
// 64-bit kernels the way open does (x/sys defines the libc value, 0).
const oLargefile = 0o100000
