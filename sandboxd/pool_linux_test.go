//go:build linux

package sandboxd

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// TestPoolSandboxUsedOnce: with a warm pool (pool.size 2), creates take
// pooled sandboxes, each a fresh one (its own id, init and workspace): a
// file one sandbox wrote is in no later one, and no init serves twice.
// The refill is rate-limited as pool.refill_per_second says.
func TestPoolSandboxUsedOnce(t *testing.T) {
	m := realManagerWith(t, func(c *Config) { c.Pool = Pool{Size: 2, RefillPerSecond: 50} })
	if m.refillRate == nil || m.refillRate.Limit() != rate.Limit(50) || cap(m.spares) != 2 {
		t.Fatalf("pool: refill limit %v, capacity %d; want 50/s and 2", m.refillRate, cap(m.spares))
	}
	ctx := context.Background()
	waitPool := func() {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); len(m.spares) < 2; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("pool holds %d of 2", len(m.spares))
			}
		}
	}
	waitPool()
	seenPid, seenID := map[int]bool{}, map[string]bool{}
	for i := range 5 {
		pooled := len(m.spares) > 0
		in, err := m.Create(ctx, CreateRequest{Agent: "a", Session: "pool"})
		if err != nil {
			t.Fatal(err)
		}
		if seenPid[in.Pid] || seenID[in.ID] {
			t.Fatalf("create #%d got sandbox %s (init %d) again", i, in.ID, in.Pid)
		}
		seenPid[in.Pid], seenID[in.ID] = true, true
		res, err := m.Exec(ctx, in.ID, ExecRequest{Argv: []string{"/bin/sh", "-c", "ls -A /workspace; echo secret-$0 > /workspace/left", "x"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %v %+v", err, res)
		}
		if strings.TrimSpace(res.Stdout) != "" {
			t.Errorf("create #%d (pooled %v): /workspace holds %q; want it empty (nothing of an earlier sandbox)", i, pooled, res.Stdout)
		}
		var buf bytes.Buffer
		if err := m.GetFile(in.ID, "/workspace/left", &buf); err != nil || buf.String() != "secret-x\n" {
			t.Fatalf("get file: %v %q", err, buf.String())
		}
		if err := m.Destroy(in.ID); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			waitPool()
		}
	}
}
