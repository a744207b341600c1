package vault

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/vault/api"
	"golang.org/x/sync/singleflight"
)

// ErrUnavailable is returned (wrapped) when Vault cannot answer: unreachable,
// sealed, timed out or refusing the gateway's token. A caller must treat it
// like any other failure to get a credential: refuse the call.
var ErrUnavailable = errors.New("vault: unavailable")

// ErrWrapReused means a response-wrapping token the gateway was given had
// already been unwrapped (or never existed): the secret inside may be in
// someone else's hands (THREATS D8).
var ErrWrapReused = errors.New("vault: the wrapping token was already unwrapped or is invalid; the wrapped secret may be compromised")

// VaultConfig configures the HashiCorp Vault backend.
type VaultConfig struct {
	// Address is Vault's URL, e.g. https://vault.internal:8200.
	Address string
	// CAFile verifies Vault's TLS certificate; empty means the system roots.
	CAFile string
	// Auth is how the gateway logs in.
	Auth VaultAuth
	// KVMount and KVPrefix place named secrets (credential.secret with the
	// vault backend): KVMount/data/KVPrefix/<scope>/<name>, field "value".
	// Defaults "secret" and "sluice".
	KVMount, KVPrefix string
	// TransitMount is where per-call JWTs are signed. Default "transit".
	TransitMount string
	// CacheTTL bounds how long a KV value is used without asking Vault
	// again (and how long a Vault outage is bridged). Default 60 s.
	CacheTTL time.Duration
	// Timeout bounds one request to Vault. Default 5 s.
	Timeout time.Duration
	// LeaseIdle: a dynamic secret unused this long is revoked at its next
	// renewal instead of renewed. Default 15 min.
	LeaseIdle time.Duration
	// Logger receives lifecycle events; never a secret.
	Logger *slog.Logger
}

// VaultAuth is how the gateway logs in to Vault.
type VaultAuth struct {
	Method       string // token | approle | jwt | kubernetes
	TokenFile    string // token
	RoleIDFile   string // approle
	SecretIDFile string // approle
	// SecretIDWrapped: SecretIDFile holds a response-wrapping token around
	// the secret_id (the AppRole delivery pattern). It is unwrapped once, at
	// the first login, and kept only in memory; if Vault says the wrapping
	// token was already used, someone else unwrapped it: OpenVault fails
	// with ErrWrapReused, an alert the operator must act on.
	SecretIDWrapped bool
	Role            string // jwt, kubernetes
	JWTFile         string // jwt, kubernetes (default the service account token)
	Mount           string // the auth method's mount; default its method name
}

// defaultK8sJWT is where Kubernetes mounts a pod's service account token.
const defaultK8sJWT = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// Vault is a credential source backed by HashiCorp Vault: KV values cached
// for CacheTTL, leased dynamic secrets per session (renewed at two thirds of
// their lease, revoked when the session ends), JWTs signed per call by the
// transit engine and identity tokens. Its own token never leaves it.
type Vault struct {
	cfg VaultConfig
	log *slog.Logger

	client   *api.Client // carries the current token
	loginMu  sync.Mutex  // serialises logins
	tokenTTL atomic.Int64
	loggedIn atomic.Int64 // unix nanos of the last successful login/renewal
	ownToken bool         // logged in by us (not a token file): revoke it at Close
	secretID string       // an unwrapped secret_id (SecretIDWrapped), memory only

	requests atomic.Int64 // HTTP requests sent to Vault

	sf       singleflight.Group
	mu       sync.Mutex
	kv       map[string]kvEntry
	leases   map[leaseKey]*lease
	keys     map[string]keyEntry
	idTokens map[string]idToken
	revoke   []*lease // revocations that failed; retried until their lease ends

	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
}

type kvEntry struct {
	val     Secret
	found   bool // false: Vault said 404 (cached so a miss costs no request either)
	expires time.Time
}

// OpenVault connects to Vault, logs in and starts keeping the token alive.
// It fails when the login fails: a gateway configured for Vault does not
// start without it.
func OpenVault(ctx context.Context, cfg VaultConfig) (*Vault, error) {
	if cfg.KVMount == "" {
		cfg.KVMount = "secret"
	}
	if cfg.KVPrefix == "" {
		cfg.KVPrefix = "sluice"
	}
	if cfg.TransitMount == "" {
		cfg.TransitMount = "transit"
	}
	if cfg.CacheTTL <= 0 {
		cfg.CacheTTL = 60 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.LeaseIdle <= 0 {
		cfg.LeaseIdle = 15 * time.Minute
	}
	if cfg.Auth.Mount == "" {
		cfg.Auth.Mount = cfg.Auth.Method
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	v := &Vault{
		cfg: cfg, log: log,
		kv: map[string]kvEntry{}, leases: map[leaseKey]*lease{}, keys: map[string]keyEntry{}, idTokens: map[string]idToken{},
		stop: make(chan struct{}),
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("vault: ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("vault: ca_file %s: no PEM certificate", cfg.CAFile)
		}
		tlsConf.RootCAs = pool
	}
	// Built here rather than from api.DefaultConfig so that no VAULT_*
	// environment variable (VAULT_SKIP_VERIFY, a proxy, a token) changes
	// how the gateway talks to Vault.
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConf,
		TLSHandshakeTimeout: cfg.Timeout,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	conf := &api.Config{
		Address:    cfg.Address,
		HttpClient: &http.Client{Transport: counting{tr, &v.requests}, Timeout: cfg.Timeout},
		Timeout:    cfg.Timeout,
		MaxRetries: 0, // a retry loop would hold calls; the cache bridges outages
	}
	c, err := api.NewClient(conf)
	if err != nil {
		return nil, fmt.Errorf("vault: client: %w", err)
	}
	c.ClearToken() // NewClient reads VAULT_TOKEN; only our login sets one
	c.ClearNamespace()
	v.client = c
	if err := v.login(ctx); err != nil {
		return nil, err
	}
	v.wg.Add(1)
	go v.maintain()
	return v, nil
}

// counting is a RoundTripper that counts the requests sent to Vault (the
// benchmark's "requests per 1,000 calls").
type counting struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c counting) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}

// Requests is how many HTTP requests the gateway has sent to Vault.
func (v *Vault) Requests() int64 { return v.requests.Load() }

// Close stops renewing, revokes every dynamic secret still held (the
// gateway stops using them) and, when the gateway logged in itself, its
// own token.
func (v *Vault) Close(ctx context.Context) error {
	v.stopped.Do(func() { close(v.stop) })
	v.wg.Wait()
	v.mu.Lock()
	all := make([]*lease, 0, len(v.leases)+len(v.revoke))
	for k, l := range v.leases {
		all = append(all, l)
		delete(v.leases, k)
	}
	all = append(all, v.revoke...)
	v.revoke = nil
	v.mu.Unlock()
	var errs []error
	for _, l := range all {
		if err := v.revokeLease(ctx, l); err != nil {
			errs = append(errs, err)
		}
	}
	if v.ownToken {
		if err := v.client.Auth().Token().RevokeSelfWithContext(ctx, ""); err != nil {
			errs = append(errs, vaultErr("revoke own token", "auth/token/revoke-self", err))
		}
	}
	v.client.ClearToken()
	return errors.Join(errs...)
}

// login authenticates with the configured method and installs the token.
func (v *Vault) login(ctx context.Context) error {
	v.loginMu.Lock()
	defer v.loginMu.Unlock()
	a := v.cfg.Auth
	if a.Method == "token" {
		tok, err := readCredFile(a.TokenFile, "token_file")
		if err != nil {
			return err
		}
		v.client.SetToken(tok)
		sec, err := v.client.Auth().Token().LookupSelfWithContext(ctx)
		if err != nil {
			v.client.ClearToken()
			return vaultErr("login: look up token", "auth/token/lookup-self", err)
		}
		ttl, _ := sec.TokenTTL()
		v.tokenTTL.Store(int64(ttl))
		v.loggedIn.Store(time.Now().UnixNano())
		v.log.Info("vault: using token", "ttl", ttl, "policies", tokenPolicies(sec))
		return nil
	}
	var body map[string]any
	switch a.Method {
	case "approle":
		rid, err := readCredFile(a.RoleIDFile, "role_id_file")
		if err != nil {
			return err
		}
		sid := v.secretID
		if sid == "" {
			if sid, err = readCredFile(a.SecretIDFile, "secret_id_file"); err != nil {
				return err
			}
			if a.SecretIDWrapped {
				if sid, err = v.unwrapSecretID(ctx, sid); err != nil {
					return err
				}
				v.secretID = sid
			}
		}
		body = map[string]any{"role_id": rid, "secret_id": sid}
	case "jwt", "kubernetes":
		f := a.JWTFile
		if f == "" && a.Method == "kubernetes" {
			f = defaultK8sJWT
		}
		jwt, err := readCredFile(f, "jwt_file")
		if err != nil {
			return err
		}
		body = map[string]any{"role": a.Role, "jwt": jwt}
	default:
		return fmt.Errorf("vault: auth.method %q: want token, approle, jwt or kubernetes", a.Method)
	}
	anon, err := v.client.Clone()
	if err != nil {
		return fmt.Errorf("vault: login: %w", err)
	}
	anon.ClearToken()
	path := "auth/" + strings.Trim(a.Mount, "/") + "/login"
	sec, err := anon.Logical().WriteWithContext(ctx, path, body)
	if err != nil {
		return vaultErr("login", path, err)
	}
	if sec == nil || sec.Auth == nil || sec.Auth.ClientToken == "" {
		return fmt.Errorf("vault: login %s: no token in the reply: %w", path, ErrUnavailable)
	}
	v.client.SetToken(sec.Auth.ClientToken)
	v.ownToken = true
	v.tokenTTL.Store(int64(time.Duration(sec.Auth.LeaseDuration) * time.Second))
	v.loggedIn.Store(time.Now().UnixNano())
	v.log.Info("vault: logged in", "method", a.Method, "ttl", time.Duration(sec.Auth.LeaseDuration)*time.Second, "policies", sec.Auth.Policies)
	return nil
}

// unwrapSecretID unwraps a wrapped secret_id. Unwrapping is single use:
// a token that is already spent is the D8 alarm.
func (v *Vault) unwrapSecretID(ctx context.Context, wrapping string) (string, error) {
	anon, err := v.client.Clone()
	if err != nil {
		return "", fmt.Errorf("vault: unwrap: %w", err)
	}
	anon.ClearToken()
	sec, err := anon.Logical().UnwrapWithContext(ctx, wrapping)
	if err != nil {
		var re *api.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusBadRequest {
			v.log.Error("vault: ALERT the wrapped secret_id was already unwrapped or is invalid; someone else may hold it", "file", v.cfg.Auth.SecretIDFile)
			return "", fmt.Errorf("vault: auth.secret_id_file: %w", ErrWrapReused)
		}
		return "", vaultErr("unwrap", "sys/wrapping/unwrap", err)
	}
	if sec == nil {
		return "", fmt.Errorf("vault: auth.secret_id_file: %w", ErrWrapReused)
	}
	sid, _ := sec.Data["secret_id"].(string)
	if sid == "" {
		return "", fmt.Errorf("vault: auth.secret_id_file: the wrapped response holds no secret_id")
	}
	return sid, nil
}

func tokenPolicies(s *api.Secret) []string {
	p, _ := s.TokenPolicies()
	return p
}

// readCredFile reads a login credential from a file. The error names the
// key and the file, never the content.
func readCredFile(path, key string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("vault: auth.%s is not set", key)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("vault: auth.%s: %w", key, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("vault: auth.%s: %s is empty", key, path)
	}
	return s, nil
}

// maintain keeps the gateway's token alive (renewing it at two thirds of
// its TTL, logging in again when it cannot be renewed) and retries failed
// revocations, until Close.
func (v *Vault) maintain() {
	defer v.wg.Done()
	t := time.NewTicker(250 * time.Millisecond) // fine enough for short TTLs
	defer t.Stop()
	nextRevoke := time.Now()
	for {
		select {
		case <-v.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		ttl := time.Duration(v.tokenTTL.Load())
		since := now.Sub(time.Unix(0, v.loggedIn.Load()))
		if ttl > 0 && since >= ttl*2/3 {
			v.refreshToken(ttl)
		}
		if now.After(nextRevoke) {
			v.retryRevocations()
			nextRevoke = now.Add(5 * time.Second)
		}
	}
}

// refreshToken renews the token, or logs in again when renewal is refused
// or would not restore the TTL (a max TTL is near).
func (v *Vault) refreshToken(ttl time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), v.cfg.Timeout)
	defer cancel()
	sec, err := v.client.Auth().Token().RenewSelfWithContext(ctx, int(ttl/time.Second))
	if err == nil && sec != nil && sec.Auth != nil {
		got := time.Duration(sec.Auth.LeaseDuration) * time.Second
		if got >= ttl/2 {
			v.tokenTTL.Store(int64(got))
			v.loggedIn.Store(time.Now().UnixNano())
			v.log.Debug("vault: token renewed", "ttl", got)
			return
		}
		v.log.Info("vault: token near its max TTL; logging in again", "left", got)
	}
	if v.cfg.Auth.Method == "token" && err != nil {
		// A token from a file may have been replaced: read it again.
		v.log.Warn("vault: token renewal failed; re-reading the token file", "err", vaultErr("renew", "auth/token/renew-self", err))
	}
	if lerr := v.login(ctx); lerr != nil {
		v.log.Error("vault: token could not be renewed nor replaced; cached credentials serve until they expire", "err", lerr)
		// Try again in a few seconds rather than every tick.
		v.loggedIn.Store(time.Now().Add(-ttl*2/3 + 5*time.Second).UnixNano())
	}
}

// read is a logical read that turns Vault's answers into sanitized errors:
// (nil, nil) means "no such path".
func (v *Vault) read(ctx context.Context, path string) (*api.Secret, error) {
	sec, err := v.client.Logical().ReadWithContext(ctx, path)
	if err != nil {
		return nil, vaultErr("read", path, err)
	}
	return sec, nil
}

func (v *Vault) write(ctx context.Context, path string, body map[string]any) (*api.Secret, error) {
	sec, err := v.client.Logical().WriteWithContext(ctx, path, body)
	if err != nil {
		return nil, vaultErr("write", path, err)
	}
	return sec, nil
}

// vaultErr keeps Vault's status and error strings (which name paths and
// reasons, never values) and drops everything else, and marks the error as
// ErrUnavailable.
func vaultErr(op, path string, err error) error {
	var re *api.ResponseError
	if errors.As(err, &re) {
		return fmt.Errorf("vault: %s %s: status %d (%s): %w", op, path, re.StatusCode, clip(strings.Join(re.Errors, "; ")), ErrUnavailable)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("vault: %s %s: timed out: %w", op, path, ErrUnavailable)
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return fmt.Errorf("vault: %s %s: unreachable (%s): %w", op, path, oe.Op, ErrUnavailable)
	}
	return fmt.Errorf("vault: %s %s: request failed: %w", op, path, ErrUnavailable)
}

// KV returns field of the KV secret at path (a KV v2 API path such as
// secret/data/billing, or a KV v1 path), cached for CacheTTL. While Vault is
// unreachable a cached value is served until it expires, never after.
func (v *Vault) KV(ctx context.Context, path, field string) (Secret, error) {
	e, err := v.kvEntry(ctx, path, field)
	if err != nil {
		return Secret{}, err
	}
	if !e.found {
		return Secret{}, fmt.Errorf("vault: %s has no field %q: %w", path, field, ErrNotFound)
	}
	return e.val, nil
}

// Named resolves a named secret through the scopes in order (narrowest
// first), as the local store does: KVMount/data/KVPrefix/<scope>/<name>,
// field "value". A failure to ask Vault about a narrower scope fails the
// lookup: it never falls through to a wider scope.
func (v *Vault) Named(ctx context.Context, name string, scopes ...Scope) (Secret, Scope, error) {
	if err := validateName(name); err != nil {
		return Secret{}, "", fmt.Errorf("vault: %w", err)
	}
	for _, sc := range scopes {
		if err := sc.validate(); err != nil {
			return Secret{}, "", fmt.Errorf("vault: %w", err)
		}
		path := v.cfg.KVMount + "/data/" + v.cfg.KVPrefix + "/" + strings.Replace(string(sc), ":", "/", 1) + "/" + name
		e, err := v.kvEntry(ctx, path, "value")
		if err != nil {
			return Secret{}, "", err
		}
		if e.found {
			return e.val, sc, nil
		}
	}
	return Secret{}, "", fmt.Errorf("vault: %q: %w", name, ErrNotFound)
}

func (v *Vault) kvEntry(ctx context.Context, path, field string) (kvEntry, error) {
	key := path + "\x00" + field
	v.mu.Lock()
	e, ok := v.kv[key]
	v.mu.Unlock()
	if ok && time.Now().Before(e.expires) {
		return e, nil
	}
	r, err, _ := v.sf.Do("kv\x00"+key, func() (any, error) {
		sec, err := v.read(ctx, path)
		if err != nil {
			return nil, err
		}
		ttl := v.cfg.CacheTTL
		e := kvEntry{}
		if sec != nil {
			data := sec.Data
			if inner, ok := data["data"].(map[string]any); ok {
				if _, v2 := data["metadata"]; v2 {
					data = inner
				}
			}
			if data != nil {
				if s, ok := data[field].(string); ok {
					if err := ValidateValue([]byte(s)); err != nil {
						return nil, fmt.Errorf("vault: %s field %q: %w", path, field, err)
					}
					e.val, e.found = NewSecret([]byte(s)), true
				}
			}
			if d := time.Duration(sec.LeaseDuration) * time.Second; d > 0 && d < ttl {
				ttl = d
			}
		}
		e.expires = time.Now().Add(ttl)
		v.mu.Lock()
		v.kv[key] = e
		v.mu.Unlock()
		return e, nil
	})
	if err != nil {
		return kvEntry{}, err
	}
	return r.(kvEntry), nil
}
