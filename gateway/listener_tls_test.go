package gateway

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// testCA is a throwaway certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf for names (DNS SANs; IPs for a server on loopback).
func (ca *testCA) issue(t *testing.T, usage x509.ExtKeyUsage, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t *testing.T, dir string, c tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	kb, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "relay-listener.pem"), filepath.Join(dir, "relay-listener.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestRelayTLS: a remote relay is trusted by its client certificate and
// speaks only for its own host; anything else is refused for that reason.
func TestRelayTLS(t *testing.T) {
	up := newUpstream(t)
	serverCA, clientCA, otherCA := newTestCA(t, "gateway CA"), newTestCA(t, "relay CA"), newTestCA(t, "someone else's CA")
	dir := t.TempDir()
	certFile, keyFile := writePEM(t, dir, serverCA.issue(t, x509.ExtKeyUsageServerAuth, "127.0.0.1"))
	caFile := filepath.Join(dir, "relay-ca.pem")
	if err := os.WriteFile(caFile, clientCA.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, up.URL, "", func(c *config.Config) {
		c.Gateway.RelayTLS = config.RelayTLS{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile}
	})
	addr := g.RelayAddr()
	if addr == "" {
		t.Fatal("RelayAddr is empty with relay_tls.listen set")
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.pem)
	nodeA := clientCA.issue(t, x509.ExtKeyUsageClientAuth, "node-a.sandbox.test")
	tlsFor := func(c *tls.Certificate) *tls.Config {
		cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
		if c != nil {
			cfg.Certificates = []tls.Certificate{*c}
		}
		return cfg
	}
	idA := wire.Identity{Sandbox: "sb-remote", Agent: "agent-a", Session: "s-remote", User: "alice", Host: "node-a.sandbox.test"}
	client := func(cfg *tls.Config, id wire.Identity) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return wire.DialTLS(ctx, addr, cfg, id) },
		}}
	}

	t.Run("trusted relay, its own host: the call is served with the relayed identity", func(t *testing.T) {
		r := doCall(t, client(tlsFor(&nodeA), idA), "tickets.list_tickets", `{"query":{"limit":5}}`)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.raw)
		}
		found := false
		for _, rec := range auditEvents(t, g) {
			if rec.Event == "decision" && rec.Fields["sandbox"] == "sb-remote" && rec.Fields["session"] == "s-remote" {
				found = true
			}
		}
		if !found {
			t.Fatal("no decision record carries the remote relay's identity")
		}
	})
	// refusedTLS dials with cfg and returns what the first read says (in
	// TLS 1.3 the server checks the client's certificate after the
	// client's side of the handshake is done: its alert is read).
	refusedTLS := func(t *testing.T, cfg *tls.Config) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d := tls.Dialer{Config: cfg}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = bufio.NewReader(c).ReadByte()
		return err
	}
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
		want string // in the client's error: the alert the gateway sent
	}{
		{"no client certificate", tlsFor(nil), "certificate required"},
		{"a certificate from another CA", func() *tls.Config {
			c := otherCA.issue(t, x509.ExtKeyUsageClientAuth, "node-a.sandbox.test")
			cfg := tlsFor(nil)
			// Sent although the server did not ask for its CA.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
			return cfg
		}(), "unknown certificate authority"},
	} {
		t.Run(tc.name+": handshake refused", func(t *testing.T) {
			logged := strings.Count(g.logBuf.String(), "TLS handshake failed")
			err := refusedTLS(t, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a TLS alert %q", err, tc.want)
			}
			awaitLogged(t, g, "TLS handshake failed", logged)
		})
	}
	t.Run("another host's identity: 403 untrusted_peer", func(t *testing.T) {
		id := idA
		id.Host = "node-b.sandbox.test"
		logged := strings.Count(g.logBuf.String(), "not a name in the relay's certificate")
		// Raw, not an http.Client: the refusal comes as soon as the
		// preamble is read, and a pooled client that reads an answer
		// before it has sent its request takes the connection for broken.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := wire.DialTLS(ctx, addr, tlsFor(&nodeA), id)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), `"untrusted_peer"`) {
			t.Fatalf("got %d %s", resp.StatusCode, b)
		}
		awaitLogged(t, g, "not a name in the relay's certificate", logged)
	})
	t.Run("a handoff line over TLS: 400 identity_required", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d := tls.Dialer{Config: tlsFor(&nodeA)}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		logged := strings.Count(g.logBuf.String(), "without a valid identity preamble")
		line, _ := wire.EncodeHandoff(idA)
		_, _ = c.Write(line)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !strings.Contains(string(b), `"identity_required"`) {
			t.Fatalf("got %d %s", resp.StatusCode, b)
		}
		awaitLogged(t, g, "without a valid identity preamble", logged)
	})
}

// awaitLogged fails t unless g's log holds more than before lines
// containing want within 5s (a refusal is logged on the gateway's side of
// the connection, which may finish after the client has seen it).
func awaitLogged(t *testing.T, g *testGateway, want string, before int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); strings.Count(g.logBuf.String(), want) <= before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line says %q", want)
		}
	}
}

func TestRelayTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "ca")
	certFile, keyFile := writePEM(t, dir, ca.issue(t, x509.ExtKeyUsageServerAuth, "127.0.0.1"))
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		rt   config.RelayTLS
		want string
	}{
		{"missing certificate", config.RelayTLS{CertFile: filepath.Join(dir, "nope.pem"), KeyFile: keyFile, ClientCAFile: notPEM}, "gateway.relay_tls: certificate"},
		{"missing client CA", config.RelayTLS{CertFile: certFile, KeyFile: keyFile, ClientCAFile: filepath.Join(dir, "nope.pem")}, "gateway.relay_tls.client_ca_file"},
		{"client CA not PEM", config.RelayTLS{CertFile: certFile, KeyFile: keyFile, ClientCAFile: notPEM}, "no PEM certificate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ingress.RelayTLSConfig(tc.rt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
