//go:build linux && amd64 && !sluice_seccomp_policy

package sandboxd

import (
	"os/exec"
	"testing"
)

// The amd64 build carries the filter assembled (zseccomp_linux_amd64.go);
// the policy it came from builds only with the sluice_seccomp_policy tag.
// This runs the check that the table is the policy assembled, in a build
// with that tag.
func TestSeccompTableIsThePolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package a second time (-short)")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go command")
	}
	out, err := exec.Command(goBin, "test", "-tags", "sluice_seccomp_policy", "-count=1",
		"-run", "^(TestGenerateSeccompTable|TestSeccompProgramIsThePolicy|TestSeccompPolicyAssembles)$", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("the policy check failed: %v\n%s", err, out)
	}
}
