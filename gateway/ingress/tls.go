package ingress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Remote relays. A sandboxd on another host cannot reach the gateway's
// Unix socket, so it connects over TCP with mutual TLS
// (gateway.relay_tls): the gateway trusts a relay whose client
// certificate verifies against relay_tls.client_ca_file, in place of the
// Unix socket's peer uid. As on the socket, every connection starts with
// a SLUICE-IDENTITY line, and its host field must be one of the
// certificate's DNS names, so a relay speaks only for its own host's
// sandboxes. A descriptor cannot cross hosts: there is no handoff here,
// the relay copies the bytes. Accepted connections join the sandbox
// socket's, served by the same server with the same checks.

// RelayTLSConfig loads the listener's certificate and the CA its relays'
// certificates must chain to.
func RelayTLSConfig(rt config.RelayTLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(rt.CertFile, rt.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("gateway.relay_tls: certificate: %w", err)
	}
	pemData, err := os.ReadFile(rt.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("gateway.relay_tls.client_ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, errors.New("gateway.relay_tls.client_ca_file: no PEM certificate in the file")
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// ListenRelayTLS accepts remote relays on addr into l until l is closed.
func (l *Listener) ListenRelayTLS(addr string, cfg *tls.Config) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("gateway.relay_tls.listen: %w", err)
	}
	go func() {
		<-l.done
		ln.Close()
	}()
	go func() {
		if err := l.accepting(ln.Accept, func(c net.Conn) { l.admitTLS(c, cfg) }); err != nil {
			l.log.Error("relay listener: accept failed; remote relays are no longer served", "err", err)
		}
	}()
	return ln.Addr(), nil
}

// admitTLS completes the handshake, reads the preamble and checks its
// host against the relay's certificate, all within preambleTimeout.
func (l *Listener) admitTLS(c net.Conn, cfg *tls.Config) { l.admitCapped(l.identifyTLS(c, cfg)) }

// identifyTLS is admitTLS's checks: the connection identified, or nil
// when it was refused (answered and closed).
func (l *Listener) identifyTLS(c net.Conn, cfg *tls.Config) *Conn {
	_ = c.SetDeadline(time.Now().Add(preambleTimeout))
	tc := tls.Server(c, cfg)
	if err := tc.Handshake(); err != nil {
		// No TLS, no way to answer: the handshake's alert is the answer.
		l.log.Warn("relay listener: refused connection: TLS handshake failed (a relay needs a client certificate from relay_tls.client_ca_file)", "remote", c.RemoteAddr().String(), "err", err)
		l.refused(refusal.UntrustedPeer)
		c.Close()
		return nil
	}
	certs := tc.ConnectionState().PeerCertificates
	br := bufio.NewReaderSize(tc, wire.MaxLine)
	id, err := wire.Read(br)
	if err != nil {
		l.log.Warn("relay listener: refused connection without a valid identity preamble", "remote", c.RemoteAddr().String(), "err", err)
		l.refused(refusal.IdentityRequired)
		rejectConn(tc, 400, refusal.IdentityRequired, "a relayed connection must start with a valid SLUICE-IDENTITY line (no handoff over TLS)")
		return nil
	}
	if len(certs) == 0 || !slices.Contains(certs[0].DNSNames, id.Host) {
		l.log.Warn("relay listener: refused connection: the preamble's host is not a name in the relay's certificate", "remote", c.RemoteAddr().String(), "host", id.Host)
		l.refused(refusal.UntrustedPeer)
		rejectConn(tc, 403, refusal.UntrustedPeer, "the identity's host must be a DNS name in the relay's client certificate")
		return nil
	}
	if id, err = canonicalIdentity(id); err != nil {
		l.log.Warn("relay listener: refused connection with an ambiguous identity", "remote", c.RemoteAddr().String(), "err", err)
		l.refused(refusal.IdentityRequired)
		rejectConn(tc, 400, refusal.IdentityRequired, err.Error())
		return nil
	}
	_ = c.SetDeadline(time.Time{})
	return &Conn{Conn: tc, r: br, base: br, id: id}
}
