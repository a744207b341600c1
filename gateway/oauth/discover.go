package oauth

// MCP authorization (the MCP specification's authorization section,
// 2025-06-18): a remote MCP server names its authorization server in its
// protected-resource metadata (RFC 9728), found from the WWW-Authenticate
// challenge of a 401 or at the well-known URL; the authorization server's
// own metadata (RFC 8414, or OpenID Connect discovery) gives the endpoints;
// a client is registered dynamically (RFC 7591) when none is configured;
// every authorization and token request names the server as the resource
// (RFC 8707), and a JWT access token whose audience is another resource is
// never sent.
//
// Only what is understood is accepted: https URLs (plain http only where
// the connector's allow_private covers the host, as for every credential),
// a metadata document whose resource is exactly the configured URL, an
// issuer exactly the one asked for, the authorization code grant with PKCE
// S256. Anything else is a *DiscoveryError naming the connector, the step
// and what was wrong.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/vault"
)

// Discovery steps, as DiscoveryError.Step names them.
const (
	StepProbe        = "probe"                         // the unauthenticated request and its 401 challenge
	StepResourceMeta = "protected-resource metadata"   // RFC 9728
	StepServerMeta   = "authorization-server metadata" // RFC 8414 / OIDC discovery
	StepRegistration = "client registration"           // RFC 7591
	StepAudience     = "token audience"                // RFC 8707: a JWT for another resource
	stepStore        = "registered client store"
)

// DiscoveryError is a remote MCP server whose authorization could not be
// found or is not one the gateway accepts. Its text names the connector,
// the step and the reason; it never carries a token or a client secret.
type DiscoveryError struct {
	Connector string
	Step      string
	Reason    string
}

func (e *DiscoveryError) Error() string {
	return fmt.Sprintf("oauth: %s: MCP authorization: %s: %s", e.Connector, e.Step, e.Reason)
}

// maxMetadata bounds a metadata or registration document.
const maxMetadata = 64 << 10

// ResourceMetadata is the part of RFC 9728's document the gateway uses.
type ResourceMetadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
}

// ServerMetadata is the part of RFC 8414's document the gateway uses.
type ServerMetadata struct {
	Issuer                        string   `json:"issuer"`
	AuthorizationEndpoint         string   `json:"authorization_endpoint"`
	TokenEndpoint                 string   `json:"token_endpoint"`
	RegistrationEndpoint          string   `json:"registration_endpoint"`
	RevocationEndpoint            string   `json:"revocation_endpoint"`
	ResponseTypesSupported        []string `json:"response_types_supported"`
	GrantTypesSupported           []string `json:"grant_types_supported"`
	CodeChallengeMethodsSupported []string `json:"code_challenge_methods_supported"`
	TokenAuthMethodsSupported     []string `json:"token_endpoint_auth_methods_supported"`
}

// Registered is a client the gateway registered dynamically: kept
// (encrypted) so that it is registered once, not per connect. It is
// reused only for the same issuer, resource and redirect URL.
type Registered struct {
	Issuer       string    `json:"issuer"`
	Resource     string    `json:"resource"`
	RedirectURL  string    `json:"redirect_url"`
	ClientID     string    `json:"client_id"`
	ClientSecret string    `json:"client_secret,omitempty"`
	RegisteredAt time.Time `json:"registered_at"`
}

// String names the client, never its secret.
func (r Registered) String() string { return "client " + r.ClientID + " at " + r.Issuer }

// GoString is String.
func (r Registered) GoString() string { return r.String() }

// RegisteredStore keeps dynamically registered clients by connector. Load
// returns ErrNoConnection when there is none.
type RegisteredStore interface {
	LoadRegistered(ctx context.Context, connector string) (Registered, error)
	SaveRegistered(ctx context.Context, connector string, r Registered) error
}

// Discovery makes a Client's endpoints (and, when it has no client id,
// the client itself) come from a remote MCP server's metadata. The
// Manager resolves it on first use and keeps the result; a failure is
// kept for Retry and then tried again.
type Discovery struct {
	// PlainOK says whether host may be reached over plain http (the
	// connector's allow_private; loopback in tests).
	PlainOK func(host string) bool
	// Registered keeps a dynamically registered client; nil: a client id
	// must be configured.
	Registered RegisteredStore
	// ClientName is sent at registration (default "sluice").
	ClientName string
	// Retry is how long a failed discovery is reported before it is tried
	// again (default 30s); Valid how long a successful one is used before
	// the metadata is read again (default 1h: an authorization server that
	// moved, or metadata that turned to another resource, is noticed).
	Retry time.Duration
	Valid time.Duration
	Now   func() time.Time

	mu     sync.Mutex // serialises discoveries; held while one runs
	done   *Client
	doneAt time.Time
	err    error
	at     time.Time
	// last is the outcome Status reports, readable while a discovery runs.
	last atomic.Pointer[error]
}

// Status is the discovery's last failure, or nil: what the Connections
// page and the tool list show for the connector.
func (d *Discovery) Status() error {
	if p := d.last.Load(); p != nil {
		return *p
	}
	return nil
}

func (d *Discovery) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

func (d *Discovery) resolve(ctx context.Context, c *Client, redirect string, register bool) (*Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock() // one discovery at a time per connector; the rest wait for its result
	valid := d.Valid
	if valid <= 0 {
		valid = time.Hour
	}
	if d.done != nil && d.now().Sub(d.doneAt) < valid {
		return d.done, nil
	}
	d.done = nil // expired: discovered again, and a failure now closes
	retry := d.Retry
	if retry <= 0 {
		retry = 30 * time.Second
	}
	if d.err != nil && d.now().Sub(d.at) < retry {
		return nil, d.err
	}
	rc, err := d.discover(ctx, c, redirect, register)
	if errors.Is(err, errNoClient) {
		return nil, err // not a discovery failure: neither kept nor reported
	}
	d.last.Store(&err)
	if err != nil {
		d.err, d.at = err, d.now()
		return nil, err
	}
	d.done, d.doneAt, d.err = rc, d.now(), nil
	return rc, nil
}

func (d *Discovery) discover(ctx context.Context, c *Client, redirect string, register bool) (*Client, error) {
	fail := func(step, format string, args ...any) error {
		return &DiscoveryError{Connector: c.Connector, Step: step, Reason: fmt.Sprintf(format, args...)}
	}
	if c.Resource == "" {
		return nil, fmt.Errorf("bug(): oauth: %s: discovery without a resource", c.Connector)
	}
	rm, err := d.ResourceMetadata(ctx, c.HTTP, c.Connector, c.Resource)
	if err != nil {
		return nil, err
	}
	var sm *ServerMetadata
	var tried []string
	for _, issuer := range rm.AuthorizationServers {
		if err := d.checkURL(issuer); err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", redact(issuer), err))
			continue
		}
		m, err := d.ServerMetadata(ctx, c.HTTP, c.Connector, issuer)
		if err != nil {
			var de *DiscoveryError
			if errors.As(err, &de) {
				tried = append(tried, de.Reason)
			} else {
				tried = append(tried, err.Error())
			}
			continue
		}
		sm = m
		break
	}
	if sm == nil {
		if len(rm.AuthorizationServers) == 0 {
			return nil, fail(StepResourceMeta, "names no authorization_servers")
		}
		return nil, fail(StepServerMeta, "no authorization server is usable: %s", strings.Join(tried, "; "))
	}
	rc := *c
	rc.Discovery = nil
	rc.Issuer = sm.Issuer
	rc.AuthURL = withQuery(sm.AuthorizationEndpoint, "resource", c.Resource)
	rc.TokenURL = sm.TokenEndpoint
	if rc.RevocationURL == "" {
		rc.RevocationURL = sm.RevocationEndpoint
	}
	if len(rc.Scopes) == 0 {
		rc.Scopes = slices.Clone(rm.ScopesSupported)
	}
	if rc.ClientID == "" {
		reg, err := d.client(ctx, c, sm, redirect, register)
		if err != nil {
			return nil, err
		}
		rc.ClientID = reg.ClientID
		if reg.ClientSecret != "" {
			secret := reg.ClientSecret
			rc.Secret = func(context.Context) ([]byte, error) { return []byte(secret), nil }
		} else {
			rc.Secret = nil // a public client: PKCE alone
		}
	}
	// RFC 8707: every token request (code exchange, refresh, revocation
	// aside) names the resource. x/oauth2 has no option for the refresh,
	// so the client's transport adds it to each token request's form.
	hc := *c.HTTP
	hc.Transport = resourceTransport{base: transport(c.HTTP), token: sm.TokenEndpoint, resource: c.Resource}
	rc.HTTP = &hc
	return &rc, nil
}

func transport(hc *http.Client) http.RoundTripper {
	if hc.Transport != nil {
		return hc.Transport
	}
	return http.DefaultTransport
}

// client is the registered client for c: the one kept, when it was made
// for this issuer, resource and redirect; else a new registration.
func (d *Discovery) client(ctx context.Context, c *Client, sm *ServerMetadata, redirect string, register bool) (Registered, error) {
	fail := func(format string, args ...any) error {
		return &DiscoveryError{Connector: c.Connector, Step: StepRegistration, Reason: fmt.Sprintf(format, args...)}
	}
	if d.Registered == nil {
		return Registered{}, fail("no client_id is configured and there is nowhere to keep a registered client; set credential.oauth2.client_id")
	}
	kept, err := d.Registered.LoadRegistered(ctx, c.Connector)
	switch {
	case err == nil && kept.Issuer == sm.Issuer && kept.Resource == c.Resource && kept.RedirectURL == redirect && kept.ClientID != "":
		return kept, nil
	case err != nil && !errors.Is(err, ErrNoConnection):
		return Registered{}, &DiscoveryError{Connector: c.Connector, Step: stepStore, Reason: "the registered client cannot be read: " + err.Error()}
	}
	if !register {
		return Registered{}, errNoClient
	}
	if sm.RegistrationEndpoint == "" {
		return Registered{}, fail("no client_id is configured and the authorization server offers no registration_endpoint (RFC 7591); set credential.oauth2.client_id")
	}
	if err := d.checkURL(sm.RegistrationEndpoint); err != nil {
		return Registered{}, fail("registration_endpoint %s: %v", redact(sm.RegistrationEndpoint), err)
	}
	reg, err := d.Register(ctx, c.HTTP, c.Connector, sm, redirect)
	if err != nil {
		return Registered{}, err
	}
	reg.Issuer, reg.Resource, reg.RedirectURL, reg.RegisteredAt = sm.Issuer, c.Resource, redirect, d.now().UTC()
	if err := d.Registered.SaveRegistered(ctx, c.Connector, reg); err != nil {
		return Registered{}, &DiscoveryError{Connector: c.Connector, Step: stepStore, Reason: "the registered client cannot be kept: " + err.Error()}
	}
	return reg, nil
}

// checkURL accepts an absolute https URL, or http to a host PlainOK allows.
func (d *Discovery) checkURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil || u.Host == "" || u.User != nil || u.Fragment != "":
		return errors.New("not an absolute URL without user info or fragment")
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && d.PlainOK != nil && d.PlainOK(u.Hostname()):
		return nil
	case u.Scheme == "http":
		return errors.New("plain http (tokens and client secrets cross it): want https, or an address inside the connector's allow_private")
	}
	return fmt.Errorf("scheme %q: want https", u.Scheme)
}

// ResourceMetadata finds and checks the remote's protected-resource
// metadata: from an unauthenticated request's 401 WWW-Authenticate
// resource_metadata parameter, else at the well-known URLs (RFC 9728
// 3.1: path-inserted, then the root). Its resource must be exactly
// resource (RFC 9728 3.3): metadata naming another resource is refused.
func (d *Discovery) ResourceMetadata(ctx context.Context, hc *http.Client, connector, resource string) (*ResourceMetadata, error) {
	fail := func(step, format string, args ...any) error {
		return &DiscoveryError{Connector: connector, Step: step, Reason: fmt.Sprintf(format, args...)}
	}
	ru, err := url.Parse(resource)
	if err != nil || ru.Host == "" {
		return nil, fail(StepProbe, "the server URL %q is not absolute", redact(resource))
	}
	var candidates []string
	if meta, err := probe(ctx, hc, resource); err != nil {
		return nil, fail(StepProbe, "%v", err)
	} else if meta != "" {
		if err := d.checkURL(meta); err != nil {
			return nil, fail(StepProbe, "the 401 challenge's resource_metadata %s: %v", redact(meta), err)
		}
		candidates = append(candidates, meta)
	} else {
		base := url.URL{Scheme: ru.Scheme, Host: ru.Host}
		if p := strings.TrimRight(ru.EscapedPath(), "/"); p != "" {
			candidates = append(candidates, base.String()+"/.well-known/oauth-protected-resource"+p)
		}
		candidates = append(candidates, base.String()+"/.well-known/oauth-protected-resource")
	}
	var why []string
	for _, u := range candidates {
		var rm ResourceMetadata
		if err := getJSON(ctx, hc, u, &rm); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", redact(u), err))
			continue
		}
		if !SameResource(rm.Resource, resource) {
			return nil, fail(StepResourceMeta, "%s names the resource %q, not this server's URL %q", redact(u), redact(rm.Resource), redact(resource))
		}
		if len(rm.BearerMethodsSupported) > 0 && !slices.Contains(rm.BearerMethodsSupported, "header") {
			return nil, fail(StepResourceMeta, "bearer_methods_supported %v has no \"header\"", rm.BearerMethodsSupported)
		}
		if len(rm.AuthorizationServers) == 0 {
			return nil, fail(StepResourceMeta, "%s names no authorization_servers", redact(u))
		}
		return &rm, nil
	}
	return nil, fail(StepResourceMeta, "not found: %s", strings.Join(why, "; "))
}

// probe sends the MCP server an unauthenticated request and returns the
// resource_metadata URL of its 401 Bearer challenge ("" when it has none).
// A server that answers without asking for a token is not one whose
// authorization can be discovered.
func probe(ctx context.Context, hc *http.Client, resource string) (string, error) {
	body := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sluice","version":"1"}}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, resource, strings.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("the server URL: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("the server could not be reached: %s", short(err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxMetadata))
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		return "", fmt.Errorf("an unauthenticated request got HTTP %d, not 401: the server does not ask for MCP authorization", resp.StatusCode)
	}
	for _, h := range resp.Header.Values("WWW-Authenticate") {
		if v, ok := bearerParam(h, "resource_metadata"); ok {
			return v, nil
		}
	}
	return "", nil
}

// bearerParam finds param in a WWW-Authenticate value's Bearer challenge
// (RFC 9110 11.6.1: auth-params, quoted or token values).
func bearerParam(h, param string) (string, bool) {
	i := strings.Index(strings.ToLower(h), "bearer ")
	if i < 0 {
		return "", false
	}
	s := h[i+len("bearer "):]
	for s != "" {
		s = strings.TrimLeft(s, " \t,")
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return "", false
		}
		name := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t")
		var val string
		if strings.HasPrefix(s, `"`) {
			var b strings.Builder
			j := 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return "", false // unterminated
			}
			val, s = b.String(), s[j+1:]
		} else {
			end := strings.IndexAny(s, ", \t")
			if end < 0 {
				end = len(s)
			}
			val, s = s[:end], s[end:]
		}
		if strings.EqualFold(name, param) {
			return val, true
		}
		if strings.Contains(name, " ") { // the next challenge's scheme: this one ended
			return "", false
		}
	}
	return "", false
}

// ServerMetadata fetches issuer's metadata: RFC 8414's well-known URL
// (path-inserted), then OpenID Connect discovery (path-inserted, then
// path-appended). The document's issuer must be exactly issuer (RFC 8414
// 3.3), its endpoints https (or allowed plain http), and it must offer the
// authorization code grant with PKCE S256.
func (d *Discovery) ServerMetadata(ctx context.Context, hc *http.Client, connector, issuer string) (*ServerMetadata, error) {
	fail := func(format string, args ...any) error {
		return &DiscoveryError{Connector: connector, Step: StepServerMeta, Reason: fmt.Sprintf(format, args...)}
	}
	iu, err := url.Parse(issuer)
	if err != nil || iu.Host == "" || iu.RawQuery != "" || iu.Fragment != "" {
		return nil, fail("issuer %q is not an https URL without query or fragment", redact(issuer))
	}
	base := url.URL{Scheme: iu.Scheme, Host: iu.Host}
	p := strings.TrimRight(iu.EscapedPath(), "/")
	urls := []string{base.String() + "/.well-known/oauth-authorization-server" + p}
	if p != "" {
		urls = append(urls, base.String()+"/.well-known/openid-configuration"+p)
	}
	urls = append(urls, base.String()+p+"/.well-known/openid-configuration")
	var why []string
	for _, u := range urls {
		var sm ServerMetadata
		if err := getJSON(ctx, hc, u, &sm); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", redact(u), err))
			continue
		}
		if sm.Issuer != issuer {
			return nil, fail("%s says its issuer is %q, not %q (RFC 8414 3.3: refused)", redact(u), redact(sm.Issuer), redact(issuer))
		}
		for k, v := range map[string]string{"authorization_endpoint": sm.AuthorizationEndpoint, "token_endpoint": sm.TokenEndpoint} {
			if v == "" {
				return nil, fail("%s has no %s", redact(u), k)
			}
			if err := d.checkURL(v); err != nil {
				return nil, fail("%s %s: %v", k, redact(v), err)
			}
		}
		if sm.RevocationEndpoint != "" && d.checkURL(sm.RevocationEndpoint) != nil {
			sm.RevocationEndpoint = "" // not used: Disconnect then only deletes
		}
		if !slices.Contains(sm.ResponseTypesSupported, "code") {
			return nil, fail("response_types_supported %v has no \"code\"", sm.ResponseTypesSupported)
		}
		if len(sm.GrantTypesSupported) > 0 && !slices.Contains(sm.GrantTypesSupported, "authorization_code") {
			return nil, fail("grant_types_supported %v has no \"authorization_code\"", sm.GrantTypesSupported)
		}
		if !slices.Contains(sm.CodeChallengeMethodsSupported, "S256") {
			return nil, fail("code_challenge_methods_supported %v has no \"S256\": PKCE is required", sm.CodeChallengeMethodsSupported)
		}
		return &sm, nil
	}
	return nil, fail("not found for issuer %s: %s", redact(issuer), strings.Join(why, "; "))
}

// Register registers the gateway as a client at sm's registration
// endpoint (RFC 7591): a confidential web client (client_secret_basic)
// when the server supports it, else a public one (PKCE alone), for the
// authorization code and refresh grants and redirect alone.
func (d *Discovery) Register(ctx context.Context, hc *http.Client, connector string, sm *ServerMetadata, redirect string) (Registered, error) {
	fail := func(format string, args ...any) error {
		return &DiscoveryError{Connector: connector, Step: StepRegistration, Reason: fmt.Sprintf(format, args...)}
	}
	auth := "none"
	if len(sm.TokenAuthMethodsSupported) == 0 || slices.Contains(sm.TokenAuthMethodsSupported, "client_secret_basic") {
		auth = "client_secret_basic" // RFC 8414 2: the default is client_secret_basic
	}
	name := d.ClientName
	if name == "" {
		name = "sluice"
	}
	body, _ := json.Marshal(map[string]any{
		"client_name":                name,
		"redirect_uris":              []string{redirect},
		"grant_types":                []string{"authorization_code", "refresh_token"},
		"response_types":             []string{"code"},
		"token_endpoint_auth_method": auth,
		"application_type":           "web",
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sm.RegistrationEndpoint, bytes.NewReader(body))
	if err != nil {
		return Registered{}, fail("registration_endpoint: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return Registered{}, fail("the registration endpoint could not be reached: %s", short(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetadata+1))
	if err != nil || len(b) > maxMetadata {
		return Registered{}, fail("the answer could not be read or is larger than %d bytes", maxMetadata)
	}
	var out struct {
		ClientID     string   `json:"client_id"`
		ClientSecret string   `json:"client_secret"`
		RedirectURIs []string `json:"redirect_uris"`
		Error        string   `json:"error"`
	}
	jerr := json.Unmarshal(b, &out)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		if jerr == nil && out.Error != "" && isToken(out.Error) {
			return Registered{}, fail("the server answered HTTP %d %s", resp.StatusCode, out.Error)
		}
		return Registered{}, fail("the server answered HTTP %d", resp.StatusCode)
	}
	switch {
	case jerr != nil:
		return Registered{}, fail("the answer is not JSON")
	case out.ClientID == "" || strings.ContainsAny(out.ClientID, "\r\n\x00"):
		return Registered{}, fail("the answer has no usable client_id")
	case len(out.RedirectURIs) > 0 && !slices.Equal(out.RedirectURIs, []string{redirect}):
		return Registered{}, fail("the server registered other redirect_uris than the gateway's callback")
	case auth == "client_secret_basic" && out.ClientSecret == "":
		return Registered{}, fail("a confidential client was registered without a client_secret")
	}
	return Registered{ClientID: out.ClientID, ClientSecret: out.ClientSecret}, nil
}

// getJSON fetches a metadata document: 200, JSON, bounded, no redirect
// followed (the client's CheckRedirect).
func getJSON(ctx context.Context, hc *http.Client, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("could not be fetched: %s", short(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" {
		return fmt.Errorf("Content-Type %q, not application/json", mt)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetadata+1))
	if err != nil {
		return fmt.Errorf("could not be read: %s", short(err))
	}
	if len(b) > maxMetadata {
		return fmt.Errorf("larger than %d bytes", maxMetadata)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errors.New("not a JSON document of the expected shape")
	}
	return nil
}

// LoadRegistered implements RegisteredStore: the client is one secret of
// the secret store (the local store, encrypted at rest, or Vault KV),
// "oauth2-client.CONNECTOR" at the connector's scope.
func (s SplitStore) LoadRegistered(ctx context.Context, connector string) (Registered, error) {
	v, err := s.Secrets.Get(ctx, "oauth2-client."+connector, vault.ConnectorScope(connector))
	if errors.Is(err, vault.ErrNotFound) {
		return Registered{}, ErrNoConnection
	}
	if err != nil {
		return Registered{}, err
	}
	var r Registered
	if err := json.Unmarshal(v.Reveal(), &r); err != nil {
		return Registered{}, errors.New("oauth: the stored registered client is not readable")
	}
	return r, nil
}

// SaveRegistered implements RegisteredStore.
func (s SplitStore) SaveRegistered(ctx context.Context, connector string, r Registered) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.Secrets.Set(ctx, "oauth2-client."+connector, vault.ConnectorScope(connector), vault.NewSecret(b))
}

// LoadRegistered implements RegisteredStore in the local store.
func (s LocalStore) LoadRegistered(ctx context.Context, connector string) (Registered, error) {
	return SplitStore{Secrets: s.Local}.LoadRegistered(ctx, connector)
}

// SaveRegistered implements RegisteredStore in the local store.
func (s LocalStore) SaveRegistered(ctx context.Context, connector string, r Registered) error {
	return SplitStore{Secrets: s.Local}.SaveRegistered(ctx, connector, r)
}
