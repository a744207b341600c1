package extauthz

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"slices"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/sluice-gw/sluice/gateway/config"
)

// Listen opens gateway.ext_authz.listen and returns it with the gRPC
// server options it needs: a Unix socket (mode 0660) that serves only
// peers whose uid is in trusted_uids, or a TCP listener with mutual TLS
// (client certificates verified against client_ca_file, TLS 1.2 or later,
// ALPN h2 as gRPC requires).
func Listen(c *config.ExtAuthz, log *slog.Logger) (net.Listener, []grpc.ServerOption, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(8 << 20), // Envoy's buffered body (max_request_bytes) travels in the CheckRequest
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{PermitWithoutStream: true}),
	}
	if path, ok := c.UnixPath(); ok {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("extauthz: listen: %w", err)
		}
		l, err := net.Listen("unix", path)
		if err != nil {
			return nil, nil, fmt.Errorf("extauthz: listen: %w", err)
		}
		if err := os.Chmod(path, 0o660); err != nil {
			l.Close()
			return nil, nil, fmt.Errorf("extauthz: listen: %w", err)
		}
		return &uidListener{Listener: l, uids: c.TrustedUIDs, log: log}, opts, nil
	}
	tc, err := ServerTLS(c)
	if err != nil {
		return nil, nil, err
	}
	l, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("extauthz: listen: %w", err)
	}
	return l, append(opts, grpc.Creds(credentials.NewTLS(tc))), nil
}

// ServerTLS is the TCP listener's TLS configuration: mutual TLS required.
func ServerTLS(c *config.ExtAuthz) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("extauthz: gateway.ext_authz.cert_file/key_file: %w", err)
	}
	pem, err := os.ReadFile(c.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("extauthz: gateway.ext_authz.client_ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("extauthz: gateway.ext_authz.client_ca_file: no PEM certificate in %s", c.ClientCAFile)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2"},
	}, nil
}

// uidListener accepts only peers whose uid is trusted; others are closed
// before a byte is read.
type uidListener struct {
	net.Listener
	uids []uint32
	log  *slog.Logger
}

func (l *uidListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && slices.Contains(l.uids, uid) {
			return c, nil
		}
		l.log.Warn("ext_authz: untrusted peer on the Unix socket", "decision", "block", "reason", "untrusted_peer", "uid", uid)
		c.Close()
	}
}

func peerUID(c net.Conn) (uint32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, errors.New("not a Unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

// NewGRPC returns a gRPC server with the Authorization service and, when
// x is not nil, the ADS service registered: one listener for Envoy.
//
// Streams are served by a fixed set of worker goroutines (one per CPU;
// gRPC starts a goroutine of its own when all are busy), not a goroutine
// each: a Check's policy evaluation recurses deeply, and on a new
// goroutine every Check grew its stack from 8 KiB again (runtime.copystack
// was an eighth of a Check's CPU, BenchmarkEnvoyCheck).
func NewGRPC(opts []grpc.ServerOption, a *Authz, x *XDS) *grpc.Server {
	opts = append(slices.Clip(opts), grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))))
	g := grpc.NewServer(opts...)
	authv3.RegisterAuthorizationServer(g, a)
	if x != nil {
		x.Register(g)
	}
	return g
}
