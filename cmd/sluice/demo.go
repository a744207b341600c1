package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/bcrypt"

	"github.com/sluice-gw/sluice/gateway"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault"
)

// demoFS holds the demo upstream's OpenAPI spec.
//
//go:embed demo/*
var demoFS embed.FS

const (
	demoSpec      = "tickets.yaml"
	demoSecret    = "tickets-api-key"
	demoKeyHeader = "X-Api-Key"
	demoInput     = "eval-input.json"
)

// demoIdentity is who the scripted agent is, as sandboxd would announce it.
var demoIdentity = wire.Identity{Sandbox: "demo-sb-1", Agent: "demo-agent", Session: "demo", User: "you"}

func demoCmd(g *globals) *cobra.Command {
	var keep bool
	var dir string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole pipeline locally: gateway, secret store, demo upstream and a scripted agent",
		Long: `Run sluice end to end on embedded defaults, in a temporary directory (or --dir):
a local secret store, SQLite, the audit log, a demo "tickets" API on loopback and
the gateway in front of it. A scripted agent then makes an allowed, a blocked and
an ask call over the gateway's socket, and the demo checks every answer.

Without --keep everything stops afterwards (the files stay in the directory);
with --keep the gateway and the upstream keep running until Ctrl-C, the
approver's API token is written to approver-token (0600) and the admin port
the gateway got is recorded in the demo's sluice.yaml, so that
"sluice approvals list --config DIR/sluice.yaml --token-file DIR/approver-token"
works while it runs. A directory a running demo is using (its demo.lock is
held) is refused before anything is written. The exit status is non-zero if
any answer is not the expected one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), cmd.OutOrStdout(), dir, keep)
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the gateway and the upstream running until Ctrl-C")
	cmd.Flags().StringVar(&dir, "dir", "", "directory for the demo's files (default: a new temporary directory)")
	return cmd
}

// writeDemoFiles writes the demo's spec, config and a sample policy input
// into dir and returns the config's path. The connector's base_url is
// upstream; relayUID is the uid the gateway trusts to send the preamble.
func writeDemoFiles(dir, upstream string, relayUID int, appr demoApprover) (string, error) {
	spec, err := demoFS.ReadFile("demo/" + demoSpec)
	if err != nil {
		return "", fmt.Errorf("bug(): embedded demo spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, demoSpec), spec, 0o644); err != nil {
		return "", err
	}
	cfg := fmt.Sprintf(`# Written by `+"`sluice demo`"+`: the embedded defaults, with every path inside this
# directory. Relative paths resolve against this file's directory.
gateway:
  sandbox_socket: relay.sock
  # Who may send the identity preamble. In production this is sandboxd's uid;
  # here the demo's scripted agent dials the socket itself, as you.
  trusted_relay_uids: [%d]
  hold_wait: 1s
  admin_listen: 127.0.0.1:0   # a free port, printed by the demo
store: sqlite:sluice.db
audit:
  path: audit.log
secrets:
  backend: local
  local:
    path: secrets.json
    key_file: secrets.key
connectors:
  - slug: tickets
    spec: %s
    base_url: %s
    # The guarded dialer refuses loopback, private and link-local addresses.
    # The demo upstream listens on loopback, so this connector, and only this
    # one, may dial 127.0.0.1. Never write this for an API you do not run.
    allow_private: [127.0.0.1/32]
    credential:
      secret: %s   # attached as X-Api-Key (the spec's apiKey scheme)
agents:
  - name: %s
    connectors: [tickets]
policies:
  - match: tickets.list_tickets
    action: allow
  - match: tickets.get_ticket
    action: allow
  - match: tickets.create_refund
    action: ask
    approvers: [group:finance]
    reason: refunds move money
  - match: "*"
    action: block
`, relayUID, demoSpec, upstream, demoSecret, demoIdentity.Agent)
	if appr.Name != "" {
		cfg += fmt.Sprintf(`approvers:
  # The demo's approver: logs in to the review UI with the password in
  # approver-password (bcrypt here), and the demo's script approves through
  # the admin API with a token whose SHA-256 is below.
  users:
    - name: %s
      groups: [finance]
      password_hash: %q
      token_sha256: %s
`, appr.Name, appr.PasswordHash, appr.TokenSHA256)
	}
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return "", err
	}
	input := fmt.Sprintf(`{
  "version": 1,
  "kind": "tool_call",
  "caller": {"sandbox": %q, "agent": %q, "session": %q, "user": %q},
  "connector": "tickets",
  "tool": "tickets.delete_ticket",
  "operation": {"id": "deleteTicket", "method": "DELETE", "path": "/tickets/{id}", "risk": "write", "tags": []},
  "args": {"path": {"id": "T-1"}},
  "request": {"method": "DELETE", "host": "tickets.example.com", "path": "/tickets/T-1", "query": {}, "headers": {}}
}
`, demoIdentity.Sandbox, demoIdentity.Agent, demoIdentity.Session, demoIdentity.User)
	if err := os.WriteFile(filepath.Join(dir, demoInput), []byte(input), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// demoUpstream is the "tickets" API: it answers only requests that carry the
// key, and counts what it saw so the demo can show what reached it.
type demoUpstream struct {
	key  []byte
	srv  *http.Server
	ln   net.Listener
	mu   sync.Mutex
	hits map[string]int // "GET /tickets" → requests with the right key
	bad  int            // requests without it
}

func startUpstream(key string) (*demoUpstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo upstream: %w", err)
	}
	u := &demoUpstream{key: []byte(key), ln: ln, hits: map[string]int{}}
	tickets := []map[string]string{
		{"id": "T-1", "subject": "Printer on fire", "status": "open"},
		{"id": "T-2", "subject": "Refund for double charge", "status": "open"},
		{"id": "T-3", "subject": "Password reset", "status": "closed"},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /tickets", func(w http.ResponseWriter, r *http.Request) {
		writeDemoJSON(w, 200, map[string]any{"tickets": tickets})
	})
	mux.HandleFunc("GET /tickets/{id}", func(w http.ResponseWriter, r *http.Request) {
		for _, t := range tickets {
			if t["id"] == r.PathValue("id") {
				writeDemoJSON(w, 200, t)
				return
			}
		}
		writeDemoJSON(w, 404, map[string]string{"error": "no such ticket"})
	})
	mux.HandleFunc("DELETE /tickets/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /refunds", func(w http.ResponseWriter, r *http.Request) {
		writeDemoJSON(w, 201, map[string]string{"refund_id": "R-1", "status": "issued"})
	})
	u.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if subtle.ConstantTimeCompare([]byte(r.Header.Get(demoKeyHeader)), u.key) != 1 {
				u.mu.Lock()
				u.bad++
				u.mu.Unlock()
				writeDemoJSON(w, 401, map[string]string{"error": "missing or wrong " + demoKeyHeader})
				return
			}
			route := r.Method + " " + r.URL.Path
			if strings.HasPrefix(r.URL.Path, "/tickets/") {
				route = r.Method + " /tickets/{id}"
			}
			u.mu.Lock()
			u.hits[route]++
			u.mu.Unlock()
			mux.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = u.srv.Serve(ln) }()
	return u, nil
}

func (u *demoUpstream) URL() string { return "http://" + u.ln.Addr().String() }

// seen returns how many keyed requests reached route, and how many requests
// came without the key.
func (u *demoUpstream) seen(route string) (keyed, unkeyed int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[route], u.bad
}

func (u *demoUpstream) Close() { _ = u.srv.Close() }

func writeDemoJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// agentClient is the scripted agent's HTTP client. Each connection dials the
// gateway's Unix socket and first writes the identity preamble, exactly as
// sandboxd's relay does, then carries one HTTP exchange.
func agentClient(sock string, id wire.Identity) (*http.Client, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, sock, id)
		},
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}

// reply is one answer the agent got.
type reply struct {
	status int
	body   []byte
}

// code is the error code of a refusal, or "".
func (r reply) code() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code
}

func agentCall(ctx context.Context, c *http.Client, method, path, body string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://sluice"+path, rd)
	if err != nil {
		return reply{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, body: b}, nil
}

// adminPost sends a JSON POST to the admin API as the bearer of token and
// returns the status.
func adminPost(ctx context.Context, url, token, body string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// toolNames pulls tool names out of GET /v1/tools, whether the list is the
// document itself or under "tools".
func toolNames(body []byte) []string {
	var doc any
	if json.Unmarshal(body, &doc) != nil {
		return nil
	}
	if m, ok := doc.(map[string]any); ok {
		doc = m["tools"]
	}
	list, _ := doc.([]any)
	var names []string
	for _, t := range list {
		if m, ok := t.(map[string]any); ok {
			if n, ok := m["name"].(string); ok {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	return names
}

// demoRun carries the demo's output and its verdicts.
type demoRun struct {
	w      io.Writer
	failed []string
}

// check prints one step's result; a step whose answer was not the expected
// one fails the demo.
func (d *demoRun) check(ok bool, step, got, want string) {
	if ok {
		fmt.Fprintf(d.w, "   ok   %s\n", got)
		return
	}
	fmt.Fprintf(d.w, "   FAIL %s (want %s)\n", got, want)
	d.failed = append(d.failed, step)
}

// demoApprover is the person the demo configures to decide held calls.
type demoApprover struct {
	Name, PasswordHash, TokenSHA256 string
	token, passwordFile, tokenFile  string // the script's API token; where the UI password is; where --keep writes the token
}

// newDemoApprover makes the approver's random password (written 0600 into
// dir, never printed) and API token (kept in memory for the script).
func newDemoApprover(dir string) (demoApprover, error) {
	var pw, tok [16]byte
	if _, err := rand.Read(pw[:]); err != nil {
		return demoApprover{}, err
	}
	if _, err := rand.Read(tok[:]); err != nil {
		return demoApprover{}, err
	}
	password := hex.EncodeToString(pw[:])
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return demoApprover{}, err
	}
	a := demoApprover{Name: "fran", PasswordHash: string(hash), token: hex.EncodeToString(tok[:]),
		passwordFile: filepath.Join(dir, "approver-password"), tokenFile: filepath.Join(dir, "approver-token")}
	sum := sha256.Sum256([]byte(a.token))
	a.TokenSHA256 = hex.EncodeToString(sum[:])
	if err := os.WriteFile(a.passwordFile, []byte(password+"\n"), 0o600); err != nil {
		return demoApprover{}, err
	}
	return a, nil
}

// demoLock is the file in a demo directory that a running demo holds an
// exclusive flock on, with its pid inside for the message. The kernel
// drops the lock when the process ends, however it ends, so a stale file
// never blocks a new demo.
const demoLock = "demo.lock"

// lockDemoDir takes dir's demo lock, or says which live demo holds it.
// Opening the lock file creates it when it is missing; when it exists,
// nothing in dir is modified unless the lock is free.
func lockDemoDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, demoLock)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who := "another process"
			if p := strings.TrimSpace(string(pid)); p != "" {
				who = "pid " + p
			}
			return nil, fmt.Errorf("%s is in use by a running demo (%s holds %s): stop it (Ctrl-C), or use another --dir; nothing was written", dir, who, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// recordAdminAddr rewrites the admin_listen line of the demo's config to
// the address the gateway listens on (the config asked for port 0),
// replacing the file in one rename.
func recordAdminAddr(cfgPath, addr string) error {
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	const line = "  admin_listen: 127.0.0.1:0   # a free port, printed by the demo\n"
	if !bytes.Contains(data, []byte(line)) {
		return fmt.Errorf("bug(): %s has no admin_listen line to record the port in", cfgPath)
	}
	data = bytes.Replace(data, []byte(line), []byte("  admin_listen: "+addr+"   # the port this demo's gateway got (it asked for 0)\n"), 1)
	tmp := cfgPath + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, cfgPath)
}

func runDemo(ctx context.Context, w io.Writer, dir string, keep bool) error {
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "sluice-demo-"); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	// Before anything is written: a directory a live demo is using is
	// refused, or this run would rewrite its config, key and password
	// under it.
	lock, err := lockDemoDir(dir)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer lock.Close()

	// The key exists only here, in the upstream and in the sealed store: it is
	// never printed, and the agent never holds it.
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return fmt.Errorf("demo: key: %w", err)
	}
	key := "demo-" + hex.EncodeToString(raw[:])

	up, err := startUpstream(key)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer up.Close()

	appr, err := newDemoApprover(dir)
	if err != nil {
		return fmt.Errorf("demo: approver: %w", err)
	}
	cfgPath, err := writeDemoFiles(dir, up.URL(), os.Getuid(), appr)
	if err != nil {
		return fmt.Errorf("demo: write files: %w", err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	store, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := store.Set(ctx, demoSecret, vault.ScopeProject, vault.NewSecret([]byte(key))); err != nil {
		return fmt.Errorf("demo: store key: %w", err)
	}

	logPath := filepath.Join(dir, "gateway.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer logFile.Close()
	log := slog.New(slog.NewJSONHandler(logFile, nil))

	srv, err := gateway.New(ctx, cfg, gateway.Options{Logger: log})
	if err != nil {
		return fmt.Errorf("demo: start gateway (config %s): %w", cfgPath, err)
	}
	serveCtx, stop := context.WithCancel(ctx)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(serveCtx) }()
	stopped := false
	shutdown := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stop()
		err := <-served
		if cerr := srv.Close(); err == nil || errors.Is(err, context.Canceled) {
			err = cerr
		}
		return err
	}
	defer shutdown()

	select {
	case <-srv.Ready():
	case err := <-served:
		stopped = true
		_ = srv.Close()
		return fmt.Errorf("demo: gateway stopped before it was ready: %w", err)
	case <-time.After(20 * time.Second):
		return errors.New("demo: gateway not ready after 20s")
	case <-ctx.Done():
		return ctx.Err()
	}
	admin := "http://" + srv.AdminAddr()
	if keep {
		// The config now names the port the gateway really got, so that
		// `sluice approvals list --config DIR/sluice.yaml` reaches it, and
		// the approver's token is where --token-file can read it.
		if err := recordAdminAddr(cfgPath, srv.AdminAddr()); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if err := os.WriteFile(appr.tokenFile, []byte(appr.token+"\n"), 0o600); err != nil {
			return fmt.Errorf("demo: approver token: %w", err)
		}
	}

	fmt.Fprintf(w, "sluice demo: gateway, local secret store, SQLite and audit log in %s\n", dir)
	fmt.Fprintf(w, "  upstream   %s: a demo \"tickets\" API that answers only with its key in %s\n", up.URL(), demoKeyHeader)
	fmt.Fprintf(w, "             (connector allow_private: [127.0.0.1/32] because it listens on loopback)\n")
	fmt.Fprintf(w, "  secret     %q in the local store (%s); the agent never sees it\n", demoSecret, cfg.Secrets.Local.Path)
	fmt.Fprintf(w, "  gateway    socket %s, admin %s\n", cfg.Gateway.SandboxSocket, admin)
	fmt.Fprintf(w, "  policy     list/get allow, create_refund ask (group:finance), everything else block\n\n")
	fmt.Fprintf(w, "The agent is a scripted stand-in for sandboxed code: it dials the socket, sends the\n")
	fmt.Fprintf(w, "identity preamble sandboxd's relay sends (sandbox %s, agent %s) and speaks HTTP.\n", demoIdentity.Sandbox, demoIdentity.Agent)
	fmt.Fprintf(w, "(Real code in a real sandbox: `sandboxd run --gateway %s --agent %s -- CMD`, as root.)\n\n", cfg.Gateway.SandboxSocket, demoIdentity.Agent)

	agent, err := agentClient(cfg.Gateway.SandboxSocket, demoIdentity)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d := &demoRun{w: w}
	d.steps(ctx, agent, up, key, admin, appr)

	fmt.Fprintf(w, "\nreview UI  %s/  (log in as %s; the password is in %s)\n", admin, appr.Name, appr.passwordFile)
	fmt.Fprintf(w, "admin      %s/metrics  %s/healthz\n", admin, admin)
	fmt.Fprintf(w, "logs       %s (one JSON decision line per call)\n", logPath)
	fmt.Fprintf(w, "audit      %s\n", cfg.Audit.Path)
	fmt.Fprintf(w, "           verify it: sluice audit verify --config %s\n", cfgPath)
	fmt.Fprintf(w, "\nTry next:\n")
	fmt.Fprintf(w, "  sluice tools --config %s\n", cfgPath)
	fmt.Fprintf(w, "  sluice policy eval --config %s --input %s\n", cfgPath, filepath.Join(dir, demoInput))
	fmt.Fprintf(w, "  edit the policies in %s, then sluice validate --config %s\n", cfgPath, cfgPath)
	if !keep {
		fmt.Fprintf(w, "  sluice demo --keep, to keep the gateway running and look at %s/metrics\n", admin)
	}

	if keep && len(d.failed) == 0 {
		// Leave one call held for a person to decide in the review UI.
		if r, err := agentCall(ctx, agent, "POST", "/v1/tools/tickets.create_refund", `{"body":{"ticket_id":"T-3","amount_cents":990,"reason":"late delivery"}}`); err == nil && r.status == 202 {
			fmt.Fprintf(w, "\nA second refund is held now: open %s/, log in as %s and approve or deny it.\n", admin, appr.Name)
		}
		fmt.Fprintf(w, "\nadmin URL  %s (gateway.admin_listen in %s now names this port)\n", admin, cfgPath)
		fmt.Fprintf(w, "approvals  fran's API token is in %s (mode 0600); in another terminal:\n", appr.tokenFile)
		fmt.Fprintf(w, "             sluice approvals list --config %s --token-file %s\n", cfgPath, appr.tokenFile)
		fmt.Fprintf(w, "\nThe gateway and the upstream keep running; Ctrl-C stops them.\n")
		<-ctx.Done()
	}
	if err := shutdown(); err != nil {
		return fmt.Errorf("demo: stop gateway: %w", err)
	}
	res, err := verifyAudit(cfg.Audit.Path, true, 0, "")
	n := res.n
	switch {
	case err != nil:
		fmt.Fprintf(w, "\naudit: FAIL %v\n", err)
		d.failed = append(d.failed, "audit verify")
	case n < 3:
		fmt.Fprintf(w, "\naudit: FAIL %d records, want one per tool call (3)\n", n)
		d.failed = append(d.failed, "audit records")
	default:
		fmt.Fprintf(w, "\naudit: ok: %d records, chain intact\n", n)
	}
	if len(d.failed) > 0 {
		return fmt.Errorf("demo: unexpected answers at: %s (gateway log: %s)", strings.Join(d.failed, ", "), logPath)
	}
	fmt.Fprintf(w, "demo ok: every answer was the expected one; gateway stopped, files kept in %s\n", dir)
	return nil
}

// steps runs the scripted agent's calls and checks each answer.
func (d *demoRun) steps(ctx context.Context, agent *http.Client, up *demoUpstream, key, admin string, appr demoApprover) {
	w := d.w
	leak := func(r reply) bool { return bytes.Contains(r.body, []byte(key)) }

	fmt.Fprintf(w, "1. GET  /v1/tools\n")
	r, err := agentCall(ctx, agent, "GET", "/v1/tools", "")
	if err != nil {
		d.check(false, "list tools", err.Error(), "200")
	} else {
		names := toolNames(r.body)
		ok := r.status == 200 && slices.Contains(names, "tickets.list_tickets") && !slices.Contains(names, "tickets.delete_ticket")
		d.check(ok, "list tools", fmt.Sprintf("%d: %s (delete_ticket is blocked, so not listed)", r.status, strings.Join(names, ", ")),
			"200 with tickets.list_tickets and without the blocked tickets.delete_ticket")
	}

	fmt.Fprintf(w, "2. POST /v1/tools/tickets.list_tickets   policy: allow\n")
	r, err = agentCall(ctx, agent, "POST", "/v1/tools/tickets.list_tickets", `{"query":{"status":"open"}}`)
	if err != nil {
		d.check(false, "allowed call", err.Error(), "200")
	} else {
		var out struct {
			Status int `json:"status"`
			Body   struct {
				Tickets []any `json:"tickets"`
			} `json:"body"`
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(r.body, &out)
		keyed, unkeyed := up.seen("GET /tickets")
		ok := r.status == 200 && out.Status == 200 && len(out.Body.Tickets) > 0 && keyed == 1 && unkeyed == 0 && !leak(r)
		d.check(ok, "allowed call",
			fmt.Sprintf("%d: upstream answered %d with %d tickets (request %s)", r.status, out.Status, len(out.Body.Tickets), out.RequestID),
			"200 with the upstream's tickets")
		d.check(keyed == 1 && unkeyed == 0, "credential attached",
			fmt.Sprintf("the upstream saw the API key in %s on %d request(s), %d without it", demoKeyHeader, keyed, unkeyed),
			"one keyed request")
		d.check(!leak(r), "no key in the reply", "the agent's reply does not contain the key", "no key")
	}

	fmt.Fprintf(w, "3. POST /v1/tools/tickets.delete_ticket  policy: block\n")
	r, err = agentCall(ctx, agent, "POST", "/v1/tools/tickets.delete_ticket", `{"path":{"id":"T-1"}}`)
	if err != nil {
		d.check(false, "blocked call", err.Error(), "403 policy_block")
	} else {
		keyed, _ := up.seen("DELETE /tickets/{id}")
		d.check(r.status == 403 && r.code() == "policy_block" && keyed == 0 && !leak(r), "blocked call",
			fmt.Sprintf("%d %s; the upstream saw %d delete(s)", r.status, r.code(), keyed), "403 policy_block and no upstream call")
	}

	fmt.Fprintf(w, "4. POST /v1/tools/tickets.create_refund  policy: ask (approvers group:finance)\n")
	r, err = agentCall(ctx, agent, "POST", "/v1/tools/tickets.create_refund", `{"body":{"ticket_id":"T-2","amount_cents":1500,"reason":"double charge"}}`)
	var hold struct {
		Hold struct {
			ID, Status, Poll string
		} `json:"hold"`
	}
	if err != nil {
		d.check(false, "ask call", err.Error(), "202 held for approval")
	} else {
		keyed, _ := up.seen("POST /refunds")
		_ = json.Unmarshal(r.body, &hold)
		d.check(r.status == 202 && hold.Hold.Status == "pending" && keyed == 0 && !leak(r), "ask call",
			fmt.Sprintf("%d held for approval: hold %s %s; the upstream saw %d refund(s)", r.status, hold.Hold.ID, hold.Hold.Status, keyed),
			"202 with a pending hold and no upstream call")
	}

	fmt.Fprintf(w, "5. %s (group finance) approves hold %s; the agent polls %s\n", appr.Name, hold.Hold.ID, hold.Hold.Poll)
	if hold.Hold.ID == "" {
		d.check(false, "approval", "no hold to approve", "an approved hold")
	} else {
		st, err := adminPost(ctx, admin+"/api/v1/holds/"+hold.Hold.ID+"/approve", appr.token, `{"reason":"refund checked against the ledger"}`)
		if err != nil {
			d.check(false, "approval", err.Error(), "200")
		} else {
			d.check(st == 200, "approval", fmt.Sprintf("%d: approved through the admin API (a person's token; never the sandbox socket)", st), "200")
		}
		r, err = agentCall(ctx, agent, "GET", hold.Hold.Poll+"?wait=10s", "")
		if err != nil {
			d.check(false, "held call result", err.Error(), "200")
		} else {
			var out struct {
				Status int `json:"status"`
			}
			_ = json.Unmarshal(r.body, &out)
			keyed, unkeyed := up.seen("POST /refunds")
			d.check(r.status == 200 && out.Status == 201 && keyed == 1 && unkeyed == 0 && !leak(r), "held call result",
				fmt.Sprintf("%d: the stored request ran once, upstream answered %d; the upstream saw %d keyed refund(s)", r.status, out.Status, keyed),
				"200 with the upstream's 201 and exactly one keyed refund")
		}
	}

	fmt.Fprintf(w, "6. GET  %s/healthz (admin listener; never reachable from a sandbox)\n", admin)
	hc := &http.Client{Timeout: 10 * time.Second}
	hreq, err := http.NewRequestWithContext(ctx, "GET", admin+"/healthz", nil)
	var hr *http.Response
	if err == nil {
		hr, err = hc.Do(hreq)
	}
	if err != nil {
		d.check(false, "healthz", err.Error(), "200")
	} else {
		_, _ = io.Copy(io.Discard, hr.Body)
		hr.Body.Close()
		d.check(hr.StatusCode == 200, "healthz", fmt.Sprintf("%d", hr.StatusCode), "200")
	}
}
