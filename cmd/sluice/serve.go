package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway"
	"github.com/sluice-gw/sluice/gateway/tracing"
	"github.com/sluice-gw/sluice/internal/buildinfo"
)

func serveCmd(g *globals) *cobra.Command {
	var logFlush time.Duration
	var debugListen string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the gateway: the sandbox socket and the admin listener",
		Long: `Run the gateway until SIGINT or SIGTERM.

SIGHUP reloads the policy (simple rules are fixed at start; the Rego modules
under rego: are re-read). A reload that fails keeps the previous policy
serving and is logged. Logs go to stderr (--log-format, --log-level); info
lines are written out together at most --log-flush after the first of them,
warnings and errors at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), g, cmd, logFlush, debugListen)
		},
	}
	cmd.Flags().DurationVar(&logFlush, "log-flush", 5*time.Millisecond,
		"longest an info log line waits to be written with the lines after it; 0 writes each line at once")
	cmd.Flags().StringVar(&debugListen, "debug-listen", "",
		"serve Go's CPU, heap, allocation, mutex and block profiles on this loopback address (127.0.0.1:6060) under /debug/pprof/; off when empty")
	return cmd
}

func serve(ctx context.Context, g *globals, cmd *cobra.Command, logFlush time.Duration, debugListen string) error {
	if logFlush < 0 {
		return fmt.Errorf("serve: --log-flush must not be negative, got %s", logFlush)
	}
	if debugListen != "" {
		if err := checkDebugListen(debugListen); err != nil { // debug.go
			return fmt.Errorf("serve: %w", err)
		}
	}
	out := cmd.ErrOrStderr()
	var lb *logBuffer
	if logFlush > 0 {
		lb = newLogBuffer(out, logFlush) // logbuf.go
		defer lb.Flush()                 // runs last: after "stopped" and Close's errors
		out = lb
	}
	log, err := g.logger(out)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if lb != nil {
		log = slog.New(flushOnWarn{log.Handler(), lb})
	}
	lc, err := g.loadConfig()
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	stopTrace, err := startDebugTrace() // debugtrace.go: SLUICE_DEBUG_TRACE
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer func() {
		if err := stopTrace(); err != nil {
			log.Warn("debug trace not written whole", "err", err)
		}
	}()
	if pct, limit, ok := gcDefaults(); ok { // gc.go
		log.Info("gc defaults", "gogc", pct, "memory_limit_bytes", limit)
	}
	version, commit := buildinfo.Version()
	log.Info("starting", "config", lc.Source, "version", version, "commit", commit)
	if debugListen != "" {
		addr, err := serveDebug(ctx, debugListen, log) // debug.go
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		log.Info("debug: profiles served", "addr", addr)
	}
	opts := gateway.Options{Logger: log}
	// Spans are exported when the OTEL_* environment asks for it; off,
	// the gateway makes none (package tracing).
	tp, err := tracing.FromEnv(ctx, os.Getenv, version)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if tp != nil {
		opts.Tracing = tp.TracerProvider()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(sctx); err != nil {
				log.Warn("tracing: spans not exported at shutdown", "err", err)
			}
		}()
		log.Info("tracing: exporting spans over OTLP")
	}
	srv, err := gateway.New(ctx, lc.Config, opts)
	if err != nil {
		return fmt.Errorf("serve (%s): %w", lc.Source, err)
	}
	defer func() {
		if err := srv.Close(); err != nil {
			log.Error("close", "err", err)
		}
	}()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	serveCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(serveCtx) }()

	ready := srv.Ready()
	for {
		select {
		case <-ready:
			log.Info("ready", "sandbox_socket", lc.Gateway.SandboxSocket, "admin", srv.AdminAddr())
			ready = nil // a nil channel never fires again
		case <-hup:
			_ = srv.Reload(ctx) // the policy engine logs the outcome, once
		case err := <-done:
			// Serve returns when ctx ends (SIGINT/SIGTERM) or a listener fails.
			if err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("serve: %w", err)
			}
			log.Info("stopped")
			return nil
		}
	}
}
