//go:build linux

package bench

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// BENCH_AGAINST=REV: every section that compares a change runs its sluice
// rows again with the gateway binary built at git revision REV, the same
// configuration, sampled in turns with this tree's, so that a change's
// before and after share one run and its load.

// againstRev is BENCH_AGAINST ("" = no rows at another revision).
func againstRev() string { return os.Getenv("BENCH_AGAINST") }

// againstBuild is the binary built at BENCH_AGAINST, once per run.
type againstBuild struct {
	done       bool
	bin, short string
	err        error
}

// againstBin builds the gateway at BENCH_AGAINST the first time a section
// asks and returns the same binary (or the same error) after.
func (w *world) againstBin() (bin, short string, err error) {
	if !w.ag.done {
		w.ag.bin, w.ag.short, w.ag.err = buildAt(w, againstRev(), "against") // tracing_test.go
		w.ag.done = true
	}
	return w.ag.bin, w.ag.short, w.ag.err
}

// againstName is the name of row name's twin run by the binary at REV.
func againstName(name string) string { return name + " at " + againstRev() }

// againstNote is the one note of a section with rows at REV, naming them.
func againstNote(w *world, rows ...string) string {
	rev := againstRev()
	_, short, err := w.againstBin()
	from := "the binary built from " + short
	if err != nil {
		from = "the binary at " + rev + ", which did not build (the rows say why)"
	}
	q := make([]string, len(rows))
	for i, r := range rows {
		q[i] = `"` + r + `"`
	}
	return fmt.Sprintf("BENCH_AGAINST=%s: the rows ending \"at %s\" are the rows %s run by %s (git archive, go build) with the same configuration, sampled in turns with this tree's rows so that both take the run's load alike; "+
		"where that binary refuses the configuration the row says \"not measured\" with its error", rev, rev, strings.Join(q, ", "), from)
}

// againstVerdicts adds, for each row name, this tree's row ÷ its twin at
// REV: the medians, the p99s, the rates and the CPU-µs per request of
// sluice's own processes (cpu, by row name; nil where not metered) where
// both have them.
func againstVerdicts(s *section, cpu map[string]float64, rows ...string) {
	for _, name := range rows {
		v := againstVerdict(s.Rate, name, s.find(name), s.find(againstName(name)))
		if now, then := cpu[name], cpu[againstName(name)]; now > 0 && then > 0 {
			v += fmt.Sprintf("; CPU-µs per request in sluice's own processes (the figure the load moves least) %.1f ÷ %.1f = %.3f×", now, then, now/then)
		}
		s.Verdicts = append(s.Verdicts, v)
	}
}

// sluiceCPU is each row's CPU-µs per completed request in sluice's own
// processes among its meters (the gateway and the relay, not the test
// process or the upstream).
func sluiceCPU(ts []*tput) map[string]float64 {
	out := map[string]float64{}
	for _, tp := range ts {
		if tp.done == 0 {
			continue
		}
		var sum time.Duration
		for _, m := range tp.cpu {
			if m.name == "gateway" || m.name == "relay" || m.name == "sluice" {
				sum += m.used
			}
		}
		out[tp.row.Name] = float64(sum.Microseconds()) / float64(tp.done)
	}
	return out
}

// againstVerdict is one row's before/after line. Issue 18's bound for
// "within noise of before" is 1.05×: the median at most 1.05× REV's and
// the rate at least REV's ÷ 1.05.
func againstVerdict(rate, name string, now, then *row) string {
	goal := fmt.Sprintf("BENCH_AGAINST: \"%s\", this tree ÷ %s", name, againstRev())
	switch {
	case now == nil || then == nil:
		return goal + ": not measured (no such row)"
	case then.Reason != "":
		return goal + ": " + then.Reason
	case now.Reason != "":
		return goal + ": " + now.Reason
	}
	var parts []string
	within := true
	if len(now.Lat) > 0 && len(then.Lat) > 0 {
		p50 := float64(pct(now.Lat, 50)) / float64(pct(then.Lat, 50))
		p99 := float64(pct(now.Lat, 99)) / float64(pct(then.Lat, 99))
		parts = append(parts, fmt.Sprintf("p50 %.3f×, p99 %.3f×", p50, p99))
		within = within && p50 <= 1.05
	}
	if now.QPS > 0 && then.QPS > 0 {
		if rate == "" {
			rate = "rate"
		}
		r := now.QPS / then.QPS
		parts = append(parts, fmt.Sprintf("%s %.3f×", rate, r))
		within = within && r >= 1/1.05
	}
	if len(parts) == 0 {
		return goal + ": not measured"
	}
	word := "**within**"
	if !within {
		word = "**not within**"
	}
	return fmt.Sprintf("%s: %s; %s issue 18's noise bound (p50 ≤ 1.05×, rate ≥ 1/1.05×)", goal, strings.Join(parts, ", "), word)
}
