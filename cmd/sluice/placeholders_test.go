package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
)

// TestPlaceholders: `sluice placeholders` reads the placeholders from a
// real gateway's admin API with a session token, prints them as a table
// or as VAR='placeholder' lines named as sandboxd names them, saves the
// interception CA, and refuses without a token or with a wrong one.
func TestPlaceholders(t *testing.T) {
	cfgPath := demoConfig(t)
	setSecret(t, cfgPath, "placeholders-secret-value")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gateway.SessionTokensSHA256 = []string{tokenSHA256("tok-sandboxd")}
	cfg.Egress.Intercept = config.Intercept{Hosts: []string{"api.example.test"}, CADir: filepath.Join(t.TempDir(), "ca")}
	cfg.Egress.Placeholders = []config.Placeholder{{Secret: "gh-token", Hosts: []string{"api.example.test"}, Header: "Authorization", Prefix: "Bearer "}}
	srv := startAdminGateway(t, cfg)
	admin := "http://" + srv.AdminAddr()
	envLine := regexp.MustCompile(`^SLUICE_SECRET_GH_TOKEN='sluice:secret:gh-token:[0-9a-f]{32}'\n$`)

	t.Run("table", func(t *testing.T) {
		t.Setenv("SLUICE_TOKEN", "tok-sandboxd")
		out, _, err := cli(t, "", "placeholders", "--admin", admin)
		checkCLI(t, out, err, []string{"SECRET", "gh-token", "SLUICE_SECRET_GH_TOKEN", "sluice:secret:gh-token:", "api.example.test", "Authorization: Bearer"}, "")
		if strings.Contains(out, "placeholders-secret-value") {
			t.Error("the output carries a secret value")
		}
	})
	t.Run("env lines and the CA", func(t *testing.T) {
		t.Setenv("SLUICE_TOKEN", "tok-sandboxd")
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		out, _, err := cli(t, "", "placeholders", "--admin", admin, "--env", "--ca", caFile)
		if err != nil {
			t.Fatal(err)
		}
		if !envLine.MatchString(out) {
			t.Fatalf("--env printed %q, want one SLUICE_SECRET_GH_TOKEN line", out)
		}
		b, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			t.Fatalf("--ca wrote %q, not PEM", b)
		}
		ca, err := x509.ParseCertificate(blk.Bytes)
		if err != nil || !ca.IsCA {
			t.Fatalf("--ca wrote a certificate that is not a CA: %v", err)
		}
	})
	for _, tc := range []struct{ name, token, wantErr string }{
		{"no token", "", "no token"},
		{"a wrong token", "tok-wrong", "401 unauthenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SLUICE_TOKEN", tc.token)
			out, _, err := cli(t, "", "placeholders", "--admin", admin)
			checkCLI(t, out, err, nil, tc.wantErr)
		})
	}
}
