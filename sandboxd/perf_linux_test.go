//go:build linux

package sandboxd

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestEnvKey(t *testing.T) {
	cases := []struct {
		name string
		key  string
		ok   bool
	}{
		{"letters", "PATH", true},
		{"underscore first", "_X1", true},
		{"lower case", "lower_case9", true},
		{"128 bytes", strings.Repeat("A", 128), true},
		{"empty", "", false},
		{"129 bytes", strings.Repeat("A", 129), false},
		{"digit first", "1A", false},
		{"equals sign", "A=B", false},
		{"dash", "A-B", false},
		{"non-ASCII", "ÄB", false},
		{"NUL", "A\x00", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := envKey.MatchString(tc.key); got != tc.ok {
				t.Errorf("envKey(%q) = %v, want %v", tc.key, got, tc.ok)
			}
		})
	}
}

// A sandbox never runs without its filter: a missing or oversized program
// is refused before any syscall.
func TestLoadSeccompRefusesBadProgram(t *testing.T) {
	cases := []struct {
		name string
		prog []unix.SockFilter
	}{
		{"none", nil},
		{"empty", []unix.SockFilter{}},
		{"over BPF_MAXINSNS", make([]unix.SockFilter, maxSeccompInsns+1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := loadSeccomp(tc.prog)
			if err == nil || !strings.Contains(err.Error(), "seccomp: program of") {
				t.Fatalf("got %v, want the program refused", err)
			}
		})
	}
}

// fakeInit answers a setup message on the other end of a control socket
// with the given replies, then returns the setup message it read.
func fakeInit(t *testing.T, replies []replyMsg) (*ctlConn, chan setupMsg) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(fd int) *ctlConn {
		f := os.NewFile(uintptr(fd), "ctl")
		c, err := newCtlConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	host, init := mk(fds[0]), mk(fds[1])
	host.max = maxReply
	got := make(chan setupMsg, 1)
	go func() {
		defer init.Close()
		var s setupMsg
		if _, err := init.recv(&s); err != nil {
			close(got)
			return
		}
		got <- s
		for _, r := range replies {
			if init.send(r) != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { host.Close() })
	return host, got
}

func TestSetupProtocol(t *testing.T) {
	errExits := errors.New("exits refused")
	cases := []struct {
		name      string
		replies   []replyMsg
		onNetErr  error
		wantErr   string // "" = success
		wantOnNet bool
	}{
		{"lo up, then built", []replyMsg{{NetReady: true}, {}}, nil, "", true},
		{"exits fail while the root is built", []replyMsg{{NetReady: true}, {}}, errExits, "exits refused", true},
		{"build fails after lo up", []replyMsg{{NetReady: true}, {Error: "init: mount x: EPERM"}}, nil, "init: mount x: EPERM", true},
		{"net fails", []replyMsg{{Error: "init: lo up: EPERM"}}, nil, "init: lo up: EPERM", false},
		{"built before lo up", []replyMsg{{}}, nil, "done before net_ready", false},
		{"lo up twice", []replyMsg{{NetReady: true}, {NetReady: true}}, nil, "second net_ready", true},
		{"init dies", []replyMsg{{NetReady: true}}, nil, "control: recv", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			host, got := fakeInit(t, tc.replies)
			m := &Manager{cfg: Default()}
			sb := &sandbox{info: Info{ID: "0123456789abcdef", Limits: m.cfg.Limits}, dir: t.TempDir(), ctl: host}
			onNet := false
			err := m.setup(sb, func() error { onNet = true; return tc.onNetErr })
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("setup: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("setup: %v, want an error containing %q", err, tc.wantErr)
			}
			if tc.onNetErr != nil && !errors.Is(err, tc.onNetErr) {
				t.Errorf("setup: %v, want it to carry the exits' error", err)
			}
			if onNet != tc.wantOnNet {
				t.Errorf("exits opened = %v, want %v", onNet, tc.wantOnNet)
			}
			if sb.built != (err == nil) {
				t.Errorf("built = %v after error %v", sb.built, err)
			}
			s := <-got
			if len(s.Seccomp) == 0 || s.Hostname != "sandbox-01234567" {
				t.Errorf("setup message without the filter or hostname: %d instructions, %q", len(s.Seccomp), s.Hostname)
			}
		})
	}
}

// TestTakeSpare: a create takes a pooled sandbox only when one waits and
// its tmpfs sizes fit; it never waits for a refill under way (that would
// put the refill on the create's path: the tail of a burst), and a pooled
// sandbox whose init died is never handed out.
func TestTakeSpare(t *testing.T) {
	def := Default().Limits
	bigger := def
	bigger.WorkspaceBytes *= 2
	lessPids := def
	lessPids.Pids /= 2
	cases := []struct {
		name    string
		spares  int
		waiting bool // a spare waits in the pool
		dead    bool // its init has died
		refill  bool // a refill is building one (delivered after 50ms)
		lim     Limits
		want    bool
	}{
		{"no pool", 0, false, false, false, def, false},
		{"waiting spare", 1, true, false, false, def, true},
		{"other cgroup limits fit", 1, true, false, false, lessPids, true},
		{"other workspace size does not fit", 1, true, false, false, bigger, false},
		{"empty pool, no refill", 1, false, false, false, def, false},
		{"empty pool, refill under way: no wait", 1, false, false, true, def, false},
		{"dead spare skipped", 1, true, true, false, def, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			cfg.Spares = tc.spares
			m := &Manager{cfg: cfg}
			m.newPools()
			spare := &sandbox{info: Info{ID: "spare"}, slot: -1}
			spare.dead.Store(tc.dead)
			if tc.waiting {
				m.pools[""].spares <- spare
			}
			if tc.refill {
				p := m.pools[""]
				p.builders, p.building = 1, 1
				go func() {
					time.Sleep(50 * time.Millisecond)
					p.spares <- spare
				}()
			}
			start := time.Now()
			got := m.takeSpare("", tc.lim)
			if (got == spare) != tc.want {
				t.Fatalf("took %v, want a spare: %v", got, tc.want)
			}
			if d := time.Since(start); d > 20*time.Millisecond {
				t.Errorf("takeSpare took %s: it must never wait", d)
			}
			if !tc.want && tc.waiting && !tc.dead && len(m.pools[""].spares) != 1 {
				t.Error("a spare that does not fit left the pool")
			}
			if tc.dead && len(m.pools[""].spares) != 0 {
				t.Error("a dead spare stayed in the pool")
			}
		})
	}
}

// Destroy answers at once; the "destroyed" event comes when the state is
// gone and the uid slot is free again.
func TestDestroyFinishesInBackground(t *testing.T) {
	base, err := os.MkdirTemp("", "sluice-destroy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.StateDir, cfg.CgroupParent = filepath.Join(base, "state"), "sluice-test-destroy"
	m, err := New(Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cfg.StateDir, "sb-1")
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.slots[3] = true
	m.boxes["sb-1"] = &sandbox{info: Info{ID: "sb-1", Agent: "a"}, slot: 3, dir: dir}
	m.mu.Unlock()
	if err := m.Destroy("sb-1"); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := m.Get("sb-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Destroy: %v, want ErrNotFound", err)
	}
	m.pending.Wait()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state dir after the background cleanup: %v", err)
	}
	m.mu.Lock()
	freed := !m.slots[3]
	m.mu.Unlock()
	if !freed {
		t.Error("uid slot still taken")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(cfg.StateDir, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var e event
	if err := json.Unmarshal(raw, &e); err != nil || e.Event != "destroyed" || e.Sandbox != "sb-1" || e.Error != "" {
		t.Fatalf("event %s (%v), want one destroyed event for sb-1", raw, err)
	}
}

func TestStateDir(t *testing.T) {
	dir, err := os.MkdirTemp("", "sluice-statedir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	log := slog.New(slog.DiscardHandler)
	// A directory a sandboxd that died left behind.
	stale := filepath.Join(dir, boxesDir, "deadbeef00000000")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	sd, err := openStateDir(dir, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("second holder refused", func(t *testing.T) {
		if _, err := openStateDir(dir, log, nil); err == nil || !strings.Contains(err.Error(), "in use by another sandboxd") {
			t.Fatalf("second open: %v, want in use", err)
		}
	})
	t.Run("stale entries removed", func(t *testing.T) {
		if _, err := os.Stat(stale); !os.IsNotExist(err) {
			t.Fatalf("stale sandbox directory: %v", err)
		}
	})
	t.Run("tmpfs, traversable but not listable by others", func(t *testing.T) {
		var st unix.Statfs_t
		if err := unix.Statfs(sd.boxes, &st); err != nil {
			t.Fatal(err)
		}
		if os.Geteuid() == 0 && (st.Type != unix.TMPFS_MAGIC || !sd.mounted) {
			t.Errorf("fs type %#x mounted=%v, want a tmpfs as root", st.Type, sd.mounted)
		}
		fi, err := os.Stat(sd.boxes)
		if err != nil || fi.Mode().Perm() != 0o711 {
			t.Errorf("mode %v (%v), want 0711", fi.Mode().Perm(), err)
		}
	})
	if err := sd.close(); err != nil {
		t.Fatal(err)
	}
	t.Run("close unmounts, removes and unlocks", func(t *testing.T) {
		if _, err := os.Stat(filepath.Join(dir, boxesDir)); !os.IsNotExist(err) {
			t.Errorf("sandboxes/ after close: %v", err)
		}
		sd2, err := openStateDir(dir, log, nil)
		if err != nil {
			t.Fatalf("reopen after close: %v", err)
		}
		if err := sd2.close(); err != nil {
			t.Fatal(err)
		}
	})
}
