package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway"
)

func serveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the gateway: the sandbox socket and the admin listener",
		Long: `Run the gateway until SIGINT or SIGTERM.

SIGHUP reloads the policy (simple rules are fixed at start; the Rego modules
under rego: are re-read). A reload that fails keeps the previous policy
serving and is logged. Logs go to stderr (--log-format, --log-level).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), g, cmd)
		},
	}
}

func serve(ctx context.Context, g *globals, cmd *cobra.Command) error {
	log, err := g.logger(cmd.ErrOrStderr())
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	lc, err := g.loadConfig()
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if pct, limit, ok := gcDefaults(); ok { // gc.go
		log.Info("gc defaults", "gogc", pct, "memory_limit_bytes", limit)
	}
	log.Info("starting", "config", lc.Source)
	srv, err := gateway.New(ctx, lc.Config, gateway.Options{Logger: log})
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
