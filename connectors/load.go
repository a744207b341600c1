package connectors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
)

const (
	// maxSpecBytes caps what one Load reads in total: the spec plus every
	// document its $refs pull in.
	maxSpecBytes = 16 << 20
	// fetchTimeout bounds each https fetch, whatever client is used.
	fetchTimeout = 30 * time.Second
	// maxRedirects bounds redirects while fetching a spec; each must stay https.
	maxRedirects = 5
)

// param is one path, query or header parameter of a tool.
type param struct {
	name     string
	in       string // "path", "query" or "header"
	required bool
	style    string // "simple", "form", "spaceDelimited", "pipeDelimited" or "deepObject"
	explode  bool
	// reserved is allowReserved: a query value keeps RFC 3986 reserved
	// characters, a path value may hold "/" (never empty or dot segments).
	reserved bool
	schema   *openapi3.Schema // nil accepts any value
	desc     string
}

// Load reads a spec and returns its tools. Errors name the spec and, where
// possible, the operation.
func Load(ctx context.Context, opts Options) (*Connector, error) {
	if err := checkSlug(opts.Slug); err != nil {
		return nil, fmt.Errorf("connectors: load %s: %w", opts.Spec, err)
	}
	doc, specURL, err := readSpec(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connectors: load %s: %w", opts.Spec, err)
	}
	c, err := build(ctx, opts.Slug, doc, specURL, opts.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("connectors: load %s: %w", opts.Spec, err)
	}
	return c, nil
}

// LoadData builds a connector from spec bytes already in memory. External
// $refs are refused: there is no location to resolve them against. baseURL
// may be empty, in which case the spec's first server is used.
func LoadData(ctx context.Context, slug string, data []byte, baseURL string) (*Connector, error) {
	if err := checkSlug(slug); err != nil {
		return nil, fmt.Errorf("connectors: load data: %w", err)
	}
	if len(data) > maxSpecBytes {
		return nil, fmt.Errorf("connectors: load data: spec is over %d bytes", maxSpecBytes)
	}
	loader := newLoader(ctx)
	loader.ReadFromURIFunc = func(_ *openapi3.Loader, loc *url.URL) ([]byte, error) {
		return nil, fmt.Errorf("ref %s: external refs are not allowed in an in-memory spec", loc.Redacted())
	}
	doc, err := loadDoc(loader, data, nil)
	if err != nil {
		return nil, fmt.Errorf("connectors: load data: parse: %w", err)
	}
	c, err := build(ctx, slug, doc, nil, baseURL)
	if err != nil {
		return nil, fmt.Errorf("connectors: load data: %w", err)
	}
	return c, nil
}

func newLoader(ctx context.Context) *openapi3.Loader {
	loader := openapi3.NewLoader()
	loader.Context = ctx
	loader.IsExternalRefsAllowed = true // enforced by our ReadFromURIFunc instead
	return loader
}

// loadDoc parses and resolves a document, turning a panic inside the
// third-party loader into an error: spec bytes are input, and a malformed
// one must fail the load, not the process.
func loadDoc(loader *openapi3.Loader, data []byte, loc *url.URL) (doc *openapi3.T, err error) {
	defer func() {
		if r := recover(); r != nil {
			doc, err = nil, fmt.Errorf("openapi loader panicked: %v", r)
		}
	}()
	if loc == nil {
		return loader.LoadFromData(data)
	}
	return loader.LoadFromDataWithPath(data, loc)
}

// budget is what is left of maxSpecBytes for one Load.
type budget struct{ left int64 }

func (b *budget) read(r io.Reader, what string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, b.left+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if int64(len(data)) > b.left {
		return nil, fmt.Errorf("read %s: specs are capped at %d bytes in total", what, maxSpecBytes)
	}
	b.left -= int64(len(data))
	return data, nil
}

// readSpec loads the document named by opts.Spec: an https:// URL or a file.
// Its $refs may reach only documents of the same kind: an https spec refers
// to the same host over https, a file spec to files under its own directory.
func readSpec(ctx context.Context, opts Options) (*openapi3.T, *url.URL, error) {
	spec := opts.Spec
	if spec == "" {
		return nil, nil, errors.New("spec: empty")
	}
	b := &budget{left: maxSpecBytes}
	loader := newLoader(ctx)
	if u, err := url.Parse(spec); err == nil && len(u.Scheme) > 1 {
		if u.Scheme != "https" {
			return nil, nil, fmt.Errorf("spec: scheme %q is not allowed: use an https:// URL or a file path", u.Scheme)
		}
		if u.Host == "" || u.User != nil {
			return nil, nil, errors.New("spec: an https URL needs a host and no user info")
		}
		client := fetchClient(opts.Client)
		data, err := fetch(ctx, client, u, b)
		if err != nil {
			return nil, nil, err
		}
		loader.ReadFromURIFunc = func(_ *openapi3.Loader, loc *url.URL) ([]byte, error) {
			if loc.Scheme != "https" || loc.Host != u.Host || loc.User != nil {
				return nil, fmt.Errorf("ref %s: an https spec may refer only to https documents on %s", loc.Redacted(), u.Host)
			}
			return fetch(ctx, client, loc, b)
		}
		doc, err := loadDoc(loader, data, u)
		if err != nil {
			return nil, nil, fmt.Errorf("parse: %w", err)
		}
		return doc, u, nil
	}

	abs, err := filepath.Abs(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("spec: %w", err)
	}
	root := filepath.Dir(abs)
	data, err := readFile(abs, b)
	if err != nil {
		return nil, nil, err
	}
	loader.ReadFromURIFunc = func(_ *openapi3.Loader, loc *url.URL) ([]byte, error) {
		if (loc.Scheme != "" && loc.Scheme != "file") || loc.Host != "" || loc.User != nil {
			return nil, fmt.Errorf("ref %s: a file spec may refer only to files beside it", loc.Redacted())
		}
		p := filepath.Clean(filepath.FromSlash(loc.Path))
		if !filepath.IsAbs(p) {
			p = filepath.Join(root, p)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return nil, fmt.Errorf("ref %s: outside the spec's directory", loc.Path)
		}
		return readFile(p, b)
	}
	doc, err := loadDoc(loader, data, &url.URL{Path: filepath.ToSlash(abs)})
	if err != nil {
		return nil, nil, fmt.Errorf("parse: %w", err)
	}
	return doc, nil, nil
}

func readFile(name string, b *budget) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("open spec: %w", err)
	}
	defer f.Close()
	return b.read(f, name)
}

// fetchClient copies c (or a default) so that redirects are bounded and stay
// on https; the caller's client is not modified.
func fetchClient(c *http.Client) *http.Client {
	var cl http.Client
	if c != nil {
		cl = *c
	}
	if cl.Timeout == 0 {
		cl.Timeout = fetchTimeout
	}
	cl.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		if req.URL.Scheme != "https" {
			return fmt.Errorf("redirect to scheme %q refused", req.URL.Scheme)
		}
		return nil
	}
	return &cl
}

func fetch(ctx context.Context, client *http.Client, u *url.URL, b *budget) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", u.Redacted(), err)
	}
	req.Header.Set("Accept", "application/yaml, application/json;q=0.9, */*;q=0.1")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch %s: status %d", u.Redacted(), resp.StatusCode)
	}
	if resp.ContentLength > b.left {
		return nil, fmt.Errorf("fetch %s: specs are capped at %d bytes in total", u.Redacted(), maxSpecBytes)
	}
	return b.read(resp.Body, u.Redacted())
}

// methods lists the HTTP methods an OpenAPI path item may hold, in the order
// tools are built (the result is sorted by name anyway).
var methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"}

// build validates doc and turns each operation into a Tool.
func build(ctx context.Context, slug string, doc *openapi3.T, specURL *url.URL, baseOverride string) (c *Connector, err error) {
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("validate: openapi validator panicked: %v", r)
		}
	}()
	is31 := strings.HasPrefix(doc.OpenAPI, "3.1")
	if !is31 && !strings.HasPrefix(doc.OpenAPI, "3.0") {
		return nil, fmt.Errorf("version: openapi %q is not supported (want 3.0 or 3.1)", doc.OpenAPI)
	}
	vopts := []openapi3.ValidationOption{
		openapi3.DisableExamplesValidation(),
		openapi3.DisableSchemaDefaultsValidation(),
	}
	if err := doc.Validate(ctx, vopts...); err != nil {
		return nil, fmt.Errorf("validate: %w", err)
	}
	base, err := baseURL(doc, specURL, baseOverride)
	if err != nil {
		return nil, err
	}
	c = &Connector{Slug: slug, BaseURL: base, Schemes: securitySchemes(doc)}

	if doc.Paths == nil {
		return c, nil
	}
	byName := map[string]string{} // tool name → "METHOD /path"
	pathMap := doc.Paths.Map()
	paths := make([]string, 0, len(pathMap))
	for p := range pathMap {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		item := pathMap[p]
		if item == nil {
			continue
		}
		ops := item.Operations()
		for _, m := range sortedMethods(ops) {
			op := ops[m]
			where := strings.ToUpper(m) + " " + p
			if op.OperationID != "" {
				where += " (" + op.OperationID + ")"
			}
			t, skip, err := buildTool(slug, doc, c.Schemes, p, strings.ToUpper(m), item, op, is31)
			if err != nil {
				return nil, fmt.Errorf("operation %s: %w", where, err)
			}
			if skip != "" {
				c.Skipped = append(c.Skipped, where+": "+skip)
				continue
			}
			if prev, dup := byName[t.Name]; dup {
				return nil, fmt.Errorf("operation %s: tool name %s is also the name of operation %s", where, t.Name, prev)
			}
			byName[t.Name] = where
			c.Tools = append(c.Tools, t)
		}
	}
	sort.Slice(c.Tools, func(i, j int) bool { return c.Tools[i].Name < c.Tools[j].Name })
	return c, nil
}

func sortedMethods(ops map[string]*openapi3.Operation) []string {
	order := map[string]int{}
	for i, m := range methods {
		order[m] = i
	}
	ms := make([]string, 0, len(ops))
	for m, op := range ops {
		if op != nil {
			ms = append(ms, m)
		}
	}
	sort.Slice(ms, func(i, j int) bool {
		oi, iok := order[strings.ToUpper(ms[i])]
		oj, jok := order[strings.ToUpper(ms[j])]
		switch {
		case iok && jok:
			return oi < oj
		case iok != jok:
			return iok
		}
		return ms[i] < ms[j]
	})
	return ms
}

// baseURL picks Options.BaseURL, else the spec's first server with its
// variables set to their defaults. A relative server URL is resolved against
// the URL the spec was fetched from.
func baseURL(doc *openapi3.T, specURL *url.URL, override string) (*url.URL, error) {
	raw, what := override, "base_url"
	if raw == "" {
		if len(doc.Servers) == 0 || doc.Servers[0] == nil {
			return nil, nil
		}
		s := doc.Servers[0]
		raw, what = s.URL, "servers[0]"
		for name, v := range s.Variables {
			def := ""
			if v != nil {
				def = v.Default
			}
			raw = strings.ReplaceAll(raw, "{"+name+"}", def)
		}
		if strings.ContainsAny(raw, "{}") {
			return nil, fmt.Errorf("%s %q: a server variable has no value", what, raw)
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if !u.IsAbs() {
		if what == "base_url" {
			return nil, fmt.Errorf("base_url %q: must be an absolute http(s) URL", raw)
		}
		if specURL == nil {
			return nil, fmt.Errorf("servers[0] %q is relative and the spec was not fetched from a URL: set base_url", raw)
		}
		u = specURL.ResolveReference(u)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%s %q: scheme must be http or https", what, u.Redacted())
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return nil, fmt.Errorf("%s %q: need a host and no user info, query or fragment", what, u.Redacted())
	}
	return u, nil
}

func securitySchemes(doc *openapi3.T) map[string]*SecurityScheme {
	out := map[string]*SecurityScheme{}
	if doc.Components == nil {
		return out
	}
	for name, ref := range doc.Components.SecuritySchemes {
		if ref == nil || ref.Value == nil {
			continue
		}
		v := ref.Value
		s := &SecurityScheme{Name: name, Type: v.Type}
		switch v.Type {
		case "apiKey":
			s.In, s.Param = v.In, v.Name
		case "http":
			s.Scheme = strings.ToLower(v.Scheme)
		}
		out[name] = s
	}
	return out
}

// buildTool converts one operation. A non-empty skip says why the operation
// yields no tool (a request body in no media type this package can send).
func buildTool(slug string, doc *openapi3.T, schemes map[string]*SecurityScheme, path, method string, item *openapi3.PathItem, op *openapi3.Operation, is31 bool) (*Tool, string, error) {
	opID := op.OperationID
	snake := snakeCase(opID)
	if opID == "" {
		opID = derivedOperationID(method, path)
		snake = opID
	}
	if snake == "" {
		return nil, "", fmt.Errorf("operationId %q has no letters or digits to name a tool", op.OperationID)
	}
	t := &Tool{
		Name:         slug + "." + snake,
		Connector:    slug,
		OperationID:  opID,
		Method:       method,
		PathTemplate: path,
		Tags:         append([]string(nil), op.Tags...),
		Summary:      op.Summary,
		Description:  op.Description,
		schema2020:   is31,
	}

	t.Risk = RiskWrite
	if method == http.MethodGet || method == http.MethodHead {
		t.Risk = RiskRead
	}
	if v, ok := op.Extensions["x-sluice-risk"]; ok {
		switch v {
		case "read":
			t.Risk = RiskRead
		case "write":
			t.Risk = RiskWrite
		default:
			return nil, "", fmt.Errorf("x-sluice-risk %v: must be \"read\" or \"write\"", v)
		}
	}

	sec := doc.Security
	if op.Security != nil {
		sec = *op.Security
	}
	t.Security = [][]string{}
	for _, req := range sec {
		alt := make([]string, 0, len(req))
		for name := range req {
			if _, ok := schemes[name]; !ok {
				return nil, "", fmt.Errorf("security: scheme %q is not in components.securitySchemes", name)
			}
			alt = append(alt, name)
		}
		sort.Strings(alt)
		t.Security = append(t.Security, alt)
	}

	params, err := mergeParams(item.Parameters, op.Parameters, schemes)
	if err != nil {
		return nil, "", err
	}
	t.params = params
	if err := checkTemplate(path, params); err != nil {
		return nil, "", err
	}
	for _, p := range params {
		if p.in == openapi3.ParameterInHeader && strings.EqualFold(p.name, IdempotencyKey) {
			t.IdempotencyHeader = p.name
		}
	}

	if skip, err := t.setBody(op.RequestBody); err != nil || skip != "" {
		return nil, skip, err
	}

	schema, err := renderToolSchema(t, is31)
	if err != nil {
		return nil, "", err
	}
	t.Schema = schema
	return t, "", nil
}

// mergeParams merges path-item and operation parameters (the operation's win
// on the same name and location) and sorts them by location then name.
// Cookie parameters are dropped, as are header parameters that OpenAPI says
// to ignore (Accept, Content-Type, Authorization) and any parameter that is
// where an apiKey credential goes: the gateway attaches credentials, an agent
// never supplies or overrides one.
func mergeParams(pathLevel, opLevel openapi3.Parameters, schemes map[string]*SecurityScheme) ([]*param, error) {
	merged := map[string]*openapi3.Parameter{}
	var order []string
	for _, list := range []openapi3.Parameters{pathLevel, opLevel} {
		for _, ref := range list {
			if ref == nil || ref.Value == nil {
				return nil, errors.New("parameters: unresolved parameter")
			}
			p := ref.Value
			key := p.In + "\x00" + p.Name
			if p.In == openapi3.ParameterInHeader {
				key = p.In + "\x00" + http.CanonicalHeaderKey(p.Name)
			}
			if _, seen := merged[key]; !seen {
				order = append(order, key)
			}
			merged[key] = p
		}
	}
	credential := map[string]bool{}
	for _, s := range schemes {
		if s.Type == "apiKey" {
			if s.In == "header" {
				credential["header\x00"+http.CanonicalHeaderKey(s.Param)] = true
			} else {
				credential[s.In+"\x00"+s.Param] = true
			}
		}
	}
	var out []*param
	for _, key := range order {
		p := merged[key]
		if p.Name == "" {
			return nil, fmt.Errorf("parameter in %s: no name", p.In)
		}
		if credential[key] {
			continue
		}
		switch p.In {
		case openapi3.ParameterInCookie:
			continue
		case openapi3.ParameterInHeader:
			switch http.CanonicalHeaderKey(p.Name) {
			case "Accept", "Content-Type", "Authorization":
				continue
			}
			if !validHeaderName(p.Name) {
				return nil, fmt.Errorf("parameter %s: not a valid header name", p.Name)
			}
		case openapi3.ParameterInPath, openapi3.ParameterInQuery:
		default:
			return nil, fmt.Errorf("parameter %s: unknown location %q", p.Name, p.In)
		}
		np := &param{name: p.Name, in: p.In, required: p.Required || p.In == openapi3.ParameterInPath, desc: shorten(p.Description)}
		if p.Schema != nil {
			if p.Schema.Value == nil {
				return nil, fmt.Errorf("parameter %s.%s: unresolved schema", p.In, p.Name)
			}
			np.schema = p.Schema.Value
		} else if len(p.Content) > 0 {
			return nil, fmt.Errorf("parameter %s.%s: content-serialized parameters are not supported", p.In, p.Name)
		}
		np.style = p.Style
		switch p.In {
		case openapi3.ParameterInQuery:
			if np.style == "" {
				np.style = "form"
			}
			switch np.style {
			case "form", "spaceDelimited", "pipeDelimited", "deepObject":
			default:
				return nil, fmt.Errorf("parameter query.%s: style %q is not supported", p.Name, np.style)
			}
		default:
			if np.style == "" {
				np.style = "simple"
			}
			if np.style != "simple" {
				return nil, fmt.Errorf("parameter %s.%s: style %q is not supported", p.In, p.Name, np.style)
			}
		}
		np.explode = np.style == "form" || np.style == "deepObject"
		// allowReserved means nothing for a header (OpenAPI 3.0.3 §4.7.12.1).
		np.reserved = p.AllowReserved && p.In != openapi3.ParameterInHeader
		if p.Explode != nil {
			np.explode = *p.Explode
		}
		out = append(out, np)
	}
	rank := map[string]int{"path": 0, "query": 1, "header": 2}
	sort.Slice(out, func(i, j int) bool {
		if out[i].in != out[j].in {
			return rank[out[i].in] < rank[out[j].in]
		}
		return out[i].name < out[j].name
	})
	return out, nil
}

// checkTemplate makes sure the path template and the path parameters agree,
// so that NewRequest can fill every placeholder and nothing else.
func checkTemplate(path string, params []*param) error {
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("path %q: must start with /", path)
	}
	if strings.ContainsAny(path, "?#") {
		return fmt.Errorf("path %q: must not hold a query or fragment", path)
	}
	names, err := templateNames(path)
	if err != nil {
		return err
	}
	declared := map[string]bool{}
	for _, p := range params {
		if p.in == "path" {
			declared[p.name] = true
		}
	}
	for _, n := range names {
		if !declared[n] {
			return fmt.Errorf("path %q: {%s} has no path parameter", path, n)
		}
		delete(declared, n)
	}
	for n := range declared {
		return fmt.Errorf("path parameter %s: not in the path %q", n, path)
	}
	return nil
}

// templateNames lists the {placeholders} of a path template in order.
func templateNames(path string) ([]string, error) {
	var names []string
	rest := path
	for {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			return names, nil
		}
		if rest[i] == '}' {
			return nil, fmt.Errorf("path %q: unbalanced }", path)
		}
		j := strings.IndexAny(rest[i+1:], "{}")
		if j < 0 || rest[i+1+j] != '}' || j == 0 {
			return nil, fmt.Errorf("path %q: bad placeholder", path)
		}
		names = append(names, rest[i+1:i+1+j])
		rest = rest[i+2+j:]
	}
}

// pickMedia chooses the request body's media type: application/json, any
// other +json type, application/x-www-form-urlencoded, multipart/form-data,
// then a binary body: application/octet-stream, an image type, */*.
func pickMedia(content openapi3.Content) (string, *openapi3.MediaType) {
	keys := make([]string, 0, len(content))
	for k := range content {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	bare := func(k string) string {
		if i := strings.IndexByte(k, ';'); i >= 0 {
			k = k[:i]
		}
		return strings.ToLower(strings.TrimSpace(k))
	}
	for _, want := range []func(string) bool{
		func(k string) bool { return k == "application/json" },
		func(k string) bool { return strings.HasPrefix(k, "application/") && strings.HasSuffix(k, "+json") },
		func(k string) bool { return k == formType },
		func(k string) bool { return k == multipartType },
		func(k string) bool { return k == octetType },
		func(k string) bool { return strings.HasPrefix(k, "image/") && validMediaType(k) },
		func(k string) bool { return k == "*/*" },
	} {
		for _, k := range keys {
			if b := bare(k); want(b) && content[k] != nil {
				return b, content[k]
			}
		}
	}
	return "", nil
}

// validMediaType reports whether s is type/subtype made of RFC 9110 tokens
// (or a * subtype), so that it can be sent as a Content-Type.
func validMediaType(s string) bool {
	typ, sub, ok := strings.Cut(s, "/")
	return ok && validHeaderName(typ) && validHeaderName(sub)
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
