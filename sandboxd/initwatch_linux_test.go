//go:build linux

package sandboxd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An init that dies anyway (here: SIGKILL from the host, which nothing
// inside can send) marks its sandbox failed at once, without waiting for an
// exec: Get says why, the event init_died is in events.jsonl with the
// signal, and an exec is refused with ErrFailed (the API's 409
// sandbox_failed) instead of an internal error. A destroy is no death: it
// writes no init_died.
func TestInitDiedMarksSandboxFailed(t *testing.T) {
	m := realManager(t, 0)
	ctx := context.Background()
	in, err := m.Create(ctx, CreateRequest{Agent: "test", Session: "s-died"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(in.ID) })
	if got := execOut(t, m, in.ID, "/bin/true"); got != `exit=0 out="" err=""` {
		t.Fatalf("control: exec before the kill: %s", got)
	}
	if err := syscall.Kill(in.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var got Info
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if got, err = m.Get(in.ID); err != nil || got.Failed != "" {
			break
		}
	}
	if err != nil || got.Failed != "init killed by signal 9 (killed)" {
		t.Fatalf("Get after the init died: %+v %v, want failed with signal 9", got, err)
	}
	_, err = m.Exec(ctx, in.ID, ExecRequest{Argv: []string{"/bin/true"}})
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("exec in a failed sandbox: %v, want ErrFailed", err)
	}
	b, err := os.ReadFile(filepath.Join(m.cfg.StateDir, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"event":"init_died","sandbox":"`+in.ID+`","agent":"test","session":"s-died"`) ||
		!strings.Contains(string(b), `"error":"init killed by signal 9 (killed)"`) {
		t.Fatalf("events.jsonl has no init_died for %s:\n%s", in.ID, b)
	}

	// Control: a sandbox destroyed the ordinary way is no death.
	other, err := m.Create(ctx, CreateRequest{Agent: "test", Session: "s-destroyed"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(other.ID); err != nil {
		t.Fatal(err)
	}
	m.pending.Wait()
	b, _ = os.ReadFile(filepath.Join(m.cfg.StateDir, "events.jsonl"))
	if strings.Contains(string(b), `"event":"init_died","sandbox":"`+other.ID) {
		t.Fatalf("a destroyed sandbox was recorded as init_died:\n%s", b)
	}
}
