package connectors

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

const (
	// maxSchemaNodes bounds the rendered schema of one tool: $refs are
	// inlined, so a small spec could otherwise expand exponentially.
	maxSchemaNodes = 20000
	// maxSchemaDepth bounds nesting in a rendered schema.
	maxSchemaDepth = 48
	// maxDescription keeps descriptions short in what agents see.
	maxDescription = 200
)

var errSchemaTooLarge = errors.New("schema: too large once $refs are inlined")

// renderToolSchema builds the JSON Schema of a tool's arguments document.
func renderToolSchema(t *Tool, is31 bool) (json.RawMessage, error) {
	r := &renderer{is31: is31}
	props := map[string]any{}
	var required []string
	for _, in := range []string{"path", "query", "header"} {
		sp := map[string]any{}
		var req []string
		for _, p := range t.params {
			if p.in != in {
				continue
			}
			s, err := r.schema(p.schema)
			if err != nil {
				return nil, fmt.Errorf("parameter %s.%s: %w", in, p.name, err)
			}
			if m, ok := s.(map[string]any); ok && p.desc != "" {
				m["description"] = p.desc
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
		s, err := r.schema(t.body)
		if err != nil {
			return nil, fmt.Errorf("request body: %w", err)
		}
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
	return json.Marshal(root)
}

// renderer turns kin-openapi schemas into plain JSON Schema with every $ref
// inlined. A schema that contains itself is cut off at the second visit;
// the spec's own schema still validates the value in full.
type renderer struct {
	is31  bool
	stack []*openapi3.Schema
	nodes int
}

func (r *renderer) ref(ref *openapi3.SchemaRef) (any, error) {
	if ref == nil {
		return map[string]any{}, nil
	}
	return r.schema(ref.Value)
}

func (r *renderer) refs(list openapi3.SchemaRefs) ([]any, error) {
	out := make([]any, 0, len(list))
	for _, ref := range list {
		s, err := r.ref(ref)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
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
	if slices.Contains(r.stack, s) || len(r.stack) >= maxSchemaDepth {
		return map[string]any{"description": "recursive: see the spec"}, nil
	}
	r.stack = append(r.stack, s)
	defer func() { r.stack = r.stack[:len(r.stack)-1] }()

	m := map[string]any{}
	if s.Type != nil && len(*s.Type) > 0 {
		types := append([]string(nil), (*s.Type)...)
		if s.Nullable && !slices.Contains(types, "null") {
			types = append(types, "null")
		}
		if len(types) == 1 {
			m["type"] = types[0]
		} else {
			m["type"] = types
		}
	}
	if d := shorten(s.Description); d != "" {
		m["description"] = d
	}
	if s.Format != "" {
		m["format"] = s.Format
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
	// Numbers: OpenAPI 3.0's boolean exclusiveMinimum becomes 2020-12's number.
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
	if s.MultipleOf != nil {
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
	if len(s.Required) > 0 {
		m["required"] = s.Required
	}

	var err error
	set := func(key string, v any, e error) {
		if e != nil && err == nil {
			err = e
		}
		m[key] = v
	}
	if s.Items != nil {
		v, e := r.ref(s.Items)
		set("items", v, e)
	}
	if len(s.PrefixItems) > 0 {
		v, e := r.refs(s.PrefixItems)
		set("prefixItems", v, e)
	}
	if len(s.Properties) > 0 {
		v, e := r.props(s.Properties)
		set("properties", v, e)
	}
	if len(s.PatternProperties) > 0 {
		v, e := r.props(s.PatternProperties)
		set("patternProperties", v, e)
	}
	if s.AdditionalProperties.Has != nil {
		m["additionalProperties"] = *s.AdditionalProperties.Has
	} else if s.AdditionalProperties.Schema != nil {
		v, e := r.ref(s.AdditionalProperties.Schema)
		set("additionalProperties", v, e)
	}
	for key, list := range map[string]openapi3.SchemaRefs{"allOf": s.AllOf, "anyOf": s.AnyOf, "oneOf": s.OneOf} {
		if len(list) > 0 {
			v, e := r.refs(list)
			set(key, v, e)
		}
	}
	if s.Not != nil {
		v, e := r.ref(s.Not)
		set("not", v, e)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (r *renderer) props(ps openapi3.Schemas) (map[string]any, error) {
	out := make(map[string]any, len(ps))
	for name, ref := range ps {
		v, err := r.ref(ref)
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
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
