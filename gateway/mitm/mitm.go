// Package mitm is the gateway's TLS interception authority: a
// per-deployment CA created at first start under a state directory (an
// ECDSA P-256 key the gateway refuses to use when it is readable by anyone
// but its owner) and short-lived leaf certificates minted per host and
// cached in memory, bounded. The CA key never leaves the gateway; only its
// certificate is published (for sandbox trust stores).
package mitm

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/internal/keyfile"
)

// File names inside the CA directory.
const (
	KeyFile  = "ca.key"
	CertFile = "ca.pem"
)

// LeafValidity is how long a minted leaf certificate is valid.
const LeafValidity = 24 * time.Hour

// DefaultCacheSize bounds the leaf cache when Options.CacheSize is zero.
const DefaultCacheSize = 1024

// Options configures an Authority.
type Options struct {
	// CacheSize bounds the number of cached leaves (LRU). Zero: DefaultCacheSize.
	CacheSize int
	// Now replaces time.Now (tests).
	Now func() time.Time
}

// Authority is a loaded CA that mints leaves.
type Authority struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	max     int
	now     func() time.Time

	mu    sync.Mutex
	lru   *list.List // of *entry, most recent first
	byKey map[string]*list.Element
}

type entry struct {
	host string
	cert *tls.Certificate
}

// PermissionError is returned when the CA key file is accessible to
// anyone but its owner.
type PermissionError struct {
	Path string
	Mode fs.FileMode
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("mitm: %s has mode %04o; the CA key must be 0600 or stricter", e.Path, e.Mode.Perm())
}

// LoadOrCreate loads the CA in dir, creating dir (0700), the key (0600)
// and the self-signed certificate when neither exists yet. A key file
// with group or other permissions is refused with a *PermissionError.
func LoadOrCreate(dir string, opts Options) (*Authority, error) {
	a := &Authority{max: opts.CacheSize, now: opts.Now, lru: list.New(), byKey: map[string]*list.Element{}}
	if a.max <= 0 {
		a.max = DefaultCacheSize
	}
	if a.now == nil {
		a.now = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("mitm: create %s: %w", dir, err)
	}
	keyPath, certPath := filepath.Join(dir, KeyFile), filepath.Join(dir, CertFile)
	if _, err := os.Lstat(keyPath); errors.Is(err, fs.ErrNotExist) {
		if err := create(keyPath, certPath, a.now()); err != nil {
			return nil, err
		}
	}
	if err := a.load(keyPath, certPath); err != nil {
		return nil, err
	}
	return a, nil
}

// create writes a new key (exclusively: a concurrent creator wins) and
// its certificate.
func create(keyPath, certPath string, now time.Time) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("mitm: generate CA key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("mitm: encode CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "sluice egress interception CA", Organization: []string{"sluice"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		// Leaves are host names only: no IP address may be vouched for.
		PermittedDNSDomainsCritical: true,
		ExcludedIPRanges:            []*net.IPNet{{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, {IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}},
	}
	certDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("mitm: sign CA certificate: %w", err)
	}
	created, err := keyfile.Create(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	if err != nil {
		return fmt.Errorf("mitm: create CA key: %w", err)
	}
	if !created {
		return nil // another process created it first; load theirs
	}
	tmp := certPath + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}), 0o644); err != nil {
		return fmt.Errorf("mitm: write CA certificate: %w", err)
	}
	if err := os.Rename(tmp, certPath); err != nil {
		return fmt.Errorf("mitm: write CA certificate: %w", err)
	}
	return nil
}

func (a *Authority) load(keyPath, certPath string) error {
	st, err := os.Lstat(keyPath)
	if err != nil {
		return fmt.Errorf("mitm: CA key: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("mitm: CA key %s is not a regular file", keyPath)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return &PermissionError{Path: keyPath, Mode: st.Mode()}
	}
	kb, err := os.ReadFile(keyPath)
	if err != nil {
		return fmt.Errorf("mitm: CA key: %w", err)
	}
	blk, _ := pem.Decode(kb)
	if blk == nil || blk.Type != "EC PRIVATE KEY" {
		return fmt.Errorf("mitm: CA key %s is not a PEM EC private key", keyPath)
	}
	key, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		return fmt.Errorf("mitm: CA key: %w", err)
	}
	cb, err := os.ReadFile(certPath)
	if err != nil {
		return fmt.Errorf("mitm: CA certificate: %w", err)
	}
	cblk, _ := pem.Decode(cb)
	if cblk == nil || cblk.Type != "CERTIFICATE" {
		return fmt.Errorf("mitm: CA certificate %s is not PEM", certPath)
	}
	cert, err := x509.ParseCertificate(cblk.Bytes)
	if err != nil {
		return fmt.Errorf("mitm: CA certificate: %w", err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return errors.New("mitm: the CA certificate does not match the CA key")
	}
	a.cert, a.key, a.certPEM = cert, key, pem.EncodeToMemory(cblk)
	return nil
}

// CertPEM is the CA certificate (public), PEM-encoded.
func (a *Authority) CertPEM() []byte { return append([]byte(nil), a.certPEM...) }

// Cert is the CA certificate.
func (a *Authority) Cert() *x509.Certificate { return a.cert }

// Leaf returns a certificate for host (a DNS name, SAN = host) signed by
// the CA, minting one when none is cached or the cached one is past half
// its validity.
func (a *Authority) Leaf(host string) (*tls.Certificate, error) {
	if host == "" || net.ParseIP(host) != nil {
		return nil, fmt.Errorf("mitm: leaf: %q is not a host name", host)
	}
	now := a.now()
	a.mu.Lock()
	if el, ok := a.byKey[host]; ok {
		e := el.Value.(*entry)
		if now.Before(e.cert.Leaf.NotAfter.Add(-LeafValidity / 2)) {
			a.lru.MoveToFront(el)
			a.mu.Unlock()
			return e.cert, nil
		}
		a.lru.Remove(el)
		delete(a.byKey, host)
	}
	a.mu.Unlock()

	cert, err := a.mint(host, now)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.byKey[host]; ok { // minted concurrently
		a.lru.MoveToFront(el)
		return el.Value.(*entry).cert, nil
	}
	a.byKey[host] = a.lru.PushFront(&entry{host: host, cert: cert})
	for a.lru.Len() > a.max {
		old := a.lru.Back()
		a.lru.Remove(old)
		delete(a.byKey, old.Value.(*entry).host)
	}
	return cert, nil
}

// Cached is the number of leaves in the cache.
func (a *Authority) Cached() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lru.Len()
}

func (a *Authority) mint(host string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mitm: leaf key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(LeafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("mitm: sign leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("mitm: parse leaf: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, a.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic("mitm: crypto/rand failed: " + err.Error())
	}
	return n.Add(n, big.NewInt(1))
}

// HMACKeyFile is the per-deployment key placeholders are derived with.
const HMACKeyFile = "placeholder.key"

// LoadOrCreateHMACKey returns the 32-byte key in dir/HMACKeyFile, creating
// it (0600) at first start. Like the CA key, it is refused when readable by
// anyone but its owner.
func LoadOrCreateHMACKey(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("mitm: create %s: %w", dir, err)
	}
	path := filepath.Join(dir, HMACKeyFile)
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			return nil, fmt.Errorf("mitm: placeholder key: %w", err)
		}
		// Whole or not at all: another replica or process may be
		// reading it as it is made (keyfile).
		if _, err := keyfile.Create(path, k); err != nil {
			return nil, fmt.Errorf("mitm: create placeholder key: %w", err)
		}
	}
	st, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("mitm: placeholder key: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("mitm: placeholder key %s is not a regular file", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, &PermissionError{Path: path, Mode: st.Mode()}
	}
	k, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mitm: placeholder key: %w", err)
	}
	if len(k) != 32 {
		return nil, fmt.Errorf("mitm: placeholder key %s is %d bytes, want 32", path, len(k))
	}
	return k, nil
}
