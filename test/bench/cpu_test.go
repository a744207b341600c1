package bench

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

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
	n, took, err := throughputN(conc, (profileSeconds+1)*time.Second, mk, nil)
	wg.Wait()
	fmt.Fprintf(os.Stderr, "bench: profiled %s at %d callers: %d calls in %s (err %v)\n", stage, conc, n, took.Round(time.Millisecond), err)
}
