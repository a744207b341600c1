// Package pgtest starts a real, throwaway PostgreSQL server for tests of
// the PostgreSQL store: Debian's postgresql package, initdb into a
// temporary directory owned by the postgres user, listening on a Unix
// socket in that directory and on a loopback port, with password
// authentication. It can be stopped and started again on the same port
// (an outage), and serve TLS with a test CA.
//
// Without the server binaries a test skips with the reason, unless
// $SLUICE_REQUIRE_POSTGRES is set (./test.sh sets it), when it fails.
package pgtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a running (or stopped) cluster.
type Server struct {
	Port     int
	Password string // the superuser "postgres"'s
	Dir      string // socket directory (and the cluster's home)
	// CAFile is the CA that signed the server's certificate (TLS only).
	CAFile string

	bin      string
	data     string
	uid, gid int
	tls      bool
	dbs      atomic.Int64
}

// Options for Start.
type Options struct {
	TLS bool // ssl=on with a certificate for 127.0.0.1 and "localhost"
}

// Available is nil when the server binaries and the postgres user exist.
func Available() error {
	if _, err := binDir(); err != nil {
		return err
	}
	if _, err := user.Lookup("postgres"); err != nil {
		return fmt.Errorf("pgtest: no postgres user: %w", err)
	}
	return nil
}

func binDir() (string, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Strings(bins)
	if len(bins) == 0 {
		return "", errors.New("pgtest: no PostgreSQL server (Debian package postgresql): ./test.sh installs it")
	}
	return filepath.Dir(bins[len(bins)-1]), nil
}

// Skip skips t (fails it under $SLUICE_REQUIRE_POSTGRES) without a server.
func Skip(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("SLUICE_REQUIRE_POSTGRES") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// StartT starts a server that is stopped and removed when t ends.
func StartT(t testing.TB, o Options) *Server {
	t.Helper()
	Skip(t)
	s, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Remove)
	return s
}

// Start initialises and starts a cluster. Call Remove at the end.
func Start(o Options) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: no postgres user: %w", err)
	}
	s := &Server{bin: bin, tls: o.TLS, Password: "pg-" + randHex(12)}
	s.uid, _ = strconv.Atoi(u.Uid)
	s.gid, _ = strconv.Atoi(u.Gid)
	if s.Dir, err = os.MkdirTemp("", "sluice-pg-"); err != nil {
		return nil, err
	}
	fail := func(err error) (*Server, error) { os.RemoveAll(s.Dir); return nil, err }
	if err := os.Chmod(s.Dir, 0o700); err != nil {
		return fail(err)
	}
	if err := os.Chown(s.Dir, s.uid, s.gid); err != nil {
		return fail(err)
	}
	pw := filepath.Join(s.Dir, "pw")
	if err := os.WriteFile(pw, []byte(s.Password+"\n"), 0o600); err != nil {
		return fail(err)
	}
	_ = os.Chown(pw, s.uid, s.gid)
	s.data = filepath.Join(s.Dir, "data")
	if err := s.run("initdb", "-D", s.data, "-U", "postgres", "--pwfile", pw, "-A", "scram-sha-256", "--no-sync"); err != nil {
		return fail(err)
	}
	if o.TLS {
		if err := s.makeCerts(); err != nil {
			return fail(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	s.Port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	if err := s.StartAgain(); err != nil {
		return fail(err)
	}
	return s, nil
}

// StartAgain starts a stopped server (same data, same port).
func (s *Server) StartAgain() error {
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c max_connections=200", s.Port, s.Dir)
	if s.tls {
		opts += " -c ssl=on -c ssl_cert_file=" + filepath.Join(s.Dir, "server.crt") + " -c ssl_key_file=" + filepath.Join(s.Dir, "server.key")
	}
	return s.run("pg_ctl", "-D", s.data, "-o", opts, "-l", filepath.Join(s.Dir, "log"), "-w", "-t", "60", "start")
}

// Stop stops the server at once (immediate shutdown: connections drop).
func (s *Server) Stop() error {
	return s.run("pg_ctl", "-D", s.data, "-m", "immediate", "-w", "stop")
}

// Remove stops the server and deletes its directory.
func (s *Server) Remove() {
	_ = s.Stop()
	os.RemoveAll(s.Dir)
}

func (s *Server) run(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.Dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(s.uid), Gid: uint32(s.gid)}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
		return fmt.Errorf("pgtest: %s: %w\n%s\n%s", name, err, tail(out), tail(log))
	}
	return nil
}

// SuperURL is the superuser's DSN for database db over loopback TCP.
func (s *Server) SuperURL(db string) string {
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/%s?sslmode=disable", url.QueryEscape(s.Password), s.Port, db)
}

// SocketURL is the superuser's DSN for database db over the Unix socket
// (reachable from a network namespace that shares the file system).
func (s *Server) SocketURL(db string) string {
	return fmt.Sprintf("postgres://postgres:%s@/%s?host=%s&port=%d&sslmode=disable", url.QueryEscape(s.Password), db, url.QueryEscape(s.Dir), s.Port)
}

// NewDatabase creates a fresh database and returns its name.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d_%s", s.dbs.Add(1), randHex(4))
	if err := s.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	return name, nil
}

// NewDatabaseT is NewDatabase failing t on error.
func (s *Server) NewDatabaseT(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := s.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// Exec runs sql as the superuser in database postgres.
func (s *Server) Exec(ctx context.Context, sql string) error {
	c, err := pgx.Connect(ctx, s.SuperURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgtest: %s: %w", strings.Fields(sql)[0], err)
	}
	return nil
}

// Log is the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
	return string(b)
}

// makeCerts writes a CA and a server certificate for 127.0.0.1/localhost
// signed by it; the CA is at CAFile.
func (s *Server) makeCerts() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pgtest CA"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(24 * time.Hour), DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	s.CAFile = filepath.Join(s.Dir, "ca.crt")
	for _, f := range []struct {
		path string
		typ  string
		der  []byte
		mode os.FileMode
	}{{s.CAFile, "CERTIFICATE", caDER, 0o644}, {filepath.Join(s.Dir, "server.crt"), "CERTIFICATE", der, 0o644},
		{filepath.Join(s.Dir, "server.key"), "EC PRIVATE KEY", kb, 0o600}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.mode); err != nil {
			return err
		}
		if err := os.Chown(f.path, s.uid, s.gid); err != nil {
			return err
		}
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func tail(b []byte) string {
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
