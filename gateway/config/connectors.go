package config

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// Connector is one API the gateway fronts.
type Connector struct {
	Slug         string   `yaml:"slug"`
	Provider     string   `yaml:"provider"`
	Spec         string   `yaml:"spec"`
	BaseURL      string   `yaml:"base_url"`
	AllowPrivate []string `yaml:"allow_private"`
	// AllowPrivateCoversMetadata acknowledges an allow_private entry that
	// overlaps a cloud metadata range (MetadataRanges). Without it such an
	// entry is an error: the guard still refuses the metadata addresses it
	// knows, but the rest of those ranges (other link-local instance
	// services) become dialable.
	AllowPrivateCoversMetadata bool        `yaml:"allow_private_covers_metadata"`
	Credential                 *Credential `yaml:"credential"`
	// URL is a remote MCP server's streamable HTTP endpoint (provider:
	// mcp): the gateway is its MCP client and re-exposes its tools.
	URL string `yaml:"url"`
	// Refresh is how often a remote MCP server's tool list is fetched
	// again besides its notifications/tools/list_changed (provider: mcp;
	// default 5m).
	Refresh Duration `yaml:"refresh"`
	// ListUser is the service identity a per-user credential ({user} in
	// its Vault path) is fetched for when the gateway lists a remote MCP
	// server's tools (provider: mcp): a listing has no caller. Unset, such
	// a remote's tools are unavailable (mcp_list.go).
	ListUser string `yaml:"list_user"`
	// Strict refuses the connector when any operation of its spec is
	// skipped or any defect is found, instead of loading what can be.
	Strict bool `yaml:"strict"`
}

// Credential says how the gateway authenticates to a connector's API.
type Credential struct {
	// Secret names a secret in the configured store.
	Secret string `yaml:"secret"`
	// Vault references a Vault secret (the Vault issue).
	Vault *VaultRef `yaml:"vault"`
	// Scheme picks one of the spec's securitySchemes by name; empty means
	// the operation's own requirement decides.
	Scheme string `yaml:"scheme"`
	// Header, Query and Prefix attach explicitly instead of by securityScheme:
	// the value goes into Header (with Prefix, e.g. "Bearer ") or Query.
	Header string `yaml:"header"`
	Query  string `yaml:"query"`
	Prefix string `yaml:"prefix"`
	// OAuth2 makes the gateway an OAuth 2.0 client of the connector's API
	// (package gateway/oauth): per person (authorization_code, connected
	// on the review UI's Connections page) or per connector
	// (client_credentials). The access token goes in Authorization: Bearer.
	OAuth2 *OAuth2 `yaml:"oauth2"`
}

// OAuth2 is a connector's OAuth 2.0 client. The URLs default to the spec's
// oauth2 securityScheme flow (Scheme names it when there are several).
type OAuth2 struct {
	Flow     string `yaml:"flow"` // authorization_code | client_credentials
	ClientID string `yaml:"client_id"`
	// ClientSecret names a secret in the configured store (local or
	// Vault), looked up at the connector's scope, then the project's.
	ClientSecret     string   `yaml:"client_secret"`
	Scopes           []string `yaml:"scopes"`
	Scheme           string   `yaml:"scheme"`
	AuthorizationURL string   `yaml:"authorization_url"`
	TokenURL         string   `yaml:"token_url"`
	// RevocationURL (RFC 7009) is where Disconnect revokes the tokens;
	// without it they are only deleted here.
	RevocationURL string `yaml:"revocation_url"`
	// OnMissing is what a call for a person without a usable connection
	// gets: "refuse" (default: 403 connection_required) or "hold" (held
	// like an ask until the person connects, then sent once).
	OnMissing string `yaml:"on_missing"`
}

// VaultRef is a Vault-backed credential: exactly one of KV, Dynamic,
// TransitKey or OIDCRole. KV and Dynamic paths may contain {user} (the
// person the session acts for: a call without one is refused) and
// {connector}.
type VaultRef struct {
	// KV is a KV API path (secret/data/billing for KV v2); Field picks the
	// value (default "value").
	KV    string `yaml:"kv"`
	Field string `yaml:"field"`
	// Dynamic is a path that returns a leased secret (database/creds/ro):
	// leased per session, renewed, revoked when the session ends. Without
	// Field, its username and password become user:password (basic auth).
	Dynamic string `yaml:"dynamic"`
	// TransitKey signs a JWT per call (claims: agent, session, user, tool,
	// aud, req_sha256) with the transit engine; TTL default 5m.
	TransitKey string `yaml:"transit_key"`
	// OIDCRole mints Vault identity tokens (no per-call claims).
	OIDCRole string `yaml:"oidc_role"`
	// Audience is the aud claim (transit_key: required; oidc_role: checked).
	Audience string   `yaml:"audience"`
	TTL      Duration `yaml:"ttl"`
}

// validateConnectors checks connectors[]: each slug (returned, for
// agents[].connectors), its provider, spec, base_url, allow_private and
// credential.
func validateConnectors(c *Config, bad func(key, format string, args ...any)) map[string]bool {
	slugs := map[string]bool{}
	for i, cn := range c.Connectors {
		k := fmt.Sprintf("connectors[%d]", i)
		if !slugRE.MatchString(cn.Slug) {
			bad(k+".slug", "want lower-case letters, digits and dashes (at most 63), got %q", cn.Slug)
		} else if slugs[cn.Slug] {
			bad(k+".slug", "%q is used twice", cn.Slug)
		}
		slugs[cn.Slug] = true
		mcp := cn.Provider == "mcp"
		switch {
		case cn.Provider != "" && cn.Provider != "openapi" && !mcp:
			bad(k+".provider", "want openapi or mcp, got %q", cn.Provider)
		case mcp:
			mcpConnectorProblems(k, cn, bad)
		case cn.URL != "":
			bad(k+".url", "only with provider: mcp (an OpenAPI connector has spec and base_url)")
		case cn.Refresh != 0:
			bad(k+".refresh", "only with provider: mcp")
		case cn.ListUser != "":
			bad(k+".list_user", "only with provider: mcp")
		}
		switch { // a provider: mcp connector has no spec (mcpConnectorProblems)
		case mcp:
		case cn.Spec == "":
			bad(k+".spec", "must be set (a file or an https URL)")
		case strings.HasPrefix(cn.Spec, "http://"):
			bad(k+".spec", "a spec URL must be https")
		}
		if u, err := url.Parse(cn.Spec); !mcp && err == nil && u.Scheme == "https" && u.User != nil {
			bad(k+".spec", "a spec URL must not carry user info (got %q): a credential does not belong in sluice.yaml", RedactURL(cn.Spec))
		}
		if cn.BaseURL != "" && !mcp {
			u, err := url.Parse(cn.BaseURL)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
				bad(k+".base_url", "want http(s)://host[:port][/path] without user, query or fragment, got %q", RedactURL(cn.BaseURL))
			}
		}
		covers := false
		for j, p := range cn.AllowPrivate {
			pfx, err := ParseAllowPrivate(p)
			if err != nil {
				bad(fmt.Sprintf("%s.allow_private[%d]", k, j), "%v", err)
				continue
			}
			if m, ok := CoversMetadata(pfx); ok {
				covers = true
				if !cn.AllowPrivateCoversMetadata {
					bad(fmt.Sprintf("%s.allow_private[%d]", k, j), "%s overlaps the cloud metadata range %s: instance services there hand out credentials; narrow it, or set %s.allow_private_covers_metadata: true if this connector really needs it", p, m, k)
				}
			}
		}
		if cn.AllowPrivateCoversMetadata && !covers {
			bad(k+".allow_private_covers_metadata", "no allow_private entry overlaps a metadata range: remove the key")
		}
		if cr := cn.Credential; cr != nil {
			ck := k + ".credential"
			switch {
			case cr.Secret == "" && cr.Vault == nil && cr.OAuth2 == nil:
				bad(ck, "needs secret, vault or oauth2")
			case cr.Secret != "" && cr.Vault != nil:
				bad(ck, "secret and vault are exclusive")
			case cr.OAuth2 != nil && (cr.Secret != "" || cr.Vault != nil || cr.Header != "" || cr.Query != "" || cr.Scheme != ""):
				bad(ck+".oauth2", "is exclusive with secret, vault, header, query and scheme (the access token goes in Authorization: Bearer)")
			case cr.Secret != "" && !nameRE.MatchString(cr.Secret):
				bad(ck+".secret", "not a secret name: %q", cr.Secret)
			}
			reservedSecret(ck+".secret", cr.Secret, bad) // oauthnames.go
			if cr.Vault != nil {
				v := cr.Vault
				n := 0
				for _, s := range []string{v.KV, v.Dynamic, v.TransitKey, v.OIDCRole} {
					if s != "" {
						n++
					}
				}
				if n != 1 {
					bad(ck+".vault", "needs exactly one of kv, dynamic, transit_key or oidc_role")
				}
				if c.Secrets.Backend != "vault" {
					bad(ck+".vault", "needs secrets.backend: vault")
				}
				for key, p := range map[string]string{"kv": v.KV, "dynamic": v.Dynamic} {
					if p != "" && !vaultPathOK(p) {
						bad(ck+".vault."+key, "want a Vault path of letters, digits, '_', '-', '.', '/' and the placeholders {user} and {connector}, without '..' or a leading '/', got %q", p)
					}
				}
				for key, p := range map[string]string{"transit_key": v.TransitKey, "oidc_role": v.OIDCRole} {
					if p != "" && !nameRE.MatchString(p) {
						bad(ck+".vault."+key, "not a name: %q", p)
					}
				}
				if v.Field != "" && v.KV == "" && v.Dynamic == "" {
					bad(ck+".vault.field", "only with kv or dynamic")
				}
				if v.TransitKey != "" && v.Audience == "" {
					bad(ck+".vault.audience", "is required with transit_key (the upstream checks it)")
				}
				if v.TTL != 0 && (v.TransitKey == "" || v.TTL.Std() < time.Second || v.TTL.Std() > time.Hour) {
					bad(ck+".vault.ttl", "only with transit_key, between 1s and 1h")
				}
			}
			if o := cr.OAuth2; o != nil {
				validateOAuth2(ck+".oauth2", o, c, cn.Provider == "mcp", bad)
			}
			if cr.Header != "" && cr.Query != "" {
				bad(ck, "header and query are exclusive")
			}
			if cr.Header != "" && !headerRE.MatchString(cr.Header) {
				bad(ck+".header", "not a header name: %q", cr.Header)
			}
			if strings.ContainsAny(cr.Prefix, "\r\n\x00") {
				bad(ck+".prefix", "must not contain CR, LF or NUL")
			}
			if cr.Scheme != "" && (cr.Header != "" || cr.Query != "") {
				bad(ck+".scheme", "scheme and header/query are exclusive")
			}
		}
	}
	return slugs
}

// ParseAllowPrivate parses one allow_private entry: a CIDR (host bits
// cleared: 10.0.0.5/8 is 10.0.0.0/8) or a bare address, which means that
// address alone (10.0.0.5 is 10.0.0.5/32, fd00::5 is fd00::5/128). The
// gateway admits exactly what this returns.
func ParseAllowPrivate(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("want a CIDR like 10.0.0.0/8 or an address like 10.0.0.5, got %q (no zone)", s)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("want a CIDR like 10.0.0.0/8 or an address like 10.0.0.5, got %q", s)
	}
	return p.Masked(), nil
}

// validateOAuth2 checks a connector's oauth2 client. URLs left empty
// come from the spec (checked when it is loaded).
func validateOAuth2(k string, o *OAuth2, c *Config, mcp bool, bad func(key, format string, args ...any)) {
	switch o.Flow {
	case "authorization_code":
		if c.Approvals.PublicURL == "" {
			bad("approvals.public_url", "must be set with %s.flow: authorization_code: the redirect URL is built from it", k)
		}
	case "client_credentials":
		if o.ClientSecret == "" {
			bad(k+".client_secret", "is required with flow: client_credentials")
		}
	case "":
		bad(k+".flow", "must be set: authorization_code (per person) or client_credentials (per connector)")
	default:
		bad(k+".flow", "want authorization_code or client_credentials, got %q", o.Flow)
	}
	if o.ClientID == "" && !mcp { // a remote MCP server's may be registered (RFC 7591)
		bad(k+".client_id", "must be set")
	} else if strings.ContainsAny(o.ClientID, "\r\n\x00") {
		bad(k+".client_id", "must not contain CR, LF or NUL")
	}
	reservedSecret(k+".client_secret", o.ClientSecret, bad) // oauthnames.go
	if o.ClientSecret != "" && !nameRE.MatchString(o.ClientSecret) {
		bad(k+".client_secret", "not a secret name: %q (name a secret in the store; the value never goes in sluice.yaml)", o.ClientSecret)
	}
	for i, sc := range o.Scopes {
		if sc == "" || strings.ContainsAny(sc, " \t\r\n\x00\"\\") {
			bad(fmt.Sprintf("%s.scopes[%d]", k, i), "not a scope token: %q", sc)
		}
	}
	for key, v := range map[string]string{"authorization_url": o.AuthorizationURL, "token_url": o.TokenURL, "revocation_url": o.RevocationURL} {
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.Fragment != "" {
			bad(k+"."+key, "want an absolute http(s) URL without user info or fragment, got %q", RedactURL(v))
		}
	}
	switch o.OnMissing {
	case "", "refuse":
	case "hold":
		if o.Flow != "authorization_code" {
			bad(k+".on_missing", "hold is for flow: authorization_code (a person connects)")
		}
	default:
		bad(k+".on_missing", "want refuse or hold, got %q", o.OnMissing)
	}
	if o.AuthorizationURL != "" && o.Flow == "client_credentials" {
		bad(k+".authorization_url", "is not used with flow: client_credentials")
	}
}

// RedactURL is s fit for an error message: a URL can carry a credential
// in its user info (https://user:token@host) or its query (?api_key=…),
// so both are replaced by "REDACTED" (the fragment is dropped), and text
// that does not parse as a URL is not shown at all.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(not shown: not a URL)"
	}
	if u.Opaque != "" { // scheme:opaque, e.g. sqlite:path or postgres:… without //
		if strings.ContainsAny(u.Opaque, "@?") || u.RawQuery != "" {
			return u.Scheme + ":REDACTED"
		}
		return u.Scheme + ":" + u.Opaque
	}
	user, query := u.User != nil, u.RawQuery != "" || u.ForceQuery
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	out := u.String()
	if user {
		if scheme, rest, ok := strings.Cut(out, "//"); ok {
			out = scheme + "//REDACTED@" + rest
		}
	}
	if query {
		out += "?REDACTED"
	}
	return out
}

// MetadataRanges are where cloud instance metadata and credential services
// live, and the IPv6 forms that embed the IPv4 ones (IPv4-mapped, NAT64
// RFC 6052, 6to4 RFC 3056). An allow_private entry overlapping one needs
// allow_private_covers_metadata. The guard refuses the known metadata
// addresses whatever allow_private says; these ranges are wider because
// new services appear in them (EKS Pod Identity at 169.254.170.23 and
// fd00:ec2::23).
var MetadataRanges = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),     // link-local: AWS, GCP, Azure, OpenStack, Oracle IMDS; AWS ECS/EKS credentials
	netip.MustParsePrefix("fd00:ec2::/32"),      // AWS IMDS and EKS Pod Identity over IPv6
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
	netip.MustParsePrefix("168.63.129.16/32"),   // Azure WireServer
	netip.MustParsePrefix("::ffff:169.254.0.0/112"),
	netip.MustParsePrefix("64:ff9b::a9fe:0/112"),
	netip.MustParsePrefix("2002:a9fe::/32"),
	netip.MustParsePrefix("::ffff:100.100.100.200/128"),
	netip.MustParsePrefix("64:ff9b::6464:64c8/128"),
	netip.MustParsePrefix("2002:6464:64c8::/48"),
	netip.MustParsePrefix("::ffff:168.63.129.16/128"),
	netip.MustParsePrefix("64:ff9b::a83f:8110/128"),
	netip.MustParsePrefix("2002:a83f:8110::/48"),
}

// CoversMetadata returns the first metadata range p overlaps.
func CoversMetadata(p netip.Prefix) (netip.Prefix, bool) {
	for _, m := range MetadataRanges {
		if p.Overlaps(m) {
			return m, true
		}
	}
	return netip.Prefix{}, false
}

// DefaultMCPRefresh is how often a remote MCP server's tool list is
// fetched again when connectors[].refresh is unset.
const DefaultMCPRefresh = 5 * time.Minute

// mcpConnectorProblems checks a provider: mcp connector: an https url
// (http only to an address literal, which the guard then judges with
// allow_private), no spec or base_url, a credential sent in a header.
func mcpConnectorProblems(k string, cn Connector, bad func(key, format string, args ...any)) {
	u, err := url.Parse(cn.URL)
	switch {
	case cn.URL == "":
		bad(k+".url", "is required with provider: mcp (the remote server's streamable HTTP endpoint, https://…)")
	case err != nil || u.Host == "" || u.User != nil || u.Fragment != "":
		bad(k+".url", "want https://host[:port][/path] without user or fragment, got %q", RedactURL(cn.URL))
	case u.Scheme == "http":
		if _, err := netip.ParseAddr(u.Hostname()); err != nil {
			bad(k+".url", "a remote MCP server by name must be https (plain http only to an address literal inside allow_private), got %q", RedactURL(cn.URL))
		}
	case u.Scheme != "https":
		bad(k+".url", "want https://…, got %q", RedactURL(cn.URL))
	}
	if cn.Spec != "" {
		bad(k+".spec", "not with provider: mcp (the tools are listed by the remote server)")
	}
	if cn.BaseURL != "" {
		bad(k+".base_url", "not with provider: mcp (use url)")
	}
	if cn.Refresh != 0 && (cn.Refresh.Std() < 10*time.Second || cn.Refresh.Std() > 24*time.Hour) {
		bad(k+".refresh", "want between 10s and 24h, got %s", cn.Refresh.Std())
	}
	listUserProblems(k, cn, bad) // mcp_list.go
	if cr := cn.Credential; cr != nil {
		if cr.Query != "" {
			bad(k+".credential.query", "not with provider: mcp (an MCP request carries the credential in a header)")
		}
		if cr.Scheme != "" {
			bad(k+".credential.scheme", "not with provider: mcp (there is no spec; use header and prefix, default Authorization: Bearer)")
		}
		if cr.Prefix != "" && cr.Header == "" {
			bad(k+".credential.prefix", "needs credential.header with provider: mcp")
		}
		if o := cr.OAuth2; o != nil { // MCP authorization (gateway/oauth/discover.go)
			mcpOAuth2Problems(k+".credential.oauth2", o, bad)
		}
	}
}
