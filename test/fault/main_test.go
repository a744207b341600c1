//go:build linux

package fault

import (
	"fmt"
	"os"
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
