package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-gw/sluice/sandboxd"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// The client verbs (create, exec, cp, ls, rm) talk to a running daemon's
// API socket (config api, or --api): the daemon owns the sandboxes and
// the state directory, the verbs only ask.

// sizeFlag is a byte count given as a number or a size like 512MiB.
type sizeFlag int64

func (s *sizeFlag) String() string { return strconv.FormatInt(int64(*s), 10) }
func (s *sizeFlag) Type() string   { return "size" }
func (s *sizeFlag) Set(v string) error {
	n, err := sandboxd.ParseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

// daemonAnswers reports whether a daemon serves its API on sock.
func daemonAnswers(ctx context.Context, sock string) bool {
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c := &apiClient{sock: sock, hc: unixClient(sock)}
	var list []sandboxd.Info
	return c.do(ctx, http.MethodGet, "/v1/sandboxes", nil, http.StatusOK, &list) == nil
}

func parseEnv(verb string, envs []string) (map[string]string, error) {
	m := map[string]string{}
	for _, e := range envs {
		k, v, ok := strings.Cut(e, "=")
		if !ok {
			return nil, fmt.Errorf("%s: --env %q: want KEY=VALUE", verb, e)
		}
		m[k] = v
	}
	return m, nil
}

// readStdin returns what is on stdin when it is not a terminal (a pipe, a
// file, /dev/null); a terminal gives nothing, so exec never waits on it.
func readStdin(f *os.File) (string, error) {
	if f == nil {
		return "", nil
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice != 0 {
		return "", nil
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(b), err
}

// create asks the daemon for a sandbox and returns its id.
func (c *apiClient) create(ctx context.Context, b sandboxd.CreateBody) (sandboxd.Info, error) {
	body, err := json.Marshal(b)
	if err != nil {
		return sandboxd.Info{}, err
	}
	var in sandboxd.Info
	err = c.do(ctx, http.MethodPost, "/v1/sandboxes", body, http.StatusCreated, &in)
	return in, err
}

// exec runs argv in sandbox id and writes its output to stdout and
// stderr; it returns the command's exit code.
func (c *apiClient) exec(ctx context.Context, id string, b sandboxd.ExecBody, stdout, stderr io.Writer) (int, error) {
	body, err := json.Marshal(b)
	if err != nil {
		return 0, err
	}
	var res sandboxd.ExecResult
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/exec", body, http.StatusOK, &res); err != nil {
		return 0, err
	}
	_, _ = io.WriteString(stdout, res.Stdout)
	_, _ = io.WriteString(stderr, res.Stderr)
	if res.KilledBy != sandboxd.KilledByNone {
		fmt.Fprintf(stderr, "sandboxd: killed_by=%s\n", res.KilledBy)
	}
	return res.ExitCode, nil
}

// filePath is the API path of p ("/workspace/a/b") in sandbox id.
func filePath(id, p string) string {
	p = strings.TrimPrefix(p, "/")
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "/v1/sandboxes/" + url.PathEscape(id) + "/files/" + strings.Join(segs, "/")
}

// putFile copies host file src to dst in sandbox id, keeping its exec bit.
func (c *apiClient) putFile(ctx context.Context, id, src, dst string) error {
	f, mode, err := openCopy(src)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = c.send(ctx, http.MethodPut, filePath(id, dst)+"?mode="+strconv.FormatUint(uint64(mode), 8), f, "application/octet-stream", http.StatusNoContent)
	return err
}

// runViaDaemon is `sandboxd run` through a running daemon: create, check
// the agent with the gateway (check, when not nil: unknown_agent fails the
// run, as without a daemon), copy in, exec, and destroy whatever happened.
func runViaDaemon(ctx context.Context, c *apiClient, rc sandboxd.CreateRequest, envs, copies, argv []string,
	timeout time.Duration, outputBytes int, stdin *os.File, stdout, stderr io.Writer, check func(wire.Identity) error) (int, error) {
	env, err := parseEnv("run", envs)
	if err != nil {
		return 0, err
	}
	in, err := c.create(ctx, sandboxd.CreateBody{Template: rc.Template, Agent: rc.Agent, Session: rc.Session, User: rc.User, Limits: rc.Limits, Egress: rc.Egress})
	if err != nil {
		return 0, fmt.Errorf("run (daemon %s): create: %w", c.sock, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := c.do(dctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(in.ID), nil, http.StatusNoContent, nil); err != nil {
			fmt.Fprintf(stderr, "sandboxd: run: destroy %s: %v\n", in.ID, err)
		}
	}()
	if check != nil {
		if err := check(wire.Identity{Sandbox: in.ID, Agent: in.Agent, Session: in.Session, User: in.User}); err != nil {
			return 0, err
		}
	}
	for _, cp := range copies {
		src, dst, ok := strings.Cut(cp, ":")
		if !ok {
			return 0, fmt.Errorf("run: --copy %q: want HOSTPATH:/workspace/PATH", cp)
		}
		if err := c.putFile(ctx, in.ID, src, dst); err != nil {
			return 0, fmt.Errorf("run: --copy %s: %w", cp, err)
		}
	}
	input, err := readStdin(stdin)
	if err != nil {
		return 0, fmt.Errorf("run: stdin: %w", err)
	}
	return c.exec(ctx, in.ID, sandboxd.ExecBody{Argv: argv, Stdin: input, Env: env, TimeoutMS: timeout.Milliseconds(), OutputBytes: outputBytes}, stdout, stderr)
}

// clientCmds are create, exec, cp, ls and rm.
func clientCmds(ctx context.Context, cfgPath *string, code *int, stdin *os.File, stdout, stderr io.Writer) []*cobra.Command {
	var apiSock string
	client := func() (*apiClient, error) { return newAPIClient(*cfgPath, apiSock) }

	var (
		cb           sandboxd.CreateBody
		mem, ws, tmp sizeFlag
		lifetime     time.Duration
		cenvs        []string
	)
	create := &cobra.Command{
		Use:   "create --agent A [--template NAME] [--session S] [--user U] [--egress HOST...] [limits]",
		Short: "ask the daemon for a sandbox; prints its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			if cb.Env, err = parseEnv("create", cenvs); err != nil {
				return err
			}
			cb.Limits.MemoryBytes, cb.Limits.WorkspaceBytes, cb.Limits.TmpBytes = int64(mem), int64(ws), int64(tmp)
			cb.LifetimeMS = lifetime.Milliseconds()
			in, err := c.create(ctx, cb)
			if err != nil {
				return fmt.Errorf("create: %w", err)
			}
			fmt.Fprintln(stdout, in.ID)
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&cb.Agent, "agent", "", "agent name (identity, required)")
	f.StringVar(&cb.Template, "template", "", "a template of sandboxd.yaml (its rootfs, limits, egress and env)")
	f.StringVar(&cb.Session, "session", "", "session (identity)")
	f.StringVar(&cb.User, "user", "", "user the agent acts for (identity)")
	f.StringSliceVar(&cb.Egress, "egress", nil, "narrow the agent's egress allowlist to these hosts (repeatable or comma-separated; never widens)")
	f.IntVar(&cb.Limits.Pids, "pids", 0, "pids limit (0 = config)")
	f.Var(&mem, "memory", "memory limit, bytes or a size like 512MiB (0 = config)")
	f.IntVar(&cb.Limits.CPUMillis, "cpu-millis", 0, "CPU limit, 1000 = one core (0 = config)")
	f.Var(&ws, "workspace", "/workspace size, bytes or a size like 64MiB (0 = config)")
	f.Var(&tmp, "tmp", "/tmp size, bytes or a size like 16MiB (0 = config)")
	f.DurationVar(&lifetime, "lifetime", 0, "destroy the sandbox after this long (0 = config)")
	f.StringArrayVar(&cenvs, "env", nil, "KEY=VALUE for every command (repeatable)")
	_ = create.MarkFlagRequired("agent")

	var (
		eb    sandboxd.ExecBody
		eenvs []string
		etime time.Duration
	)
	execCmd := &cobra.Command{
		Use:   "exec ID [flags] -- CMD [ARG...]",
		Short: "run CMD in a sandbox the daemon made; exits with CMD's code",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			if eb.Env, err = parseEnv("exec", eenvs); err != nil {
				return err
			}
			if eb.Stdin, err = readStdin(stdin); err != nil {
				return fmt.Errorf("exec: stdin: %w", err)
			}
			eb.Argv, eb.TimeoutMS = args[1:], etime.Milliseconds()
			n, err := c.exec(ctx, args[0], eb, stdout, stderr)
			if err != nil {
				return fmt.Errorf("exec: %w", err)
			}
			*code = n
			return nil
		},
	}
	f = execCmd.Flags()
	f.StringArrayVar(&eenvs, "env", nil, "KEY=VALUE for the command (repeatable)")
	f.DurationVar(&etime, "timeout", 0, "wall-clock limit (0 = the sandbox's exec_timeout)")
	f.IntVar(&eb.OutputBytes, "output-bytes", 0, "cap on each of stdout and stderr (0 = the sandbox's)")

	cp := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "copy a file into (HOSTPATH ID:/workspace/PATH) or out of (ID:/workspace/PATH HOSTPATH) a sandbox",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			sid, sp, sIn := splitRemote(args[0])
			did, dp, dIn := splitRemote(args[1])
			switch {
			case sIn == dIn:
				return fmt.Errorf("cp: exactly one of SRC and DST must be ID:/workspace/PATH")
			case dIn:
				if err := c.putFile(ctx, did, args[0], dp); err != nil {
					return fmt.Errorf("cp: %w", err)
				}
				return nil
			}
			b, err := c.send(ctx, http.MethodGet, filePath(sid, sp), nil, "", http.StatusOK)
			if err != nil {
				return fmt.Errorf("cp: %w", err)
			}
			if args[1] == "-" {
				_, err = stdout.Write(b)
				return err
			}
			// Written whole or not at all: a temp file renamed over dst.
			tmp, err := os.CreateTemp(dirOf(args[1]), ".sandboxd-cp-*")
			if err != nil {
				return fmt.Errorf("cp: %w", err)
			}
			defer os.Remove(tmp.Name())
			if _, err := tmp.Write(b); err != nil {
				tmp.Close()
				return fmt.Errorf("cp: %w", err)
			}
			if err := tmp.Close(); err != nil {
				return fmt.Errorf("cp: %w", err)
			}
			if err := os.Chmod(tmp.Name(), 0o644); err != nil {
				return fmt.Errorf("cp: %w", err)
			}
			return os.Rename(tmp.Name(), args[1])
		},
	}

	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "list the daemon's sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			var list []sandboxd.Info
			if err := c.do(ctx, http.MethodGet, "/v1/sandboxes", nil, http.StatusOK, &list); err != nil {
				return fmt.Errorf("ls: %w", err)
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tAGENT\tSESSION\tUSER\tCREATED\tMEMORY\tEGRESS\tSTATE")
			for _, in := range list {
				egress, state := strings.Join(in.Egress, ","), "running"
				if egress == "" {
					egress = "(agent's)"
				}
				if in.Failed != "" {
					state = "failed: " + in.Failed
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in.ID, in.Agent, dash(in.Session), dash(in.User),
					in.Created.Local().Format(time.DateTime), sandboxd.FormatSize(in.Limits.MemoryBytes), egress, state)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print the daemon's JSON")

	rm := &cobra.Command{
		Use:   "rm ID...",
		Short: "destroy sandboxes the daemon made",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			var failed int
			for _, id := range args {
				if err := c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), nil, http.StatusNoContent, nil); err != nil {
					fmt.Fprintf(stderr, "sandboxd: rm %s: %v\n", id, err)
					failed++
				}
			}
			if failed > 0 {
				return fmt.Errorf("rm: %d of %d not destroyed", failed, len(args))
			}
			return nil
		},
	}
	cmds := []*cobra.Command{create, execCmd, cp, ls, rm}
	for _, c := range cmds {
		c.Flags().StringVar(&apiSock, "api", "", "override the daemon's API socket (config api)")
	}
	return cmds
}

// splitRemote splits "ID:/workspace/PATH"; ok is false for a host path.
func splitRemote(s string) (id, p string, ok bool) {
	id, p, ok = strings.Cut(s, ":")
	if !ok || id == "" || strings.Contains(id, "/") || !strings.HasPrefix(p, "/workspace/") {
		return "", "", false
	}
	return id, p, true
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i+1]
	}
	return "."
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
