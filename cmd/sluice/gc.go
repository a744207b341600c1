package main

import (
	"os"
	"runtime/debug"
)

// gcPercent is the gateway's default GOGC. Every proxied request and
// tool call allocates short-lived garbage (request heads, audit lines,
// log records) over a small live heap, so with Go's default of 100 the
// collector runs often; 200 halves how often, for at most half again the
// heap.
const gcPercent = 200

// gcSoftLimit is the soft memory limit set with gcPercent. It bounds what
// the higher GOGC costs on a large heap: the heap may grow to 3× the live
// heap only while that stays under the limit; near it the collector runs
// as often as needed to stay there, which is never more often than with
// Go's defaults until the live heap passes half the limit (512 MiB). The
// gateway's live heap is tens of MiB (56 MiB RSS with 10,000 pending
// holds).
const gcSoftLimit = 1 << 30

// gcDefaults sets the collector for `sluice serve`, unless the operator
// chose: GOGC set leaves both settings alone, GOMEMLIMIT set leaves the
// limit alone. It returns the settings it made, for the log.
func gcDefaults() (percent int, limit int64, set bool) {
	if _, ok := os.LookupEnv("GOGC"); ok {
		return 0, 0, false
	}
	debug.SetGCPercent(gcPercent)
	if _, ok := os.LookupEnv("GOMEMLIMIT"); !ok {
		debug.SetMemoryLimit(gcSoftLimit)
		limit = gcSoftLimit
	}
	return gcPercent, limit, true
}
