package connectors

import (
	"encoding/json"
	"fmt"
	"regexp"
	"regexp/syntax"
	"sort"
	"strings"
)

// Example returns example arguments for t, made from its argument
// schema: each property's example, default, const or first enum value
// when the spec gives one, otherwise a value of its type (strings
// "example", numbers their minimum or 1, one item per array), every
// property of every object included, and no empty path, query or headers
// object. They are only a starting point: validating them as a call's
// arguments says what a pattern or format rejected.
func (t *Tool) Example() ([]byte, error) {
	var schema map[string]any
	if err := json.Unmarshal(t.Schema, &schema); err != nil {
		return nil, fmt.Errorf("bug(): tool %s: its schema is not a JSON object: %w", t.Name, err)
	}
	v := exampleOf(schema, schema, 0)
	if m, ok := v.(map[string]any); ok {
		for _, k := range []string{"path", "query", "headers"} {
			if sub, ok := m[k].(map[string]any); ok && len(sub) == 0 {
				delete(m, k)
			}
		}
	}
	return json.Marshal(v)
}

// exampleOf is one schema's example value; root resolves local $refs.
func exampleOf(s, root map[string]any, depth int) any {
	if depth > 12 {
		return nil
	}
	if ref, ok := s["$ref"].(string); ok {
		if r := resolveRef(root, ref); r != nil {
			return exampleOf(r, root, depth+1)
		}
		return nil
	}
	if v, ok := s["example"]; ok {
		return v
	}
	if vs, ok := s["examples"].([]any); ok && len(vs) > 0 {
		return vs[0]
	}
	for _, k := range []string{"const", "default"} {
		if v, ok := s[k]; ok {
			return v
		}
	}
	if vs, ok := s["enum"].([]any); ok && len(vs) > 0 {
		return vs[0]
	}
	for _, k := range []string{"allOf", "oneOf", "anyOf"} {
		if vs, ok := s[k].([]any); ok && len(vs) > 0 {
			if sub, ok := vs[0].(map[string]any); ok {
				return exampleOf(sub, root, depth+1)
			}
		}
	}
	typ := s["type"]
	if ts, ok := typ.([]any); ok { // ["string", "null"]: the first that is not null
		for _, t := range ts {
			if t != "null" {
				typ = t
				break
			}
		}
	}
	switch typ {
	case "object":
		props, _ := s["properties"].(map[string]any)
		out := map[string]any{}
		names := make([]string, 0, len(props))
		for k := range props {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			if sub, ok := props[k].(map[string]any); ok {
				out[k] = exampleOf(sub, root, depth+1)
			}
		}
		return out
	case "array":
		if it, ok := s["items"].(map[string]any); ok {
			return []any{exampleOf(it, root, depth+1)}
		}
		return []any{}
	case "integer":
		if m, ok := s["minimum"].(float64); ok {
			return int64(m)
		}
		return 1
	case "number":
		if m, ok := s["minimum"].(float64); ok {
			return m
		}
		return 1.5
	case "boolean":
		return true
	case "string":
		switch s["format"] {
		case "date-time":
			return "2026-01-01T00:00:00Z"
		case "date":
			return "2026-01-01"
		case "email":
			return "user@example.com"
		case "uuid":
			return "00000000-0000-4000-8000-000000000000"
		case "uri":
			return "https://example.com/"
		}
		if p, ok := s["pattern"].(string); ok {
			if v, ok := patternExample(p); ok {
				return v
			}
		}
		return "example"
	}
	if _, ok := s["properties"]; ok {
		return exampleOf(map[string]any{"type": "object", "properties": s["properties"]}, root, depth+1)
	}
	return nil
}

// patternExample is a short string the regular expression p matches:
// each repeat at its minimum, each alternation's first branch, each class's
// first character. ok is false when p does not parse or the string made
// does not match (look-arounds, back-references: the caller falls back).
func patternExample(p string) (string, bool) {
	re, err := syntax.Parse(p, syntax.Perl)
	if err != nil {
		return "", false
	}
	var b strings.Builder
	var walk func(r *syntax.Regexp)
	walk = func(r *syntax.Regexp) {
		switch r.Op {
		case syntax.OpLiteral:
			b.WriteString(string(r.Rune))
		case syntax.OpCharClass:
			if len(r.Rune) > 0 {
				b.WriteRune(r.Rune[0])
			}
		case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
			b.WriteByte('x')
		case syntax.OpCapture:
			walk(r.Sub[0])
		case syntax.OpConcat:
			for _, sub := range r.Sub {
				walk(sub)
			}
		case syntax.OpAlternate:
			walk(r.Sub[0])
		case syntax.OpPlus:
			walk(r.Sub[0])
		case syntax.OpRepeat:
			for range r.Min {
				walk(r.Sub[0])
			}
		}
	}
	walk(re.Simplify())
	ok, err := regexp.MatchString(p, b.String())
	return b.String(), err == nil && ok
}

// resolveRef follows a local JSON pointer ("#/$defs/Item").
func resolveRef(root map[string]any, ref string) map[string]any {
	p, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil
	}
	var cur any = root
	for _, part := range strings.Split(p, "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[part]
	}
	m, _ := cur.(map[string]any)
	return m
}
