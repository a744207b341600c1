package connectors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"sort"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"golang.org/x/sync/errgroup"
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

	schemaRef *openapi3.SchemaRef // as written, for rendering ($ref kept)
	pointer   string              // JSON pointer of the parameter in the spec
}

// Load reads a spec and returns its tools. Errors name the spec and, where
// possible, the operation.
func Load(ctx context.Context, opts Options) (*Connector, error) {
	if err := checkSlug(opts.Slug); err != nil {
		return nil, fmt.Errorf("connectors: load %s: %w", shownSpec(opts.Spec), err)
	}
	doc, specURL, err := readSpec(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connectors: load %s: %w", shownSpec(opts.Spec), err)
	}
	c, err := build(ctx, opts.Slug, doc, specURL, opts.BaseURL, opts.Strict, opts.Defects)
	if err != nil {
		return nil, fmt.Errorf("connectors: load %s: %w", shownSpec(opts.Spec), err)
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
	doc, err := readData(ctx, data)
	if err != nil {
		return nil, fmt.Errorf("connectors: load data: %w", err)
	}
	c, err := build(ctx, slug, doc, nil, baseURL, false, false)
	if err != nil {
		return nil, fmt.Errorf("connectors: load data: %w", err)
	}
	return c, nil
}

// methods lists the HTTP methods an OpenAPI path item may hold, in the order
// tools are built (the result is sorted by name anyway).
var methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"}

// build turns each operation of doc into a Tool. It is lenient the way a
// user needs it to be with a vendor's spec: an operation whose own
// parameters, request body or security cannot be understood is skipped
// with its reason, and a defect anywhere else (a response schema, an
// unused component) is reported and drops nothing. With strict, any
// skipped operation or defect, or anything kin-openapi's validator finds,
// fails the load, listing all of them.
func build(ctx context.Context, slug string, doc *openapi3.T, specURL *url.URL, baseOverride string, strict, report bool) (c *Connector, err error) {
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("build: openapi document panicked: %v", r)
		}
	}()
	is31 := strings.HasPrefix(doc.OpenAPI, "3.1")
	if !is31 && !strings.HasPrefix(doc.OpenAPI, "3.0") {
		return nil, fmt.Errorf("version: openapi %q is not supported (want 3.0 or 3.1, or Swagger 2.0)", doc.OpenAPI)
	}
	base, err := baseURL(doc, specURL, baseOverride)
	if err != nil {
		return nil, err
	}
	c = &Connector{Slug: slug, BaseURL: base, Schemes: securitySchemes(doc)}
	d := newDefs(is31)

	// Render every operation's schema in order (named schemas become defs
	// as they are met, so their names are stable), then compile them all
	// on every core, then name them in order.
	type candidate struct {
		where, ptr string
		t          *Tool
		used       []*def
		err        error
	}
	var cands []*candidate
	var paths []string
	var pathMap map[string]*openapi3.PathItem
	if doc.Paths != nil {
		pathMap = doc.Paths.Map()
		for p := range pathMap {
			paths = append(paths, p)
		}
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
			cd := &candidate{where: strings.ToUpper(m) + " " + p, ptr: "#/paths/" + pointerEscape(p) + "/" + strings.ToLower(m)}
			if op.OperationID != "" {
				cd.where += " (" + op.OperationID + ")"
			}
			cd.t, cd.used, cd.err = buildTool(slug, doc, c.Schemes, p, cd.ptr, strings.ToUpper(m), item, op, d)
			cands = append(cands, cd)
		}
	}
	var g errgroup.Group // errors stay per candidate: g.Wait's is always nil
	g.SetLimit(runtime.GOMAXPROCS(0))
	for _, cd := range cands {
		if cd.err == nil {
			g.Go(func() error { cd.err = cd.t.compile(d, cd.ptr, report || strict); return nil })
		}
	}
	_ = g.Wait()

	byName := map[string]string{} // tool name → "METHOD /path"
	aliases := map[string]string{}
	used := map[*def]bool{}
	var outDefects []Problem
	for _, cd := range cands {
		skip := func(err error) {
			pointer := cd.ptr
			var se *specError
			if errors.As(err, &se) {
				pointer, err = se.Pointer, se.Err
			}
			c.Skipped = append(c.Skipped, Problem{Operation: cd.where, Pointer: pointer, Reason: err.Error()})
		}
		t := cd.t
		if cd.err != nil {
			skip(cd.err)
			continue
		}
		if prev, dup := byName[t.Name]; dup {
			skip(fmt.Errorf("tool name %s is also the name of operation %s", t.Name, prev))
			continue
		}
		t.Alias = aliasFor(t.Name)
		if prev, dup := aliases[t.Alias]; dup {
			skip(fmt.Errorf("tool alias %s is also the alias of %s", t.Alias, prev))
			continue
		}
		byName[t.Name] = cd.where
		aliases[t.Alias] = t.Name
		c.Tools = append(c.Tools, t)
		for _, x := range cd.used {
			used[x] = true
		}
		if t.outErr != nil {
			pointer, err := t.outPointer, t.outErr
			var se *specError
			if errors.As(err, &se) {
				pointer, err = se.Pointer, se.Err
			}
			outDefects = append(outDefects, Problem{Operation: cd.where, Pointer: pointer, Reason: err.Error()})
		} else {
			for _, x := range t.outUsed {
				used[x] = true
			}
		}
	}
	sort.Slice(c.Tools, func(i, j int) bool { return c.Tools[i].Name < c.Tools[j].Name })
	if report || strict {
		c.Defects = componentDefects(doc, d, c.Skipped, used)
	}
	c.Defects = append(c.Defects, outDefects...)
	if strict {
		if err := strictCheck(ctx, doc, c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// componentDefects renders and compiles every named schema no tool's
// compiled schema holds already, so that a defect in one no tool uses is
// reported (it would fail an operation that used it) without dropping
// anything. They are compiled as one document first; only when that fails
// is each compiled alone, to say which. Defects already given as a skipped
// operation's reason are not repeated.
func componentDefects(doc *openapi3.T, d *defs, skipped []Problem, compiled map[*def]bool) []Problem {
	if doc.Components == nil || len(doc.Components.Schemas) == 0 {
		return nil
	}
	names := make([]string, 0, len(doc.Components.Schemas))
	for n := range doc.Components.Schemas {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []Problem
	add := func(p Problem) {
		if !slices.ContainsFunc(out, func(q Problem) bool { return q.Pointer == p.Pointer }) &&
			!slices.ContainsFunc(skipped, func(q Problem) bool { return q.Pointer == p.Pointer }) {
			out = append(out, p)
		}
	}
	var all []*def
	for _, n := range names {
		ref := doc.Components.Schemas[n]
		ptr := "#/components/schemas/" + pointerEscape(n)
		if ref == nil || ref.Value == nil {
			add(Problem{Pointer: ptr, Reason: "unresolved schema"})
			continue
		}
		x := d.get(ptr, ref.Value)
		if x.err != nil {
			add(Problem{Pointer: x.ref, Reason: x.err.Error()})
			continue
		}
		if !compiled[x] {
			all = append(all, x)
		}
	}
	if compileDefs(all) == nil {
		return out
	}
	for _, x := range all {
		used, err := closure([]*def{x})
		if err == nil {
			err = compileDefs(used)
		}
		if err == nil {
			continue
		}
		loc, msg := compileLocation(err)
		ptr := d.specPointer(loc)
		if ptr == "" {
			ptr = x.ref
		}
		add(Problem{Pointer: ptr, Reason: msg})
	}
	return out
}

// compileDefs compiles a document that holds only the given defs.
func compileDefs(list []*def) error {
	m := make(map[string]any, len(list))
	for _, x := range list {
		m[x.name] = x.value
	}
	raw, err := json.Marshal(map[string]any{"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": m})
	if err != nil {
		return err
	}
	_, err = compileSchema(raw)
	return err
}

// strictCheck is today's all-or-nothing rule for teams that want it: the
// whole document must pass kin-openapi's validator, and nothing may be
// skipped or defective.
func strictCheck(ctx context.Context, doc *openapi3.T, c *Connector) error {
	var errs []error
	if err := doc.Validate(ctx, openapi3.DisableExamplesValidation(), openapi3.DisableSchemaDefaultsValidation()); err != nil {
		errs = append(errs, fmt.Errorf("validate: %w", err))
	}
	for _, p := range c.Skipped {
		errs = append(errs, fmt.Errorf("skipped %s", p))
	}
	for _, p := range c.Defects {
		errs = append(errs, fmt.Errorf("defect %s", p))
	}
	if len(errs) > 0 {
		return fmt.Errorf("strict: %w", errors.Join(errs...))
	}
	return nil
}

// pointerEscape escapes one JSON pointer token (RFC 6901).
func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
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
		case "oauth2":
			s.Flows = oauthFlows(v.Flows)
		}
		out[name] = s
	}
	return out
}

// oauthFlows keeps the flows an OAuth client can run.
func oauthFlows(f *openapi3.OAuthFlows) map[string]OAuthFlow {
	if f == nil {
		return nil
	}
	out := map[string]OAuthFlow{}
	for name, fl := range map[string]*openapi3.OAuthFlow{"authorizationCode": f.AuthorizationCode, "clientCredentials": f.ClientCredentials} {
		if fl == nil {
			continue
		}
		of := OAuthFlow{AuthorizationURL: fl.AuthorizationURL, TokenURL: fl.TokenURL, RefreshURL: fl.RefreshURL}
		for sc := range fl.Scopes {
			of.Scopes = append(of.Scopes, sc)
		}
		sort.Strings(of.Scopes)
		out[name] = of
	}
	return out
}

// buildTool converts one operation, or says (with the JSON pointer of the
// part at fault, as a *specError where it is narrower than ptr) why the
// operation yields no tool.
func buildTool(slug string, doc *openapi3.T, schemes map[string]*SecurityScheme, path, ptr, method string, item *openapi3.PathItem, op *openapi3.Operation, d *defs) (t *Tool, used []*def, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, used, err = nil, nil, fmt.Errorf("operation could not be read: %v", r)
		}
	}()
	opID := op.OperationID
	snake := snakeCase(opID)
	if opID == "" {
		opID = derivedOperationID(method, path)
		snake = opID
	}
	if snake == "" {
		return nil, nil, fmt.Errorf("operationId %q has no letters or digits to name a tool", op.OperationID)
	}
	t = &Tool{
		Name:         slug + "." + snake,
		Connector:    slug,
		OperationID:  opID,
		Method:       method,
		PathTemplate: path,
		Tags:         append([]string(nil), op.Tags...),
		Summary:      op.Summary,
		Description:  op.Description,
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
			return nil, nil, &specError{Pointer: ptr + "/x-sluice-risk", Err: fmt.Errorf("x-sluice-risk %v: must be \"read\" or \"write\"", v)}
		}
	}

	sec, secPtr := doc.Security, "#/security"
	if op.Security != nil {
		sec, secPtr = *op.Security, ptr+"/security"
	}
	t.Security = [][]string{}
	for i, req := range sec {
		alt := make([]string, 0, len(req))
		for name := range req {
			if _, ok := schemes[name]; !ok {
				return nil, nil, &specError{Pointer: fmt.Sprintf("%s/%d/%s", secPtr, i, pointerEscape(name)), Err: fmt.Errorf("security: scheme %q is not in components.securitySchemes", name)}
			}
			alt = append(alt, name)
		}
		sort.Strings(alt)
		t.Security = append(t.Security, alt)
	}

	params, err := mergeParams(item.Parameters, op.Parameters, schemes, ptr)
	if err != nil {
		return nil, nil, err
	}
	t.params = params
	// Some vendors' generators put a fixed query in the path key
	// ("/responses?beta=true"). OpenAPI does not allow it, but the intent
	// is plain: the template is the part before "?", and the fixed query is
	// sent with every call and may not be set by the agent.
	if tmpl, q, ok := strings.Cut(path, "?"); ok {
		fixed, err := fixedQuery(q, params)
		if err != nil {
			return nil, nil, fmt.Errorf("path %q: %w", path, err)
		}
		t.PathTemplate, t.fixedQuery = tmpl, fixed
	}
	if err := checkTemplate(t.PathTemplate, params); err != nil {
		return nil, nil, err
	}
	for _, p := range params {
		if p.in == openapi3.ParameterInHeader && strings.EqualFold(p.name, IdempotencyKey) {
			t.IdempotencyHeader = p.name
		}
	}

	if op.RequestBody != nil {
		if skip, err := t.setBody(op.RequestBody); err != nil || skip != "" {
			if err == nil {
				err = errors.New(skip)
			}
			return nil, nil, &specError{Pointer: ptr + "/requestBody", Err: err}
		}
		_, media := pickMedia(op.RequestBody.Value.Content)
		t.bodyPointer = ptr + "/requestBody/content/" + pointerEscape(mediaKey(op.RequestBody.Value.Content, media)) + "/schema"
		// The schema as written (its $ref kept), unless setBody changed it
		// (a multipart body's filename siblings, a binary body's string):
		// then what setBody made is what is shown and enforced.
		t.bodyRef = media.Schema
		if media.Schema == nil || media.Schema.Value != t.body {
			t.bodyRef = &openapi3.SchemaRef{Value: t.body}
		}
	}

	t.Schema, used, err = renderToolSchema(t, d)
	if err != nil {
		return nil, nil, err
	}
	// The success reply's schema: one that cannot be rendered is a
	// defect, and the tool is kept without it.
	if ref, pointer := successResponse(op, ptr); ref != nil {
		t.outPointer = pointer
		t.OutputSchema, t.outUsed, t.outBase, t.outErr = renderOutputSchema(ref, pointer, d)
		t.out = &outCheck{}
	}
	return t, used, nil
}

// compile compiles the tool's rendered schema, and its output schema when
// defects are looked for (else on first use: see MatchesOutput). It only
// reads d, so tools compile concurrently.
func (t *Tool) compile(d *defs, ptr string, output bool) (err error) {
	defer func() {
		if r := recover(); r != nil { // on a worker goroutine: build's recover cannot see it
			err = fmt.Errorf("schema could not be compiled: %v", r)
		}
	}()
	compiled, err := compileSchema(t.Schema)
	if err != nil {
		loc, msg := compileLocation(err)
		return &specError{Pointer: t.specPointer(d, loc, ptr), Err: errors.New(msg)}
	}
	t.compiled = compiled
	if output {
		t.compileOutput(d)
	}
	return nil
}

// mediaKey is the key under which media is in content, as the spec spells it.
func mediaKey(content openapi3.Content, media *openapi3.MediaType) string {
	for k, v := range content {
		if v == media {
			return k
		}
	}
	return ""
}

// specPointer maps a location inside a def of a rendered schema back to
// the spec, or returns "" when loc is not in a def.
func (d *defs) specPointer(loc string) string {
	rest, ok := strings.CutPrefix(loc, "#/$defs/")
	if !ok {
		return ""
	}
	name, tail, _ := strings.Cut(rest, "/")
	x := d.byName[name]
	if x == nil {
		return ""
	}
	if tail != "" {
		return x.ref + "/" + tail
	}
	return x.ref
}

// specPointer maps a location in the tool's rendered schema back to the
// spec: "#/$defs/Pet/properties/tag" to "#/components/schemas/Pet/properties/tag",
// "#/properties/body/…" to the request body's schema. Locations that do
// not map (a wrapper the renderer added) give the operation's pointer.
func (t *Tool) specPointer(d *defs, loc, opPtr string) string {
	if p := d.specPointer(loc); p != "" {
		return p
	}
	if rest, ok := strings.CutPrefix(loc, "#/properties/body"); ok && t.bodyPointer != "" {
		return t.bodyPointer + rest
	}
	for _, in := range []string{"path", "query", "headers"} {
		if rest, ok := strings.CutPrefix(loc, "#/properties/"+in+"/properties/"); ok {
			name, tail, _ := strings.Cut(rest, "/")
			for _, p := range t.params {
				if p.name == name && p.pointer != "" && (p.in == in || (in == "headers" && p.in == "header")) {
					if tail != "" {
						return p.pointer + "/schema/" + tail
					}
					return p.pointer + "/schema"
				}
			}
		}
	}
	return opPtr
}

// mergeParams merges path-item and operation parameters (the operation's win
// on the same name and location) and sorts them by location then name.
// Cookie parameters are dropped, as are header parameters that OpenAPI says
// to ignore (Accept, Content-Type, Authorization) and any parameter that is
// where an apiKey credential goes: the gateway attaches credentials, an agent
// never supplies or overrides one.
func mergeParams(pathLevel, opLevel openapi3.Parameters, schemes map[string]*SecurityScheme, opPtr string) ([]*param, error) {
	merged := map[string]*openapi3.Parameter{}
	where := map[string]string{} // key → JSON pointer of the parameter that won
	var order []string
	lists := []struct {
		ps  openapi3.Parameters
		ptr string
	}{{pathLevel, opPtr[:strings.LastIndexByte(opPtr, '/')]}, {opLevel, opPtr}}
	for _, list := range lists {
		for i, ref := range list.ps {
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
			where[key] = fmt.Sprintf("%s/parameters/%d", list.ptr, i)
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
		np := &param{name: p.Name, in: p.In, required: p.Required || p.In == openapi3.ParameterInPath, desc: shorten(p.Description),
			schemaRef: p.Schema, pointer: where[key]}
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

// fixedQuery checks the query part of a path key and returns it encoded
// canonically: no fragment, valid escapes, and no name the operation also
// declares as a query parameter.
func fixedQuery(q string, params []*param) (string, error) {
	if strings.Contains(q, "#") {
		return "", errors.New("must not hold a fragment")
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return "", fmt.Errorf("fixed query: %w", err)
	}
	for _, p := range params {
		if p.in == openapi3.ParameterInQuery && vals.Has(p.name) {
			return "", fmt.Errorf("fixed query sets %s, which is also a query parameter", p.name)
		}
	}
	return vals.Encode(), nil
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
