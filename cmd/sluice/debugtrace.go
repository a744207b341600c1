package main

import (
	"fmt"
	"os"
	"runtime/trace"
)

// debugTraceEnv names a file `sluice serve` writes a Go execution trace
// (runtime/trace) to, from start to shutdown: a debugging knob for a
// person measuring one call's wall-clock timeline (goroutine hand-offs,
// netpoll wake-ups, syscalls, GC) with `go tool trace`. Unset, nothing is
// traced. The file is created new (0600), never written over, and holds
// no request data: a trace records scheduling events and stacks only.
const debugTraceEnv = "SLUICE_DEBUG_TRACE"

// startDebugTrace starts the execution trace when debugTraceEnv is set and
// returns the function that ends it.
func startDebugTrace() (stop func() error, err error) {
	path := os.Getenv(debugTraceEnv)
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", debugTraceEnv, err)
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", debugTraceEnv, err)
	}
	return func() error {
		trace.Stop()
		return f.Close()
	}, nil
}
