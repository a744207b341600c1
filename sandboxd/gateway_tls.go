package sandboxd

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// validate checks the gateway_tls keys; host is the config's host, which
// the client certificate must name.
func (g GatewayTLS) validate(host string) error {
	if g.Address == "" {
		if g.CertFile != "" || g.KeyFile != "" || g.CAFile != "" || g.ServerName != "" {
			return errors.New("config: gateway_tls.address: must be set when the other gateway_tls keys are")
		}
		return nil
	}
	if h, port, err := net.SplitHostPort(g.Address); err != nil || h == "" || port == "" {
		return fmt.Errorf("config: gateway_tls.address: want host:port, got %q", g.Address)
	}
	for _, p := range []struct{ key, v string }{{"cert_file", g.CertFile}, {"key_file", g.KeyFile}, {"ca_file", g.CAFile}} {
		if p.v == "" || !filepath.IsAbs(p.v) {
			return fmt.Errorf("config: gateway_tls.%s: must be an absolute path, got %q", p.key, p.v)
		}
	}
	if host == "" {
		return errors.New("config: host: must be set with gateway_tls (the gateway checks it against the client certificate)")
	}
	return nil
}

// gatewayTLS is the client side of a remote gateway's relay listener: the
// CA and server name are fixed at start, the client certificate is
// re-read when its files change.
type gatewayTLS struct {
	cfg GatewayTLS

	mu      sync.Mutex
	cert    *tls.Certificate
	modTime [2]time.Time // of CertFile and KeyFile when cert was loaded
}

// newGatewayTLS is the client configuration for g. It loads g's files
// once, so that a mistake shows at start: the CA must parse, and the
// certificate must name host.
func newGatewayTLS(g GatewayTLS, host string) (*tls.Config, error) {
	pemData, err := os.ReadFile(g.CAFile)
	if err != nil {
		return nil, fmt.Errorf("gateway_tls.ca_file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemData) {
		return nil, errors.New("gateway_tls.ca_file: no PEM certificate in the file")
	}
	gt := &gatewayTLS{cfg: g}
	cert, err := gt.clientCert()
	if err != nil {
		return nil, err
	}
	if !slices.Contains(cert.Leaf.DNSNames, host) {
		return nil, fmt.Errorf("gateway_tls.cert_file: the certificate does not name host %q among its DNS names %q; the gateway would refuse every connection", host, cert.Leaf.DNSNames)
	}
	name := g.ServerName
	if name == "" {
		name, _, _ = net.SplitHostPort(g.Address)
	}
	return &tls.Config{
		RootCAs:              roots,
		ServerName:           name,
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return gt.clientCert() },
	}, nil
}

// clientCert returns the key pair, loading it again when either file's
// modification time changed since the last load.
func (gt *gatewayTLS) clientCert() (*tls.Certificate, error) {
	var mt [2]time.Time
	for i, f := range []string{gt.cfg.CertFile, gt.cfg.KeyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("gateway_tls: %w", err)
		}
		mt[i] = fi.ModTime()
	}
	gt.mu.Lock()
	defer gt.mu.Unlock()
	if gt.cert != nil && mt == gt.modTime {
		return gt.cert, nil
	}
	c, err := tls.LoadX509KeyPair(gt.cfg.CertFile, gt.cfg.KeyFile)
	if err != nil {
		if gt.cert != nil {
			return gt.cert, nil // a renewal half written: keep the last good pair
		}
		return nil, fmt.Errorf("gateway_tls: certificate: %w", err)
	}
	gt.cert, gt.modTime = &c, mt
	return gt.cert, nil
}
