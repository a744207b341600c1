//go:build linux

package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// bulkPath is the upstream's bulk download: GET /bulk/N answers N bytes.
const bulkPath = "/bulk/"

// serveBulk answers GET /bulk/N with N bytes from one reused buffer, so
// the upstream costs the same for every row; false for any other path.
func serveBulk(rw http.ResponseWriter, r *http.Request) bool {
	s, ok := strings.CutPrefix(r.URL.Path, bulkPath)
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		http.Error(rw, "bad size", http.StatusBadRequest)
		return true
	}
	rw.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := make([]byte, 64<<10)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := rw.Write(buf[:k]); err != nil {
			return true
		}
		n -= k
	}
	return true
}

// bulkTarget is one way to reach the upstream: directly or through a proxy.
type bulkTarget struct {
	name   string
	mk     func() *http.Client
	meters func() []*cpuMeter // the proxy's processes (none for direct)
	err    error
}

// benchBulk is the bulk-download table: one 100 MB GET at a time (as pip
// install or git clone fetches an archive), through a CONNECT tunnel
// (HTTPS) and through the plain proxy (HTTP), each beside the same
// download made directly; the rows are sampled in turns.
func benchBulk(targets []bulkTarget) *section {
	size := int64(100 << 20) // MiB
	rounds := 5
	if smoke() {
		size, rounds = 16<<20, 2
	}
	s := &section{Title: fmt.Sprintf("Egress proxy: bulk download (one %d MiB GET)", size>>20), Baseline: "direct HTTPS", Rate: "MB/s",
		Intro: fmt.Sprintf("One client downloads %d MiB from the loopback upstream (%s), %d times per row in turns; MB/s is the size over the median download time. "+
			"HTTPS rows go through a CONNECT tunnel (TLS end to end, the proxy relays bytes); HTTP rows through the plain proxy (the proxy reads and writes the body). "+
			"The ratio column is against direct HTTPS; the HTTP rows' verdict is against direct HTTP.", size>>20, egressIP, rounds)}
	type job struct {
		name string
		c    *http.Client
		url  string
		took []time.Duration
		cpu  []*cpuMeter
		err  error
	}
	var jobs []*job
	for _, scheme := range []string{"HTTPS", "HTTP"} {
		for _, tg := range targets {
			name := tg.name + " " + scheme
			if tg.name == "direct" {
				name = "direct " + scheme
			} else if scheme == "HTTPS" {
				name = tg.name + " CONNECT (HTTPS)"
			} else {
				name = tg.name + " plain (HTTP)"
			}
			j := &job{name: name, err: tg.err, url: fmt.Sprintf("%s://pkg.test%s%d", strings.ToLower(scheme), bulkPath, size)}
			if tg.err == nil {
				j.c = tg.mk()
				j.c.Timeout = 5 * time.Minute
				j.cpu = append(tg.meters(), &cpuMeter{name: "test process (client, upstream)"})
			}
			jobs = append(jobs, j)
		}
	}
	for range rounds {
		for _, j := range jobs {
			if j.err != nil {
				continue
			}
			at := make([]time.Duration, len(j.cpu))
			for i, m := range j.cpu {
				at[i] = m.read()
			}
			t0 := time.Now()
			n, err := download(j.c, j.url)
			if err == nil && n != size {
				err = fmt.Errorf("downloaded %d bytes, want %d", n, size)
			}
			if err != nil {
				j.err = err
				continue
			}
			j.took = append(j.took, time.Since(t0))
			for i, m := range j.cpu {
				m.used += m.read() - at[i]
			}
		}
	}
	var cpu []string
	for _, j := range jobs {
		if j.c != nil {
			j.c.CloseIdleConnections()
		}
		r := &row{Name: j.name}
		if j.err != nil {
			r.Reason = "not measured: " + oneLine(j.err.Error())
		} else {
			slices.Sort(j.took)
			r.Lat = j.took
			r.QPS = float64(size) / 1e6 / pct(r.Lat, 50).Seconds()
			var ps []string
			for _, m := range j.cpu {
				ps = append(ps, fmt.Sprintf("%s %.2f", m.name, m.used.Seconds()*1e3/float64(len(j.took))/(float64(size)/1e8)))
			}
			cpu = append(cpu, j.name+": "+strings.Join(ps, ", "))
		}
		s.add(r)
	}
	s.Verdicts = append(s.Verdicts,
		verdictRatio("issue 22: bulk download through CONNECT ≥ 0.9× direct", s.find("sluice (via sandbox relay) CONNECT (HTTPS)"), s.find("direct HTTPS"), 0.9))
	if p, d := s.find("sluice (via sandbox relay) plain (HTTP)"), s.find("direct HTTP"); p != nil && d != nil && p.QPS > 0 && d.QPS > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("Through the plain proxy sluice downloads at %.2f× direct HTTP (no goal set).", p.QPS/d.QPS))
	}
	if len(cpu) > 0 {
		s.Notes = append(s.Notes, "CPU ms per 100 MB downloaded (user+system, /proc/PID/stat of each process group; the client's TLS and the upstream's are this test process): "+strings.Join(cpu, "; ")+".")
	}
	s.Notes = append(s.Notes, "Through CONNECT sluice relays the tunnel socket to socket, a bulk direction 1 MiB per read(2) and write(2) (splice(2) cost the client and upstream more, perf-egress.md); the Go floor splices (io.Copy); the plain proxy reads the body and writes it on.")
	return s
}

// download GETs url and returns how many body bytes arrived.
func download(c *http.Client, url string) (int64, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	return io.Copy(io.Discard, resp.Body)
}
