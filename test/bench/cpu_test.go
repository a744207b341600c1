package bench

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// cpuProc is a process whose CPU time a throughput row accounts per call:
// the figure that load from elsewhere does not move, where calls per second
// on a shared two-core machine do. Pid 0 is this test process (the clients,
// and the peers that run in it).
type cpuProc struct {
	name string
	pid  int
}

// cpuTime is the user+system CPU time pid has used so far.
func cpuTime(pid int) (time.Duration, error) {
	if pid == 0 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return 0, err
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command's closing parenthesis: state is the
	// first, utime the 12th, stime the 13th (proc(5) fields 3, 14, 15).
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clkTck, nil
}

// clkTck is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports.
const clkTck = 100

// cpuSample is the CPU time of each of procs now.
func cpuSample(procs []cpuProc) []time.Duration {
	out := make([]time.Duration, len(procs))
	for i, p := range procs {
		out[i], _ = cpuTime(p.pid) // a process gone counts nothing more
	}
	return out
}

// cpuNote says a row's CPU-µs per call for each process it accounts.
func cpuNote(procs []cpuProc, used []time.Duration, calls int64) string {
	if len(procs) == 0 || calls == 0 {
		return ""
	}
	parts := make([]string, len(procs))
	for i, p := range procs {
		parts[i] = fmt.Sprintf("%s %.0f", p.name, cpuPerCall(used[i], calls))
	}
	return "CPU-µs per call: " + strings.Join(parts, ", ")
}

// cpuPerCall is used ÷ calls in µs.
func cpuPerCall(used time.Duration, calls int64) float64 {
	if calls == 0 {
		return 0
	}
	return float64(used.Microseconds()) / float64(calls)
}

// profileDir is BENCH_PROFILE: when set, the throughput rows' gateways run
// with serve --debug-listen (which turns the mutex and block profiles on,
// so their rows cost a little more than without it), and after the rows
// each is profiled under its 8-caller load into this directory.
func profileDir() string { return os.Getenv("BENCH_PROFILE") }

// profileSeconds is how long each gateway is profiled under load.
const profileSeconds = 8

// profileGateway puts the gateway of stage under conc callers (made by mk)
// for profileSeconds while it takes its CPU profile and its mutex and block
// profiles over the same seconds, and writes them to BENCH_PROFILE as
// STAGE-cpu.pprof, STAGE-mutex.pprof, STAGE-block.pprof. A failure is
// reported on stderr: profiles are for the person reading them, not a row.
func profileGateway(w *world, stage, addr string, conc int, mk func() (func() error, func())) {
	tr := w.ns.transport()
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: (profileSeconds + 30) * time.Second}
	var wg sync.WaitGroup
	for _, p := range []string{"profile", "mutex", "block"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := p
			if p == "profile" {
				name = "cpu"
			}
			out := filepath.Join(profileDir(), stage+"-"+name+".pprof")
			resp, err := c.Get(fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", addr, p, profileSeconds))
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: profile %s: %v\n", out, err)
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
			}
			if err == nil {
				err = os.WriteFile(out, b, 0o644)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: profile %s: %v\n", out, err)
			}
		}()
	}
	n, took, err := throughputN(conc, (profileSeconds+1)*time.Second, mk)
	wg.Wait()
	fmt.Fprintf(os.Stderr, "bench: profiled %s at %d callers: %d calls in %s (err %v)\n", stage, conc, n, took.Round(time.Millisecond), err)
}
