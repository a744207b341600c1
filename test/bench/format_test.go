//go:build linux

package bench

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPercentiles: the report's statistics on known samples.
func TestPercentiles(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		name string
		s    []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one sample", ms(7), 99, 7 * time.Millisecond},
		{"median of 1..100", ms(hundred...), 50, 50 * time.Millisecond},
		{"p99 of 1..100", ms(hundred...), 99, 99 * time.Millisecond},
		{"p100 is the maximum", ms(hundred...), 100, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pct(tc.s, tc.p); got != tc.want {
				t.Fatalf("pct(%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

// TestReportRendersEveryRow: each kind of row appears with its number,
// its ratio to the baseline or its reason, and the chart is a PNG.
func TestReportRendersEveryRow(t *testing.T) {
	lat := func(base time.Duration) []time.Duration {
		var s []time.Duration
		for i := range 100 {
			s = append(s, base+time.Duration(i)*time.Microsecond)
		}
		return s
	}
	secs := []*section{
		{Title: "latency", Baseline: "base", Rows: []*row{{Name: "base", Lat: lat(100 * time.Microsecond)}, {Name: "twice", Lat: lat(200 * time.Microsecond)}, {Name: "gone", Reason: "not measured: no peer"}}},
		{Title: "rate", Baseline: "b", Rate: "queries/s", Rows: []*row{{Name: "b", QPS: 1000, Lat: lat(10 * time.Microsecond)}, {Name: "half", QPS: 500, Lat: lat(20 * time.Microsecond)}}},
		{Title: "size", Baseline: "idle", Rows: []*row{{Name: "idle", Bytes: 10 << 20}, {Name: "full", Bytes: 15 << 20}}},
	}
	dir := t.TempDir()
	md, chart, err := writeReport(dir, true, machine{Lines: []string{"nproc: test"}}, secs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, want string }{
		{"smoke banner", "SMOKE RUN"},
		{"baseline marked", "| 1.1 | base (baseline) |"},
		{"median and p99 ratios", "| 1.2 | twice | 249 µs | 298 µs | 1.67× | 1.51× | 100 |"},
		{"reason instead of a number", "| 1.3 | gone | not measured: no peer |"},
		{"rate heading", "| # | row | queries/s | ratio |"},
		{"rate ratio", "| 2.2 | half | 500 | 0.50× |"},
		{"size ratio", "| 3.2 | full | 15.0 MiB | 1.50× |"},
		{"machine facts", "- nproc: test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(string(b), tc.want) {
				t.Fatalf("report lacks %q:\n%s", tc.want, b)
			}
		})
	}
	f, err := os.Open(chart)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("chart is not a PNG: %v", err)
	}
	if h := img.Bounds().Dy(); h < 30+14*4 {
		t.Errorf("chart height %d: fewer bars than the 4 latency rows", h)
	}
	if filepath.Base(chart) != "bench.png" {
		t.Errorf("chart named %s", chart)
	}
}
