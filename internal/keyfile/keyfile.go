// Package keyfile creates a secret file once, whole: several processes
// (replicas, or a gateway and a CLI) may race to make the same key at
// first start, and none of them may ever read it half-written.
package keyfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Create writes data to path (mode 0600) unless path exists. The data go
// to a temporary file in the same directory, synced, which is then linked
// into place: link(2) fails if the name exists, as O_EXCL does, but the
// name appears only with its whole content. created is false when another
// process made path first; the caller then reads theirs.
func Create(path string, data []byte) (created bool, err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	tmp, err := os.CreateTemp(dir, ".sluice-key-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(data)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return false, err
	}
	if err := os.Chmod(tmp.Name(), 0o600); err != nil {
		return false, err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, err
	}
	d, err := os.Open(dir)
	if err != nil {
		return true, fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return true, fmt.Errorf("sync %s: %w", dir, err)
	}
	return true, nil
}
