package connectors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"github.com/getkin/kin-openapi/openapi3"
	"go.yaml.in/yaml/v3"
)

// This file is where a spec comes from: reading the file or fetching the
// URL, every document its $refs reach (each once), recognising what the
// document is, converting Swagger 2.0, and the $refs kin-openapi cannot
// resolve by itself (operation-level and string-position ones), before the
// document is handed to build.

const (
	// maxSpecBytes caps what one Load reads in total: the spec plus every
	// document its $refs pull in, each counted once however often it is
	// referenced.
	maxSpecBytes = 16 << 20
	// maxInlineBytes caps what inlining copies into the root document in
	// total: a file read once may be inlined many times, and the copies must
	// not grow without bound.
	maxInlineBytes = 16 << 20
	// maxYAMLNodes caps the nodes one YAML document expands to, aliases
	// included: a "billion laughs" document is refused, not expanded.
	maxYAMLNodes = 2 << 20
	// maxDepth caps the nesting of a parsed document.
	maxDepth = 1000
	// maxRefHops bounds a chain of $refs to $refs at path-item and
	// operation level (a longer one is a cycle, or as good as one).
	maxRefHops = 16
	// fetchTimeout bounds each https fetch, whatever client is used.
	fetchTimeout = 30 * time.Second
	// maxRedirects bounds redirects while fetching a spec; each must stay https.
	maxRedirects = 5
)

// opKeys are the fields of a path item that hold an operation.
var opKeys = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// source reads one spec and the documents its $refs reach. Each document is
// read once (docs caches them by URI without fragment), so the byte budget
// counts distinct bytes.
type source struct {
	ctx    context.Context
	budget              // what is left of maxSpecBytes
	root   *url.URL     // the spec: {Path: absolute path} or an https URL; nil for in-memory data
	dir    string       // a file spec's directory: every file read stays under it
	host   string       // an https spec's host: every document fetched is on it, over https
	client *http.Client // fetches the spec (redirects may leave its host, over https)
	refs   *http.Client // fetches what its $refs name (redirects stay on host)

	rootDoc *srcDoc
	docs    map[string]*srcDoc
	reads   map[string]int   // reads per URI; each must be 1
	sizes   map[string]int64 // JSON size of each inlined target, by ref
	inlined int64            // bytes copied by inlining so far
}

// srcDoc is one document of a spec.
type srcDoc struct {
	uri     *url.URL
	raw     []byte
	tree    any // raw parsed, with string-position $refs inlined; nil until parsed
	parsed  bool
	changed bool // inlining changed tree, so kin-openapi gets tree as JSON, not raw
	out     []byte
}

func newSource(ctx context.Context) *source {
	return &source{
		ctx: ctx, budget: budget{left: maxSpecBytes},
		docs: map[string]*srcDoc{}, reads: map[string]int{}, sizes: map[string]int64{},
	}
}

// readSpec loads the document named by opts.Spec: an https:// URL or a file.
// Its $refs may reach only documents of the same kind: an https spec refers
// to the same host over https, a file spec to files under its own directory.
// The URL returned is the spec's for an https spec, else nil.
func readSpec(ctx context.Context, opts Options) (*openapi3.T, *url.URL, error) {
	s, err := specSource(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	doc, err := s.load()
	if err != nil {
		return nil, nil, err
	}
	if s.client != nil {
		return doc, s.root, nil
	}
	return doc, nil, nil
}

func specSource(ctx context.Context, opts Options) (*source, error) {
	spec := opts.Spec
	if spec == "" {
		return nil, errors.New("spec: empty")
	}
	s := newSource(ctx)
	if u, err := url.Parse(spec); err == nil && len(u.Scheme) > 1 {
		if u.Scheme != "https" {
			return nil, fmt.Errorf("spec: scheme %q is not allowed: use an https:// URL or a file path", u.Scheme)
		}
		if u.Host == "" || u.User != nil {
			return nil, errors.New("spec: an https URL needs a host and no user info")
		}
		s.client, s.refs = fetchClient(opts.Client, ""), fetchClient(opts.Client, u.Host)
		s.host, s.root = u.Host, withoutFragment(u)
		return s, nil
	}
	abs, err := filepath.Abs(spec)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	s.root, s.dir = &url.URL{Path: filepath.ToSlash(abs)}, filepath.Dir(abs)
	return s, nil
}

// readData parses spec bytes already in memory; any $ref to another
// document is refused.
func readData(ctx context.Context, data []byte) (*openapi3.T, error) {
	if len(data) > maxSpecBytes {
		return nil, fmt.Errorf("spec is over %d bytes", maxSpecBytes)
	}
	s := newSource(ctx)
	s.rootDoc = &srcDoc{uri: &url.URL{}, raw: data}
	return s.load()
}

// load reads the root document, says what it is if it is not OpenAPI,
// inlines what kin-openapi cannot resolve and parses the result (converting
// Swagger 2.0 to OpenAPI 3.0).
func (s *source) load() (*openapi3.T, error) {
	if s.rootDoc == nil {
		d, err := s.get(s.root)
		if err != nil {
			return nil, err
		}
		s.rootDoc = d
	}
	d := s.rootDoc
	loader := openapi3.NewLoader()
	loader.Context = s.ctx
	loader.IsExternalRefsAllowed = true // enforced by readURI instead
	loader.ReadFromURIFunc = s.readURI
	if plainOpenAPI(d.raw) {
		// Nothing here for the raw tree to do: skip parsing it twice.
		doc, err := loadDoc(loader, d.raw, s.root)
		if err != nil {
			return nil, fmt.Errorf("parse: %w", err)
		}
		return doc, nil
	}
	tree, format, err := parseTree(d.raw)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	swagger, err := specKind(tree, format)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	d.tree, d.parsed = tree, true
	if err := s.inlineDoc(d); err != nil {
		return nil, err
	}
	changed, err := s.inlinePaths(d.tree)
	if err != nil {
		return nil, err
	}
	d.changed = d.changed || changed
	if swagger {
		doc, err := s.fromSwagger(loader, d.tree)
		if err != nil {
			return nil, fmt.Errorf("parse: %w", err)
		}
		return doc, nil
	}
	data, err := d.output()
	if err != nil {
		return nil, err
	}
	doc, err := loadDoc(loader, data, s.root)
	if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	return doc, nil
}

// refValue finds the value of each $ref in JSON or YAML text.
var refValue = regexp.MustCompile(`\$ref["']?[ \t]*:[ \t]*["']?([^"'\s,}]*)`)

// plainOpenAPI says, from the bytes alone, that data is a YAML OpenAPI
// document (an openapi key at the top level) whose every $ref points into
// its own components: one kin-openapi loads as it is, with no operation-
// level or string-position $ref to inline, so the raw tree need not be
// parsed (a 3 MB spec's YAML takes about as long to parse as the rest of
// its load). Anything else, JSON included, takes the full path.
func plainOpenAPI(data []byte) bool {
	top := false
	for line := range bytes.Lines(data) {
		if bytes.HasPrefix(line, []byte("openapi:")) || bytes.HasPrefix(line, []byte(`"openapi":`)) || bytes.HasPrefix(line, []byte("'openapi':")) {
			top = true
			break
		}
	}
	if !top {
		return false
	}
	for _, m := range refValue.FindAllSubmatch(data, -1) {
		if !componentRef.Match(m[1]) {
			return false
		}
	}
	return true
}

// componentRef matches a $ref to a component kin-openapi resolves where it
// stands (not a path item or an x- key, which may be an operation).
var componentRef = regexp.MustCompile(`^#/components/(schemas|parameters|responses|requestBodies|headers|securitySchemes|examples|links|callbacks)/`)

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

// fromSwagger converts a Swagger 2.0 document to OpenAPI 3.0: formData
// parameters become a form (or multipart) request body, securityDefinitions
// become securitySchemes and host, basePath and schemes become servers, the
// https ones first (build uses the first server).
func (s *source) fromSwagger(loader *openapi3.Loader, tree any) (doc *openapi3.T, err error) {
	defer func() {
		if r := recover(); r != nil {
			doc, err = nil, fmt.Errorf("swagger 2.0 converter panicked: %v", r)
		}
	}()
	m := tree.(map[string]any) // specKind checked
	m["swagger"] = "2.0"       // YAML may have read it as a number
	swaggerSchemas(m, tupleItems)
	formConsumes(m)
	data, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("swagger 2.0: %w", err)
	}
	var doc2 openapi2.T
	if err := json.Unmarshal(data, &doc2); err != nil {
		return nil, fmt.Errorf("swagger 2.0: %w", err)
	}
	doc, err = openapi2conv.ToV3WithLoader(&doc2, loader, s.root)
	if err != nil {
		return nil, fmt.Errorf("swagger 2.0: convert: %w", err)
	}
	if doc.Paths == nil {
		doc.Paths = openapi3.NewPaths()
	}
	sort.SliceStable(doc.Servers, func(i, j int) bool {
		return doc.Servers[i] != nil && strings.HasPrefix(doc.Servers[i].URL, "https:") &&
			(doc.Servers[j] == nil || !strings.HasPrefix(doc.Servers[j].URL, "https:"))
	})
	return doc, nil
}

// formConsumes narrows the consumes of each operation with formData
// parameters to the form media types: Swagger 2.0 sends formData only as
// application/x-www-form-urlencoded or multipart/form-data, but a spec may
// also list application/json (Slack's does, for the JSON-body variant of
// the same method), which the converter would turn into a JSON body of the
// form's fields.
func formConsumes(doc map[string]any) {
	shared, _ := doc["parameters"].(map[string]any)
	isForm := func(p any) bool {
		pm, _ := p.(map[string]any)
		if ref, ok := pm["$ref"].(string); ok {
			pm, _ = shared[strings.TrimPrefix(ref, "#/parameters/")].(map[string]any)
		}
		return pm["in"] == "formData"
	}
	paths, _ := doc["paths"].(map[string]any)
	for _, item := range paths {
		im, _ := item.(map[string]any)
		pathParams, _ := im["parameters"].([]any)
		for _, m := range opKeys {
			om, ok := im[m].(map[string]any)
			if !ok {
				continue
			}
			opParams, _ := om["parameters"].([]any)
			if !slices.ContainsFunc(opParams, isForm) && !slices.ContainsFunc(pathParams, isForm) {
				continue
			}
			consumes, ok := om["consumes"].([]any)
			if !ok {
				consumes, _ = doc["consumes"].([]any)
			}
			var form []any
			for _, c := range consumes {
				ct, _ := c.(string)
				ct = strings.ToLower(strings.TrimSpace(strings.Split(ct, ";")[0]))
				if ct == "application/x-www-form-urlencoded" || ct == "multipart/form-data" {
					form = append(form, c)
				}
			}
			if len(form) == 0 {
				form = []any{"application/x-www-form-urlencoded"}
			}
			om["consumes"] = form
		}
	}
}

// swaggerSchemas calls fn on each schema of a Swagger 2.0 document: in
// definitions, parameters and responses, at the top level and in each
// operation.
func swaggerSchemas(doc map[string]any, fn func(any)) {
	params := func(v any) {
		switch ps := v.(type) {
		case []any:
			for _, p := range ps {
				if pm, ok := p.(map[string]any); ok {
					fn(pm["schema"])
					fn(pm) // a non-body parameter is schema-like (type, items, …)
				}
			}
		case map[string]any:
			for _, p := range ps {
				if pm, ok := p.(map[string]any); ok {
					fn(pm["schema"])
					fn(pm)
				}
			}
		}
	}
	responses := func(v any) {
		rs, _ := v.(map[string]any)
		for _, r := range rs {
			if rm, ok := r.(map[string]any); ok {
				fn(rm["schema"])
			}
		}
	}
	if defs, ok := doc["definitions"].(map[string]any); ok {
		for _, d := range defs {
			fn(d)
		}
	}
	params(doc["parameters"])
	responses(doc["responses"])
	paths, _ := doc["paths"].(map[string]any)
	for _, item := range paths {
		im, _ := item.(map[string]any)
		params(im["parameters"])
		for _, m := range opKeys {
			if om, ok := im[m].(map[string]any); ok {
				params(om["parameters"])
				responses(om["responses"])
			}
		}
	}
}

// tupleItems rewrites, in schema v and the schemas inside it, the JSON
// Schema draft 4 that Swagger 2.0 does not allow but specs write (Slack's
// does) into what OpenAPI 3.0 can say, so that the document converts: a
// tuple `items: [a, b]` becomes `items: {anyOf: [a, b]}`, which is what
// such specs mean (`items: [{$ref: …}, {type: "null"}]` is "one of these");
// `type: [t, "null"]` becomes `type: t, nullable: true`; several types
// become an anyOf of each; `type: "null"` becomes `nullable: true,
// enum: [null]`.
func tupleItems(v any) {
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	if l, ok := m["items"].([]any); ok {
		m["items"] = map[string]any{"anyOf": l}
	}
	switch t := m["type"].(type) {
	case string:
		if t == "null" { // only null: 3.0 spells it nullable with an enum of null
			delete(m, "type")
			m["nullable"], m["enum"] = true, []any{nil}
		}
	case []any:
		var types []any
		for _, e := range t {
			if e == "null" {
				m["nullable"] = true
			} else {
				types = append(types, e)
			}
		}
		delete(m, "type")
		switch len(types) {
		case 0:
			m["enum"] = []any{nil}
		case 1:
			m["type"] = types[0]
		default:
			alts := make([]any, len(types))
			for i, e := range types {
				alts[i] = map[string]any{"type": e}
			}
			m["anyOf"] = alts
		}
	}
	for _, k := range []string{"items", "additionalProperties", "not"} {
		tupleItems(m[k])
	}
	for _, k := range []string{"allOf", "anyOf", "oneOf"} {
		if l, ok := m[k].([]any); ok {
			for _, e := range l {
				tupleItems(e)
			}
		}
	}
	if props, ok := m["properties"].(map[string]any); ok {
		for _, p := range props {
			tupleItems(p)
		}
	}
}

// get returns the document at u, reading it the first time only.
func (s *source) get(u *url.URL) (*srcDoc, error) {
	u, err := s.allowed(u)
	if err != nil {
		return nil, err
	}
	k := u.String()
	if d := s.docs[k]; d != nil {
		return d, nil
	}
	var data []byte
	switch {
	case s.client != nil && k == s.root.String():
		data, err = fetch(s.ctx, s.client, u, &s.budget)
	case s.client != nil:
		data, err = fetch(s.ctx, s.refs, u, &s.budget)
	default:
		data, err = readFile(filepath.FromSlash(u.Path), &s.budget)
	}
	s.reads[k]++
	if err != nil {
		return nil, err
	}
	d := &srcDoc{uri: u, raw: data}
	s.docs[k] = d
	return d, nil
}

// allowed checks that u may be read from this spec and returns it in its
// canonical form (no fragment; a file as an absolute, clean path).
func (s *source) allowed(u *url.URL) (*url.URL, error) {
	switch {
	case s.root == nil:
		return nil, fmt.Errorf("ref %s: external refs are not allowed in an in-memory spec", u.Redacted())
	case s.client != nil:
		if u.Scheme != "https" || u.Host != s.host || u.User != nil {
			return nil, fmt.Errorf("ref %s: an https spec may refer only to https documents on %s", u.Redacted(), s.host)
		}
		return withoutFragment(u), nil
	}
	if (u.Scheme != "" && u.Scheme != "file") || u.Host != "" || u.User != nil {
		return nil, fmt.Errorf("ref %s: a file spec may refer only to files beside it", u.Redacted())
	}
	p := filepath.Clean(filepath.FromSlash(u.Path))
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.dir, p)
	}
	rel, err := filepath.Rel(s.dir, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("ref %s: outside the spec's directory", u.Path)
	}
	return &url.URL{Path: filepath.ToSlash(p)}, nil
}

// readURI is kin-openapi's way to read the documents the spec's $refs name:
// each is read once, through allowed, with its string-position $refs
// already inlined.
func (s *source) readURI(_ *openapi3.Loader, loc *url.URL) ([]byte, error) {
	d, err := s.doc(loc)
	if err != nil {
		return nil, err
	}
	return d.output()
}

// doc returns the parsed document at u: the root, or another one read once.
func (s *source) doc(u *url.URL) (*srcDoc, error) {
	if s.isRoot(u) {
		return s.rootDoc, nil
	}
	d, err := s.get(u)
	if err != nil {
		return nil, err
	}
	if !d.parsed && bytes.Contains(d.raw, []byte("$ref")) {
		if d.tree, _, err = parseTree(d.raw); err != nil {
			return nil, fmt.Errorf("ref %s: %w", u.Redacted(), err)
		}
		d.parsed = true
		if err := s.inlineDoc(d); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func (s *source) isRoot(u *url.URL) bool {
	if s.root == nil {
		return u.Scheme == "" && u.Host == "" && u.Path == "" && u.Opaque == ""
	}
	c, err := s.allowed(u)
	return err == nil && c.String() == s.root.String()
}

// output is what kin-openapi is given of d: its bytes as read, or, when
// inlining changed it, its tree as JSON.
func (d *srcDoc) output() ([]byte, error) {
	if !d.changed {
		return d.raw, nil
	}
	if d.out == nil {
		out, err := json.Marshal(d.tree)
		if err != nil {
			return nil, fmt.Errorf("ref %s: %w", d.uri.Redacted(), err)
		}
		d.out = out
	}
	return d.out, nil
}

// inlineDoc replaces every {$ref: file} whose file is not JSON or YAML (by
// its extension: .md, .txt, …) with the file's text, as Redocly's bundler
// does for a description kept in Markdown beside the spec. The ref is
// relative to d.
func (s *source) inlineDoc(d *srcDoc) error {
	var walk func(v any) (any, error)
	walk = func(v any) (any, error) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok && len(x) == 1 && isTextRef(ref) {
				return s.text(d, ref)
			}
			for k, e := range x {
				n, err := walk(e)
				if err != nil {
					return nil, err
				}
				x[k] = n
			}
		case []any:
			for i, e := range x {
				n, err := walk(e)
				if err != nil {
					return nil, err
				}
				x[i] = n
			}
		}
		return v, nil
	}
	tree, err := walk(d.tree)
	d.tree = tree
	return err
}

// isTextRef says whether ref names a whole file that is not JSON or YAML.
func isTextRef(ref string) bool {
	u, err := url.Parse(ref)
	if err != nil || u.Fragment != "" || u.Path == "" {
		return false
	}
	switch strings.ToLower(path.Ext(u.Path)) {
	case ".json", ".yaml", ".yml":
		return false
	}
	return true
}

// text reads the file ref (relative to d) as a string.
func (s *source) text(d *srcDoc, ref string) (string, error) {
	r, _ := url.Parse(ref) // isTextRef parsed it
	u := r
	if d.uri != nil {
		u = d.uri.ResolveReference(r)
	}
	t, err := s.get(u)
	if err != nil {
		return "", err
	}
	d.changed = true
	if !utf8.Valid(t.raw) {
		return "", fmt.Errorf("ref %s: a $ref where a string is expected must name a UTF-8 text file", u.Redacted())
	}
	if err := s.charge(int64(len(t.raw))); err != nil {
		return "", err
	}
	return string(t.raw), nil
}

func (s *source) charge(n int64) error {
	s.inlined += n
	if s.inlined > maxInlineBytes {
		return fmt.Errorf("spec: $refs inline more than %d bytes in total", maxInlineBytes)
	}
	return nil
}

// inlinePaths replaces each path item that is a $ref, and each operation
// that is one (`get: {$ref: ops/get-x.yaml}`, not in the OpenAPI standard
// but what split specs hold), with a copy of its target whose own $refs are
// rewritten to be relative to the root document, which is how Redocly
// bundles such specs. kin-openapi resolves every other $ref itself.
func (s *source) inlinePaths(tree any) (bool, error) {
	root, _ := tree.(map[string]any)
	paths, _ := root["paths"].(map[string]any)
	changed := false
	for p, item := range paths {
		im, ok := item.(map[string]any)
		if !ok {
			continue
		}
		if _, ok := im["$ref"].(string); ok {
			v, err := s.deref(im, "paths."+p)
			if err != nil {
				return false, err
			}
			im, paths[p], changed = v, v, true
		}
		for _, m := range opKeys {
			om, ok := im[m].(map[string]any)
			if !ok {
				continue
			}
			if _, ok := om["$ref"].(string); ok {
				v, err := s.deref(om, "paths."+p+"."+m)
				if err != nil {
					return false, err
				}
				im[m], changed = v, true
			}
		}
	}
	return changed, nil
}

// deref follows node's $ref (relative to the root document) to an object
// and returns a copy of it, node's other fields overriding the target's.
func (s *source) deref(node map[string]any, where string) (map[string]any, error) {
	cur := node
	for hop := 0; ; hop++ {
		ref, ok := cur["$ref"].(string)
		if !ok {
			return cur, nil
		}
		if hop == maxRefHops {
			return nil, fmt.Errorf("%s: $ref %s: more than %d $refs in a chain (a cycle?)", where, ref, maxRefHops)
		}
		target, from, err := s.resolve(ref)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		tm, ok := target.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: $ref %s: not an object", where, ref)
		}
		k := from.String()
		size, seen := s.sizes[k]
		if !seen {
			b, err := json.Marshal(tm)
			if err != nil {
				return nil, fmt.Errorf("%s: $ref %s: %w", where, ref, err)
			}
			size = int64(len(b))
			s.sizes[k] = size
		}
		if err := s.charge(size); err != nil {
			return nil, err
		}
		next := s.rebase(tm, from).(map[string]any)
		for k, v := range cur {
			if k != "$ref" {
				next[k] = v
			}
		}
		cur = next
	}
}

// resolve finds the value ref (relative to the root document) points at,
// and returns it with the ref's absolute URI.
func (s *source) resolve(ref string) (any, *url.URL, error) {
	r, err := url.Parse(ref)
	if err != nil {
		return nil, nil, fmt.Errorf("$ref %q: %w", ref, err)
	}
	u := r
	if s.root != nil {
		u = s.root.ResolveReference(r)
	}
	d, err := s.doc(u)
	if err != nil {
		return nil, nil, err
	}
	if !d.parsed {
		if d.tree, _, err = parseTree(d.raw); err != nil {
			return nil, nil, fmt.Errorf("ref %s: %w", u.Redacted(), err)
		}
		d.parsed = true
	}
	v, err := pointer(d.tree, u.Fragment)
	if err != nil {
		return nil, nil, fmt.Errorf("$ref %s: %w", ref, err)
	}
	return v, u, nil
}

// pointer evaluates an RFC 6901 JSON pointer (the decoded URI fragment).
func pointer(v any, ptr string) (any, error) {
	if ptr == "" {
		return v, nil
	}
	if !strings.HasPrefix(ptr, "/") {
		return nil, fmt.Errorf("fragment %q is not a JSON pointer", ptr)
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case map[string]any:
			e, ok := x[tok]
			if !ok {
				return nil, fmt.Errorf("%q: no %q", ptr, tok)
			}
			v = e
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil, fmt.Errorf("%q: no index %q", ptr, tok)
			}
			v = x[i]
		default:
			return nil, fmt.Errorf("%q: %q is inside a scalar", ptr, tok)
		}
	}
	return v, nil
}

// rebase deep-copies v, found in the document at from, rewriting each
// $ref in it to mean the same from the root document.
func (s *source) rebase(v any, from *url.URL) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			if ref, ok := e.(string); ok && k == "$ref" {
				out[k] = s.relocate(ref, from)
				continue
			}
			out[k] = s.rebase(e, from)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = s.rebase(e, from)
		}
		return out
	}
	return v
}

// relocate rewrites ref, written in the document at from, to be relative
// to the root document. A ref that cannot be parsed is left for
// kin-openapi to report.
func (s *source) relocate(ref string, from *url.URL) string {
	r, err := url.Parse(ref)
	if err != nil || s.root == nil {
		return ref
	}
	u := from.ResolveReference(r)
	frag := ""
	if u.Fragment != "" {
		frag = "#" + u.EscapedFragment()
	}
	if s.isRoot(u) {
		return frag
	}
	if s.client == nil {
		if rel, err := filepath.Rel(s.dir, filepath.FromSlash(u.Path)); err == nil {
			return (&url.URL{Path: filepath.ToSlash(rel)}).String() + frag
		}
	}
	return u.String()
}

// parseTree parses JSON or YAML into maps (string keys), slices, strings,
// json.Numbers, bools and nils. format is "JSON" or "YAML".
func parseTree(data []byte) (tree any, format string, err error) {
	trim := bytes.TrimLeft(data, " \t\r\n\ufeff")
	if len(trim) == 0 {
		return nil, "", errors.New("the file is empty")
	}
	if trim[0] == '<' {
		low := strings.ToLower(string(trim[:min(len(trim), 64)]))
		if strings.HasPrefix(low, "<?xml") {
			return nil, "", errors.New("the file is XML, not an OpenAPI document")
		}
		return nil, "", errors.New("the file is HTML (a saved web page?), not an OpenAPI document")
	}
	if trim[0] == '{' || trim[0] == '[' {
		dec := json.NewDecoder(bytes.NewReader(trim))
		dec.UseNumber()
		if err := dec.Decode(&tree); err == nil {
			if _, err := dec.Token(); err == io.EOF {
				return tree, "JSON", nil
			}
		}
	}
	var n yaml.Node
	if err := yaml.Unmarshal(data, &n); err != nil {
		return nil, "", fmt.Errorf("not JSON or YAML: %v", err)
	}
	c := yamlConv{}
	if tree, err = c.conv(&n, 0); err != nil {
		return nil, "", err
	}
	return tree, "YAML", nil
}

// yamlConv turns a yaml.Node into the values parseTree returns, expanding
// aliases up to maxYAMLNodes nodes in all.
type yamlConv struct{ nodes int }

func (c *yamlConv) conv(n *yaml.Node, depth int) (any, error) {
	c.nodes++
	if c.nodes > maxYAMLNodes {
		return nil, fmt.Errorf("YAML: more than %d nodes once aliases are expanded", maxYAMLNodes)
	}
	if depth > maxDepth {
		return nil, fmt.Errorf("YAML line %d: nested more than %d deep", n.Line, maxDepth)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return c.conv(n.Content[0], depth+1)
	case yaml.AliasNode:
		return c.conv(n.Alias, depth+1)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, e := range n.Content {
			v, err := c.conv(e, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.MappingNode:
		out := make(map[string]any, len(n.Content)/2)
		var merged []map[string]any
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, e := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("YAML line %d: a mapping key that is not a scalar", k.Line)
			}
			v, err := c.conv(e, depth+1)
			if err != nil {
				return nil, err
			}
			if k.ShortTag() == "!!merge" {
				switch m := v.(type) {
				case map[string]any:
					merged = append(merged, m)
				case []any:
					for _, x := range m {
						if xm, ok := x.(map[string]any); ok {
							merged = append(merged, xm)
						}
					}
				}
				continue
			}
			out[k.Value] = v
		}
		for _, m := range merged { // explicit keys win, then earlier merges
			for k, v := range m {
				if _, ok := out[k]; !ok {
					out[k] = v
				}
			}
		}
		return out, nil
	case yaml.ScalarNode:
		return scalar(n), nil
	}
	return nil, fmt.Errorf("YAML line %d: unknown node kind %d", n.Line, n.Kind)
}

func scalar(n *yaml.Node) any {
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return b
		}
	case "!!int", "!!float":
		if json.Valid([]byte(n.Value)) && n.Value != "" && (n.Value[0] == '-' || n.Value[0] >= '0' && n.Value[0] <= '9') {
			return json.Number(n.Value)
		}
		var f float64
		if n.Decode(&f) == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
	}
	return n.Value
}

// specKind says whether tree is Swagger 2.0 (true) or OpenAPI (false), or,
// if it is neither, what it is.
func specKind(tree any, format string) (swagger bool, err error) {
	m, ok := tree.(map[string]any)
	if !ok {
		what := "a list"
		switch tree.(type) {
		case string:
			what = "a string (plain text?)"
		case nil:
			what = "empty"
		case json.Number, bool:
			what = "a single value"
		}
		return false, fmt.Errorf("not an OpenAPI document: %s whose top level is %s", format, what)
	}
	str := func(k string) string {
		switch v := m[k].(type) {
		case string:
			return v
		case json.Number:
			return v.String()
		}
		return ""
	}
	not := func(what string) error {
		return fmt.Errorf("the file is %s, not an OpenAPI 3 or Swagger 2.0 document", what)
	}
	_, hasPaths := m["paths"]
	info, _ := m["info"].(map[string]any)
	switch {
	case m["openapi"] != nil:
		return false, nil
	case m["swagger"] != nil:
		if v := str("swagger"); v != "2.0" {
			return false, fmt.Errorf("swagger %q is not supported: want Swagger 2.0 or OpenAPI 3", v)
		}
		return true, nil
	case m["swaggerVersion"] != nil:
		return false, not("a Swagger " + str("swaggerVersion") + " resource listing")
	case m["asyncapi"] != nil:
		return false, not("an AsyncAPI " + str("asyncapi") + " document")
	case m["openrpc"] != nil:
		return false, not("an OpenRPC document")
	case m["arazzo"] != nil:
		return false, not("an Arazzo workflow document")
	case m["overlay"] != nil:
		return false, not("an OpenAPI Overlay document")
	case info != nil && (info["_postman_id"] != nil || strings.Contains(fmt.Sprint(info["schema"]), "getpostman.com")):
		return false, not("a Postman collection")
	case m["$schema"] != nil || (!hasPaths && (m["$defs"] != nil || m["definitions"] != nil || m["properties"] != nil || m["type"] != nil)):
		return false, not("a JSON Schema document")
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) > 8 {
		keys = append(keys[:8], "…")
	}
	return false, fmt.Errorf("not an OpenAPI document: %s with no openapi or swagger key (top-level keys: %s)", format, strings.Join(keys, ", "))
}

func withoutFragment(u *url.URL) *url.URL {
	c := *u
	c.Fragment, c.RawFragment = "", ""
	return &c
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

func readFile(name string, b *budget) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("open spec: %w", err)
	}
	defer f.Close()
	return b.read(f, name)
}

// fetchClient copies c (or a default) so that redirects are bounded and stay
// on https, and on host if host is not empty (a $ref's redirect must not
// leave the spec's host); the caller's client is not modified.
func fetchClient(c *http.Client, host string) *http.Client {
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
		if host != "" && req.URL.Host != host {
			return fmt.Errorf("redirect of a $ref to %s refused: an https spec may refer only to documents on %s", req.URL.Redacted(), host)
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
		return nil, fmt.Errorf("fetch %s: %w", shownURL(u), err)
	}
	req.Header.Set("Accept", "application/yaml, application/json;q=0.9, */*;q=0.1")
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text repeats the URL, query and all
		}
		return nil, fmt.Errorf("fetch %s: %w", shownURL(u), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch %s: status %d", shownURL(u), resp.StatusCode)
	}
	if resp.ContentLength > b.left {
		return nil, fmt.Errorf("fetch %s: specs are capped at %d bytes in total", shownURL(u), maxSpecBytes)
	}
	return b.read(resp.Body, shownURL(u))
}

// shownURL is u as errors show it: a URL may carry a credential in its
// user info or its query, so neither is shown.
func shownURL(u *url.URL) string {
	c := *u
	hidden := c.User != nil || c.RawQuery != ""
	c.User, c.RawQuery, c.ForceQuery, c.Fragment, c.RawFragment = nil, "", false, "", ""
	if hidden {
		return c.String() + " (user info and query not shown)"
	}
	return c.String()
}

// shownSpec is Options.Spec as errors show it: a file path as it is, an
// URL through shownURL.
func shownSpec(spec string) string {
	if u, err := url.Parse(spec); err == nil && len(u.Scheme) > 1 {
		return shownURL(u)
	} else if err != nil && strings.Contains(spec, "://") {
		return "(spec URL not shown: it does not parse)"
	}
	return spec
}
