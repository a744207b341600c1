package connectors

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

const (
	// maxSchemaNodes bounds the rendered nodes of one named schema or one
	// inline schema. Shared schemas are referenced through $defs, never
	// inlined, so this bounds a spec's own size, not an expansion.
	maxSchemaNodes = 20000
	// maxSchemaDepth bounds inline nesting in a rendered schema.
	maxSchemaDepth = 64
	// maxDescription keeps descriptions short in what agents see.
	maxDescription = 200
)

var errSchemaTooLarge = errors.New("schema: too large")

// A rendered schema is plain JSON Schema 2020-12, the one document that is
// both advertised to agents (Tool.Schema) and compiled to validate their
// arguments: what an agent is told is what is enforced.
//
// Schemas the spec names ($ref) are rendered once per connector into defs
// and referenced as {"$ref":"#/$defs/<name>"}; a tool's document carries
// only the defs it reaches. So recursion needs no cut-off and a schema
// shared by a hundred operations is written once per tool that uses it,
// not once per place it is used.
//
// OpenAPI 3.0 is translated on the way: nullable becomes a "null" type
// (or an anyOf with {"type":"null"} beside a composition), a boolean
// exclusiveMinimum becomes 2020-12's number, format: binary becomes
// contentEncoding: base64 (agents send bytes as base64 text). 3.1's
// $recursiveRef "#" (2019-09, used by vendors without $recursiveAnchor)
// and $dynamicRef to the enclosing schema's anchor become a $ref to the
// enclosing named schema. oneOf with a discriminator becomes anyOf: the
// discriminator, not exclusivity, is how OpenAPI picks the branch, and
// vendor branches often overlap. Unknown and x- keywords are annotations
// in JSON Schema and are dropped.

// defs renders a connector's named schemas, each once.
type defs struct {
	is31   bool
	byPtr  map[*openapi3.Schema]*def
	byName map[string]*def
}

// def is one named schema as rendered.
type def struct {
	name   string
	ref    string // the spec's $ref (for error locations)
	value  any    // rendered JSON Schema (never mutated after rendering)
	deps   []*def // defs value refers to
	err    error
	inProg bool
}

func newDefs(is31 bool) *defs {
	return &defs{is31: is31, byPtr: map[*openapi3.Schema]*def{}, byName: map[string]*def{}}
}

var defNameUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// get returns the def of the schema a $ref names, rendering it on first use.
func (d *defs) get(ref string, s *openapi3.Schema) *def {
	if x := d.byPtr[s]; x != nil {
		return x
	}
	name := ref
	if i := strings.LastIndexAny(name, "/#"); i >= 0 {
		name = name[i+1:]
	}
	name = defNameUnsafe.ReplaceAllString(strings.TrimSuffix(strings.TrimSuffix(name, ".yaml"), ".json"), "_")
	if name == "" {
		name = "schema"
	}
	base := name
	for n := 2; d.byName[name] != nil; n++ {
		name = fmt.Sprintf("%s_%d", base, n)
	}
	x := &def{name: name, ref: ref, inProg: true}
	d.byPtr[s] = x
	d.byName[name] = x
	r := &renderer{defs: d, self: x}
	x.value, x.err = r.schema(s)
	x.deps = r.deps
	x.inProg = false
	return x
}

// renderer renders one schema tree; named schemas it meets become defs.
type renderer struct {
	defs  *defs
	self  *def // the named schema being rendered, nil for an inline one
	at    string
	stack []*openapi3.Schema
	nodes int
	deps  []*def
}

// closure returns the defs reachable from roots, sorted by name, or the
// first rendering error among them.
func closure(roots []*def) ([]*def, error) {
	seen := map[*def]bool{}
	var out []*def
	var walk func(d *def) error
	walk = func(d *def) error {
		if seen[d] {
			return nil
		}
		seen[d] = true
		if d.err != nil {
			return &specError{Pointer: d.ref, Err: d.err}
		}
		out = append(out, d)
		for _, x := range d.deps {
			if err := walk(x); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range roots {
		if err := walk(d); err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// specError locates an error in the spec by JSON pointer (or $ref).
type specError struct {
	Pointer string
	Err     error
}

func (e *specError) Error() string { return e.Pointer + ": " + e.Err.Error() }
func (e *specError) Unwrap() error { return e.Err }

// renderToolSchema builds the JSON Schema of a tool's arguments document
// {"path":{…},"query":{…},"headers":{…},"body":…} as JSON, and the defs
// it carries.
func renderToolSchema(t *Tool, d *defs) (json.RawMessage, []*def, error) {
	props := map[string]any{}
	var required []string
	var deps []*def
	for _, in := range []string{"path", "query", "header"} {
		sp := map[string]any{}
		var req []string
		for _, p := range t.params {
			if p.in != in {
				continue
			}
			r := &renderer{defs: d, at: p.pointer + "/schema"}
			s, err := r.schemaRef(p.schemaRef)
			if err != nil {
				return nil, nil, &specError{Pointer: p.pointer, Err: fmt.Errorf("parameter %s.%s: %w", in, p.name, err)}
			}
			deps = append(deps, r.deps...)
			if p.desc != "" {
				s = withDescription(s, p.desc)
			}
			sp[p.name] = s
			if p.required {
				req = append(req, p.name)
			}
		}
		if len(sp) == 0 {
			continue
		}
		key := in
		if in == "header" {
			key = "headers"
		}
		obj := map[string]any{"type": "object", "properties": sp, "additionalProperties": false}
		if len(req) > 0 {
			obj["required"] = req
			required = append(required, key)
		}
		props[key] = obj
	}
	if t.BodyType != "" {
		r := &renderer{defs: d, at: t.bodyPointer}
		s, err := r.schemaRef(t.bodyRef)
		if err != nil {
			return nil, nil, &specError{Pointer: t.bodyPointer, Err: fmt.Errorf("request body: %w", err)}
		}
		deps = append(deps, r.deps...)
		props["body"] = s
		if t.bodyRequired {
			required = append(required, "body")
		}
	}
	root := map[string]any{
		"$schema":              "https://json-schema.org/draft/2020-12/schema",
		"type":                 "object",
		"properties":           props,
		"additionalProperties": false,
	}
	if len(required) > 0 {
		root["required"] = required
	}
	used, err := closure(deps)
	if err != nil {
		return nil, nil, err
	}
	if len(used) > 0 {
		m := make(map[string]any, len(used))
		for _, x := range used {
			m[x.name] = x.value
		}
		root["$defs"] = m
	}
	raw, err := json.Marshal(root)
	if err != nil {
		return nil, nil, fmt.Errorf("schema: %w", err)
	}
	return raw, used, nil
}

// withDescription returns s with a description, copying rather than
// changing s (a $ref object may be shared).
func withDescription(s any, desc string) any {
	m, ok := s.(map[string]any)
	if !ok {
		return s
	}
	c := make(map[string]any, len(m)+1)
	for k, v := range m {
		c[k] = v
	}
	c["description"] = desc
	return c
}

func (r *renderer) schemaRef(ref *openapi3.SchemaRef) (any, error) {
	if ref == nil || ref.Value == nil {
		if ref != nil && ref.Ref != "" {
			return nil, fmt.Errorf("$ref %s: unresolved", ref.Ref)
		}
		return map[string]any{}, nil
	}
	if ref.Ref != "" {
		x := r.defs.get(ref.Ref, ref.Value)
		r.deps = append(r.deps, x)
		return map[string]any{"$ref": "#/$defs/" + x.name}, nil
	}
	return r.schema(ref.Value)
}

func (r *renderer) refs(list openapi3.SchemaRefs) ([]any, error) {
	out := make([]any, 0, len(list))
	for _, ref := range list {
		s, err := r.schemaRef(ref)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// selfRef is what $recursiveRef "#" and a $dynamicRef to the enclosing
// anchor mean in vendor specs: the enclosing named schema.
func (r *renderer) selfRef(kw, v string) (any, error) {
	if r.self == nil {
		return nil, fmt.Errorf("%s %q: only supported inside a named schema (components.schemas)", kw, v)
	}
	r.deps = append(r.deps, r.self)
	return map[string]any{"$ref": "#/$defs/" + r.self.name}, nil
}

func (r *renderer) schema(s *openapi3.Schema) (any, error) {
	r.nodes++
	if r.nodes > maxSchemaNodes {
		return nil, errSchemaTooLarge
	}
	if s == nil {
		return map[string]any{}, nil
	}
	if s.Always != nil {
		return *s.Always, nil
	}
	if slices.Contains(r.stack, s) {
		return nil, errors.New("schema: an inline schema contains itself")
	}
	if len(r.stack) >= maxSchemaDepth {
		return nil, fmt.Errorf("schema: nested deeper than %d", maxSchemaDepth)
	}
	r.stack = append(r.stack, s)
	defer func() { r.stack = r.stack[:len(r.stack)-1] }()

	if v, ok := s.Extensions["$recursiveRef"].(string); ok {
		if v != "#" {
			return nil, fmt.Errorf("$recursiveRef %q: only \"#\" is supported", v)
		}
		return r.selfRef("$recursiveRef", v)
	}
	if s.DynamicRef != "" {
		anchor := strings.TrimPrefix(s.DynamicRef, "#")
		if r.self != nil && (anchor == "" || r.selfAnchor() == anchor) {
			return r.selfRef("$dynamicRef", s.DynamicRef)
		}
		return nil, fmt.Errorf("$dynamicRef %q: no enclosing schema has that $dynamicAnchor", s.DynamicRef)
	}

	m := map[string]any{}
	var types []string
	if s.Type != nil {
		types = append(types, (*s.Type)...)
	}
	if len(types) == 1 {
		m["type"] = types[0]
	} else if len(types) > 1 {
		m["type"] = types
	}
	if d := shorten(s.Description); d != "" {
		m["description"] = d
	}
	switch s.Format {
	case "":
	case "binary":
		m["contentEncoding"] = "base64"
	case "byte":
		m["format"] = "byte"
		m["contentEncoding"] = "base64"
	default:
		m["format"] = s.Format
	}
	if s.ContentEncoding != "" {
		m["contentEncoding"] = s.ContentEncoding
	}
	if isBinarySchema(s) { // raw bytes (contentEncoding binary, a non-text contentMediaType): agents send base64
		m["contentEncoding"] = "base64"
	}
	if s.ContentMediaType != "" {
		m["contentMediaType"] = s.ContentMediaType
	}
	if s.Pattern != "" {
		m["pattern"] = s.Pattern
	}
	if len(s.Enum) > 0 {
		m["enum"] = s.Enum
	}
	if s.Const != nil {
		m["const"] = s.Const
	}
	if s.Default != nil {
		m["default"] = s.Default
	}
	if s.Deprecated {
		m["deprecated"] = true
	}
	if s.ReadOnly {
		m["readOnly"] = true
	}
	if s.WriteOnly {
		m["writeOnly"] = true
	}
	// Numbers: OpenAPI 3.0's boolean exclusiveMinimum becomes 2020-12's
	// number; 3.1 documents sometimes carry the boolean form too.
	if s.Min != nil {
		if s.ExclusiveMin.IsTrue() {
			m["exclusiveMinimum"] = *s.Min
		} else {
			m["minimum"] = *s.Min
		}
	}
	if s.ExclusiveMin.Value != nil {
		m["exclusiveMinimum"] = *s.ExclusiveMin.Value
	}
	if s.Max != nil {
		if s.ExclusiveMax.IsTrue() {
			m["exclusiveMaximum"] = *s.Max
		} else {
			m["maximum"] = *s.Max
		}
	}
	if s.ExclusiveMax.Value != nil {
		m["exclusiveMaximum"] = *s.ExclusiveMax.Value
	}
	if s.MultipleOf != nil && *s.MultipleOf > 0 {
		m["multipleOf"] = *s.MultipleOf
	}
	if s.MinLength > 0 {
		m["minLength"] = s.MinLength
	}
	if s.MaxLength != nil {
		m["maxLength"] = *s.MaxLength
	}
	if s.MinItems > 0 {
		m["minItems"] = s.MinItems
	}
	if s.MaxItems != nil {
		m["maxItems"] = *s.MaxItems
	}
	if s.UniqueItems {
		m["uniqueItems"] = true
	}
	if s.MinProps > 0 {
		m["minProperties"] = s.MinProps
	}
	if s.MaxProps != nil {
		m["maxProperties"] = *s.MaxProps
	}
	if s.MinContains != nil {
		m["minContains"] = *s.MinContains
	}
	if s.MaxContains != nil {
		m["maxContains"] = *s.MaxContains
	}
	if len(s.Required) > 0 {
		m["required"] = dedupe(s.Required) // vendors repeat entries; 2020-12 wants them unique
	}
	if len(s.DependentRequired) > 0 {
		dr := make(map[string]any, len(s.DependentRequired))
		for k, v := range s.DependentRequired {
			dr[k] = dedupe(v)
		}
		m["dependentRequired"] = dr
	}

	var err error
	one := func(key string, ref *openapi3.SchemaRef) {
		if ref == nil || err != nil {
			return
		}
		var v any
		if v, err = r.schemaRef(ref); err == nil {
			m[key] = v
		}
	}
	many := func(key string, list openapi3.SchemaRefs) {
		if len(list) == 0 || err != nil {
			return
		}
		var v []any
		if v, err = r.refs(list); err == nil {
			m[key] = v
		}
	}
	named := func(key string, ps openapi3.Schemas) {
		if len(ps) == 0 || err != nil {
			return
		}
		var v map[string]any
		if v, err = r.props(ps); err == nil {
			m[key] = v
		}
	}
	boolSchema := func(key string, b openapi3.BoolSchema) {
		if b.Schema != nil {
			one(key, b.Schema)
		} else if b.Has != nil {
			m[key] = *b.Has
		}
	}
	one("items", s.Items)
	many("prefixItems", s.PrefixItems)
	one("contains", s.Contains)
	named("properties", s.Properties)
	named("patternProperties", s.PatternProperties)
	named("dependentSchemas", s.DependentSchemas)
	one("propertyNames", s.PropertyNames)
	boolSchema("additionalProperties", s.AdditionalProperties)
	boolSchema("unevaluatedItems", s.UnevaluatedItems)
	boolSchema("unevaluatedProperties", s.UnevaluatedProperties)
	many("allOf", s.AllOf)
	many("anyOf", s.AnyOf)
	if s.Discriminator != nil && len(s.OneOf) > 0 {
		many("anyOf", s.OneOf)
	} else {
		many("oneOf", s.OneOf)
	}
	one("not", s.Not)
	one("if", s.If)
	one("then", s.Then)
	one("else", s.Else)
	if err != nil {
		return nil, err
	}
	if s.Nullable {
		return nullable(m), nil
	}
	return m, nil
}

// selfAnchor is the $dynamicAnchor of the named schema being rendered.
func (r *renderer) selfAnchor() string {
	if len(r.stack) > 0 {
		return r.stack[0].DynamicAnchor
	}
	return ""
}

// nullable widens a rendered 3.0 schema with nullable: true to accept
// null. A schema with only a type (and enum) gets "null" added to them;
// anything with a composition or a $ref is wrapped, so that null is
// accepted whatever the composition says and nothing else changes.
func nullable(m map[string]any) any {
	if _, composed := m["allOf"]; !composed {
		_, any1 := m["anyOf"]
		_, one1 := m["oneOf"]
		_, not1 := m["not"]
		if t, ok := m["type"].(string); ok && !any1 && !one1 && !not1 {
			if t != "null" {
				m["type"] = []string{t, "null"}
			}
			if e, ok := m["enum"].([]any); ok && !slices.Contains(e, nil) {
				m["enum"] = append(slices.Clip(e), nil)
			}
			return m
		}
	}
	return map[string]any{"anyOf": []any{map[string]any{"type": "null"}, m}}
}

func (r *renderer) props(ps openapi3.Schemas) (map[string]any, error) {
	out := make(map[string]any, len(ps))
	names := make([]string, 0, len(ps))
	for name := range ps {
		names = append(names, name)
	}
	sort.Strings(names) // defs are named in the order they are met
	for _, name := range names {
		v, err := r.schemaRef(ps[name])
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

func dedupe(in []string) []string {
	out := make([]string, 0, len(in))
	for _, s := range in {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// shorten keeps the first paragraph of a description, at most
// maxDescription bytes, cut at a rune boundary.
func shorten(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, "\n\n"); i >= 0 {
		s = s[:i]
	}
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= maxDescription {
		return s
	}
	cut := maxDescription
	for cut > 0 && (s[cut]&0xC0) == 0x80 {
		cut--
	}
	return strings.TrimSpace(s[:cut]) + "…"
}
