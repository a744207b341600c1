// Package vaulttest starts real servers for tests of the Vault backend: a
// `vault server -dev` on a random loopback port and a PostgreSQL cluster on
// loopback for the database secrets engine.
//
// The Vault binary is built from the Go module proxy by ./test.sh (see
// test/tools/vault.sh) and found through $SLUICE_VAULT_BIN or the default
// cache path. Without it the tests skip with that reason, unless
// $SLUICE_REQUIRE_VAULT is set (test.sh sets it), in which case they fail.
package vaulttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
)

// Version is the Vault release the tests run against.
const Version = "1.21.0"

// binPath is where the Vault server binary is expected.
func binPath() string {
	if p := os.Getenv("SLUICE_VAULT_BIN"); p != "" {
		return p
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "sluice", "vault-"+Version, "vault")
}

// Available is nil when the Vault server binary is there, else why not.
func Available() error {
	p := binPath()
	if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("no Vault server binary at %s: ./test.sh builds it (test/tools/vault.sh)", p)
	}
	return nil
}

// Bin returns the Vault server binary, or skips (fails under
// SLUICE_REQUIRE_VAULT) when it has not been built.
func Bin(t testing.TB) string {
	t.Helper()
	if err := Available(); err != nil {
		missing(t, err.Error())
	}
	return binPath()
}

func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("SLUICE_REQUIRE_VAULT") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// Net runs fn on a thread inside the network namespace the servers live
// in (a test-made namespace); processes started and sockets opened in fn
// stay there. Nil means the test's own namespace.
type Net func(fn func() error) error

func (n Net) run(fn func() error) error {
	if n == nil {
		return fn()
	}
	return n(fn)
}

// HTTPClient returns a client whose connections are made inside n.
func (n Net) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := n.run(func() (err error) {
				c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

// Server is a running `vault server -dev`.
type Server struct {
	Addr      string // http://127.0.0.1:PORT
	RootToken string
	cmd       *exec.Cmd
	done      chan struct{}
	log       string
	net       Net
	t         testing.TB
}

// Start runs a dev server on a random loopback port and waits until it is
// unsealed and active. It is killed at the end of the test.
func Start(t testing.TB) *Server { return StartIn(t, nil) }

// StartIn is Start inside the network namespace n.
func StartIn(t testing.TB, n Net) *Server {
	t.Helper()
	bin := Bin(t)
	dir := t.TempDir()
	token := "root-" + randHex(16)
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		var port int
		err := n.run(func() (err error) { port, err = freePortPair(); return err })
		if err != nil {
			t.Fatalf("vaulttest: ports: %v", err)
		}
		s := &Server{Addr: "http://127.0.0.1:" + strconv.Itoa(port), RootToken: token, done: make(chan struct{}), log: filepath.Join(dir, "vault.log"), net: n, t: t}
		logf, err := os.Create(s.log)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "server", "-dev", "-dev-no-store-token", "-dev-listen-address=127.0.0.1:"+strconv.Itoa(port), "-log-level=warn")
		cmd.Env = []string{"VAULT_DEV_ROOT_TOKEN_ID=" + token, "HOME=" + dir, "PATH=/usr/bin:/bin"}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := n.run(cmd.Start); err != nil {
			logf.Close()
			t.Fatalf("vaulttest: start %s: %v", bin, err)
		}
		s.cmd = cmd
		go func() { _ = cmd.Wait(); logf.Close(); close(s.done) }()
		t.Cleanup(s.Stop)
		if lastErr = s.waitHealthy(60 * time.Second); lastErr == nil {
			return s
		}
		s.Stop()
	}
	t.Fatalf("vaulttest: vault server did not become healthy: %v", lastErr)
	return nil
}

func (s *Server) waitHealthy(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	hc := s.net.HTTPClient(2 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("exited: %s", s.Log())
		default:
		}
		resp, err := hc.Get(s.Addr + "/v1/sys/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not healthy after %s", limit)
}

func tail(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Stop kills the server (an outage from the gateway's point of view).
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// Client returns a root client for setting up engines in tests.
func (s *Server) Client(t testing.TB) *api.Client {
	t.Helper()
	c, err := api.NewClient(&api.Config{Address: s.Addr, Timeout: 10 * time.Second, HttpClient: s.net.HTTPClient(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	c.SetToken(s.RootToken)
	return c
}

// Seal seals the server: every request after this fails with 503.
func (s *Server) Seal(t testing.TB) {
	t.Helper()
	if err := s.Client(t).Sys().Seal(); err != nil {
		t.Fatalf("vaulttest: seal: %v", err)
	}
}

// Mount enables a secrets engine at path.
func (s *Server) Mount(t testing.TB, path, typ string) {
	t.Helper()
	if err := s.Client(t).Sys().Mount(path, &api.MountInput{Type: typ}); err != nil {
		t.Fatalf("vaulttest: mount %s %s: %v", typ, path, err)
	}
}

// Write writes data at path with the root token.
func (s *Server) Write(t testing.TB, path string, data map[string]any) *api.Secret {
	t.Helper()
	sec, err := s.Client(t).Logical().Write(path, data)
	if err != nil {
		t.Fatalf("vaulttest: write %s: %v", path, err)
	}
	return sec
}

// AppRole enables AppRole auth (once) and creates role with the given
// policy text, writing its role_id and a fresh secret_id into files in dir.
// It returns the two file paths.
func (s *Server) AppRole(t testing.TB, dir, role, policy string, tokenTTL string) (roleIDFile, secretIDFile string) {
	t.Helper()
	c := s.Client(t)
	auths, err := c.Sys().ListAuth()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := auths["approle/"]; !ok {
		if err := c.Sys().EnableAuthWithOptions("approle", &api.EnableAuthOptions{Type: "approle"}); err != nil {
			t.Fatalf("vaulttest: enable approle: %v", err)
		}
	}
	if err := c.Sys().PutPolicy(role, policy); err != nil {
		t.Fatalf("vaulttest: policy %s: %v", role, err)
	}
	s.Write(t, "auth/approle/role/"+role, map[string]any{"token_policies": role, "token_ttl": tokenTTL, "token_max_ttl": "24h"})
	rid, err := c.Logical().Read("auth/approle/role/" + role + "/role-id")
	if err != nil {
		t.Fatal(err)
	}
	sid := s.Write(t, "auth/approle/role/"+role+"/secret-id", nil)
	roleIDFile = filepath.Join(dir, role+".role_id")
	secretIDFile = filepath.Join(dir, role+".secret_id")
	if err := os.WriteFile(roleIDFile, []byte(rid.Data["role_id"].(string)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secretIDFile, []byte(sid.Data["secret_id"].(string)), 0o600); err != nil {
		t.Fatal(err)
	}
	return roleIDFile, secretIDFile
}

// Log returns the server's output so far (for failure messages), without
// the dev server's unseal key and root token.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.log)
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Unseal Key:") || strings.Contains(l, "Root Token:") || strings.Contains(l, s.RootToken) {
			continue
		}
		keep = append(keep, l)
	}
	return tail([]byte(strings.Join(keep, "\n")))
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freePortPair finds a loopback port p with p+1 also free: the dev server
// listens on both (API and cluster).
func freePortPair() (int, error) {
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		l.Close()
		if err == nil {
			l2.Close()
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port pair on loopback")
}

// Postgres is a throwaway PostgreSQL cluster on loopback.
type Postgres struct {
	Port     int
	Password string // the superuser "postgres"'s password
	bin      string
	dir      string
	net      Net
	t        testing.TB
}

// StartPostgres initialises a cluster in a temporary directory owned by the
// postgres user (Debian's package), with password authentication on
// 127.0.0.1, and starts it. It is stopped and removed at the end of the test.
func StartPostgres(t testing.TB) *Postgres { return StartPostgresIn(t, nil) }

// StartPostgresIn is StartPostgres inside the network namespace n.
func StartPostgresIn(t testing.TB, n Net) *Postgres {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Strings(bins)
	if len(bins) == 0 {
		missing(t, "no PostgreSQL server (Debian package postgresql): ./test.sh installs it")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	u, err := user.Lookup("postgres")
	if err != nil {
		missing(t, "no postgres user: "+err.Error())
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	p := &Postgres{Password: "pg-" + randHex(12), bin: bin, dir: dir, net: n, t: t}
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte(p.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Chown(pw, uid, gid)
	data := filepath.Join(dir, "data")
	p.run(t, uid, gid, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--pwfile", pw, "-A", "scram-sha-256", "--no-sync")
	if err := n.run(func() error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		p.Port = l.Addr().(*net.TCPAddr).Port
		return l.Close()
	}); err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off", p.Port, dir)
	p.run(t, uid, gid, filepath.Join(bin, "pg_ctl"), "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start")
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		_ = cmd.Run()
	})
	return p
}

func (p *Postgres) run(t testing.TB, uid, gid int, argv ...string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = p.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	var out []byte
	err := p.net.run(func() (err error) { out, err = cmd.CombinedOutput(); return err })
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(p.dir, "log"))
		t.Fatalf("vaulttest: %s: %v\n%s\n%s", filepath.Base(argv[0]), err, tail(out), tail(log))
	}
}

// Query runs sql with psql as user/password and returns the unaligned,
// tuples-only output.
func (p *Postgres) Query(ctx context.Context, user, password, sql string) (string, error) {
	psql := filepath.Join(p.bin, "psql")
	cmd := exec.CommandContext(ctx, psql, "-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", user, "-d", "postgres", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "PGPASSWORD=" + password, "PGCONNECT_TIMEOUT=5", "LC_ALL=C"}
	var out []byte
	err := p.net.run(func() (err error) { out, err = cmd.CombinedOutput(); return err })
	if err != nil {
		return "", fmt.Errorf("psql as %s: %w: %s", user, err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// Super runs sql as the superuser and fails the test on error.
func (p *Postgres) Super(t testing.TB, sql string) string {
	t.Helper()
	out, err := p.Query(context.Background(), "postgres", p.Password, sql)
	if err != nil {
		t.Fatalf("vaulttest: %v", err)
	}
	return out
}

// ConnectionURL is the database engine's connection_url template for this
// cluster (Vault fills in {{username}} and {{password}}).
func (p *Postgres) ConnectionURL() string {
	return fmt.Sprintf("postgresql://{{username}}:{{password}}@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
}
