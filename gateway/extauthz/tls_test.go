package extauthz_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/extauthz"
)

type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *ca {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &ca{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf certificate and key (PEM) for name.
func (c *ca) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func write(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTCPRequiresMutualTLS: on TCP, a client without a certificate, or
// with one from another CA, gets no answer; Envoy's certificate from the
// configured CA does.
func TestTCPRequiresMutualTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA, otherCA := newCA(t, "server-ca"), newCA(t, "envoy-ca"), newCA(t, "other-ca")
	sc, sk := serverCA.issue(t, "sluice", x509.ExtKeyUsageServerAuth)
	cfg := &config.ExtAuthz{Listen: "127.0.0.1:0", CertFile: write(t, dir, "s.crt", sc), KeyFile: write(t, dir, "s.key", sk), ClientCAFile: write(t, dir, "ca.crt", clientCA.pem)}
	l, opts, err := extauthz.Listen(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{verdict: extauthz.Verdict{Allow: true}}
	g := extauthz.NewGRPC(opts, extauthz.NewAuthz(rec.deps(t)), nil)
	go g.Serve(l)
	t.Cleanup(g.Stop)

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.pem)
	dial := func(certs []tls.Certificate) error {
		conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "sluice", Certificates: certs})))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = authv3.NewAuthorizationClient(conn).Check(ctx, fixture(t, "get_http1.json", nil))
		return err
	}
	pair := func(c *ca) []tls.Certificate {
		cp, kp := c.issue(t, "envoy", x509.ExtKeyUsageClientAuth)
		kc, err := tls.X509KeyPair(cp, kp)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{kc}
	}
	if err := dial(nil); err == nil {
		t.Error("a client without a certificate got an answer")
	}
	if err := dial(pair(otherCA)); err == nil {
		t.Error("a client with another CA's certificate got an answer")
	}
	if n := len(rec.calls) + len(rec.egress) + len(rec.refused); n != 0 {
		t.Fatalf("%d requests reached the door without mutual TLS", n)
	}
	if err := dial(pair(clientCA)); err != nil {
		t.Fatalf("Envoy's certificate: %v", err)
	}
	if len(rec.calls) != 1 {
		t.Fatalf("calls %d, want 1", len(rec.calls))
	}
}
