//go:build linux

package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBench runs every section in one process, on one namespace, and
// writes the report. A full run writes test/report/bench.md and bench.png;
// a -short run writes them with a smoke banner into BENCH_OUT, or a temp
// dir. BENCH_SECTIONS (comma-separated: toolcall, egress, dns, sandbox,
// holds, vault, connectors, store, mcp, tracing, oauth, policy) limits the run to some sections.
//
// The test asserts that every section produced a number or a stated
// reason for each row; it asserts nothing about speed.
func TestBench(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	started := time.Now()
	w := newWorld(t)
	opa := opaVersion + " (`opa run --server`, built from the Go module proxy)"
	if _, err := opaBinary(); err != nil {
		opa = "not available: " + err.Error()
	}
	facts := machineFacts(opa)

	want := map[string]bool{}
	for _, s := range strings.Split(os.Getenv("BENCH_SECTIONS"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			want[s] = true
		}
	}
	all := []struct {
		key string
		run func(*testing.T, *world) []*section
	}{
		{"toolcall", benchToolCalls},
		{"egress", benchEgress},
		{"dns", benchDNS},
		{"sandbox", benchSandbox},
		{"holds", benchHolds},
		{"vault", benchVault},
		{"connectors", benchConnectors},
		{"extauthz", benchExtAuthz},
		{"store", benchStore},
		{"mcp", benchMCP},
		{"tracing", benchTracing},
		{"oauth", benchOAuth},
		{"policy", benchPolicy},
		{"policylife", benchPolicyLife},
	}
	var secs []*section
	for _, sec := range all {
		if len(want) > 0 && !want[sec.key] {
			continue
		}
		t.Run(sec.key, func(t *testing.T) {
			t0 := time.Now()
			got := sec.run(t, w)
			if len(got) == 0 {
				t.Errorf("section %s produced no table", sec.key)
			}
			for _, s := range got {
				secs = append(secs, s)
				if len(s.Rows) == 0 {
					t.Errorf("section %q has no rows", s.Title)
				}
				for _, r := range s.Rows {
					if r.measured() && len(r.Lat) == 0 && r.QPS == 0 && r.Bytes == 0 {
						t.Errorf("%s / %s: neither a number nor a reason", s.Title, r.Name)
					}
					if !r.measured() {
						t.Logf("%s / %s: %s", s.Title, r.Name, r.Reason)
					}
				}
			}
			t.Logf("section %s: %d tables in %s", sec.key, len(got), time.Since(t0).Round(time.Millisecond))
		})
	}
	out := os.Getenv("BENCH_OUT")
	switch {
	case out != "":
	case smoke():
		out = t.TempDir()
	default:
		out = filepath.Join(moduleRoot, "test", "report")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	md, chart, err := writeReport(out, smoke(), facts, secs, started)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{md, chart} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("report file %s missing or empty: %v", p, err)
		}
	}
	t.Logf("report: %s, chart: %s", md, chart)
}
