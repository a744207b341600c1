//go:build linux

package sandboxd

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMain lets the test binary serve as a sandbox's init: real sandboxes
// in this package's tests re-execute it with InitArg, as sandboxd does
// with its own binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == InitArg {
		RunInit() // never returns
	}
	os.Exit(m.Run())
}

// realManager returns a Manager that makes real sandboxes, with the test
// binary as init (or $SANDBOXD_INIT, a built sandboxd), no exits.
func realManager(t testing.TB, spares int) *Manager {
	t.Helper()
	return realManagerWith(t, func(c *Config) { c.Spares = spares })
}

// realManagerWith is realManager with the configuration changed by set.
func realManagerWith(t testing.TB, set func(*Config)) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (user namespaces with an id map, cgroups)")
	}
	base, err := os.MkdirTemp("", "sluice-sbx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	init := os.Getenv("SANDBOXD_INIT")
	if init == "" {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		// The init execs this binary as an unmapped uid: copy it where
		// every directory up to / is searchable.
		b, err := os.ReadFile(exe)
		if err != nil {
			t.Fatal(err)
		}
		init = filepath.Join(base, "init")
		if err := os.WriteFile(init, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Default()
	cfg.StateDir = filepath.Join(base, "state")
	cfg.CgroupParent = "sluice-test-sandboxd"
	set(&cfg)
	m, err := New(Options{Config: cfg, InitPath: init})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkLifecycle is create + exec /bin/true + destroy, one at a time.
func BenchmarkLifecycle(b *testing.B) {
	m := realManager(b, 0)
	ctx := context.Background()
	for b.Loop() {
		in, err := m.Create(ctx, CreateRequest{Agent: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		res, err := m.Exec(ctx, in.ID, ExecRequest{Argv: []string{"/bin/true"}})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %v %+v", err, res)
		}
		if err := m.Destroy(in.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// The setup message carries the filter as bytes; what the init decodes is
// exactly what sandboxd assembled, and a torn program is refused.
func TestSeccompWire(t *testing.T) {
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	wire, err := seccompWire()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		b       []byte
		want    []unix.SockFilter
		wantErr bool
	}{
		{"the sandbox filter", wire, prog, false},
		{"one instruction", encodeSeccomp([]unix.SockFilter{{Code: 6, Jt: 1, Jf: 2, K: 0x7fff0000}}),
			[]unix.SockFilter{{Code: 6, Jt: 1, Jf: 2, K: 0x7fff0000}}, false},
		{"empty decodes empty (loadSeccomp refuses it)", nil, []unix.SockFilter{}, false},
		{"a byte short", wire[:len(wire)-1], nil, true},
		{"a byte over", append(append([]byte(nil), wire...), 0), nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeSeccomp(tc.b)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "not whole instructions") {
					t.Fatalf("decode: %v, want the torn program refused", err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decode: %d instructions, %v; want %d", len(got), err, len(tc.want))
			}
		})
	}
}

// A real sandbox, with this test binary as its init: the filter sent as
// bytes is in force, and signals sent to pid 1 from inside right after
// Create (the init replies "built" before it installs its handlers, but
// reads no exec before they are in place) do not kill it.
func TestSandboxConfinedAndInitSurvivesSignals(t *testing.T) {
	m := realManager(t, 0)
	ctx := context.Background()
	in, err := m.Create(ctx, CreateRequest{Agent: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(in.ID) })
	// confine pins the init's threads to one CPU for a moment; they and
	// everything the init starts get this process's affinity back.
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var cpus string
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			cpus = strings.TrimSpace(v)
		}
	}
	cases := []struct {
		name     string
		argv     []string
		wantCode int
		wantOut  string
		wantErr  string // in stderr
	}{
		{"affinity given back", []string{"/bin/sh", "-c", `l=$(grep -h Cpus_allowed_list: /proc/self/status /proc/1/task/*/status | sort -u); ` +
			`echo "n=$(echo "$l" | wc -l) v=$(echo "$l" | awk '{print $2}')"`}, 0, "n=1 v=" + cpus + "\n", ""},
		// The init has a uid of its own: the kernel refuses every signal
		// the command sends it (THREATS A13).
		{"signals to pid 1 refused", []string{"/bin/sh", "-c", "for s in TERM INT HUP USR1 PIPE SEGV ABRT BUS; do " +
			"kill -$s 1 2>/dev/null && echo BAD $s; done; kill -0 1 2>&1 | grep -c 'not permitted'"}, 0, "1", ""},
		{"init still serves", []string{"/bin/true"}, 0, "", ""},
		{"seccomp filter and no_new_privs", []string{"/bin/sh", "-c", "grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status | tr -s '\\t ' ' '"}, 0,
			"CapEff: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2", ""},
		// Every thread of the init, not just the one that forks: the
		// init's own uid, and no capability but on the forking thread,
		// which keeps CAP_SETUID and CAP_SETGID (0xc0) to start commands.
		{"every init thread confined", []string{"/bin/sh", "-c", `n=0; c=0; for t in /proc/1/task/*; do n=$((n+1)); ` +
			`s=$(grep -E '^(Uid|Gid|CapEff|CapPrm|NoNewPrivs|Seccomp):' $t/status | tr -s '\t ' ' ' | tr '\n' ';'); ` +
			`case "$s" in "Uid: 999 999 999 999;Gid: 1000 1000 1000 1000;CapPrm: 0000000000000000;CapEff: 0000000000000000;NoNewPrivs: 1;Seccomp: 2;") ;; ` +
			`"Uid: 999 999 999 999;Gid: 1000 1000 1000 1000;CapPrm: 00000000000000c0;CapEff: 00000000000000c0;NoNewPrivs: 1;Seccomp: 2;") c=$((c+1)) ;; ` +
			`*) echo "BAD $t $s" ;; esac; done; echo "forking=$c"`},
			0, "forking=1", ""},
		// Landlock's TCP rule: a port other than the proxy's and DNS's is
		// refused before any connection (EACCES, not ECONNREFUSED).
		{"landlock refuses other ports", []string{"/usr/bin/python3", "-c",
			"import socket\ntry:\n socket.create_connection(('127.0.0.1', 1))\nexcept OSError as e:\n print(e.errno)"}, 0, "13", ""},
		// Control: the proxy's port passes Landlock; nothing listens
		// there (no exits in this test), so the kernel refuses it.
		{"landlock lets the proxy port through", []string{"/usr/bin/python3", "-c",
			"import socket\ntry:\n socket.create_connection(('127.0.0.1', 3128))\nexcept OSError as e:\n print(e.errno)"}, 0, "111", ""},
		// The root is the template's read-only tmpfs: writing there fails
		// on the mount, whoever owns it.
		{"root read-only", []string{"/bin/sh", "-c", "{ touch /x; mkdir /y; echo x > /etc/x; } 2>&1 | grep -c 'Read-only file system'"}, 0, "3", ""},
		{"unshare refused by the filter", []string{"/usr/bin/unshare", "-U", "/bin/true"}, 1, "", "Operation not permitted"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := os.Stat(tc.argv[0]); err != nil {
				t.Skipf("the rootfs has no %s", tc.argv[0])
			}
			res, err := m.Exec(ctx, in.ID, ExecRequest{Argv: tc.argv})
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			if res.ExitCode != tc.wantCode || !strings.Contains(res.Stdout, tc.wantOut) || !strings.Contains(res.Stderr, tc.wantErr) ||
				strings.Contains(res.Stdout, "BAD") {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d with %q", res.ExitCode, res.Stdout, res.Stderr, tc.wantCode, tc.wantOut)
			}
		})
	}
	if _, err := m.Get(in.ID); errors.Is(err, ErrNotFound) {
		t.Fatal("sandbox gone")
	}
}

// lockProbe runs, with CAP_SYS_ADMIN in a sandbox's user namespace and no
// seccomp filter (entered from the host with nsenter), the mount calls a
// sandbox's own code could never make, and prints name=errno for each.
const lockProbe = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_REMOUNT, MS_BIND, MNT_DETACH = 1, 32, 4096, 2
def call(f, *a):
    return 0 if f(*a) == 0 else ctypes.get_errno()
def umount(p, flags=0):
    return call(libc.umount2, p.encode(), flags)
def remount_rw(p):
    return call(libc.mount, None, p.encode(), None, MS_REMOUNT | MS_BIND, None)
r = {
  "mount_tmp": call(libc.mount, b"none", b"/tmp", b"tmpfs", 0, None),
  "umount_shadow": umount("/etc/shadow"),
  "detach_shadow": umount("/etc/shadow", MNT_DETACH),
  "umount_ssh": umount("/etc/ssh"),
  "umount_usr": umount("/usr"),
  "umount_dev_null": umount("/dev/null"),
  "umount_resolv": umount("/etc/resolv.conf"),
  "rw_usr": remount_rw("/usr"),
  "rw_etc": remount_rw("/etc"),
  "rw_root": remount_rw("/"),
  "rw_dev": remount_rw("/dev"),
  "shadow_bytes": os.stat("/etc/shadow").st_size,
  "ssh_entries": len(os.listdir("/etc/ssh")),
}
print(" ".join("%s=%d" % kv for kv in sorted(r.items())))
`

// The mount template's mounts arrive in each sandbox locked: even a
// process with CAP_SYS_ADMIN in the sandbox's user namespace and no
// seccomp filter cannot unmount a mask (EINVAL: the mount is locked) or
// make a read-only mount writable (EPERM), and what the masks hide stays
// hidden. The control mount shows the probe does hold the capability.
func TestTemplateMountsLocked(t *testing.T) {
	m := realManager(t, 0)
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("needs nsenter")
	}
	if _, err := os.Stat("/etc/shadow"); err != nil {
		t.Skip("the rootfs has no /etc/shadow to mask")
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("the probe needs /usr/bin/python3 in the rootfs")
	}
	ctx := context.Background()
	in, err := m.Create(ctx, CreateRequest{Agent: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(in.ID) })
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(in.Pid), "-U", "-m", "--",
		"/usr/bin/python3", "-c", lockProbe).CombinedOutput()
	if err != nil {
		t.Fatalf("probe: %v: %s", err, out)
	}
	got := map[string]string{}
	for _, f := range strings.Fields(string(out)) {
		k, v, _ := strings.Cut(f, "=")
		got[k] = v
	}
	const ok, einval, eperm = "0", "22", "1"
	cases := []struct{ name, want string }{
		{"mount_tmp", ok}, // control: the capability is there
		{"umount_shadow", einval},
		{"detach_shadow", einval},
		{"umount_ssh", einval},
		{"umount_usr", einval},
		{"umount_dev_null", einval},
		{"umount_resolv", einval},
		{"rw_usr", eperm},
		{"rw_etc", eperm},
		{"rw_root", eperm},
		{"rw_dev", eperm},
		{"shadow_bytes", "0"},
		{"ssh_entries", "0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got[tc.name] != tc.want {
				t.Errorf("%s = %q, want %s (probe output %s)", tc.name, got[tc.name], tc.want, out)
			}
		})
	}
}

// A destroyed sandbox's group serves the next sandbox: renamed to its ID,
// its limits rewritten, empty of the old sandbox's processes, and its old
// event counters do not count against the new sandbox.
func TestCgroupReused(t *testing.T) {
	m := realManager(t, 0)
	ctx := context.Background()
	first, err := m.Create(ctx, CreateRequest{Agent: "test", Limits: Limits{Pids: 16}})
	if err != nil {
		t.Fatal(err)
	}
	// Hit pids.max in the first sandbox, so its group carries an event.
	res, err := m.Exec(ctx, first.ID, ExecRequest{Argv: []string{"/bin/sh", "-c", "for i in $(seq 40); do sleep 0.2 & done; wait"}})
	if err != nil || res.KilledBy != KilledByPids {
		t.Fatalf("fork past pids.max: %+v, %v; want killed_by pids", res, err)
	}
	sb1, err := m.get(first.ID)
	if err != nil {
		t.Fatal(err)
	}
	pidsKey := "pids"
	if sb1.cg.v2 {
		pidsKey = ""
	}
	oldDirs := map[string]string{}
	for c, d := range sb1.cg.dirs {
		oldDirs[c] = d
	}
	if err := m.Destroy(first.ID); err != nil {
		t.Fatal(err)
	}
	m.pending.Wait()
	// Pooled, the group no longer goes by the destroyed sandbox's ID.
	if _, err := os.Stat(oldDirs[pidsKey]); !os.IsNotExist(err) {
		t.Errorf("the destroyed sandbox's group %s: %v, want it gone", oldDirs[pidsKey], err)
	}
	second, err := m.Create(ctx, CreateRequest{Agent: "test", Limits: Limits{Pids: 100}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(second.ID) })
	sb2, err := m.get(second.ID)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		got  func() string
		want string
	}{
		// The pids limit hit in the first sandbox shows in the group the
		// second one has: it is the same group, under the new name.
		{"the first sandbox's group, renamed", func() string {
			_, hits := sb2.cg.counters()
			return filepath.Base(sb2.cg.dirs[pidsKey]) + " " + strconv.FormatBool(hits > 0)
		}, second.ID + " true"},
		{"old name gone", func() string {
			_, err := os.Stat(oldDirs[pidsKey])
			return strconv.FormatBool(os.IsNotExist(err))
		}, "true"},
		{"limit rewritten", func() string {
			b, _ := os.ReadFile(sb2.cg.path("pids/pids.max"))
			return strings.TrimSpace(string(b))
		}, "100"},
		{"only the new init in it", func() string {
			b, _ := os.ReadFile(filepath.Join(sb2.cg.dirs[pidsKey], "cgroup.procs"))
			return strings.TrimSpace(string(b))
		}, strconv.Itoa(second.Pid)},
		{"old events do not count", func() string {
			res, err := m.Exec(ctx, second.ID, ExecRequest{Argv: []string{"/bin/true"}})
			if err != nil {
				return err.Error()
			}
			return strconv.Itoa(res.ExitCode) + " " + res.KilledBy.String()
		}, "0 "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.got(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// Every mask is in place in a sandbox: the template's (under /etc) and the
// init's own (under /proc and /sys) alike. A masked file reads empty, a
// masked directory lists empty, and /proc's writable corners are
// read-only. Each path is checked only where the host has it.
func TestMasks(t *testing.T) {
	m := realManager(t, 0)
	ctx := context.Background()
	in, err := m.Create(ctx, CreateRequest{Agent: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(in.ID) })
	type probe struct{ path, script, want string }
	var probes []probe
	for _, p := range maskedFiles {
		if st, err := os.Stat("/" + p); err == nil && st.Mode().IsRegular() {
			probes = append(probes, probe{"/" + p, "cat /" + p + " | wc -c", "0"})
		}
	}
	for _, p := range maskedDirs {
		if st, err := os.Stat("/" + p); err == nil && st.IsDir() {
			probes = append(probes, probe{"/" + p, "ls -A /" + p + " | wc -l", "0"})
		}
	}
	for _, p := range roProc {
		if _, err := os.Stat("/" + p); err == nil {
			probes = append(probes, probe{"/" + p, `awk '$5=="/` + p + `"{print $6}' /proc/self/mountinfo | cut -d, -f1`, "ro"})
		}
	}
	if len(probes) < 5 {
		t.Fatalf("only %d masked paths exist on this host", len(probes))
	}
	for _, p := range probes {
		t.Run(p.path, func(t *testing.T) {
			res, err := m.Exec(ctx, in.ID, ExecRequest{Argv: []string{"/bin/sh", "-c", p.script}})
			if err != nil || strings.TrimSpace(res.Stdout) != p.want {
				t.Errorf("%s: %q (stderr %q, %v), want %s", p.script, res.Stdout, res.Stderr, err, p.want)
			}
		})
	}
}
