//go:build linux

package fault

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// bin is the sluice binary TestMain built ("" when the host cannot run the suite).
var bin string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	if gwenv.SkipReason() == "" {
		dir, err := os.MkdirTemp("", "sluice-fault-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "fault: temp dir:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		if bin, err = gwenv.Build(dir); err != nil {
			fmt.Fprintln(os.Stderr, "fault:", err)
			return 1
		}
	}
	return m.Run()
}

func newEnv(t *testing.T) *gwenv.Env {
	t.Helper()
	return gwenv.New(t, bin)
}

// tmpfs mounts a tmpfs of size under the env's dir and unmounts it at
// cleanup (registered after the env's, so it runs before the dir goes).
func tmpfs(t *testing.T, e *gwenv.Env, name, size string) string {
	t.Helper()
	dir := filepath.Join(e.Dir, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs at %s: %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file in dir until the filesystem is full; removing the
// returned path gives the space back.
func fill(t *testing.T, dir string) string {
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
