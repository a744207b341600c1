package creds

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/vault"
)

// Vault serves credentials from HashiCorp Vault: named secrets from
// KV (narrowest scope first, as the local store), KV paths, leased dynamic
// secrets per session, per-call JWTs signed by the transit engine and
// identity tokens. It ends sessions (revoking their leases) and publishes
// the keys that verify its tokens.
type Vault struct {
	v           *vault.Vault
	issuer      string
	transitKeys []string // every credential.vault.transit_key, for the JWKS
	identity    bool     // some connector uses oidc_role
}

func openVault(ctx context.Context, cfg *config.Config, log *slog.Logger) (*Vault, error) {
	vc := cfg.Secrets.Vault
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := vault.OpenVault(octx, vault.VaultConfig{
		Address: vc.Address, CAFile: vc.CAFile,
		Auth: vault.VaultAuth{Method: vc.Auth.Method, TokenFile: vc.Auth.TokenFile, RoleIDFile: vc.Auth.RoleIDFile,
			SecretIDFile: vc.Auth.SecretIDFile, SecretIDWrapped: vc.Auth.SecretIDWrapped, Role: vc.Auth.Role, JWTFile: vc.Auth.JWTFile, Mount: vc.Auth.Mount},
		KVMount: vc.KVMount, KVPrefix: vc.KVPrefix, TransitMount: vc.TransitMount,
		CacheTTL: vc.CacheTTL.Std(), Timeout: vc.Timeout.Std(), LeaseIdle: vc.LeaseIdle.Std(),
		Logger: log.With("component", "vault"),
	})
	if err != nil {
		return nil, fmt.Errorf("secrets.vault: %w", err)
	}
	src := &Vault{v: v, issuer: vc.Issuer}
	if src.issuer == "" {
		src.issuer = "sluice"
	}
	for _, c := range cfg.Connectors {
		if c.Credential == nil || c.Credential.Vault == nil {
			continue
		}
		if k := c.Credential.Vault.TransitKey; k != "" && !slices.Contains(src.transitKeys, k) {
			src.transitKeys = append(src.transitKeys, k)
		}
		if c.Credential.Vault.OIDCRole != "" {
			src.identity = true
		}
	}
	return src, nil
}

// errNoUser refuses a per-user credential for a session that acts for no one.
var errNoUser = errors.New("the credential is per user ({user}) and this session acts for no user")

// expandPath fills {user} and {connector}. The user must be a name the
// secret stores accept (vault.ValidateName: letters, digits, '_', '.', '-',
// not starting with '.'), so it stays one path segment; the connector slug
// is checked by the config.
func expandPath(p string, ref Ref) (string, error) {
	if strings.Contains(p, "{user}") {
		if ref.Caller.User == "" {
			return "", errNoUser
		}
		if err := vault.ValidateName(ref.Caller.User); err != nil {
			return "", fmt.Errorf("user cannot name a Vault path segment: %w", err)
		}
	}
	return strings.NewReplacer("{user}", ref.Caller.User, "{connector}", ref.Connector).Replace(p), nil
}

func (s *Vault) Credential(ctx context.Context, ref Ref) (vault.Secret, error) {
	r := ref.Vault
	if r == nil {
		scopes := []vault.Scope{vault.ConnectorScope(ref.Connector)}
		if ref.Caller.User != "" {
			scopes = append(scopes, vault.UserScope(ref.Caller.User))
		}
		scopes = append(scopes, vault.ScopeProject)
		sec, _, err := s.v.Named(ctx, ref.Secret, scopes...)
		return sec, err
	}
	switch {
	case r.KV != "":
		path, err := expandPath(r.KV, ref)
		if err != nil {
			return vault.Secret{}, err
		}
		field := r.Field
		if field == "" {
			field = "value"
		}
		return s.v.KV(ctx, path, field)
	case r.Dynamic != "":
		path, err := expandPath(r.Dynamic, ref)
		if err != nil {
			return vault.Secret{}, err
		}
		data, err := s.v.Dynamic(ctx, ref.Caller.Session, path)
		if err != nil {
			return vault.Secret{}, err
		}
		if r.Field != "" {
			v, ok := data[r.Field]
			if !ok {
				return vault.Secret{}, fmt.Errorf("vault: %s has no field %q", path, r.Field)
			}
			return v, nil
		}
		u, p := data["username"], data["password"]
		if u.IsZero() || p.IsZero() {
			return vault.Secret{}, fmt.Errorf("vault: %s has no username and password; set field", path)
		}
		return vault.NewSecret([]byte(string(u.Reveal()) + ":" + string(p.Reveal()))).WithLease(u.LeaseID()), nil
	case r.TransitKey != "":
		ttl := r.TTL.Std()
		if ttl <= 0 {
			ttl = 5 * time.Minute
		}
		sub := ref.Caller.User
		if sub == "" {
			sub = "agent:" + ref.Caller.Agent
		}
		return s.v.SignJWT(ctx, r.TransitKey, map[string]any{
			"iss": s.issuer, "sub": sub, "aud": r.Audience, "jti": newJTI(),
			"agent": ref.Caller.Agent, "session": ref.Caller.Session, "user": ref.Caller.User,
			"sandbox": ref.Caller.Sandbox, "connector": ref.Connector, "tool": ref.Tool,
			"req_sha256": ref.RequestSHA256,
		}, ttl)
	case r.OIDCRole != "":
		return s.v.IdentityToken(ctx, r.OIDCRole, r.Audience)
	}
	return vault.Secret{}, errors.New("credential.vault names no kind")
}

// Client is the Vault client the source reads through (tests count its
// requests and leases).
func (s *Vault) Client() *vault.Vault { return s.v }

func newJTI() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// EndSession revokes the session's leases (the gateway calls it when a
// session ends).
func (s *Vault) EndSession(ctx context.Context, session string) error {
	return s.v.EndSession(ctx, session)
}

// JWKS is the key set that verifies the tokens this source attaches.
func (s *Vault) JWKS(ctx context.Context) ([]byte, error) {
	return s.v.JWKS(ctx, s.transitKeys, s.identity)
}

func (s *Vault) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return s.v.Close(ctx)
}

// Close closes a credential source that holds resources.
func Close(c Source) error {
	if cl, ok := c.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// RequestHash is the req_sha256 claim of per-call tokens: the hex SHA-256
// of the method, a newline, the request target (path and query as sent), a
// newline and the body. An upstream recomputes it from what it received to
// check the token was minted for exactly this request.
func RequestHash(req *http.Request) (string, error) {
	h := sha256.New()
	io.WriteString(h, req.Method+"\n"+req.URL.RequestURI()+"\n")
	if req.GetBody != nil {
		b, err := req.GetBody()
		if err != nil {
			return "", err
		}
		defer b.Close()
		if _, err := io.Copy(h, b); err != nil {
			return "", err
		}
	} else if req.Body != nil && req.Body != http.NoBody {
		return "", errors.New("request body cannot be re-read for hashing")
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// JWKS is GET /.well-known/jwks.json on the admin listener: the public
// keys that verify the tokens src attaches (none when src signs nothing),
// so it is not authenticated.
func JWKS(src Source, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ks, ok := src.(interface {
			JWKS(context.Context) ([]byte, error)
		})
		if !ok {
			refusal.WriteJSON(w, http.StatusOK, map[string]any{"keys": []any{}})
			return
		}
		b, err := ks.JWKS(r.Context())
		if err != nil {
			log.Error("jwks: keys unavailable", "err", err)
			refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the signing keys are unavailable"), refusal.NewRequestID())
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Header().Set("Cache-Control", "max-age=60")
		_, _ = w.Write(b)
	}
}

// Label names a connector's credential for people (the hold
// page): which secret, never its value.
func Label(c *config.Credential) string {
	if c.Vault == nil {
		return c.Secret
	}
	switch v := c.Vault; {
	case v.KV != "":
		return "vault kv " + v.KV + "#" + cmp.Or(v.Field, "value")
	case v.Dynamic != "":
		return "vault lease " + v.Dynamic
	case v.TransitKey != "":
		return "vault-signed JWT (" + v.TransitKey + ", aud " + v.Audience + ")"
	default:
		return "vault identity token (" + v.OIDCRole + ")"
	}
}
