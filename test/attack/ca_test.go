//go:build linux

package attack

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-gw/sluice/gateway/mitm"
	"github.com/sluice-gw/sluice/sandboxd"
)

// adminServer serves GET /ca.pem and GET /api/v1/placeholders in the
// gateway's format, with a real interception CA made by gateway/mitm;
// fail makes both answer 500.
func adminServer(t *testing.T, fail *atomic.Bool) (url string, caPEM []byte) {
	t.Helper()
	ca, err := mitm.LoadOrCreate(t.TempDir(), mitm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	caPEM = ca.CertPEM()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ca.pem", func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/x-pem-file")
		_, _ = w.Write(caPEM)
	})
	mux.HandleFunc("GET /api/v1/placeholders", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"placeholders": []map[string]any{
			{"secret": "github-token", "placeholder": "sluice:secret:github-token:q7Xz", "hosts": []string{"api.github.com"}, "header": "Authorization", "prefix": "Bearer "},
			{"secret": "pypi", "placeholder": "sluice:secret:pypi:9kLm", "hosts": []string{"upload.pypi.org"}, "header": "Authorization"},
		}})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL, caPEM
}

// TestSandboxGetsGatewayTrust: with gateway_admin set, a real sandbox
// carries the gateway's CA (readable at /run/sluice/ca.pem, byte for byte
// what the admin listener served, not writable), the TLS clients'
// variables naming it and each placeholder in SLUICE_SECRET_<NAME>; when
// the admin listener fails, Create fails and leaves no sandbox behind.
func TestSandboxGetsGatewayTrust(t *testing.T) {
	need(t)
	var fail atomic.Bool
	admin, caPEM := adminServer(t, &fail)
	st := stateDir(t)
	cfg := sandboxd.Default()
	cfg.StateDir = filepath.Join(st, "state")
	cfg.Gateway = filepath.Join(st, "gw.sock")
	cfg.GatewayAdmin = admin
	m, err := sandboxd.New(sandboxd.Options{Config: cfg, InitPath: bin})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	in, err := m.Create(ctx, sandboxd.CreateRequest{Agent: "agent-a"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer func() { _ = m.Destroy(in.ID) }()
	exec := func(argv ...string) sandboxd.ExecResult {
		t.Helper()
		res, err := m.Exec(ctx, in.ID, sandboxd.ExecRequest{Argv: argv})
		if err != nil {
			t.Fatalf("exec %v: %v", argv, err)
		}
		return res
	}

	t.Run("environment", func(t *testing.T) {
		res := exec("/usr/bin/env")
		env := map[string]string{}
		for _, l := range strings.Split(res.Stdout, "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				env[k] = v
			}
		}
		want := map[string]string{
			"SSL_CERT_FILE": sandboxd.CABundleFile, "REQUESTS_CA_BUNDLE": sandboxd.CABundleFile,
			"GIT_SSL_CAINFO": sandboxd.CABundleFile, "NODE_EXTRA_CA_CERTS": sandboxd.CAFile,
			"SLUICE_SECRET_GITHUB_TOKEN": "sluice:secret:github-token:q7Xz", "SLUICE_SECRET_PYPI": "sluice:secret:pypi:9kLm",
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("inside: %s = %q, want %q", k, env[k], v)
			}
		}
	})
	t.Run("CA file equals the served PEM", func(t *testing.T) {
		res := exec("/bin/cat", sandboxd.CAFile)
		if res.ExitCode != 0 || res.Stdout != string(caPEM) {
			t.Fatalf("cat %s: exit %d, %d bytes (want the %d served): %s", sandboxd.CAFile, res.ExitCode, len(res.Stdout), len(caPEM), res.Stderr)
		}
	})
	t.Run("bundle ends with the CA", func(t *testing.T) {
		res := exec("/bin/cat", sandboxd.CABundleFile)
		if res.ExitCode != 0 || !strings.HasSuffix(res.Stdout, string(caPEM)) {
			t.Fatalf("cat %s: exit %d: %s", sandboxd.CABundleFile, res.ExitCode, res.Stderr)
		}
		if _, err := os.Stat("/etc/ssl/certs/ca-certificates.crt"); err == nil && strings.Count(res.Stdout, "BEGIN CERTIFICATE") < 2 {
			t.Errorf("the bundle lacks the system roots")
		}
	})
	t.Run("CA file is read-only inside", func(t *testing.T) {
		res := exec("/bin/sh", "-c", "echo x > "+sandboxd.CAFile)
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Read-only file system") {
			t.Fatalf("overwrite %s inside: exit %d, stderr %q; want a read-only file system error", sandboxd.CAFile, res.ExitCode, res.Stderr)
		}
	})
	t.Run("request may not override", func(t *testing.T) {
		_, err := m.Create(ctx, sandboxd.CreateRequest{Agent: "agent-a", Env: map[string]string{"SSL_CERT_FILE": "/workspace/evil.pem"}})
		if err == nil || !strings.Contains(err.Error(), "set from gateway_admin") {
			t.Fatalf("create with SSL_CERT_FILE: %v, want refused", err)
		}
	})
	t.Run("admin listener failing fails closed", func(t *testing.T) {
		fail.Store(true)
		defer fail.Store(false)
		before := len(m.List())
		_, err := m.Create(ctx, sandboxd.CreateRequest{Agent: "agent-a"})
		if err == nil || !strings.Contains(err.Error(), "gateway_admin: GET /ca.pem: status 500") {
			t.Fatalf("create: %v, want a gateway_admin fetch error", err)
		}
		if n := len(m.List()); n != before {
			t.Errorf("%d sandboxes after a failed create, want %d", n, before)
		}
	})
}
