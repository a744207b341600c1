//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/sandboxd"
	"github.com/sluice-gw/sluice/sandboxd/relay"
)

// sandboxManager is an in-process Manager whose init is the built sandboxd
// binary and whose sandboxes' exit is the real relay.
func sandboxManager(t *testing.T, w *world, spares int) (*sandboxd.Manager, error) {
	m, _, err := sandboxManagerIn(t, w, spares)
	return m, err
}

// sandboxManagerIn is sandboxManager, also returning its state_dir.
func sandboxManagerIn(t *testing.T, w *world, spares int) (*sandboxd.Manager, string, error) {
	st, err := os.MkdirTemp("", "sluice-bench-sbx-")
	if err != nil {
		return nil, "", err
	}
	t.Cleanup(func() { _ = os.RemoveAll(st) })
	if err := os.Chmod(st, 0o711); err != nil { // the init traverses it as an unmapped uid
		return nil, "", err
	}
	cfg := sandboxd.Default()
	cfg.StateDir = filepath.Join(st, "state")
	cfg.Gateway = filepath.Join(st, "gw.sock")
	cfg.Spares = spares
	m, err := sandboxd.New(sandboxd.Options{Config: cfg, InitPath: sandboxdBin,
		Exits: func(ctx context.Context, e sandboxd.Exit) (io.Closer, error) {
			return relay.Open(ctx, relay.Options{NetNS: e.NetNS, Identity: e.Identity, Gateway: e.Gateway,
				SocketPath: e.SocketPath, ProxyPort: e.ProxyPort, DNSPort: e.DNSPort})
		}})
	if err != nil {
		return nil, "", fmt.Errorf("sandboxd.New: %w", err)
	}
	t.Cleanup(func() { m.Close() })
	return m, cfg.StateDir, nil
}

// poolHits counts the created events in state's events.jsonl, and those a
// pooled sandbox served.
func poolHits(state string) (pooled, all int) {
	b, _ := os.ReadFile(filepath.Join(state, "events.jsonl"))
	for _, l := range strings.Split(string(b), "\n") {
		var ev struct {
			Event  string `json:"event"`
			Pooled bool   `json:"pooled"`
		}
		if json.Unmarshal([]byte(l), &ev) == nil && ev.Event == "created" {
			all++
			if ev.Pooled {
				pooled++
			}
		}
	}
	return pooled, all
}

// crunBundle makes an OCI bundle whose read-only root holds only /usr (and
// the merged-/usr symlinks), running /bin/true; the rest is crun's default
// spec (pid, ipc, uts, mount and network namespaces, /proc, /dev, /sys).
func crunBundle(w *world) (string, error) {
	d := filepath.Join(w.dir, "crun-bundle")
	root := filepath.Join(d, "rootfs")
	for _, sub := range []string{"usr", "proc", "dev", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, sub), 0o755); err != nil {
			return "", err
		}
	}
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		_ = os.Symlink("usr/"+l, filepath.Join(root, l))
	}
	cmd := exec.Command("crun", "spec")
	cmd.Dir = d
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("crun spec: %w: %s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(d, "config.json"))
	if err != nil {
		return "", err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return "", fmt.Errorf("crun spec: %w", err)
	}
	p := spec["process"].(map[string]any)
	p["terminal"] = false
	p["args"] = []string{"/bin/true"}
	spec["root"] = map[string]any{"path": "rootfs", "readonly": true}
	mounts, _ := spec["mounts"].([]any)
	spec["mounts"] = append(mounts, map[string]any{"destination": "/usr", "type": "bind", "source": "/usr", "options": []string{"rbind", "ro"}},
		map[string]any{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev"}})
	out, _ := json.MarshalIndent(spec, "", "  ")
	if err := os.WriteFile(filepath.Join(d, "config.json"), out, 0o644); err != nil {
		return "", err
	}
	return d, nil
}

// benchSandbox is section 4: create+exec+destroy, and exec in a running
// sandbox.
func benchSandbox(t *testing.T, w *world) []*section {
	life := &section{Title: "Sandbox: create + exec `/bin/true` + destroy", Baseline: "plain fork+exec",
		Intro: "Sequential, one at a time, the rows sampled in turns. sluice is the sandboxd manager in process (the API daemon's own code, without its HTTP layer), " +
			"with the built `sandboxd` binary as each sandbox's init and the real relay as its network exit: user, pid, mount, net, ipc, uts and cgroup " +
			"namespaces, a minimal read-only root, seccomp, Landlock, a cgroup with limits, the relay's listeners, then exec and destroy."}
	execS := &section{Title: "Exec `/bin/true` in a running sandbox", Baseline: "nsenter -a",
		Intro: "Both enter the same running sandbox: `nsenter -t PID -a /bin/true` joins its namespaces from outside (no seccomp, Landlock or cgroup); " +
			"sandboxd's Exec runs the command through the sandbox's init with every restriction."}
	n := iterations(200)
	run := func(argv ...string) func() error {
		return func() error {
			out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %w: %s", argv[0], err, lastLines(string(out), 2))
			}
			return nil
		}
	}
	ps := []*probe{{name: "plain fork+exec", fn: run("/bin/true")}}
	bw := &probe{name: "bwrap (full isolation)", note: "--unshare-all --die-with-parent --new-session --cap-drop ALL --clearenv, /usr read-only"}
	if _, err := lookPath("bwrap"); err != nil {
		bw.err = err
	} else {
		bw.fn = run("bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
			"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
			"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/true")
	}
	ps = append(ps, bw)

	cr := &probe{name: "crun run", note: "OCI default spec namespaces, read-only root with /usr"}
	if _, err := lookPath("crun"); err != nil {
		cr.err = err
	} else if bundle, err := crunBundle(w); err != nil {
		cr.err = err
	} else {
		i := 0
		cr.fn = func() error {
			i++
			id := "sluice-bench-" + strconv.Itoa(i) + "-" + randHex(3)
			err := run("crun", "run", "--bundle", bundle, id)()
			_ = exec.Command("crun", "delete", "-f", id).Run()
			return err
		}
	}
	ps = append(ps, cr)

	ctx := context.Background()
	var first *sandboxd.Manager
	for _, spares := range []int{0, 1} {
		p := &probe{name: "sluice sandboxd", note: "no pre-forked spare"}
		if spares > 0 {
			p.name += " (1 spare)"
			p.note = "a pre-forked spare sandbox takes the create; a new spare is made in the background"
		}
		ps = append(ps, p)
		m, err := sandboxManager(t, w, spares)
		if err != nil {
			p.err = err
			continue
		}
		if first == nil {
			first = m
		}
		p.fn = func() error {
			in, err := m.Create(ctx, sandboxd.CreateRequest{Agent: "bench"})
			if err != nil {
				return fmt.Errorf("create: %w", err)
			}
			res, err := m.Exec(ctx, in.ID, sandboxd.ExecRequest{Argv: []string{"/bin/true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
			}
			if derr := m.Destroy(in.ID); err == nil && derr != nil {
				err = fmt.Errorf("destroy: %w", derr)
			}
			return err
		}
	}
	time.Sleep(500 * time.Millisecond) // let the first spare be ready
	interleave(ps, n, 3)
	life.addProbes(ps)

	// Exec in a running sandbox, against nsenter into the same one.
	ns := &probe{name: "nsenter -a"}
	ex := &probe{name: "sluice sandboxd Exec"}
	var in sandboxd.Info
	var err error
	if first == nil {
		ns.err, ex.err = errors.New("no sandbox manager"), errors.New("no sandbox manager")
	} else if in, err = first.Create(ctx, sandboxd.CreateRequest{Agent: "bench"}); err != nil {
		ns.err, ex.err = fmt.Errorf("no sandbox to enter: %w", err), err
	} else {
		defer first.Destroy(in.ID)
		if _, err := lookPath("nsenter"); err != nil {
			ns.err = err
		} else {
			ns.fn = run("nsenter", "-t", strconv.Itoa(in.Pid), "-a", "/bin/true")
		}
		ex.fn = func() error {
			res, err := first.Exec(ctx, in.ID, sandboxd.ExecRequest{Argv: []string{"/bin/true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d", res.ExitCode)
			}
			return err
		}
	}
	eps := []*probe{ns, ex}
	interleave(eps, n, 3)
	execS.addProbes(eps)
	life.Notes = append(life.Notes, "The rows take turns in blocks of consecutive runs; a pre-forked spare only helps the first create of a block, since the next spare is forked in the background while the following creates already wait for it: the spare pays off when creates are spaced out, not in a tight loop.")
	if cr.err != nil && strings.Contains(cr.err.Error(), "hybrid") {
		life.Notes = append(life.Notes, "crun: this host mounts cgroup v1 controllers beside a cgroup2 hierarchy that holds a controller (hybrid mode), which crun "+version("crun", "--version")+" refuses even with `--cgroup-manager=disabled`; the suite does not change the host's cgroups, so crun is not measured here.")
	}
	life.Verdicts = append(life.Verdicts, verdictLat("issue 5: create + exec + destroy ≤ 1.0× bwrap (median)", life.find("sluice sandboxd"), life.find("bwrap (full isolation)"), 1.0),
		verdictLat("issue 5, with a pre-forked spare: ≤ 1.0× bwrap (median)", life.find("sluice sandboxd (1 spare)"), life.find("bwrap (full isolation)"), 1.0))
	execS.Verdicts = append(execS.Verdicts, verdictLat("issue 5: exec in a running sandbox ≤ 1.0× nsenter (median)", execS.find("sluice sandboxd Exec"), execS.find("nsenter -a"), 1.0))
	return []*section{life, execS, benchSandboxBursts(t, w, bw)}
}

// burstSize and burstGap are issue 24's create pattern: bursts of 8
// creates at once, a burst every 100 ms (or when the last one ended).
const (
	burstSize = 8
	burstGap  = 100 * time.Millisecond
)

// benchSandboxBursts is issue 24's warm-pool measure: each sample is one
// create + exec `/bin/true` + destroy of a burst of 8 made at once, bursts
// 100 ms apart, the rows taking turns burst by burst. sluice with a warm
// pool of 8 (pool.size) against bwrap, and sluice without a pool.
func benchSandboxBursts(t *testing.T, w *world, bw *probe) *section {
	sec := &section{Title: "Sandbox create in bursts of 8, 100 ms apart (create + exec `/bin/true` + destroy)", Baseline: "bwrap (full isolation)",
		Intro: "Eight creates start together, a burst every 100 ms (later when the last burst has not ended); each sample is one create's whole latency, " +
			"so queueing behind the other seven counts. The rows take turns burst by burst. With a warm pool, a create takes a sandbox built ahead " +
			"(namespaces, root, confinement, cgroup; no identity yet), binds its identity and opens its exits; the pool refills in the background."}
	bursts := max(5, iterations(400)/burstSize)
	base := &probe{name: "bwrap (full isolation)", note: bw.note, fn: bw.fn, err: bw.err}
	ps := []*probe{base}
	ctx := context.Background()
	poolState := ""
	for _, pool := range []int{burstSize, 0} {
		p := &probe{name: "sluice sandboxd, warm pool of 8", note: "pool.size 8: every create of a burst takes a pooled sandbox while the pool lasts"}
		if pool == 0 {
			p.name, p.note = "sluice sandboxd, no pool", "every create forks its sandbox"
		}
		ps = append(ps, p)
		m, state, err := sandboxManagerIn(t, w, pool)
		if err != nil {
			p.err = err
			continue
		}
		if pool > 0 {
			poolState = state
		}
		p.fn = func() error {
			in, err := m.Create(ctx, sandboxd.CreateRequest{Agent: "bench"})
			if err != nil {
				return fmt.Errorf("create: %w", err)
			}
			res, err := m.Exec(ctx, in.ID, sandboxd.ExecRequest{Argv: []string{"/bin/true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
			}
			if derr := m.Destroy(in.ID); err == nil && derr != nil {
				err = fmt.Errorf("destroy: %w", derr)
			}
			return err
		}
	}
	time.Sleep(time.Second)     // the pool fills
	for b := range bursts + 1 { // the first burst of each row warms it, untimed
		for _, p := range ps {
			if p.err != nil || p.fn == nil {
				continue
			}
			start := time.Now()
			var mu sync.Mutex
			var wg sync.WaitGroup
			for range burstSize {
				wg.Add(1)
				go func() {
					defer wg.Done()
					t0 := time.Now()
					err := p.fn()
					d := time.Since(t0)
					mu.Lock()
					defer mu.Unlock()
					if err != nil && p.err == nil {
						p.err = err
					}
					if b > 0 {
						p.lat = append(p.lat, d)
					}
				}()
			}
			wg.Wait()
			time.Sleep(burstGap - time.Since(start))
		}
	}
	for _, p := range ps {
		slices.Sort(p.lat)
	}
	sec.addProbes(ps)
	if poolState != "" {
		hit, all := poolHits(poolState)
		sec.Notes = append(sec.Notes, fmt.Sprintf("Of the warm-pool row's %d creates (the untimed first burst included), %d took a pooled sandbox; the other %d found the pool not yet refilled and forked their own (a create never waits for a refill).", all, hit, all-hit))
	}
	pool, bwr := sec.find("sluice sandboxd, warm pool of 8"), sec.find("bwrap (full isolation)")
	sec.Verdicts = append(sec.Verdicts, verdictLat("issue 24: warm pool ≤ 0.5× bwrap (median)", pool, bwr, 0.5),
		verdictP99("issue 24: warm pool ≤ 1.0× bwrap (p99)", pool, bwr, 1.0))
	return sec
}
