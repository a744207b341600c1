package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
)

// selfSigned writes a throwaway server certificate for 127.0.0.1.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "hosted.pem"), filepath.Join(dir, "hosted.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestSessionsMint: the CLI mints through the admin API with a session
// token; an approver's token is refused; --proxy prints the sandbox's
// settings; the summary on stderr never holds the token.
func TestSessionsMint(t *testing.T) {
	cfgPath := demoConfig(t)
	setSecret(t, cfgPath, "mint-secret-value")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := selfSigned(t, t.TempDir())
	cfg.Approvers.Users = []config.User{{Name: "bob", Groups: []string{"finance"}, TokenSHA256: tokenSHA256("tok-bob")}}
	cfg.Gateway.SessionTokensSHA256 = []string{tokenSHA256("tok-platform")}
	cfg.Gateway.Hosted = &config.Hosted{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile,
		TokenKeyFile: filepath.Join(t.TempDir(), "hosted-token.key"), MaxTokenTTL: config.Duration(2 * time.Hour)}
	srv := startAdminGateway(t, cfg)
	admin := "http://" + srv.AdminAddr()
	agent := cfg.Agents[0].Name
	mint := func(tok string, args ...string) (string, string, error) {
		t.Setenv("SLUICE_TOKEN", tok)
		return cli(t, "", append([]string{"sessions", "--admin", admin, "mint"}, args...)...)
	}

	out, errOut, err := mint("tok-platform", "--agent", agent, "--session", "run-1", "--user", "alice", "--ttl", "30m")
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(out)
	if !strings.HasPrefix(tok, "srt1.") || strings.Count(out, "\n") != 1 {
		t.Fatalf("stdout is not the token alone (%d bytes)", len(out))
	}
	if strings.Contains(errOut, tok) || !strings.Contains(errOut, "session run-1") || !strings.Contains(errOut, "user alice") {
		t.Fatalf("summary: holds the token, or misses the identity: %q", strings.ReplaceAll(errOut, tok, "[TOKEN]"))
	}

	out, _, err = mint("tok-platform", "--agent", agent, "--session", "run-2", "--proxy", "sluice.example:3129")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(out, "\n")
	u, err := url.Parse(strings.TrimPrefix(line, "HTTPS_PROXY="))
	if err != nil || u.Scheme != "https" || u.Host != "sluice.example:3129" || u.User.Username() != "run-2" || !strings.Contains(out, "HTTP_PROXY=https://") {
		t.Fatalf("--proxy output is not the sandbox's settings: %v", err)
	}

	for _, tc := range []struct {
		name, tok string
		args      []string
		wantErr   string
	}{
		{"an approver may not mint", "tok-bob", []string{"--agent", agent, "--session", "run-3"}, "401 unauthenticated"},
		{"ttl past max_token_ttl", "tok-platform", []string{"--agent", agent, "--session", "run-3", "--ttl", "3h"}, "400 bad_request: ttl:"},
		{"unknown agent", "tok-platform", []string{"--agent", "nobody", "--session", "run-3"}, "400 bad_request: agent:"},
		{"no session", "tok-platform", []string{"--agent", agent}, "--agent and --session are required"},
		{"bad proxy", "tok-platform", []string{"--agent", agent, "--session", "run-3", "--proxy", "nohost"}, "--proxy: want host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := mint(tc.tok, tc.args...)
			checkCLI(t, "", err, nil, tc.wantErr)
		})
	}
}
