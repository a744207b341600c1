package main

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestGCDefaults: serve sets GOGC=200 and a 1 GiB soft memory limit only
// where the operator set neither; GOGC set leaves both alone, GOMEMLIMIT
// set leaves the limit alone.
func TestGCDefaults(t *testing.T) {
	tests := []struct {
		name        string
		env         map[string]string // set; the others are unset
		wantSet     bool
		wantPercent int
		wantLimit   int64 // -1: not changed
	}{
		{"neither set", nil, true, gcPercent, gcSoftLimit},
		{"GOGC set", map[string]string{"GOGC": "50"}, false, 50, -1},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "300MiB"}, true, gcPercent, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"GOGC", "GOMEMLIMIT"} {
				t.Setenv(k, "") // restored after the test
				os.Unsetenv(k)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			prevPercent := debug.SetGCPercent(50) // what an operator's GOGC=50 would have set
			prevLimit := debug.SetMemoryLimit(-1)
			t.Cleanup(func() { debug.SetGCPercent(prevPercent); debug.SetMemoryLimit(prevLimit) })
			_, _, set := gcDefaults()
			if set != tc.wantSet {
				t.Fatalf("set %v, want %v", set, tc.wantSet)
			}
			if got := debug.SetGCPercent(-1); got != tc.wantPercent {
				t.Errorf("GC percent %d, want %d", got, tc.wantPercent)
			}
			debug.SetGCPercent(prevPercent)
			if got := debug.SetMemoryLimit(-1); tc.wantLimit >= 0 && got != tc.wantLimit || tc.wantLimit < 0 && got != prevLimit {
				t.Errorf("memory limit %d, want %d", got, tc.wantLimit)
			}
		})
	}
}
