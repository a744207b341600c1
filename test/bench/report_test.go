//go:build linux

package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// row is one line of a section's table: latency samples, a throughput, a
// size, or the reason it was not measured.
type row struct {
	Name   string
	Lat    []time.Duration // sorted; latency rows
	QPS    float64         // throughput rows
	Bytes  int64           // size rows
	Reason string          // "not measured: …" when the row has no number
	Note   string
}

func (r *row) measured() bool { return r.Reason == "" }

// section is one table: rows compared with the row named Baseline.
type section struct {
	Title    string
	Intro    string   // what is measured and how
	Rows     []*row   // the baseline is one of them
	Baseline string   // name of the baseline row
	Notes    []string // after the table: what each row means
	Verdicts []string // goals from other issues, met or not
	Rate     string   // the throughput column's heading ("queries/s")
}

func (s *section) add(r *row) *row { s.Rows = append(s.Rows, r); return r }

func (s *section) lat(name string, lat []time.Duration, err error, note string) *row {
	r := &row{Name: name, Lat: lat, Note: note}
	if err != nil {
		r.Lat, r.Reason = nil, "not measured: "+oneLine(err.Error())
	}
	return s.add(r)
}

func (s *section) skip(name, reason string) *row {
	return s.add(&row{Name: name, Reason: "not measured: " + oneLine(reason)})
}

func (s *section) base() *row {
	for _, r := range s.Rows {
		if r.Name == s.Baseline {
			return r
		}
	}
	return nil
}

func (s *section) find(name string) *row {
	for _, r := range s.Rows {
		if r.Name == name {
			return r
		}
	}
	return nil
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
}

func ratio(a, b float64) string {
	if b <= 0 || a <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// machine is the facts at the top of the report.
type machine struct {
	Lines []string
}

// writeReport writes the Markdown report and the chart into dir.
func writeReport(dir string, smoke bool, m machine, secs []*section, started time.Time) (md, chart string, err error) {
	var b strings.Builder
	b.WriteString("# sluice performance against its peers\n\n")
	if smoke {
		b.WriteString("> **SMOKE RUN** (`-short`): a few iterations per row, to keep the harness working. The numbers are not meaningful.\n\n")
	}
	b.WriteString("Every figure is a ratio to a baseline measured in the same run, on the same machine, at the same time. " +
		"Latencies are sequential requests from one client (median and p99 of the samples); the rows of a table take turns in blocks of 1/40 of their samples, so that load from elsewhere falls on every row alike; ratios are row ÷ baseline for the median and for the p99 separately. " +
		"The machine is shared and loaded by other work, so absolute numbers are noisy; the ratios are the result.\n\n")
	fmt.Fprintf(&b, "Reproduce (as root, Debian 12): `apt-get install -y squid tinyproxy bubblewrap crun dnsperf dnsmasq-base nginx-light wrk` then `SLUICE_BENCH=full go test ./test/bench -run TestBench -timeout 60m -v` (writes this file and `bench.png`).\n\n")
	b.WriteString("## Machine\n\n")
	for _, l := range m.Lines {
		fmt.Fprintf(&b, "- %s\n", l)
	}
	fmt.Fprintf(&b, "- run: %s, %s\n\n", started.UTC().Format(time.RFC3339), time.Since(started).Round(time.Second))
	b.WriteString("![latency distributions](bench.png)\n\n")
	b.WriteString("The chart: one bar per latency row, numbered as in the tables (section.row); the box spans p25–p75, the tick is the median, the whisker reaches p99; orange bars are the baselines; the scale is logarithmic.\n\n")
	for i, s := range secs {
		fmt.Fprintf(&b, "## %d. %s\n\n", i+1, s.Title)
		if s.Intro != "" {
			b.WriteString(s.Intro + "\n\n")
		}
		writeTable(&b, i+1, s)
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
		if len(s.Notes) > 0 {
			b.WriteString("\n")
		}
		if len(s.Verdicts) > 0 {
			b.WriteString("**Goals:**\n\n")
			for _, v := range s.Verdicts {
				fmt.Fprintf(&b, "- %s\n", v)
			}
			b.WriteString("\n")
		}
	}
	md = filepath.Join(dir, "bench.md")
	if err := os.WriteFile(md, []byte(b.String()), 0o644); err != nil {
		return "", "", fmt.Errorf("write report: %w", err)
	}
	chart = filepath.Join(dir, "bench.png")
	if err := writeChart(chart, secs); err != nil {
		return md, "", err
	}
	return md, chart, nil
}

func writeTable(b *strings.Builder, si int, s *section) {
	base := s.base()
	kind := "lat"
	for _, r := range s.Rows {
		switch {
		case r.QPS > 0:
			kind = "qps"
		case r.Bytes > 0:
			kind = "bytes"
		}
	}
	switch kind {
	case "lat":
		b.WriteString("| # | row | median | p99 | median ratio | p99 ratio | n |\n|---|---|---:|---:|---:|---:|---:|\n")
	case "qps":
		rate := s.Rate
		if rate == "" {
			rate = "per second"
		}
		fmt.Fprintf(b, "| # | row | %s | ratio | median | p99 | median ratio | p99 ratio |\n|---|---|---:|---:|---:|---:|---:|---:|\n", rate)
	case "bytes":
		b.WriteString("| # | row | value | ratio |\n|---|---|---:|---:|\n")
	}
	for ri, r := range s.Rows {
		name := r.Name
		if r.Name == s.Baseline {
			name += " (baseline)"
		}
		if r.Note != "" {
			name += " — " + r.Note
		}
		id := fmt.Sprintf("%d.%d", si, ri+1)
		if !r.measured() {
			cols := map[string]int{"lat": 5, "qps": 6, "bytes": 2}[kind]
			fmt.Fprintf(b, "| %s | %s | %s |%s\n", id, name, r.Reason, strings.Repeat(" |", cols-1))
			continue
		}
		latCols := func() string {
			if len(r.Lat) == 0 {
				return "– | – | – | –"
			}
			m, p := pct(r.Lat, 50), pct(r.Lat, 99)
			mr, pr := "–", "–"
			if base != nil && len(base.Lat) > 0 {
				mr, pr = ratio(float64(m), float64(pct(base.Lat, 50))), ratio(float64(p), float64(pct(base.Lat, 99)))
			}
			return fmt.Sprintf("%s | %s | %s | %s", fmtDur(m), fmtDur(p), mr, pr)
		}
		switch kind {
		case "lat":
			fmt.Fprintf(b, "| %s | %s | %s | %d |\n", id, name, latCols(), len(r.Lat))
		case "qps":
			q, qr := "–", "–"
			if r.QPS > 0 {
				q = fmt.Sprintf("%.0f", r.QPS)
				if base != nil {
					qr = ratio(r.QPS, base.QPS)
				}
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", id, name, q, qr, latCols())
		case "bytes":
			v, vr := "–", "–"
			if r.Bytes > 0 {
				v = fmt.Sprintf("%.1f MiB", float64(r.Bytes)/(1<<20))
				if base != nil {
					vr = ratio(float64(r.Bytes), float64(base.Bytes))
				}
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s |\n", id, name, v, vr)
		}
	}
	b.WriteString("\n")
}

// machineFacts collects nproc, kernel, Go and the peers' versions.
func machineFacts(opaVersion string) machine {
	var m machine
	host, _ := os.Hostname()
	kernel := version("uname", "-srm")
	m.Lines = append(m.Lines,
		fmt.Sprintf("nproc: %d (GOMAXPROCS %d), host %s", runtime.NumCPU(), runtime.GOMAXPROCS(0), host),
		"kernel: "+kernel,
		"Go: "+runtime.Version(),
		"load average at start: "+strings.TrimSpace(readFile("/proc/loadavg")),
	)
	var pk []string
	for _, p := range []string{"squid", "tinyproxy", "bubblewrap", "crun", "dnsperf", "dnsmasq-base", "nginx-light", "wrk", "util-linux"} {
		v := version("dpkg-query", "-W", "-f", "${Version}", p)
		if v == "" || strings.Contains(v, "no packages found") || v == "not installed" {
			v = "not installed"
		}
		pk = append(pk, p+" "+v)
	}
	m.Lines = append(m.Lines, "peers (Debian packages): "+strings.Join(pk, ", "), "OPA: "+opaVersion, "sluice: "+buildSource())
	if mi := readFile("/proc/meminfo"); mi != "" {
		l, _, _ := strings.Cut(mi, "\n")
		m.Lines = append(m.Lines, "memory: "+strings.Join(strings.Fields(l)[1:], " "))
	}
	return m
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// ---------------------------------------------------------------------------
// Chart: pure Go, image/png, a tiny built-in font.

// glyphs is a 3×5 pixel font: each glyph is five rows of three bits.
var glyphs = map[rune][5]uint8{
	'0': {7, 5, 5, 5, 7}, '1': {2, 6, 2, 2, 7}, '2': {7, 1, 7, 4, 7}, '3': {7, 1, 7, 1, 7}, '4': {5, 5, 7, 1, 1},
	'5': {7, 4, 7, 1, 7}, '6': {7, 4, 7, 5, 7}, '7': {7, 1, 1, 1, 1}, '8': {7, 5, 7, 5, 7}, '9': {7, 5, 7, 1, 7},
	'.': {0, 0, 0, 0, 2}, 'U': {5, 5, 5, 5, 7}, 'S': {7, 4, 7, 1, 7}, 'M': {5, 7, 7, 5, 5}, ' ': {},
}

func drawText(img *image.RGBA, x, y, scale int, s string, c color.Color) {
	for _, ch := range s {
		g := glyphs[ch]
		for gy := 0; gy < 5; gy++ {
			for gx := 0; gx < 3; gx++ {
				if g[gy]&(4>>gx) != 0 {
					fill(img, x+gx*scale, y+gy*scale, scale, scale, c)
				}
			}
		}
		x += 4 * scale
	}
}

func fill(img *image.RGBA, x, y, w, h int, c color.Color) {
	for i := x; i < x+w; i++ {
		for j := y; j < y+h; j++ {
			img.Set(i, j, c)
		}
	}
}

// writeChart draws one horizontal bar per latency row on a log scale from
// 10 µs to the largest p99, with decade grid lines labelled in µs/ms/s.
func writeChart(path string, secs []*section) error {
	type bar struct {
		label              string
		p25, p50, p75, p99 time.Duration
		baseline           bool
	}
	var bars []bar
	maxD := 100 * time.Microsecond
	for si, s := range secs {
		for ri, r := range s.Rows {
			if len(r.Lat) == 0 {
				continue
			}
			b := bar{fmt.Sprintf("%d.%d", si+1, ri+1), pct(r.Lat, 25), pct(r.Lat, 50), pct(r.Lat, 75), pct(r.Lat, 99), r.Name == s.Baseline}
			maxD = max(maxD, b.p99)
			bars = append(bars, b)
		}
	}
	const left, top, rowH, width = 60, 30, 14, 900
	h := top + rowH*len(bars) + 20
	img := image.NewRGBA(image.Rect(0, 0, width, max(h, 60)))
	fill(img, 0, 0, width, max(h, 60), color.White)
	lo := math.Log10(10e3) // 10 µs in ns
	hi := math.Ceil(math.Log10(float64(maxD)))
	x := func(d time.Duration) int {
		v := math.Log10(math.Max(float64(d), 10e3))
		return left + int((v-lo)/(hi-lo)*float64(width-left-70))
	}
	grey := color.RGBA{200, 200, 200, 255}
	for e := lo; e <= hi; e++ {
		gx := x(time.Duration(math.Pow(10, e)))
		fill(img, gx, top-4, 1, h-top, grey)
		d := time.Duration(math.Pow(10, e))
		var l string
		switch {
		case d >= time.Second:
			l = fmt.Sprintf("%dS", d/time.Second)
		case d >= time.Millisecond:
			l = fmt.Sprintf("%dMS", d/time.Millisecond)
		default:
			l = fmt.Sprintf("%dUS", d/time.Microsecond)
		}
		drawText(img, gx+2, 6, 2, l, color.Black)
	}
	blue, orange, dark := color.RGBA{70, 130, 200, 255}, color.RGBA{230, 140, 40, 255}, color.RGBA{20, 20, 20, 255}
	for i, b := range bars {
		y := top + i*rowH
		drawText(img, 4, y+2, 2, b.label, color.Black)
		c := blue
		if b.baseline {
			c = orange
		}
		fill(img, x(b.p75), y+rowH/2, x(b.p99)-x(b.p75)+1, 1, dark) // whisker to p99
		fill(img, x(b.p99), y+3, 1, rowH-6, dark)
		fill(img, x(b.p25), y+2, max(1, x(b.p75)-x(b.p25)), rowH-4, c)
		fill(img, x(b.p50), y+1, 2, rowH-2, dark)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return fmt.Errorf("chart: %w", err)
	}
	return f.Close()
}

// verdictLat says whether row's median is at most max × base's median.
func verdictLat(goal string, row, base *row, max float64) string {
	return verdictAt(50, goal, row, base, max)
}

// buildSource says which code the gateway binary was built from.
func buildSource() string {
	head := version("git", "-C", moduleRoot, "rev-parse", "--short", "HEAD")
	if src := os.Getenv("BENCH_SRC"); src != "" {
		return fmt.Sprintf("gateway built from BENCH_SRC (%s); sandboxd from the working tree at %s", src, head)
	}
	dirty := ""
	if out := version("git", "-C", moduleRoot, "status", "--porcelain"); out != "" && out != "not installed" {
		dirty = " with uncommitted changes"
	}
	return "built from the working tree at " + head + dirty
}

// verdictP99 is verdictLat at the 99th percentile.
func verdictP99(goal string, row, base *row, max float64) string {
	return verdictAt(99, goal, row, base, max)
}

// verdictAt holds a latency goal at percentile p: met when the row's p-th
// percentile is at most max times the base's.
func verdictAt(p float64, goal string, row, base *row, max float64) string {
	if row == nil || base == nil || len(row.Lat) == 0 || len(base.Lat) == 0 {
		return goal + ": not measured"
	}
	r := float64(pct(row.Lat, p)) / float64(pct(base.Lat, p))
	if r <= max {
		return fmt.Sprintf("%s: **met** (%.2f×)", goal, r)
	}
	return fmt.Sprintf("%s: **not met** (%.2f×)", goal, r)
}
