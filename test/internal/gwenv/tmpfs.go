package gwenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Tmpfs mounts a tmpfs of size (mount's size= option, e.g. "64k") at
// dir/name and unmounts it when t ends; registered after whatever made
// dir, the unmount runs before dir is removed. For tests of full disks.
func Tmpfs(t testing.TB, dir, name, size string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", p).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs at %s: %v: %s", p, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", p).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", p, err, out)
		}
	})
	return p
}

// Fill writes dir/filler until the file system is full and returns its
// path: removing it gives the space back.
func Fill(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 512)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !strings.Contains(err.Error(), "no space left") {
				t.Fatalf("filler: %v", err)
			}
			return p
		}
	}
}
