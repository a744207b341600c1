package gateway

import (
	"os"
	"path/filepath"
	"runtime"

	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
)

// BenchmarkAllowedCall compares one allowed tool call end to end over the
// Unix socket (identity, validation, Rego, credential, guarded dial, scrub,
// two fsynced audit records) with a direct call to the same upstream, in the
// same run. The p50 difference is the gateway's added latency.
//
// "gateway" keeps the audit log on the test's disk (each call waits for an
// fsync); "gateway-audit-tmpfs" puts it on /dev/shm, where fsync is nearly
// free, which isolates the gateway's own work from the disk's.
func BenchmarkAllowedCall(b *testing.B) {
	up := newUpstream(b)
	g := startGateway(b, up.URL, "", nil)
	shm := startGateway(b, up.URL, "", auditOnShm(b))
	direct := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}

	run := func(b *testing.B, do func() int) {
		lat := make([]time.Duration, 0, b.N)
		cpu0 := processCPU()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if st := do(); st != 200 {
				b.Fatalf("status %d", st)
			}
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		// CPU time of the whole process (client, gateway and upstream)
		// per call: unlike latency, other processes on the machine barely
		// move it, so it compares two builds on a busy host.
		b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
	b.Run("direct", func(b *testing.B) {
		run(b, func() int {
			req, _ := http.NewRequest("GET", up.URL+"/tickets?limit=5", nil)
			req.Header.Set("X-Api-Key", testSecret)
			resp, err := direct.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		})
	})
	for _, v := range []struct {
		name string
		gw   *testGateway
	}{{"gateway", g}, {"gateway-audit-tmpfs", shm}} {
		via := v.gw.client(agentA)
		b.Run(v.name, func(b *testing.B) {
			run(b, func() int {
				resp, err := via.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{"query":{"limit":5}}`))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			})
		})
	}
}

// auditOnShm puts a test gateway's audit log on /dev/shm, where fsync is
// nearly free (the test's temporary directory where there is none).
func auditOnShm(b *testing.B) func(*config.Config) {
	return func(c *config.Config) {
		c.Audit.Path = filepath.Join(b.TempDir(), "audit.log")
		if dir, err := os.MkdirTemp("/dev/shm", "sluice-bench-"); err == nil {
			b.Cleanup(func() { os.RemoveAll(dir) })
			c.Audit.Path = filepath.Join(dir, "audit.log")
		}
	}
}

// processCPU is the user and system CPU time this process has used (its
// own copy: the egress benchmarks' cpuTime leaves with them).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAllowedCallParallel is BenchmarkAllowedCall's tmpfs and disk
// gateways called by 8 concurrent callers, each on its own kept-alive
// socket connection (test/bench's throughput rows, in process): with
// -mutexprofile and -blockprofile it shows what calls wait on.
func BenchmarkAllowedCallParallel(b *testing.B) {
	up := newUpstream(b)
	shm := startGateway(b, up.URL, "", auditOnShm(b))
	disk := startGateway(b, up.URL, "", nil)
	for _, v := range []struct {
		name string
		gw   *testGateway
	}{{"audit-tmpfs", shm}, {"audit-disk", disk}} {
		b.Run(v.name, func(b *testing.B) {
			b.SetParallelism((8 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			st0 := v.gw.audit.Stats()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				via := v.gw.client(agentA)
				defer via.CloseIdleConnections()
				for pb.Next() {
					resp, err := via.Post("http://sluice/v1/tools/tickets.list_tickets", "application/json", strings.NewReader(`{"query":{"limit":5}}`))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.StopTimer()
			st := v.gw.audit.Stats()
			if syncs := st.Syncs - st0.Syncs; syncs > 0 {
				b.ReportMetric(float64(st.Records-st0.Records)/float64(syncs), "records/fsync")
			}
		})
	}
}
