package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/sandboxd"
)

// silentError makes the exit status non-zero after the problems have
// been printed.
type silentError struct{ msg string }

func (e silentError) Error() string { return e.msg }

// validateCmd checks sandboxd.yaml without starting anything: the file
// strictly (every key, sizes like 1GiB), then what serve would trip on
// at once (rootfs, the gateway socket, the files named). Problems are
// printed as sluice validate prints them: "error: …" (exit 1) or
// "warning: …"; then an "ok:" summary.
func validateCmd(cfgPath *string) *cobra.Command {
	return &cobra.Command{
		Use:   "validate",
		Short: "check sandboxd.yaml (every key, sizes like 1GiB) and what serve would need, without starting anything",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			src := *cfgPath
			if src == "" {
				src = "built-in defaults"
			}
			cfg, err := loadConfig(*cfgPath)
			if err != nil {
				lines := strings.Split(err.Error(), "\n")
				for _, l := range lines {
					fmt.Fprintln(out, "error:", l)
				}
				return silentError{fmt.Sprintf("validate: %d problem(s)", len(lines))}
			}
			var errs, warns []string
			if fi, err := os.Stat(cfg.Rootfs); err != nil || !fi.IsDir() {
				errs = append(errs, fmt.Sprintf("rootfs: %s is not a directory", cfg.Rootfs))
			}
			for _, name := range slices.Sorted(maps.Keys(cfg.Templates)) {
				if r := cfg.Templates[name].Rootfs; r != "" {
					if fi, err := os.Stat(r); err != nil || !fi.IsDir() {
						errs = append(errs, fmt.Sprintf("templates.%s.rootfs: %s is not a directory", name, r))
					}
				}
			}
			if cfg.GatewayTLS.Address == "" {
				if fi, err := os.Stat(cfg.Gateway); err != nil {
					warns = append(warns, fmt.Sprintf("gateway: %s: %v (every sandbox's exit answers 503 gateway_unavailable until the gateway listens there)", cfg.Gateway, errors.Unwrap(err)))
				} else if fi.Mode().Type() != os.ModeSocket {
					errs = append(errs, fmt.Sprintf("gateway: %s is not a socket", cfg.Gateway))
				}
			}
			for _, f := range []struct{ key, path string }{
				{"gateway_tls.cert_file", cfg.GatewayTLS.CertFile}, {"gateway_tls.key_file", cfg.GatewayTLS.KeyFile},
				{"gateway_tls.ca_file", cfg.GatewayTLS.CAFile}, {"gateway_session_token_file", cfg.GatewaySessionTokenFile},
			} {
				if f.path == "" {
					continue
				}
				if _, err := os.Stat(f.path); err != nil {
					errs = append(errs, fmt.Sprintf("%s: %v", f.key, err))
				}
			}
			for _, w := range warns {
				fmt.Fprintln(out, "warning:", w)
			}
			for _, e := range errs {
				fmt.Fprintln(out, "error:", e)
			}
			if len(errs) > 0 {
				return silentError{fmt.Sprintf("validate: %d problem(s)", len(errs))}
			}
			l := cfg.Limits
			fmt.Fprintf(out, "ok: api %s, gateway %s, limits pids %d, memory %s, cpu_millis %d, workspace %s, tmp %s, exec_timeout %s; %d warnings (%s)\n",
				cfg.API, gatewayOf(cfg), l.Pids, sandboxd.FormatSize(l.MemoryBytes), l.CPUMillis, sandboxd.FormatSize(l.WorkspaceBytes),
				sandboxd.FormatSize(l.TmpBytes), l.ExecTimeout, len(warns), src)
			return nil
		},
	}
}

func gatewayOf(cfg sandboxd.Config) string {
	if cfg.GatewayTLS.Address != "" {
		return cfg.GatewayTLS.Address + " (mTLS)"
	}
	return cfg.Gateway
}
