package gateway

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/vault"
)

// localSource serves credentials from the embedded local store, trying the
// narrowest scope first: the connector's, then the calling user's, then the
// project's.
type localSource struct{ store *vault.Local }

func (l localSource) Credential(ctx context.Context, ref CredentialRef) (vault.Secret, error) {
	scopes := []vault.Scope{vault.ConnectorScope(ref.Connector)}
	if ref.Caller.User != "" {
		scopes = append(scopes, vault.UserScope(ref.Caller.User))
	}
	scopes = append(scopes, vault.Scope("project"))
	s, _, err := l.store.Resolve(ctx, ref.Secret, scopes...)
	return s, err
}

func openCredentials(ctx context.Context, cfg *config.Config, log *slog.Logger) (CredentialSource, error) {
	switch cfg.Secrets.Backend {
	case "local":
		st, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("secrets.local: %w", err)
		}
		return localSource{st}, nil
	case "vault":
		return openVault(ctx, cfg, log) // vaultcreds.go
	default:
		return nil, fmt.Errorf("secrets.backend: %q is not available in this build yet", cfg.Secrets.Backend)
	}
}

// checkSecretRefs reports every named secret the configuration refers to
// (a connector's credential.secret, an egress placeholder's secret) that
// the local store does not hold at any scope. It creates nothing: without
// a key file there can be no secrets yet.
func checkSecretRefs(ctx context.Context, cfg *config.Config) []error {
	type ref struct{ key, name string }
	var refs []ref
	for i, c := range cfg.Connectors {
		if c.Credential != nil && c.Credential.Secret != "" {
			refs = append(refs, ref{fmt.Sprintf("connectors[%d].credential.secret", i), c.Credential.Secret})
		}
	}
	for i, p := range cfg.Egress.Placeholders {
		refs = append(refs, ref{fmt.Sprintf("egress.placeholders[%d].secret", i), p.Secret})
	}
	if len(refs) == 0 {
		return nil
	}
	if cfg.Secrets.Backend == "vault" {
		return nil // named secrets live in Vault: `sluice validate` does not log in to check them
	}
	if cfg.Secrets.Backend != "local" {
		return []error{fmt.Errorf("secrets.backend: %q is not available in this build", cfg.Secrets.Backend)}
	}
	var errs []error
	if _, err := os.Stat(cfg.Secrets.Local.KeyFile); err != nil {
		for _, r := range refs {
			errs = append(errs, fmt.Errorf("%s: %q cannot exist yet: the local store has no key file (%s); run `sluice secrets set %s`", r.key, r.name, cfg.Secrets.Local.KeyFile, r.name))
		}
		return errs
	}
	st, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
	if err != nil {
		return []error{fmt.Errorf("secrets.local: %w", err)}
	}
	entries, err := st.List(ctx)
	if err != nil {
		return []error{fmt.Errorf("secrets.local: %w", err)}
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name] = true
	}
	for _, r := range refs {
		if !have[r.name] {
			errs = append(errs, fmt.Errorf("%s: no secret named %q in the local store; run `sluice secrets set %s`", r.key, r.name, r.name))
		}
	}
	return errs
}

// attachment is how a credential was put on a request; forms lists the byte
// strings a reflecting upstream might echo back, for the scrubber.
type attachment struct {
	where string // "header:X-Api-Key", "query:key", "cookie:sid", "basic", "bearer"
	forms [][]byte
}

var errNoScheme = errors.New("no security scheme of this operation can be satisfied by the configured credential")

// attach puts secret on req as the connector's config or the tool's
// securitySchemes say. The agent's own value for the same header, query
// parameter or cookie is replaced, never merged.
func attach(req *http.Request, cred *config.Credential, tool *connectors.Tool, schemes map[string]*connectors.SecurityScheme, secret vault.Secret) (attachment, error) {
	v := string(secret.Reveal())
	if strings.ContainsAny(v, "\r\n\x00") {
		return attachment{}, errors.New("credential contains CR, LF or NUL")
	}
	forms := [][]byte{secret.Reveal()}
	switch {
	case cred.Header != "":
		req.Header.Set(cred.Header, cred.Prefix+v)
		return attachment{where: "header:" + cred.Header, forms: forms}, nil
	case cred.Query != "":
		q := req.URL.Query()
		q.Set(cred.Query, v)
		req.URL.RawQuery = q.Encode()
		return attachment{where: "query:" + cred.Query, forms: forms}, nil
	}
	sch := pickScheme(cred.Scheme, tool, schemes)
	if sch == nil {
		if cred.Scheme == "" && len(tool.Security) == 0 {
			return attachment{}, nil // the operation needs no credential
		}
		return attachment{}, errNoScheme
	}
	switch {
	case sch.Type == "apiKey" && sch.In == "header":
		req.Header.Set(sch.Param, v)
		return attachment{where: "header:" + sch.Param, forms: forms}, nil
	case sch.Type == "apiKey" && sch.In == "query":
		q := req.URL.Query()
		q.Set(sch.Param, v)
		req.URL.RawQuery = q.Encode()
		return attachment{where: "query:" + sch.Param, forms: forms}, nil
	case sch.Type == "apiKey" && sch.In == "cookie":
		dropCookie(req, sch.Param)
		req.AddCookie(&http.Cookie{Name: sch.Param, Value: v})
		return attachment{where: "cookie:" + sch.Param, forms: forms}, nil
	case sch.Type == "http" && sch.Scheme == "bearer":
		req.Header.Set("Authorization", "Bearer "+v)
		return attachment{where: "bearer", forms: forms}, nil
	case sch.Type == "http" && sch.Scheme == "basic":
		user, pass, ok := strings.Cut(v, ":")
		if !ok {
			return attachment{}, errors.New("a basic-auth credential must be stored as user:password")
		}
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":"+pass)))
		if len(pass) > 0 {
			forms = append(forms, []byte(pass))
		}
		return attachment{where: "basic", forms: forms}, nil
	}
	return attachment{}, errNoScheme
}

// pickScheme returns the named scheme, else the first alternative of the
// tool's requirement that is a single scheme sluice can satisfy.
func pickScheme(name string, tool *connectors.Tool, schemes map[string]*connectors.SecurityScheme) *connectors.SecurityScheme {
	if name != "" {
		return schemes[name]
	}
	for _, alt := range tool.Security {
		if len(alt) != 1 {
			continue
		}
		if s := schemes[alt[0]]; s != nil && supported(s) {
			return s
		}
	}
	return nil
}

func supported(s *connectors.SecurityScheme) bool {
	switch s.Type {
	case "apiKey":
		return s.In == "header" || s.In == "query" || s.In == "cookie"
	case "http":
		return s.Scheme == "bearer" || s.Scheme == "basic"
	}
	return false
}

func dropCookie(req *http.Request, name string) {
	cs := req.Cookies()
	req.Header.Del("Cookie")
	for _, c := range cs {
		if c.Name != name {
			req.AddCookie(c)
		}
	}
}
