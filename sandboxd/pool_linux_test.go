//go:build linux

package sandboxd

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// TestPoolSandboxUsedOnce: with a warm pool (pool.size 2), creates take
// pooled sandboxes, each a fresh one (its own id, init and workspace): a
// file one sandbox wrote is in no later one, and no init serves twice.
// The refill is rate-limited as pool.refill_per_second says.
func TestPoolSandboxUsedOnce(t *testing.T) {
	m := realManagerWith(t, func(c *Config) { c.Pool = Pool{Size: 2, RefillPerSecond: 50} })
	pool := m.pools[""]
	if m.refillRate == nil || m.refillRate.Limit() != rate.Limit(50) || pool == nil || cap(pool.spares) != 2 {
		t.Fatalf("pool: refill limit %v, pool %+v; want 50/s and 2", m.refillRate, pool)
	}
	ctx := context.Background()
	waitPool := func() {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); len(pool.spares) < 2; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("pool holds %d of 2", len(pool.spares))
			}
		}
	}
	waitPool()
	seenPid, seenID := map[int]bool{}, map[string]bool{}
	for i := range 5 {
		pooled := len(pool.spares) > 0
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

// poolIDs waits until template's pool holds n sandboxes and returns their
// ids (each put back).
func poolIDs(t *testing.T, m *Manager, template string, n int) map[string]bool {
	t.Helper()
	p := m.pools[template]
	if p == nil || cap(p.spares) != n {
		t.Fatalf("pool %q: %+v, want one of %d", template, p, n)
	}
	for deadline := time.Now().Add(30 * time.Second); len(p.spares) < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pool %q holds %d of %d", template, len(p.spares), n)
		}
	}
	ids := map[string]bool{}
	var sbs []*sandbox
	for range n {
		sb := <-p.spares
		ids[sb.info.ID] = true
		sbs = append(sbs, sb)
	}
	for _, sb := range sbs {
		p.spares <- sb
	}
	return ids
}

// TestTemplatePools: a create naming a template gets its limits (as
// defaults: the workspace tmpfs is the template's size) and env, and takes
// a sandbox from that template's own pool, built with them; the pool of
// sandboxes without a template is left alone. What a template fixes a
// create cannot change: a limit above the template's ceiling, an env key
// of the template, an egress of its own beside the template's, and an
// unknown template are each refused with ErrInvalid, naming the key, and
// recorded; the template's egress goes through the gateway's check like a
// create's own (here no gateway answers: refused, ErrEgress).
func TestTemplatePools(t *testing.T) {
	m := realManagerWith(t, func(c *Config) {
		c.Templates = map[string]Template{
			"small":  {Limits: Limits{MemoryBytes: 64 << 20, WorkspaceBytes: 8 << 20, Pids: 32}, Env: map[string]string{"TEMPLATE_MARK": "small"}},
			"narrow": {Egress: []string{"pypi.org"}},
		}
		c.Pool = Pool{Size: 1, PerTemplate: map[string]int{"small": 2}}
	})
	ctx := context.Background()
	small := poolIDs(t, m, "small", 2)
	plain := poolIDs(t, m, "", 1)
	in, err := m.Create(ctx, CreateRequest{Template: "small", Agent: "a", Env: map[string]string{"OWN": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !small[in.ID] {
		t.Errorf("create with template small got %s, not one of its pool %v", in.ID, small)
	}
	if in.Template != "small" || in.Limits.MemoryBytes != 64<<20 || in.Limits.Pids != 32 || in.Limits.WorkspaceBytes != 8<<20 {
		t.Errorf("info %+v: want template small with its limits", in)
	}
	res, err := m.Exec(ctx, in.ID, ExecRequest{Argv: []string{"/bin/sh", "-c", `echo "$TEMPLATE_MARK $OWN"; df -k /workspace | tail -n 1`}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %v %+v", err, res)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 2 || lines[0] != "small 1" || strings.Fields(lines[1])[1] != "8192" {
		t.Errorf("exec in a small sandbox: %q; want the template's env and an 8 MiB workspace", res.Stdout)
	}
	if got := poolIDs(t, m, "", 1); len(got) != 1 || !maps.Equal(got, plain) {
		t.Errorf("the pool without a template changed: %v, was %v", got, plain)
	}
	if err := m.Destroy(in.ID); err != nil {
		t.Fatal(err)
	}

	refused := []struct {
		name string
		req  CreateRequest
		is   error
		msg  string
	}{
		{"above the template's ceiling", CreateRequest{Template: "small", Agent: "a", Limits: Limits{MemoryBytes: 128 << 20}}, ErrInvalid,
			"memory_bytes: requested 134217728 (128MiB) is above the ceiling 67108864 (64MiB) (sandboxd.yaml templates.small.limits.memory_bytes)"},
		{"env the template fixes", CreateRequest{Template: "small", Agent: "a", Env: map[string]string{"TEMPLATE_MARK": "mine"}}, ErrInvalid,
			`env "TEMPLATE_MARK" is fixed by template "small"`},
		{"unknown template", CreateRequest{Template: "nope", Agent: "a"}, ErrInvalid, `template "nope" is not configured`},
		{"egress beside the template's", CreateRequest{Template: "narrow", Agent: "a", Egress: []string{"example.com"}}, ErrInvalid,
			`egress is fixed by template "narrow"`},
		{"template's egress unconfirmed", CreateRequest{Template: "narrow", Agent: "a"}, ErrEgress, "pypi.org"},
	}
	for _, tc := range refused {
		_, err := m.Create(ctx, tc.req)
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: got %v; want %v naming %q", tc.name, err, tc.is, tc.msg)
		}
	}
	if l := m.List(); len(l) != 0 {
		t.Errorf("refused creates left sandboxes: %+v", l)
	}
	b, err := os.ReadFile(filepath.Join(m.cfg.StateDir, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	created := false
	for _, l := range strings.Split(string(b), "\n") {
		created = created || strings.Contains(l, `"event":"created","sandbox":"`+in.ID+`"`) && strings.Contains(l, `"template":"small","pooled":true`)
	}
	if !created {
		t.Errorf("events.jsonl lacks created for %s with template small, pooled:\n%s", in.ID, b)
	}
	for _, want := range []string{`"event":"limit_refused"`, `"event":"template_refused"`, `"event":"egress_refused"`, `"egress":"pypi.org"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("events.jsonl lacks %s:\n%s", want, b)
		}
	}
}

// TestTemplateRootfs: a template's rootfs is what its sandboxes see: a
// root holding the host's /usr (bound here, in the test's own directory)
// and an etc/ of its own shows that etc/ in the template's sandboxes and
// the configured rootfs's in the others.
func TestTemplateRootfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	root, err := os.MkdirTemp("", "sluice-tmpl-rootfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"usr", "etc"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		if err := os.Symlink("usr/"+l, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "template-marker"), []byte("from the template's rootfs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/usr", filepath.Join(root, "usr"), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(root, "usr"), unix.MNT_DETACH) })
	m := realManagerWith(t, func(c *Config) { c.Templates = map[string]Template{"own": {Rootfs: root}} })
	ctx := context.Background()
	for _, tc := range []struct{ template, want string }{{"own", "from the template's rootfs"}, {"", "absent"}} {
		in, err := m.Create(ctx, CreateRequest{Template: tc.template, Agent: "a"})
		if err != nil {
			t.Fatalf("create (template %q): %v", tc.template, err)
		}
		res, err := m.Exec(ctx, in.ID, ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /etc/template-marker 2>/dev/null || echo absent"}})
		if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != tc.want {
			t.Errorf("template %q: %v %+v; want %q", tc.template, err, res, tc.want)
		}
		if err := m.Destroy(in.ID); err != nil {
			t.Fatal(err)
		}
	}
}
