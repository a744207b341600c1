//go:build linux

package sandboxd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCert returns a self-signed certificate in PEM, a CA or not.
func testCert(t *testing.T, isCA bool) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: isCA, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestGatewayAdminConfig(t *testing.T) {
	cases := []struct{ name, yaml, wantErr string }{
		{"absent", "", ""},
		{"http loopback", "gateway_admin: http://127.0.0.1:9090\n", ""},
		{"https with path", "gateway_admin: https://gw.internal/admin\n", ""},
		{"relative", "gateway_admin: 127.0.0.1:9090\n", "gateway_admin"},
		{"ftp", "gateway_admin: ftp://x\n", "gateway_admin"},
		{"userinfo", "gateway_admin: http://u:p@x\n", "gateway_admin"},
		{"query", "gateway_admin: http://x/?a=b\n", "gateway_admin"},
		{"misspelt key", "gateway_adminn: http://x\n", "gateway_adminn: unknown key (line 1)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("got %v, want error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestFetchGatewayTrust: the CA and the placeholders come from a real
// HTTP admin listener; every bad answer fails the fetch (so Create fails
// closed) with an error naming the endpoint.
func TestFetchGatewayTrust(t *testing.T) {
	ca, leaf := testCert(t, true), testCert(t, false)
	const okPH = `{"placeholders":[{"secret":"github-token","placeholder":"sluice:secret:github-token:AbC","hosts":["api.github.com"],"header":"Authorization"}]}`
	cases := []struct {
		name             string
		caStatus         int
		caBody, phBody   string
		wantErr, wantEnv string
	}{
		{"ok", 200, string(ca), okPH, "", "SLUICE_SECRET_GITHUB_TOKEN=sluice:secret:github-token:AbC"},
		{"no placeholders", 200, string(ca), `{"placeholders":[]}`, "", ""},
		{"another server's 404", 404, `{"error":{}}`, okPH, "GET /ca.pem: status 404", ""},
		{"interception off: the gateway's 404 not_found", 404, `{"error":{"code":"not_found","message":"TLS interception is not configured"}}`, okPH, "", "SLUICE_SECRET_GITHUB_TOKEN=sluice:secret:github-token:AbC"},
		{"not PEM", 200, "hello", okPH, "GET /ca.pem: want PEM certificates", ""},
		{"a private key", 200, string(ca) + "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", okPH, "want only CERTIFICATE", ""},
		{"not a CA", 200, string(leaf), okPH, "not a CA", ""},
		{"placeholders not JSON", 200, string(ca), "<html>", "GET /api/v1/placeholders: decode", ""},
		{"placeholders list missing", 200, string(ca), `{}`, `no "placeholders" list`, ""},
		{"a secret value instead of a placeholder", 200, string(ca), `{"placeholders":[{"secret":"k","placeholder":"ghp_real"}]}`, "not a placeholder", ""},
		{"colliding names", 200, string(ca), `{"placeholders":[{"secret":"a-b","placeholder":"sluice:secret:a-b:x"},{"secret":"a_b","placeholder":"sluice:secret:a_b:y"}]}`, "two secrets map to SLUICE_SECRET_A_B", ""},
		{"newline in placeholder", 200, string(ca), `{"placeholders":[{"secret":"k","placeholder":"sluice:secret:k:x\nEVIL=1"}]}`, "not a placeholder", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("GET /ca.pem", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.caStatus)
				_, _ = w.Write([]byte(tc.caBody))
			})
			mux.HandleFunc("GET /api/v1/placeholders", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(tc.phBody)) })
			srv := httptest.NewServer(mux)
			defer srv.Close()
			g, err := fetchGatewayTrust(context.Background(), srv.URL)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "gateway_admin: ") {
					t.Fatalf("got %v, want error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			run := t.TempDir()
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "etc/ssl/certs"), 0o755); err != nil {
				t.Fatal(err)
			}
			sys := testCert(t, true)
			if err := os.WriteFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"), sys, 0o644); err != nil {
				t.Fatal(err)
			}
			env, err := g.install(run, root)
			if err != nil {
				t.Fatal(err)
			}
			if tc.caStatus == 404 {
				// No CA: nothing written, no TLS variable, the placeholders.
				if ents, _ := os.ReadDir(run); len(ents) != 0 {
					t.Errorf("files written without a CA: %v", ents)
				}
				for _, k := range trustEnv {
					if v, ok := env[k]; ok {
						t.Errorf("%s = %q set without a CA", k, v)
					}
				}
				if k, v, _ := strings.Cut(tc.wantEnv, "="); env[k] != v || len(env) != 1 {
					t.Errorf("env %v, want only %s", env, tc.wantEnv)
				}
				return
			}
			if b, _ := os.ReadFile(filepath.Join(run, "ca.pem")); string(b) != string(ca) {
				t.Errorf("ca.pem is not the served PEM")
			}
			if b, _ := os.ReadFile(filepath.Join(run, "ca-bundle.pem")); !strings.HasPrefix(string(b), string(sys)) || !strings.HasSuffix(string(b), string(ca)) {
				t.Errorf("ca-bundle.pem is not the system roots followed by the CA")
			}
			for k, v := range map[string]string{"SSL_CERT_FILE": CABundleFile, "REQUESTS_CA_BUNDLE": CABundleFile, "GIT_SSL_CAINFO": CABundleFile, "NODE_EXTRA_CA_CERTS": CAFile} {
				if env[k] != v {
					t.Errorf("%s = %q, want %q", k, env[k], v)
				}
			}
			if tc.wantEnv != "" {
				k, v, _ := strings.Cut(tc.wantEnv, "=")
				if env[k] != v {
					t.Errorf("%s = %q, want %q", k, env[k], v)
				}
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		if _, err := fetchGatewayTrust(context.Background(), url); err == nil || !strings.Contains(err.Error(), "gateway_admin: GET /ca.pem") {
			t.Fatalf("got %v, want a fetch error", err)
		}
	})
}
