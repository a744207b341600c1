package sandboxd

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// What sandboxd gives a sandbox for the gateway's TLS interception and
// placeholders when gateway_admin is set (issue 6, THREATS D): the
// gateway's CA certificate, the environment variables common TLS clients
// read it from, and each placeholder (never a secret) as an environment
// variable. Both are fetched from the gateway's admin listener at every
// Create; a failure fails the Create (a sandbox that cannot verify the
// gateway's certificates is no use, and one without its placeholders
// would send nothing the gateway can credential). A gateway with TLS
// interception off answers GET /ca.pem 404 not_found: then no CA is
// installed and no TLS variable set.
//
// Inside the sandbox (the per-sandbox run directory is bound read-only at
// /run/sluice):
//
//	/run/sluice/ca.pem         the CA exactly as GET /ca.pem served it
//	/run/sluice/ca-bundle.pem  the rootfs's system roots followed by the CA
//
// SSL_CERT_FILE, REQUESTS_CA_BUNDLE and GIT_SSL_CAINFO name the bundle
// (they replace a client's trust store, and hosts that are not
// intercepted still present their real certificates); NODE_EXTRA_CA_CERTS
// and SLUICE_CA_FILE name ca.pem (Node adds it to its built-in roots).
// A placeholder for secret NAME is SLUICE_SECRET_<NAME> (upper case, every
// byte other than a letter, digit or '_' becomes '_').
const (
	CAFile       = "/run/sluice/ca.pem"
	CABundleFile = "/run/sluice/ca-bundle.pem"
)

// trustEnv are the variables sandboxd sets from gateway_admin; a create
// request may not set them.
var trustEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "SLUICE_CA_FILE"}

// systemBundles are where Debian/Ubuntu, Fedora/RHEL and Alpine keep the
// system roots, relative to the rootfs.
var systemBundles = []string{"etc/ssl/certs/ca-certificates.crt", "etc/pki/tls/certs/ca-bundle.crt", "etc/ssl/cert.pem"}

// gatewayTrust is what one fetch from the admin listener returned.
type gatewayTrust struct {
	caPEM []byte
	env   map[string]string // placeholder variables
}

// Bounds of what the admin listener may send.
const (
	maxCABytes          = 64 << 10
	maxPlaceholderBytes = 1 << 20
	fetchTimeout        = 10 * time.Second
)

// fetchGatewayTrust is fetchGatewayTrustWith without a token (no
// gateway_session_token_file): only a gateway that does not guard its
// placeholders answers it.
func fetchGatewayTrust(ctx context.Context, base string) (*gatewayTrust, error) {
	return fetchGatewayTrustWith(ctx, base, "")
}

// fetchGatewayTrustWith gets GET /ca.pem (public: a certificate) and GET
// /api/v1/placeholders from the gateway's admin listener at base. The
// placeholders are shown only to a caller with a session token, so that
// request carries the token of tokenFile (gateway_session_token_file; ""
// sends none); the token goes to no other path and, with no proxy and no
// redirects, to no other host. Every failure is an error: nothing is
// installed from a partial answer.
func fetchGatewayTrustWith(ctx context.Context, base, tokenFile string) (*gatewayTrust, error) {
	token := ""
	if tokenFile != "" {
		var err error
		if token, err = sessionToken(tokenFile); err != nil {
			return nil, fmt.Errorf("gateway_admin: GET /api/v1/placeholders: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	// No proxy from the environment: the admin listener is reached directly.
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	defer client.CloseIdleConnections()
	get := func(path, token string, limit int64) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+path, nil)
		if err != nil {
			return nil, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
		if err != nil {
			return nil, err
		}
		if resp.StatusCode == http.StatusUnauthorized && token == "" {
			return nil, fmt.Errorf("status %d (set gateway_session_token_file): %.200s", resp.StatusCode, b)
		}
		if path == "/ca.pem" && resp.StatusCode == http.StatusNotFound && interceptionOff(b) {
			return nil, errNoInterception
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
		}
		if int64(len(b)) > limit {
			return nil, fmt.Errorf("answer over %d bytes", limit)
		}
		return b, nil
	}
	caPEM, err := get("/ca.pem", "", maxCABytes)
	switch {
	case errors.Is(err, errNoInterception):
		// The gateway intercepts nothing: every TLS connection is the
		// upstream's own, verified against the sandbox's usual roots.
		caPEM = nil
	case err != nil:
		return nil, fmt.Errorf("gateway_admin: GET /ca.pem: %w", err)
	default:
		if err := checkCAPEM(caPEM); err != nil {
			return nil, fmt.Errorf("gateway_admin: GET /ca.pem: %w", err)
		}
	}
	body, err := get("/api/v1/placeholders", token, maxPlaceholderBytes)
	if err != nil {
		return nil, fmt.Errorf("gateway_admin: GET /api/v1/placeholders: %w", err)
	}
	env, err := placeholderEnv(body)
	if err != nil {
		return nil, fmt.Errorf("gateway_admin: GET /api/v1/placeholders: %w", err)
	}
	return &gatewayTrust{caPEM: caPEM, env: env}, nil
}

// checkCAPEM requires one or more PEM certificates, each a CA, and
// nothing else (no private key ever goes into a sandbox).
func checkCAPEM(b []byte) error {
	rest, n := b, 0
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return fmt.Errorf("PEM block %q, want only CERTIFICATE", blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return fmt.Errorf("certificate: %w", err)
		}
		if !c.IsCA {
			return errors.New("the certificate is not a CA")
		}
		n++
	}
	if n == 0 || strings.TrimSpace(string(rest)) != "" {
		return errors.New("want PEM certificates and nothing else")
	}
	return nil
}

// placeholderEnv turns the placeholders answer ({"placeholders":
// [{"secret": NAME, "placeholder": TOKEN, ...}]}) into variables.
func placeholderEnv(body []byte) (map[string]string, error) {
	var doc struct {
		Placeholders *[]struct {
			Secret      string `json:"secret"`
			Placeholder string `json:"placeholder"`
		} `json:"placeholders"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if doc.Placeholders == nil {
		return nil, errors.New(`no "placeholders" list`)
	}
	env := map[string]string{}
	for i, p := range *doc.Placeholders {
		k := wire.PlaceholderEnvName(p.Secret)
		if p.Secret == "" || !envKey.MatchString(k) {
			return nil, fmt.Errorf("entry %d: bad secret name %q", i, p.Secret)
		}
		if !strings.HasPrefix(p.Placeholder, "sluice:secret:") || len(p.Placeholder) > 512 || strings.ContainsAny(p.Placeholder, "\x00\r\n") {
			return nil, fmt.Errorf("entry %d (%s): not a placeholder", i, p.Secret)
		}
		if _, dup := env[k]; dup {
			return nil, fmt.Errorf("entry %d: two secrets map to %s", i, k)
		}
		env[k] = p.Placeholder
	}
	return env, nil
}

// errNoInterception is GET /ca.pem answered by a gateway with TLS
// interception off.
var errNoInterception = errors.New("TLS interception is not configured")

// interceptionOff reports whether a 404 body is the gateway's answer
// when TLS interception is not configured ({"error":{"code":"not_found"}}),
// as opposed to any other server's 404.
func interceptionOff(body []byte) bool {
	var doc struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &doc) == nil && doc.Error.Code == "not_found"
}

// install writes ca.pem and ca-bundle.pem into runDir (the host side of
// the sandbox's /run/sluice) and returns the variables to set. Without a
// CA (interception off) it writes nothing and sets only the placeholders.
func (g *gatewayTrust) install(runDir, rootfs string) (map[string]string, error) {
	if g.caPEM == nil {
		return maps.Clone(g.env), nil
	}
	bundle := []byte(nil)
	for _, p := range systemBundles {
		if b, err := os.ReadFile(filepath.Join(rootfs, p)); err == nil {
			bundle = append(b, '\n')
			break
		}
	}
	bundle = append(bundle, g.caPEM...)
	for name, b := range map[string][]byte{"ca.pem": g.caPEM, "ca-bundle.pem": bundle} {
		if err := os.WriteFile(filepath.Join(runDir, name), b, 0o644); err != nil {
			return nil, fmt.Errorf("gateway_admin: install %s: %w", name, err)
		}
	}
	env := map[string]string{
		"SSL_CERT_FILE": CABundleFile, "REQUESTS_CA_BUNDLE": CABundleFile, "GIT_SSL_CAINFO": CABundleFile,
		"NODE_EXTRA_CA_CERTS": CAFile, "SLUICE_CA_FILE": CAFile,
	}
	for k, v := range g.env {
		env[k] = v
	}
	return env, nil
}
