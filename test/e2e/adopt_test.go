//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// adoptable is a real gateway and a sandboxd serve (adopt_wait 2m) on a
// state_dir of its own, for the restart tests.
type adoptable struct {
	e                    *gwenv.Env
	g                    *gwenv.Gateway
	dir, state, cfg, api string
	sd                   *sandboxdProc
	run                  func(args ...string) (string, string, int)
	host                 net.Listener // a host listener the agent must not reach (its "escape" line)
}

// startAdoptable starts them; extra is appended to sandboxd.yaml.
func startAdoptable(t *testing.T, stem, extra string) *adoptable {
	t.Helper()
	a := &adoptable{e: newEnv(t)}
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("kernel lacks user namespaces")
	}
	buildSandboxBins(t)
	d := mainConfig(a.e, stem)
	a.g = a.e.Start(d, a.e.Write(d))
	a.dir = sandboxState(t, "sluice-e2e-"+stem+"-")
	a.state = filepath.Join(a.dir, "state")
	a.cfg = filepath.Join(a.dir, "sandboxd.yaml")
	a.api = filepath.Join(a.dir, "api.sock")
	if err := os.WriteFile(a.cfg, []byte("api: "+a.api+"\nstate_dir: "+a.state+"\ngateway: "+a.g.Sock+"\nadopt_wait: 2m\n"+extra), 0o600); err != nil {
		t.Fatal(err)
	}
	a.sd = startSandboxd(t, a.cfg, a.api)
	a.run = func(args ...string) (string, string, int) {
		t.Helper()
		return runBin(t, a.dir, sandboxdBin, append([]string{args[0], "--config", a.cfg}, args[1:]...)...)
	}
	var err error
	if a.host, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.host.Close() })
	return a
}

// TestSandboxdRestartKeepsSandboxes: sandboxd serve with ten running
// sandboxes (one with a 64 MiB memory limit) and two pinned namespaces is
// killed with SIGKILL; meanwhile an eleventh sandbox's init is killed. A
// new sandboxd on the same state_dir re-adopts the ten and the two pins:
// all twelve reach the real gateway with their own identities (the ten
// over 127.0.0.1:3128 and the bind-mounted socket), exec works, a memory
// bomb in the limited one is still OOM-killed and reported, the dead one
// is cleaned up and reported sandbox_lost, and destroy removes a
// re-adopted sandbox's processes, cgroup and state.
func TestSandboxdRestartKeepsSandboxes(t *testing.T) {
	a := startAdoptable(t, "adopt", "limits:\n  memory_bytes: 512MiB\n  workspace_bytes: 32MiB\n")
	e, g, dir, state, cfg, api, sd, run, host := a.e, a.g, a.dir, a.state, a.cfg, a.api, a.sd, a.run, a.host

	const n = 10
	var ids []string
	for i := range n + 1 {
		args := []string{"create", "--agent", "agent-a", "--session", "adopt-" + strconv.Itoa(i), "--user", "alice"}
		if i == 0 {
			args = append(args, "--memory", "64MiB")
		}
		out, stderr, code := run(args...)
		id := strings.TrimSpace(out)
		if code != 0 || len(id) != 16 {
			t.Fatalf("create #%d: exit %d, %q %q", i, code, out, stderr)
		}
		ids = append(ids, id)
		if out, stderr, code := run("cp", agentBin, id+":/workspace/agent"); code != 0 {
			t.Fatalf("cp agent: exit %d %q %q", code, out, stderr)
		}
	}
	var pins []*gwenv.NetNS
	for i := range 2 {
		ns := gwenv.NewNetNS(t)
		if out, stderr, code := run("pin", "--netns", "/run/netns/"+ns.Name, "--agent", "agent-a", "--session", "adopt-pin-"+strconv.Itoa(i), "--user", "alice"); code != 0 {
			t.Fatalf("pin: exit %d %q %q", code, out, stderr)
		}
		pins = append(pins, ns)
	}
	evs := sandboxdEvents(t, state)
	pidOf := map[string]int{}
	for _, ev := range evs {
		if ev["event"] == "created" {
			pidOf[ev["sandbox"].(string)] = int(ev["pid"].(float64))
		}
	}

	sd.kill9()
	dead := ids[n]
	if err := syscall.Kill(pidOf[dead], syscall.SIGKILL); err != nil {
		t.Fatalf("kill the init of %s (pid %d): %v", dead, pidOf[dead], err)
	}
	// Once it is gone (or a zombie nobody reaped yet): the new sandboxd
	// must find it dead, not dying.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pidOf[dead]) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed init %d is still running", pidOf[dead])
		}
	}
	// Every other init outlived its sandboxd.
	for _, id := range ids[:n] {
		if err := syscall.Kill(pidOf[id], 0); err != nil {
			t.Fatalf("init of %s (pid %d) died with sandboxd: %v", id, pidOf[id], err)
		}
	}
	sd = startSandboxd(t, cfg, api)

	out, _, _ := run("ls")
	evs = sandboxdEvents(t, state)
	c := casebook.Expect(t, "G19", "sandboxd is killed with SIGKILL while ten sandboxes and two pins run, and one more sandbox's init is killed while it is down; a new sandboxd starts on the same state_dir",
		"ten sandbox_readopted and two pin_readopted, the dead one sandbox_lost and cleaned up; all twelve reach the gateway as their own identities, exec works, a memory bomb is still killed_by=oom, destroy cleans up")
	c.Observef("readopted %d, pins %d, lost %d; ls has the dead one: %v", countEvents(evs, "sandbox_readopted", ""),
		countEvents(evs, "pin_readopted", ""), countEvents(evs, "sandbox_lost", dead), strings.Contains(out, dead))
	if countEvents(evs, "sandbox_readopted", "") != n || countEvents(evs, "pin_readopted", "") != 2 || countEvents(evs, "sandbox_lost", dead) != 1 {
		t.Errorf("events after the restart: want %d sandbox_readopted, 2 pin_readopted, sandbox_lost for %s: %v", n, dead, evs)
	}
	if strings.Contains(out, dead) || strings.Count(out, "agent-a") != n {
		t.Errorf("ls after the restart: %q; want the %d live sandboxes and not %s", out, n, dead)
	}
	if _, err := os.Stat(filepath.Join(state, "sandboxes", dead)); !os.IsNotExist(err) {
		t.Errorf("the dead sandbox's directory is left: %v", err)
	}

	// All twelve reach the gateway.
	var wg sync.WaitGroup
	results := make([]string, n)
	for i, id := range ids[:n] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, stderr, code := runBin(t, dir, sandboxdBin, "exec", "--config", cfg, id, "--", "/workspace/agent", "tickets.list_tickets", host.Addr().String())
			results[i] = fmt.Sprintf("exit %d %s %s", code, out, stderr)
		}()
	}
	wg.Wait()
	for i, r := range results {
		e.Keep([]byte(r))
		if !strings.Contains(r, "tcp 200 ") || !strings.Contains(r, "unix 200 ") || !strings.Contains(r, "escape error") {
			t.Errorf("sandbox %d (%s) after the restart: %q; want tcp and unix 200, escape refused", i, ids[i], r)
		}
	}
	for i, ns := range pins {
		status, body, err := podCall(ns, "tickets.list_tickets")
		e.Keep([]byte(body))
		if err != nil || status != 200 {
			t.Errorf("pin %d after the restart: %d %v %s", i, status, err, body)
		}
	}
	sessions := aliceSessions(g)
	for i := range n {
		if sessions["adopt-"+strconv.Itoa(i)] != 2 {
			t.Errorf("gateway saw %d calls of session adopt-%d, want 2 (tcp and unix)", sessions["adopt-"+strconv.Itoa(i)], i)
		}
	}
	for i := range 2 {
		if sessions["adopt-pin-"+strconv.Itoa(i)] != 1 {
			t.Errorf("gateway saw %d calls of pin session adopt-pin-%d, want 1", sessions["adopt-pin-"+strconv.Itoa(i)], i)
		}
	}

	// The memory limit still holds in a re-adopted sandbox.
	_, stderr, code := run("exec", ids[0], "--", "/bin/sh", "-c", "head -c 400000000 /dev/zero | tail")
	if code != 137 || !strings.Contains(stderr, "killed_by=oom") {
		t.Errorf("memory bomb after the restart: exit %d, stderr %q; want 137 killed_by=oom", code, stderr)
	}
	if countEvents(sandboxdEvents(t, state), "oom", ids[0]) != 1 {
		t.Errorf("events: want one oom for %s", ids[0])
	}

	// Destroy of a re-adopted sandbox: init gone, cgroup and state removed.
	if out, stderr, code := run("rm", ids[1]); code != 0 {
		t.Fatalf("rm: exit %d %q %q", code, out, stderr)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err1 := os.Stat(filepath.Join(state, "boxes", ids[1]+".json"))
		_, err2 := os.Stat(filepath.Join("/sys/fs/cgroup/pids/sluice-sandboxd", ids[1]))
		err3 := syscall.Kill(pidOf[ids[1]], 0)
		if os.IsNotExist(err1) && os.IsNotExist(err2) && err3 != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after rm of a re-adopted sandbox: state %v, cgroup %v, init alive %v", err1, err2, err3 == nil)
		}
	}
	if _, stderr, code := run("exec", ids[1], "--", "true"); code != 1 || !strings.Contains(stderr, "not_found") {
		t.Errorf("exec after rm: exit %d %q", code, stderr)
	}
	_ = exec.Command("true").Run()
}

// TestSandboxdUpgradeKeepsSandboxes is the upgrade path: with on_stop:
// keep, sandboxd stopping on SIGTERM (systemctl restart with
// KillMode=process) releases its sandboxes instead of destroying them;
// the next sandboxd re-adopts them and they run and reach the gateway as
// before. With the default (destroy), the same stop kills them.
func TestSandboxdUpgradeKeepsSandboxes(t *testing.T) {
	e := newEnv(t)
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("kernel lacks user namespaces")
	}
	buildSandboxBins(t)
	d := mainConfig(e, "upgrade")
	g := e.Start(d, e.Write(d))
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	for _, onStop := range []string{"keep", "destroy"} {
		t.Run(onStop, func(t *testing.T) {
			dir := sandboxState(t, "sluice-e2e-upgrade-")
			state := filepath.Join(dir, "state")
			cfg := filepath.Join(dir, "sandboxd.yaml")
			api := filepath.Join(dir, "api.sock")
			if err := os.WriteFile(cfg, []byte("api: "+api+"\nstate_dir: "+state+"\ngateway: "+g.Sock+
				"\nadopt_wait: 1m\non_stop: "+onStop+"\npool: {size: 1}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			sd := startSandboxd(t, cfg, api)
			run := func(args ...string) (string, string, int) {
				t.Helper()
				return runBin(t, dir, sandboxdBin, append([]string{args[0], "--config", cfg}, args[1:]...)...)
			}
			out, stderr, code := run("create", "--agent", "agent-a", "--session", "upgrade-"+onStop, "--user", "alice")
			id := strings.TrimSpace(out)
			if code != 0 || len(id) != 16 {
				t.Fatalf("create: exit %d %q %q", code, out, stderr)
			}
			if _, stderr, code := run("cp", agentBin, id+":/workspace/agent"); code != 0 {
				t.Fatalf("cp: %q", stderr)
			}
			var pid int
			for _, ev := range sandboxdEvents(t, state) {
				if ev["event"] == "created" {
					pid = int(ev["pid"].(float64))
				}
			}
			// The pool refilled after the create took its sandbox.
			for deadline := time.Now().Add(60 * time.Second); len(spareRecords(t, state)) < 1; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the pool did not refill in 60s")
				}
			}
			spare := ""
			for id := range spareRecords(t, state) {
				spare = id
			}
			sd.stop() // SIGTERM
			alive := syscall.Kill(pid, 0) == nil
			if onStop == "destroy" {
				for deadline := time.Now().Add(5 * time.Second); alive && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
					alive = err == nil && !strings.Contains(string(b), ") Z ")
				}
				if alive {
					t.Errorf("on_stop destroy: the init outlived SIGTERM")
				}
				return
			}
			if !alive || countEvents(sandboxdEvents(t, state), "sandbox_released", id) != 1 {
				t.Fatalf("on_stop keep: init alive %v; want it alive and sandbox_released", alive)
			}
			startSandboxd(t, cfg, api)
			out, stderr, code = run("exec", id, "--", "/workspace/agent", "tickets.list_tickets", host.Addr().String())
			e.Keep([]byte(out))
			if code != 0 || !strings.Contains(out, "tcp 200 ") || !strings.Contains(out, "unix 200 ") {
				t.Errorf("after the upgrade: exit %d %q %q; want tcp and unix 200", code, out, stderr)
			}
			if countEvents(sandboxdEvents(t, state), "sandbox_readopted", id) != 1 {
				t.Errorf("want sandbox_readopted for %s", id)
			}
			// The pooled sandbox was released too, and is back in the pool.
			if countEvents(sandboxdEvents(t, state), "spare_readopted", spare) != 1 {
				t.Errorf("want spare_readopted for the pooled %s", spare)
			}
		})
	}
}

// spareRecords reads the state files of pooled sandboxes in state: id →
// its init's pid and template.
func spareRecords(t *testing.T, state string) map[string]struct {
	Pid      int
	Template string
} {
	t.Helper()
	out := map[string]struct {
		Pid      int
		Template string
	}{}
	ents, _ := os.ReadDir(filepath.Join(state, "boxes"))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(state, "boxes", e.Name()))
		if err != nil {
			continue
		}
		var r struct {
			Info struct {
				ID       string `json:"id"`
				Template string `json:"template"`
				Pid      int    `json:"pid"`
			} `json:"info"`
			Spare bool `json:"spare"`
		}
		if json.Unmarshal(b, &r) == nil && r.Spare {
			out[r.Info.ID] = struct {
				Pid      int
				Template string
			}{r.Info.Pid, r.Info.Template}
		}
	}
	return out
}

// TestSandboxdRestartKeepsPoolSpares: sandboxd serve with a warm pool
// (pool.size 2 and a pool of 1 for template small) is killed with
// SIGKILL once the pools are full; meanwhile one pooled sandbox's init is
// killed. The new sandboxd re-adopts the two live ones into their pools
// (spare_readopted), cleans up the dead one (spare_lost: no directory, no
// state file left) and refills; creates then take the re-adopted
// sandboxes (their ids), with and without the template, and they reach
// the gateway with the identity bound at create.
func TestSandboxdRestartKeepsPoolSpares(t *testing.T) {
	a := startAdoptable(t, "adopt-pool", "templates:\n  small:\n    limits: {workspace_bytes: 48MiB}\npool: {size: 2, per_template: {small: 1}}\n")
	e, g, state, cfg, api, sd, run, host := a.e, a.g, a.state, a.cfg, a.api, a.sd, a.run, a.host
	spares := spareRecords(t, state)
	for deadline := time.Now().Add(90 * time.Second); len(spares) < 3; spares = spareRecords(t, state) {
		if time.Now().After(deadline) {
			t.Fatalf("pools hold %d of 3 after 90s: %v", len(spares), spares)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var dead, plain, small string
	for id, r := range spares {
		switch {
		case r.Template == "small":
			small = id
		case dead == "":
			dead = id
		default:
			plain = id
		}
	}
	sd.kill9()
	if err := syscall.Kill(spares[dead].Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the init of pooled %s: %v", dead, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(spares[dead].Pid) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed init %d is still running", spares[dead].Pid)
		}
	}
	for _, id := range []string{plain, small} {
		if err := syscall.Kill(spares[id].Pid, 0); err != nil {
			t.Fatalf("pooled %s's init died with sandboxd: %v", id, err)
		}
	}
	startSandboxd(t, cfg, api)
	evs := sandboxdEvents(t, state)
	c := casebook.Expect(t, "G23", "sandboxd is killed with SIGKILL while its warm pools are full, and one pooled sandbox's init is killed while it is down; a new sandboxd starts on the same state_dir",
		"the live pooled sandboxes are re-adopted into their template's pool (spare_readopted) and serve the next creates; the dead one is cleaned up (spare_lost, no directory or state file) and never handed out")
	c.Observef("readopted %s %d, %s %d; lost %s %d", plain, countEvents(evs, "spare_readopted", plain), small,
		countEvents(evs, "spare_readopted", small), dead, countEvents(evs, "spare_lost", dead))
	if countEvents(evs, "spare_readopted", plain) != 1 || countEvents(evs, "spare_readopted", small) != 1 || countEvents(evs, "spare_lost", dead) != 1 {
		t.Errorf("events after the restart: want spare_readopted for %s and %s, spare_lost for %s: %v", plain, small, dead, evs)
	}
	for _, p := range []string{filepath.Join(state, "sandboxes", dead), filepath.Join(state, "boxes", dead+".json")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("the dead pooled sandbox left %s: %v", p, err)
		}
	}
	for i, tc := range []struct{ template, want string }{{"small", small}, {"", plain}} {
		args := []string{"create", "--agent", "agent-a", "--session", "pool-" + strconv.Itoa(i), "--user", "alice"}
		if tc.template != "" {
			args = append(args, "--template", tc.template)
		}
		out, stderr, code := run(args...)
		id := strings.TrimSpace(out)
		if code != 0 || id != tc.want {
			t.Fatalf("create (template %q): exit %d, %q %q; want the re-adopted %s", tc.template, code, out, stderr, tc.want)
		}
		if _, stderr, code := run("cp", agentBin, id+":/workspace/agent"); code != 0 {
			t.Fatalf("cp agent: %q", stderr)
		}
		out, stderr, code = run("exec", id, "--", "/workspace/agent", "tickets.list_tickets", host.Addr().String())
		e.Keep([]byte(out))
		if code != 0 || !strings.Contains(out, "tcp 200 ") || !strings.Contains(out, "unix 200 ") {
			t.Errorf("re-adopted pooled %s: exit %d %q %q; want tcp and unix 200", id, code, out, stderr)
		}
	}
	seen := aliceSessions(g)
	if seen["pool-0"] != 2 || seen["pool-1"] != 2 {
		t.Errorf("gateway saw sessions %v; want pool-0 and pool-1 twice each (tcp and unix)", seen)
	}
}

// aliceSessions counts the gateway's tool_call lines of agent-a for
// alice, by session (after a moment for the last lines to be written).
func aliceSessions(g *gwenv.Gateway) map[string]int {
	time.Sleep(200 * time.Millisecond)
	sessions := map[string]int{}
	for _, m := range g.LogLines() {
		if m["msg"] == "tool_call" && m["agent"] == "agent-a" && m["user"] == "alice" {
			s, _ := m["session"].(string)
			sessions[s]++
		}
	}
	return sessions
}
