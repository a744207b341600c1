package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"time"
)

// debugProfiles are the runtime profiles the debug listener serves besides
// the CPU profile: where the process spends its CPU, allocates, and waits.
// Nothing that shows the process's memory contents or command line
// (pprof's cmdline, a goroutine dump's debug=2 is stacks only and is left
// out too: profiles are enough to find a hot path).
var debugProfiles = []string{"heap", "allocs", "mutex", "block"}

// debugMutexFraction and debugBlockRate are the sampling rates the debug
// listener turns on: one mutex contention event in 5, and every blocking
// event of 10 µs or more (runtime.SetBlockProfileRate's unit is ns).
const (
	debugMutexFraction = 5
	debugBlockRate     = 10_000
)

// serveDebug serves Go's profiles on addr, a loopback address, until ctx
// ends: the operator's knob (serve --debug-listen) for profiling the real
// gateway under its real load. It is off by default. It turns the mutex
// and block profiles on for the process's life, which costs a little on
// every contended lock and every blocking wait; that is why it is a knob.
func serveDebug(ctx context.Context, addr string, log *slog.Logger) (string, error) {
	if err := checkDebugListen(addr); err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("--debug-listen: %w", err)
	}
	runtime.SetMutexProfileFraction(debugMutexFraction)
	runtime.SetBlockProfileRate(debugBlockRate)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	for _, p := range debugProfiles {
		mux.Handle("GET /debug/pprof/"+p, pprof.Handler(p))
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("debug listener stopped", "err", err)
		}
	}()
	return l.Addr().String(), nil
}

// checkDebugListen accepts a loopback IP address and port only: the
// profiles are for the operator on the gateway's host, never the network.
func checkDebugListen(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--debug-listen: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--debug-listen: want a loopback IP address and port (127.0.0.1:6060), got %q: the profiles are for the operator on this host", addr)
	}
	return nil
}
