package config

import (
	"net/url"
	"regexp"
	"strings"
)

// Secrets selects the credential backend.
type Secrets struct {
	Backend string      `yaml:"backend"`
	Local   LocalSecret `yaml:"local"`
	Vault   *Vault      `yaml:"vault"`
}

// LocalSecret places the embedded store.
type LocalSecret struct {
	Path    string `yaml:"path"`
	KeyFile string `yaml:"key_file"`
}

// Vault configures the HashiCorp Vault backend.
type Vault struct {
	Address string    `yaml:"address"`
	CAFile  string    `yaml:"ca_file"`
	Auth    VaultAuth `yaml:"auth"`
	// KVMount and KVPrefix place named secrets (credential.secret):
	// KVMount/data/KVPrefix/<project|user/NAME|connector/SLUG>/<name>, field
	// "value". Defaults secret and sluice.
	KVMount  string `yaml:"kv_mount"`
	KVPrefix string `yaml:"kv_prefix"`
	// TransitMount signs per-call JWTs (credential.vault.transit_key).
	TransitMount string `yaml:"transit_mount"`
	// CacheTTL is how long a KV value is used without asking Vault again;
	// also how long an outage is bridged. Default 60s.
	CacheTTL Duration `yaml:"cache_ttl"`
	// Timeout bounds one request to Vault. Default 5s.
	Timeout Duration `yaml:"timeout"`
	// LeaseIdle: a dynamic secret unused this long is revoked. Default 15m.
	LeaseIdle Duration `yaml:"lease_idle"`
	// Issuer is the iss claim of per-call JWTs. Default "sluice".
	Issuer string `yaml:"issuer"`
}

// VaultAuth is how the gateway logs in to Vault.
type VaultAuth struct {
	Method       string `yaml:"method"`
	TokenFile    string `yaml:"token_file"`
	RoleIDFile   string `yaml:"role_id_file"`
	SecretIDFile string `yaml:"secret_id_file"`
	// SecretIDWrapped: secret_id_file holds a response-wrapping token
	// around the secret_id, unwrapped once at start (an already-unwrapped
	// token fails the start: someone else has the secret_id).
	SecretIDWrapped bool   `yaml:"secret_id_wrapped"`
	Role            string `yaml:"role"`
	JWTFile         string `yaml:"jwt_file"`
	Mount           string `yaml:"mount"`
}

// validateSecrets checks secrets.*: the backend and its keys.
func validateSecrets(s Secrets, bad func(key, format string, args ...any)) {
	switch s.Backend {
	case "local":
		if s.Local.Path == "" {
			bad("secrets.local.path", "must be set")
		}
		if s.Local.KeyFile == "" {
			bad("secrets.local.key_file", "must be set")
		}
	case "vault":
		if s.Vault == nil || s.Vault.Address == "" {
			bad("secrets.vault.address", "must be set when secrets.backend is vault")
		} else if u, err := url.Parse(s.Vault.Address); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad("secrets.vault.address", "want an http(s) URL, got %q", RedactURL(s.Vault.Address))
		}
		if s.Vault != nil {
			vc := s.Vault
			for key, d := range map[string]Duration{"cache_ttl": vc.CacheTTL, "timeout": vc.Timeout, "lease_idle": vc.LeaseIdle} {
				if d < 0 {
					bad("secrets.vault."+key, "must not be negative")
				}
			}
			for key, m := range map[string]string{"kv_mount": vc.KVMount, "kv_prefix": vc.KVPrefix, "transit_mount": vc.TransitMount, "auth.mount": vc.Auth.Mount} {
				if m != "" && (!vaultPathOK(m) || strings.Contains(m, "{")) {
					bad("secrets.vault."+key, "not a Vault path: %q", m)
				}
			}
			a := vc.Auth
			need := map[string][]string{"token": {"token_file"}, "approle": {"role_id_file", "secret_id_file"}, "jwt": {"role", "jwt_file"}, "kubernetes": {"role"}}
			have := map[string]string{"token_file": a.TokenFile, "role_id_file": a.RoleIDFile, "secret_id_file": a.SecretIDFile, "role": a.Role, "jwt_file": a.JWTFile}
			for _, key := range need[a.Method] {
				if have[key] == "" {
					bad("secrets.vault.auth."+key, "is required with auth.method %s", a.Method)
				}
			}
			switch s.Vault.Auth.Method {
			case "token", "approle", "jwt", "kubernetes":
			default:
				bad("secrets.vault.auth.method", "want token, approle, jwt or kubernetes, got %q", s.Vault.Auth.Method)
			}
		}
	default:
		bad("secrets.backend", "want local or vault, got %q", s.Backend)
	}
}

var vaultPathRE = regexp.MustCompile(`^[A-Za-z0-9_.{}-]+(/[A-Za-z0-9_.{}-]+)*$`)

// vaultPathOK accepts a relative Vault API path whose only braces are the
// {user} and {connector} placeholders and which has no "." or ".." segment.
func vaultPathOK(p string) bool {
	if !vaultPathRE.MatchString(p) {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	rest := strings.NewReplacer("{user}", "", "{connector}", "").Replace(p)
	return !strings.ContainsAny(rest, "{}")
}
