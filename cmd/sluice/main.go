// Package main is the sluice command: the gateway server (`sluice serve`)
// and the CLI that security and platform teams use around it (`validate`,
// `tools`, `policy test|eval`, `secrets`, `audit verify`) plus `demo`, which
// runs the whole pipeline on embedded defaults in a temporary directory.
//
// This is the only place that wires the packages together. Every verb goes
// through run, which takes its arguments and streams explicitly and returns
// an error instead of exiting, so the tests drive the real command.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/internal/buildinfo"
)

// defaultConfig is the file every verb reads when --config is not given and
// the file exists in the working directory.
const defaultConfig = "sluice.yaml"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		var se silentError
		if !errors.As(err, &se) {
			fmt.Fprintln(os.Stderr, "sluice:", err)
		}
		os.Exit(1)
	}
}

// silentError is a failure whose details the verb has already printed
// (validate's problem list, a failed policy test): main exits non-zero
// without printing it again.
type silentError struct{ msg string }

func (e silentError) Error() string { return e.msg }

// globals are the flags every verb shares.
type globals struct {
	config    string
	logFormat string
	logLevel  string
}

// run is main without the process: it parses args, runs one verb and
// returns its error.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	g := &globals{}
	root := &cobra.Command{
		Use:   "sluice",
		Short: "sluice is an egress-and-credential broker gateway for AI agents that run code",
		Long: `sluice is an egress-and-credential broker gateway for AI agents that run code.
Agent code in a sandbox reaches the world only through the gateway, which turns
OpenAPI specs into tools, decides each call with Rego (allow / ask / block),
attaches credentials the sandbox never sees and writes a hash-chained audit log.

Start with: sluice demo`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	version, commit := buildinfo.Version()
	root.Version = version + " commit " + commit
	root.SetVersionTemplate("sluice {{.Version}}\n")
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.config, "config", "", "config file (default: ./sluice.yaml if present, else the embedded defaults)")
	pf.StringVar(&g.logFormat, "log-format", "json", "log format on stderr: json or text")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")

	root.AddCommand(
		serveCmd(g),
		validateCmd(g),
		connectorsCmd(g),
		toolsCmd(g),
		policyCmd(g),
		secretsCmd(g),
		auditCmd(g),
		approvalsCmd(g),
		receiptsCmd(g),
		sessionsCmd(g),
		storeCmd(g),
		placeholdersCmd(g),
		demoCmd(g),
		mcpStdioCmd(g),
	)
	return root.ExecuteContext(ctx)
}

// loadedConfig is a configuration and where it came from, for messages.
type loadedConfig struct {
	*config.Config
	// Source is "config FILE" or "embedded defaults (no ./sluice.yaml)".
	Source string
}

// loadConfig reads --config, or ./sluice.yaml if present, or falls back to
// the embedded defaults. An explicit --config that does not exist is an
// error: falling back silently would run a different gateway than asked.
func (g *globals) loadConfig() (*loadedConfig, error) {
	path := g.config
	if path == "" {
		if _, err := os.Stat(defaultConfig); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("config %s: %w", defaultConfig, err)
			}
			c := config.Defaults()
			if err := c.Validate(); err != nil {
				return nil, fmt.Errorf("bug(): embedded defaults do not validate: %w", err)
			}
			return &loadedConfig{Config: c, Source: "embedded defaults (no ./" + defaultConfig + ")"}, nil
		}
		path = defaultConfig
	}
	c, err := config.Load(path)
	if err != nil {
		// config.Load already names the file.
		return nil, err
	}
	return &loadedConfig{Config: c, Source: "config " + path}, nil
}

// logger builds the slog logger that --log-format and --log-level ask for.
func (g *globals) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: want debug, info, warn or error, got %q", g.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(g.logFormat) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format: want json or text, got %q", g.logFormat)
	}
}

// problems splits an error (often an errors.Join of several, wrapped) into
// one line per problem.
func problems(err error) []string {
	var out []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
