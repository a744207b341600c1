package creds

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/vault"
)

// Local serves credentials from the embedded local store, trying the
// narrowest scope first: the connector's, then the calling user's, then the
// project's.
type Local struct{ Store *vault.Local }

func (l Local) Credential(ctx context.Context, ref Ref) (vault.Secret, error) {
	scopes := []vault.Scope{vault.ConnectorScope(ref.Connector)}
	if ref.Caller.User != "" {
		scopes = append(scopes, vault.UserScope(ref.Caller.User))
	}
	scopes = append(scopes, vault.Scope("project"))
	s, _, err := l.Store.Resolve(ctx, ref.Secret, scopes...)
	return s, err
}

func Open(ctx context.Context, cfg *config.Config, log *slog.Logger) (Source, error) {
	switch cfg.Secrets.Backend {
	case "local":
		st, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("secrets.local: %w", err)
		}
		return Local{Store: st}, nil
	case "vault":
		return openVault(ctx, cfg, log) // vault.go
	default:
		return nil, fmt.Errorf("secrets.backend: %q is not available in this build yet", cfg.Secrets.Backend)
	}
}

// CheckRefs reports every named secret the configuration refers to
// (a connector's credential.secret, an egress placeholder's secret) that
// the local store does not hold at any scope. It creates nothing: without
// a key file there can be no secrets yet.
func CheckRefs(ctx context.Context, cfg *config.Config) []error {
	type ref struct{ key, name string }
	var refs []ref
	for i, c := range cfg.Connectors {
		if c.Credential != nil && c.Credential.Secret != "" {
			refs = append(refs, ref{fmt.Sprintf("connectors[%d].credential.secret", i), c.Credential.Secret})
		}
		if c.Credential != nil && c.Credential.OAuth2 != nil && c.Credential.OAuth2.ClientSecret != "" {
			refs = append(refs, ref{fmt.Sprintf("connectors[%d].credential.oauth2.client_secret", i), c.Credential.OAuth2.ClientSecret})
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
	// Opened for reading only: validate creates no store or lock file.
	var entries []vault.Entry
	st, err := vault.OpenLocalExisting(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
	switch {
	case errors.Is(err, fs.ErrNotExist): // a key and no store: nothing stored yet
	case err != nil:
		return []error{fmt.Errorf("secrets.local: %w", err)}
	default:
		if entries, err = st.List(ctx); err != nil {
			return []error{fmt.Errorf("secrets.local: %w", err)}
		}
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

// Attachment is how a credential was put on a request; Forms lists the byte
// strings a reflecting upstream might echo back, for the scrubber.
type Attachment struct {
	Where string // "header:X-Api-Key", "query:key", "cookie:sid", "basic", "bearer"; several joined by ","
	Forms [][]byte
	// LeaseID is the Vault lease the credential came from (a dynamic
	// secret's), "" for none: an approval receipt names it.
	LeaseID string
}

var (
	errNoScheme  = errors.New("no security scheme of this operation can be satisfied by the configured credential")
	errAmbiguous = errors.New("the configured credential fits more than one security alternative of this operation")
	errNowhere   = errors.New("the spec gives the credential no place on this operation")
)

// Shape is what a connector's credential can be, as far as the gateway
// knows before it holds the value (from the config, or a stored value) or
// once it does (per call, from the value). It decides which
// securitySchemes the credential fits.
type Shape int

const (
	shapeUnknown Shape = iota // not known before a call: a Vault or per-user secret
	shapeToken                // no ':': it cannot be user:password, so never basic auth
	shapePair                 // has a ':': user:password where an operation offers basic auth, else a token
)

// String says what the shape means, for error messages.
func (s Shape) String() string {
	switch s {
	case shapeToken:
		return "a token (it has no ':', so it cannot be user:password)"
	case shapePair:
		return "user:password (it has a ':')"
	}
	return "a value not known before a call (a Vault or per-user secret)"
}

// configShape is the shape the configuration alone gives the credential: a
// Vault dynamic secret without field is joined as username:password (basic
// auth where an operation offers it, else the joined value, as a stored
// user:password is); per-
// call JWTs and identity tokens are tokens; anything else is not known
// until the value is.
func configShape(cr *config.Credential) Shape {
	if v := cr.Vault; v != nil {
		switch {
		case v.Dynamic != "" && v.Field == "":
			return shapePair
		case v.TransitKey != "" || v.OIDCRole != "":
			return shapeToken
		}
	}
	return shapeUnknown
}

// of narrows s by the value itself.
func (s Shape) of(v []byte) Shape {
	switch {
	case s != shapeUnknown:
		return s
	case bytes.IndexByte(v, ':') < 0:
		return shapeToken
	}
	return shapePair
}

// cases are the shapes a credential of shape s can have at a call.
func (s Shape) cases() []Shape {
	if s == shapeUnknown {
		return []Shape{shapeToken, shapePair}
	}
	return []Shape{s}
}

// Plan is how one connector's credential is attached. NewPlan makes
// it once from the config and the spec (serve refuses to start, and
// validate fails, on what it cannot decide); pick then decides each call
// with the same rules and the shape of the value actually fetched.
type Plan struct {
	schemes  map[string]*connectors.SecurityScheme
	shape    Shape                      // from the config and, where readable, the stored value
	declared bool                       // some operation declares a security requirement
	fixed    *connectors.SecurityScheme // credential.scheme, or credential.header/query as a scheme; nil: per operation
	explicit bool                       // fixed is credential.header/query: sent as configured, whatever the shape
	prefix   string                     // credential.prefix, with credential.header
}

// pick returns the schemes that carry the credential on tool (nil: the
// operation is sent without it) for a credential of shape s.
func (p *Plan) pick(tool *connectors.Tool, s Shape) ([]*connectors.SecurityScheme, error) {
	if !hasRequirement(tool) {
		if p.declared {
			// The spec says this operation needs no credential (security: [],
			// or no requirement beside operations that have one): it is sent
			// without it, by design. A public endpoint (health, login, JWKS)
			// never receives a secret it did not ask for.
			return nil, nil
		}
		if p.fixed != nil {
			return []*connectors.SecurityScheme{p.fixed}, nil // the spec says nothing; the config does
		}
		return nil, errNowhere
	}
	if p.fixed != nil {
		return []*connectors.SecurityScheme{p.fixed}, nil
	}
	var fits [][]*connectors.SecurityScheme
	var forms, why []string
	optional := false
	for _, names := range tool.Security {
		if len(names) == 0 {
			optional = true // {}: the API also takes the call without a credential
			continue
		}
		ss, reason := p.fit(names, s, false)
		if reason != "" {
			continue
		}
		if f := altForm(ss); !slices.Contains(forms, f) {
			forms = append(forms, f)
			fits = append(fits, ss)
		}
	}
	if s == shapePair && slices.ContainsFunc(fits, hasBasic) {
		// A ':' reads as user:password where the operation offers basic auth.
		fits = slices.DeleteFunc(fits, func(ss []*connectors.SecurityScheme) bool { return !hasBasic(ss) })
	}
	switch len(fits) {
	case 0:
		if optional {
			return nil, nil
		}
		for _, names := range tool.Security {
			if _, reason := p.fit(names, s, true); reason != "" {
				why = append(why, reason)
			}
		}
		return nil, &schemeError{unfit: why}
	case 1:
		return fits[0], nil
	}
	e := &schemeError{}
	for _, ss := range fits {
		e.choices = append(e.choices, altName(ss))
	}
	return nil, e
}

// fit returns the schemes of one alternative (names, all required at once)
// or why the credential, of shape s, cannot satisfy it: each scheme must be
// attachable and fit s, and no two may need the same header. Without
// explain the reason is only non-empty (a call that finds a fitting
// alternative formats nothing).
func (p *Plan) fit(names []string, s Shape, explain bool) ([]*connectors.SecurityScheme, string) {
	ss := make([]*connectors.SecurityScheme, 0, len(names))
	for _, n := range names {
		sc := p.schemes[n]
		if sc == nil {
			return nil, fmt.Sprintf("scheme %q is not in the spec's securitySchemes", n) // bug(): connectors checks this
		}
		if !attachable(sc) || !fitsShape(sc, s) {
			if !explain {
				return nil, "unfit"
			}
			if why := unattachable(sc); why != "" {
				return nil, why
			}
			return nil, misfit(sc, s)
		}
		for _, o := range ss {
			if slotOf(o) == slotOf(sc) {
				return nil, fmt.Sprintf("schemes %q and %q are required together and both go in %s", o.Name, n, slotOf(sc))
			}
		}
		ss = append(ss, sc)
	}
	return ss, ""
}

// attachable says whether the gateway can put a credential where sc says.
func attachable(sc *connectors.SecurityScheme) bool {
	switch sc.Type {
	case "apiKey":
		return sc.In == "header" || sc.In == "query" || sc.In == "cookie"
	case "http":
		return sc.Scheme == "bearer" || sc.Scheme == "basic"
	}
	return false
}

// fitsShape says whether a credential of shape s can be sent as sc.
func fitsShape(sc *connectors.SecurityScheme, s Shape) bool {
	if sc.Type == "http" && sc.Scheme == "basic" {
		return s != shapeToken
	}
	return true
}

// unattachable says why the gateway cannot attach a credential as sc, or "".
func unattachable(sc *connectors.SecurityScheme) string {
	if attachable(sc) {
		return ""
	}
	switch sc.Type {
	case "apiKey":
		return fmt.Sprintf("%q is an apiKey in %q, which is not a place sluice can attach to", sc.Name, sc.In)
	case "http":
		return fmt.Sprintf("%q is http %q, which sluice cannot attach (only bearer and basic)", sc.Name, sc.Scheme)
	case "oauth2", "openIdConnect":
		return fmt.Sprintf("%q is an %s scheme, which sluice cannot attach (it runs no OAuth flow)", sc.Name, sc.Type)
	}
	return fmt.Sprintf("%q is a %q scheme, which sluice cannot attach", sc.Name, sc.Type)
}

// misfit says why a credential of shape s does not fit sc, or "".
func misfit(sc *connectors.SecurityScheme, s Shape) string {
	if fitsShape(sc, s) {
		return ""
	}
	return fmt.Sprintf("%q is %s and the credential is %s", sc.Name, describe(sc), s)
}

// describe says what kind of scheme sc is, for people.
func describe(sc *connectors.SecurityScheme) string {
	switch sc.Type {
	case "apiKey":
		return "apiKey in " + sc.In + " " + sc.Param
	case "http":
		return "http " + sc.Scheme
	}
	return sc.Type
}

// slotOf is where sc puts the credential: two schemes of one alternative
// cannot share a slot.
func slotOf(sc *connectors.SecurityScheme) string {
	switch {
	case sc.Type == "http":
		return "header Authorization"
	case sc.In == "header":
		return "header " + http.CanonicalHeaderKey(sc.Param)
	}
	return sc.In + " " + sc.Param
}

// formOf is how sc sends the credential: alternatives with the same forms
// send the same bytes, so choosing between them is no choice.
func formOf(sc *connectors.SecurityScheme) string {
	if sc.Type == "http" {
		return sc.Scheme
	}
	return slotOf(sc)
}

func altForm(ss []*connectors.SecurityScheme) string {
	f := make([]string, len(ss))
	for i, sc := range ss {
		f[i] = formOf(sc)
	}
	sort.Strings(f)
	return strings.Join(f, " + ")
}

func altName(ss []*connectors.SecurityScheme) string {
	f := make([]string, len(ss))
	for i, sc := range ss {
		f[i] = fmt.Sprintf("%s (%s)", sc.Name, describe(sc))
	}
	return strings.Join(f, " + ")
}

func hasBasic(ss []*connectors.SecurityScheme) bool {
	return slices.ContainsFunc(ss, func(sc *connectors.SecurityScheme) bool { return sc.Type == "http" && sc.Scheme == "basic" })
}

func hasRequirement(t *connectors.Tool) bool {
	for _, alt := range t.Security {
		if len(alt) > 0 {
			return true
		}
	}
	return false
}

// schemeError says why an operation has no one way to carry the
// credential: it fits several alternatives (choices) or none (unfit, why
// each does not fit).
type schemeError struct {
	choices []string
	unfit   []string
}

func (e *schemeError) Error() string {
	if len(e.choices) > 0 {
		return "the credential fits more than one security alternative of this operation: " + strings.Join(e.choices, " or ") + "; set credential.scheme"
	}
	return "no security alternative of this operation fits the credential: " + strings.Join(e.unfit, "; ")
}

func (e *schemeError) Unwrap() error {
	if len(e.choices) > 0 {
		return errAmbiguous
	}
	return errNoScheme
}

// attach puts secret on req as plan decides for tool. The agent's own value
// for the same header, query parameter or cookie is replaced, never merged.
func Attach(req *http.Request, plan *Plan, tool *connectors.Tool, secret vault.Secret) (Attachment, error) {
	v := secret.Reveal()
	if bytes.ContainsAny(v, "\r\n\x00") {
		return Attachment{}, errors.New("credential contains CR, LF or NUL")
	}
	ss, err := plan.pick(tool, plan.shape.of(v))
	if err != nil || len(ss) == 0 {
		return Attachment{}, err
	}
	// Check every place before writing any, so that a refusal leaves req as it was.
	for _, sc := range ss {
		if plan.explicit {
			break
		}
		if why := misfit(sc, plan.shape.of(v)); why != "" {
			return Attachment{}, errors.New(why)
		}
		if sc.Type == "http" && sc.Scheme == "basic" && bytes.IndexByte(v, ':') < 0 {
			return Attachment{}, errors.New("a basic-auth credential must be stored as user:password")
		}
	}
	att := Attachment{Forms: [][]byte{v}, LeaseID: secret.LeaseID()}
	var where []string
	for _, sc := range ss {
		w, extra := put(req, sc, plan.prefixFor(sc), string(v))
		where = append(where, w)
		att.Forms = append(att.Forms, extra...)
	}
	att.Where = strings.Join(where, ",")
	return att, nil
}

func (p *Plan) prefixFor(sc *connectors.SecurityScheme) string {
	if p.explicit && sc == p.fixed {
		return p.prefix
	}
	return ""
}

// put writes v where sc says and returns that place and any further form
// of the secret a reply could echo (a basic-auth password on its own).
func put(req *http.Request, sc *connectors.SecurityScheme, prefix, v string) (string, [][]byte) {
	switch {
	case sc.Type == "http" && sc.Scheme == "bearer":
		req.Header.Set("Authorization", "Bearer "+v)
		return "bearer", nil
	case sc.Type == "http" && sc.Scheme == "basic":
		user, pass, _ := strings.Cut(v, ":")
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":"+pass)))
		if pass != "" {
			return "basic", [][]byte{[]byte(pass)}
		}
		return "basic", nil
	case sc.In == "query":
		q := req.URL.Query()
		q.Set(sc.Param, v)
		req.URL.RawQuery = q.Encode()
		return "query:" + sc.Param, nil
	case sc.In == "cookie":
		dropCookie(req, sc.Param)
		req.AddCookie(&http.Cookie{Name: sc.Param, Value: v})
		return "cookie:" + sc.Param, nil
	}
	req.Header.Set(sc.Param, prefix+v)
	return "header:" + sc.Param, nil
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

// NewPlan decides how connector key's credential is attached to conn's
// operations, for a credential of shape s. errs are what make validate fail
// and serve refuse to start (a credential with nowhere to go, an unknown or
// unattachable credential.scheme, operations it fits in several ways, no
// operation it fits); warns are operations that will be refused
// credential_unavailable while the rest work, and operations that need
// several schemes at once. It is the one place both decide.
func NewPlan(key string, cc config.Connector, conn *connectors.Connector, s Shape) (p *Plan, errs, warns []error) {
	cr := cc.Credential
	if cr == nil {
		return nil, nil, nil
	}
	key += ".credential"
	p = &Plan{schemes: conn.Schemes, shape: s}
	for _, t := range conn.Tools {
		if hasRequirement(t) {
			p.declared = true
			break
		}
	}
	switch {
	case cr.OAuth2 != nil:
		p.fixed = OAuthScheme
		return p, nil, nil
	case cr.Header != "":
		p.fixed, p.explicit, p.prefix = &connectors.SecurityScheme{Name: "credential.header", Type: "apiKey", In: "header", Param: cr.Header}, true, cr.Prefix
		return p, nil, nil
	case cr.Query != "":
		p.fixed, p.explicit = &connectors.SecurityScheme{Name: "credential.query", Type: "apiKey", In: "query", Param: cr.Query}, true
		return p, nil, nil
	case cr.Scheme != "":
		sc := conn.Schemes[cr.Scheme]
		switch {
		case sc == nil:
			return nil, []error{fmt.Errorf("%s.scheme: the spec has no securityScheme %q; %s", key, cr.Scheme, schemeList(conn.Schemes))}, nil
		case unattachable(sc) != "":
			return nil, []error{fmt.Errorf("%s.scheme: %s; use credential.header or credential.query instead, or %s", key, unattachable(sc), schemeList(conn.Schemes))}, nil
		case misfit(sc, s) != "":
			return nil, []error{fmt.Errorf("%s.scheme: %s", key, misfit(sc, s))}, nil // shapeUnknown fits every scheme
		}
		p.fixed = sc
		return p, nil, nil
	case !p.declared && len(conn.Tools) > 0:
		return nil, []error{fmt.Errorf("%s: no operation of the spec declares a security requirement, so the credential would go nowhere; set credential.header or credential.query (with prefix), or credential.scheme (%s)", key, schemeList(conn.Schemes))}, nil
	}
	type choice struct{ shape, choices string }
	ambiguous := map[choice][]string{} // -> tools
	var order []choice
	var unfit, multi []string
	needing := 0
	for _, t := range conn.Tools {
		if !hasRequirement(t) {
			continue
		}
		needing++
		var why []string
		fits := false
		for _, c := range s.cases() {
			ss, err := p.pick(t, c)
			var se *schemeError
			switch {
			case errors.As(err, &se) && len(se.choices) > 0:
				k := choice{s.String(), strings.Join(se.choices, " or ")}
				if _, ok := ambiguous[k]; !ok {
					order = append(order, k)
				}
				if ts := ambiguous[k]; len(ts) == 0 || ts[len(ts)-1] != t.Name {
					ambiguous[k] = append(ts, t.Name)
				}
				fits = true
			case errors.As(err, &se):
				why = append(why, se.unfit...)
			case err != nil:
				why = append(why, err.Error())
			default:
				fits = true
				if len(ss) > 1 {
					multi = append(multi, fmt.Sprintf("%s (%s)", t.Name, altName(ss)))
				}
			}
		}
		if !fits {
			slices.Sort(why)
			unfit = append(unfit, fmt.Sprintf("%s (%s)", t.Name, strings.Join(slices.Compact(why), "; ")))
		}
	}
	for _, k := range order {
		errs = append(errs, fmt.Errorf("%s: the credential, %s, fits more than one security alternative of %s: %s; set credential.scheme to the one it is for",
			key, k.shape, some(ambiguous[k], "operation"), k.choices))
	}
	switch {
	case len(unfit) > 0 && len(unfit) == needing:
		errs = append(errs, fmt.Errorf("%s: the credential, %s, fits no operation of the spec: %s", key, s, some(unfit, "operation")))
	case len(unfit) > 0:
		warns = append(warns, fmt.Errorf("%s: %s cannot carry the credential, %s, and will be refused 503 credential_unavailable: %s",
			key, count(len(unfit), "operation"), s, some(unfit, "operation")))
	}
	if multi = slices.Compact(multi); len(multi) > 0 {
		warns = append(warns, fmt.Errorf("%s: %s require several schemes at once; the one credential is sent as each: %s", key, count(len(multi), "operation"), some(multi, "operation")))
	}
	if len(errs) > 0 {
		return nil, errs, warns
	}
	return p, nil, warns
}

// schemeList names the securitySchemes a credential.scheme could pick.
func schemeList(schemes map[string]*connectors.SecurityScheme) string {
	if len(schemes) == 0 {
		return "the spec defines no securitySchemes"
	}
	var names []string
	for n, sc := range schemes {
		if unattachable(sc) == "" {
			names = append(names, fmt.Sprintf("%s (%s)", n, describe(sc)))
		} else {
			names = append(names, fmt.Sprintf("%s (%s, not attachable)", n, describe(sc)))
		}
	}
	sort.Strings(names)
	return "the spec's securitySchemes: " + strings.Join(names, ", ")
}

// some lists up to three of items and says how many more there are.
func some(items []string, noun string) string {
	const show = 3
	if len(items) <= show {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %s more", strings.Join(items[:show], ", "), count(len(items)-show, noun))
}

func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// StoredShape is the shape of connector cc's credential as both serve and
// validate see it before any call: configShape, narrowed by the value a
// named secret has in the local store at the connector's or the project's
// scope when the store exists (a per-user value is only known per call).
// It reads nothing from Vault (validate does not log in) and creates
// nothing.
func StoredShape(ctx context.Context, cfg *config.Config, cc config.Connector, local func() *vault.Local) Shape {
	s := configShape(cc.Credential)
	if s != shapeUnknown || cc.Credential.Secret == "" || cfg.Secrets.Backend != "local" {
		return s
	}
	st := local()
	if st == nil {
		return s
	}
	sec, _, err := st.Resolve(ctx, cc.Credential.Secret, vault.ConnectorScope(cc.Slug), vault.ScopeProject)
	if err != nil {
		return s
	}
	return s.of(sec.Reveal())
}

// ExistingLocal returns a func that opens the configured local store once,
// only if its file and key already exist (nil otherwise), creating
// nothing (not even the lock file).
func ExistingLocal(cfg *config.Config) func() *vault.Local {
	var st *vault.Local
	tried := false
	return func() *vault.Local {
		if tried {
			return st
		}
		tried = true
		var err error
		if st, err = vault.OpenLocalExisting(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile); err != nil {
			st = nil
		}
		return st
	}
}
