// Package main is the sandboxd command: `sandboxd serve` runs the daemon
// that makes sandboxes (API on a Unix socket), `sandboxd run -- CMD` makes
// one, runs CMD in it and destroys it, and `sandboxd pin` / `sandboxd
// unpin` ask a running daemon to pin (or unpin) a namespace another runtime
// made. The same binary, re-executed with a hidden first argument, is each
// sandbox's init.
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/internal/buildinfo"
	"github.com/sluice-gw/sluice/sandboxd"
	"github.com/sluice-gw/sluice/sandboxd/relay"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == sandboxd.InitArg {
		sandboxd.RunInit() // never returns
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// exits wires sandboxd/relay as every sandbox's only way out.
func exits(log *slog.Logger) sandboxd.ExitOpener {
	return func(ctx context.Context, e sandboxd.Exit) (io.Closer, error) {
		return relay.Open(ctx, relay.Options{
			NetNS: e.NetNS, Identity: e.Identity, Gateway: e.Gateway, SocketPath: e.SocketPath,
			GatewayAddr: e.GatewayAddr, GatewayTLS: e.GatewayTLS,
			ProxyPort: e.ProxyPort, DNSPort: e.DNSPort, DNSCacheFor: e.DNSCacheFor, Logger: log,
		})
	}
}

func loadConfig(path string) (sandboxd.Config, error) {
	if path == "" {
		c := sandboxd.Default()
		return c, c.Validate()
	}
	return sandboxd.LoadConfig(path)
}

// run executes one verb and returns the process exit code.
func run(ctx context.Context, args []string, stdin *os.File, stdout, stderr io.Writer) (int, error) {
	var code int
	var cfgPath string
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	root := &cobra.Command{
		Use:           "sandboxd",
		Short:         "make sandboxes whose only way out is the sluice gateway",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	version, commit := buildinfo.Version()
	root.Version = version + " commit " + commit
	root.SetVersionTemplate("sandboxd {{.Version}}\n")
	root.PersistentFlags().StringVar(&cfgPath, "config", "", "sandboxd.yaml (default: built-in defaults)")

	serve := &cobra.Command{
		Use:   "serve",
		Short: "run the daemon with its API on a Unix socket",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log = slog.New(slog.NewTextHandler(stderr, nil))
			cfg, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			return serveAPI(ctx, cfg, log)
		},
	}

	var (
		rc           sandboxd.CreateRequest
		stateDir, gw string
		timeout      time.Duration
		outputBytes  int
		copies, envs []string
		noGateway    bool
		runAPI       string
		runMem       sizeFlag
		runWS        sizeFlag
	)
	runCmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG...]",
		Short: "create a sandbox, run CMD in it, destroy it; exits with CMD's code",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			cfg, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			rc.Limits.MemoryBytes, rc.Limits.WorkspaceBytes = int64(runMem), int64(runWS)
			if stateDir == "" {
				// A daemon on the API socket owns the state directory
				// (and its lock): the run goes through it instead.
				sock := cmp.Or(runAPI, cfg.API)
				if daemonAnswers(ctx, sock) {
					if gw != "" || noGateway {
						// The daemon's sandboxes use its gateway; a run
						// must not silently use another than asked.
						return fmt.Errorf("run: a daemon serves %s and owns state_dir %s; its sandboxes use its gateway, so --gateway/--no-gateway need a one-shot run of your own: add --state-dir DIR", sock, cfg.StateDir)
					}
					c := &apiClient{sock: sock, hc: unixClient(sock)}
					var check func(id wire.Identity) error
					if !noGateway && cfg.GatewayTLS.Address == "" && checkGatewaySocket(cfg.Gateway) == nil {
						check = func(id wire.Identity) error {
							id.Host = cfg.Host
							return checkAgent(ctx, cfg.Gateway, id, stderr)
						}
					}
					rcode, err := runViaDaemon(ctx, c, rc, envs, copies, argv, timeout, outputBytes, stdin, stdout, stderr, check)
					code = rcode
					return err
				}
			}
			if stateDir != "" {
				cfg.StateDir = stateDir
			}
			if gw != "" {
				cfg.Gateway = gw
			}
			rc.Env = map[string]string{}
			for _, e := range envs {
				k, v, ok := strings.Cut(e, "=")
				if !ok {
					return fmt.Errorf("run: --env %q: want KEY=VALUE", e)
				}
				rc.Env[k] = v
			}
			// A one-shot run fails before it builds anything when its
			// sandbox could reach no gateway at all.
			if !noGateway && cfg.GatewayTLS.Address == "" {
				if err := checkGatewaySocket(cfg.Gateway); err != nil {
					return err
				}
			}
			// A one-shot run's sandbox ends with it, killed or not.
			cfg.AdoptWait, cfg.OnStop = 0, sandboxd.OnStopDestroy
			m, err := sandboxd.New(sandboxd.Options{Config: cfg, Logger: log, Exits: exits(log)})
			if err != nil {
				return err
			}
			defer m.Close()
			in, err := m.Create(ctx, rc)
			if err != nil {
				return err
			}
			if !noGateway && cfg.GatewayTLS.Address == "" {
				id := wire.Identity{Sandbox: in.ID, Agent: rc.Agent, Session: rc.Session, User: rc.User, Host: cfg.Host}
				if err := checkAgent(ctx, cfg.Gateway, id, stderr); err != nil {
					_ = m.Destroy(in.ID)
					return err
				}
			}
			for _, c := range copies {
				src, dst, ok := strings.Cut(c, ":")
				if !ok {
					return fmt.Errorf("run: --copy %q: want HOSTPATH:/workspace/PATH", c)
				}
				if err := copyIn(m, in.ID, src, dst); err != nil {
					return fmt.Errorf("run: --copy %s: %w", c, err)
				}
			}
			res, err := m.Exec(ctx, in.ID, sandboxd.ExecRequest{
				Argv: argv, Stdin: stdin, Stdout: stdout, Stderr: stderr, Timeout: timeout, OutputBytes: outputBytes,
			})
			if err != nil && res.Millis == 0 {
				return err
			}
			code = res.ExitCode
			if res.KilledBy != sandboxd.KilledByNone {
				fmt.Fprintf(stderr, "sandboxd: killed_by=%s\n", res.KilledBy)
			}
			return m.Destroy(in.ID)
		},
	}
	f := runCmd.Flags()
	f.StringVar(&rc.Agent, "agent", "cli", "agent name (identity)")
	f.StringVar(&rc.Template, "template", "", "a template of sandboxd.yaml (its rootfs, limits, egress and env)")
	f.StringVar(&rc.Session, "session", "", "session (identity)")
	f.StringVar(&rc.User, "user", "", "user the agent acts for (identity)")
	f.IntVar(&rc.Limits.Pids, "pids", 0, "pids limit (0 = config)")
	f.IntVar(&rc.Limits.CPUMillis, "cpu-millis", 0, "CPU limit, 1000 = one core (0 = config)")
	f.DurationVar(&timeout, "timeout", 0, "wall-clock limit (0 = config exec_timeout)")
	f.IntVar(&outputBytes, "output-bytes", 0, "cap on each of stdout and stderr (0 = config)")
	f.StringArrayVar(&copies, "copy", nil, "HOSTPATH:/workspace/PATH to copy in first (repeatable; keeps the exec bit)")
	f.StringArrayVar(&envs, "env", nil, "KEY=VALUE for the command (repeatable)")
	f.StringVar(&stateDir, "state-dir", "", "override state_dir")
	f.StringVar(&gw, "gateway", "", "override gateway socket")
	f.BoolVar(&noGateway, "no-gateway", false, "run without a gateway (no socket check; every exit answers 503 gateway_unavailable)")
	f.StringSliceVar(&rc.Egress, "egress", nil, "narrow the agent's egress allowlist for this sandbox to these hosts (repeatable or comma-separated; never widens)")
	f.StringVar(&runAPI, "api", "", "the daemon's API socket (default: config api); run uses a daemon that answers there unless --state-dir is given")
	f.Var(&runMem, "memory", "memory limit, bytes or a size like 512MiB (0 = config)")
	f.Var(&runWS, "workspace", "/workspace size, bytes or a size like 64MiB (0 = config)")

	var (
		pr      sandboxd.PinRequest
		apiSock string
	)
	pinCmd := &cobra.Command{
		Use:   "pin (--netns PATH | --pid N) --agent A [--session S] [--user U]",
		Short: "pin a namespace another runtime made: only lo, nftables drop, the gateway as its one exit; prints the pin id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newAPIClient(cfgPath, apiSock)
			if err != nil {
				return err
			}
			body, err := json.Marshal(pr)
			if err != nil {
				return fmt.Errorf("pin: %w", err)
			}
			var in sandboxd.PinInfo
			if err := c.do(ctx, http.MethodPost, "/v1/pin", body, http.StatusCreated, &in); err != nil {
				return fmt.Errorf("pin: %w", err)
			}
			fmt.Fprintln(stdout, in.ID)
			return nil
		},
	}
	f = pinCmd.Flags()
	f.StringVar(&pr.NetNS, "netns", "", "network namespace path (e.g. /run/netns/NAME)")
	f.IntVar(&pr.PID, "pid", 0, "or a process whose network namespace is pinned")
	f.StringVar(&pr.Agent, "agent", "", "agent name (identity, required)")
	f.StringVar(&pr.Session, "session", "", "session (identity)")
	f.StringVar(&pr.User, "user", "", "user the agent acts for (identity)")
	f.StringSliceVar(&pr.Egress, "egress", nil, "narrow the agent's egress allowlist to these hosts (repeatable or comma-separated; never widens)")
	f.StringVar(&apiSock, "api", "", "override the daemon's API socket (config api)")
	pinCmd.MarkFlagsMutuallyExclusive("netns", "pid")
	pinCmd.MarkFlagsOneRequired("netns", "pid")
	_ = pinCmd.MarkFlagRequired("agent")

	unpinCmd := &cobra.Command{
		Use:   "unpin ID",
		Short: "close a pinned namespace's listeners (the namespace stays closed)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newAPIClient(cfgPath, apiSock)
			if err != nil {
				return err
			}
			if err := c.do(ctx, http.MethodDelete, "/v1/pins/"+url.PathEscape(args[0]), nil, http.StatusNoContent, nil); err != nil {
				return fmt.Errorf("unpin: %w", err)
			}
			return nil
		},
	}
	unpinCmd.Flags().StringVar(&apiSock, "api", "", "override the daemon's API socket (config api)")
	root.AddCommand(serve, runCmd, pinCmd, unpinCmd, validateCmd(&cfgPath))
	root.AddCommand(clientCmds(ctx, &cfgPath, &code, stdin, stdout, stderr)...)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	var se silentError
	if errors.As(err, &se) {
		// The problems are printed already; exit 1 without repeating.
		return 1, nil
	}
	return code, err
}

// apiClient talks to a running daemon over its API socket.
type apiClient struct {
	sock string
	hc   *http.Client
}

func newAPIClient(cfgPath, sock string) (*apiClient, error) {
	if sock == "" {
		cfg, err := loadConfig(cfgPath)
		if err != nil {
			return nil, err
		}
		sock = cfg.API
	}
	return &apiClient{sock: sock, hc: unixClient(sock)}, nil
}

// unixClient is an HTTP client whose every connection goes to sock. It has
// no overall timeout: an exec lasts as long as its own limit says.
func unixClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

// do sends one request and decodes the answer into out; any other status
// than want is an error carrying the daemon's code and message.
func (c *apiClient) do(ctx context.Context, method, path string, body []byte, want int, out any) error {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	b, err := c.send(ctx, method, path, r, "application/json", want)
	if err != nil || out == nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("api answer: %w", err)
	}
	return nil
}

// send sends one request with body r (nil: none) and returns the answer's
// body (at most 1 GiB: files are bounded by file_bytes); any other status
// than want is an error carrying the daemon's code and message.
func (c *apiClient) send(ctx context.Context, method, path string, r io.Reader, ctype string, want int) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://sandboxd"+path, r)
	if err != nil {
		return nil, err
	}
	if r != nil {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("api %s: %w", c.sock, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("api %s: %w", c.sock, err)
	}
	if resp.StatusCode != want {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
			return nil, fmt.Errorf("%s (%d %s)", e.Error.Message, resp.StatusCode, e.Error.Code)
		}
		return nil, fmt.Errorf("api answered %s", resp.Status)
	}
	return b, nil
}

// checkGatewaySocket fails when path, the gateway's sandbox socket, does
// not exist or is not a socket: every exit of the sandbox would fail.
func checkGatewaySocket(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("run: gateway socket %s: %w (is the gateway running? set --gateway or gateway in sandboxd.yaml to its gateway.sandbox_socket, or pass --no-gateway)", path, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("run: gateway socket %s is not a socket (%s)", path, fi.Mode().Type())
	}
	return nil
}

// checkAgent asks the gateway for the tools of id, as the sandbox would
// (GET /v1/tools with id's preamble): an agent the gateway does not know
// (403 unknown_agent) fails the run. A gateway that does not answer is a
// warning only: the sandbox's calls get 503 gateway_unavailable until it
// does.
func checkAgent(ctx context.Context, path string, id wire.Identity, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return wire.Dial(ctx, path, id) }}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sluice/v1/tools", nil)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: warning: the gateway at %s does not answer (%v): the sandbox's calls get 503 gateway_unavailable until it does\n", path, err)
		return nil
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&e)
	if resp.StatusCode == http.StatusForbidden && e.Error.Code == "unknown_agent" {
		return fmt.Errorf("run: --agent %q: the gateway at %s answers unknown_agent: %s", id.Agent, path, e.Error.Message)
	}
	return nil
}

// copyIn puts a host file into the sandbox, keeping its exec bit.
func copyIn(m *sandboxd.Manager, id, src, dst string) error {
	f, mode, err := openCopy(src)
	if err != nil {
		return err
	}
	defer f.Close()
	return m.PutFile(id, dst, f, mode)
}

// openCopy opens host file src for copying into a sandbox and returns the
// mode it gets there: 0755 when src is executable by anyone, else 0644.
func openCopy(src string) (*os.File, os.FileMode, error) {
	f, err := os.Open(src)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	mode := os.FileMode(0o644)
	if st.Mode()&0o111 != 0 {
		mode = 0o755
	}
	return f, mode, nil
}

// serveAPI runs the daemon until ctx ends, then destroys every sandbox.
func serveAPI(ctx context.Context, cfg sandboxd.Config, log *slog.Logger) error {
	m, err := sandboxd.New(sandboxd.Options{Config: cfg, Logger: log, Exits: exits(log)})
	if err != nil {
		return err
	}
	defer m.Close()
	if err := os.MkdirAll(filepath.Dir(cfg.API), 0o755); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if fi, err := os.Lstat(cfg.API); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return fmt.Errorf("serve: %s exists and is not a socket", cfg.API)
		}
		_ = os.Remove(cfg.API)
	}
	// The API can create and run anything: root only.
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", cfg.API)
	syscall.Umask(old)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	version, commit := buildinfo.Version()
	log.Info("sandboxd serving", "version", version, "commit", commit, "api", cfg.API, "gateway", cfg.Gateway, "state_dir", cfg.StateDir)
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
