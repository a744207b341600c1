package connectors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// successResponse returns the schema of op's success reply body and its
// JSON pointer: the 200 response's JSON content, else 201's, else the
// first other 2xx (then 2XX) that has JSON content. nil when there is
// none (a 204, a non-JSON reply, no schema).
func successResponse(op *openapi3.Operation, ptr string) (*openapi3.SchemaRef, string) {
	if op.Responses == nil {
		return nil, ""
	}
	all := op.Responses.Map()
	var codes []string
	for code := range all {
		if len(code) == 3 && code[0] == '2' {
			codes = append(codes, code)
		}
	}
	rank := func(c string) string {
		switch strings.ToUpper(c) {
		case "200":
			return "0"
		case "201":
			return "1"
		case "2XX":
			return "3"
		}
		return "2" + c
	}
	sort.Slice(codes, func(i, j int) bool { return rank(codes[i]) < rank(codes[j]) })
	for _, code := range codes {
		r := all[code]
		if r == nil || r.Value == nil {
			continue
		}
		var keys []string
		for k := range r.Value.Content {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, want := range []func(string) bool{
			func(k string) bool { return k == "application/json" },
			isJSONType,
		} {
			for _, k := range keys {
				mt := r.Value.Content[k]
				bare, _, _ := strings.Cut(k, ";")
				if want(strings.ToLower(strings.TrimSpace(bare))) && mt != nil && mt.Schema != nil {
					return mt.Schema, ptr + "/responses/" + pointerEscape(code) + "/content/" + pointerEscape(k) + "/schema"
				}
			}
		}
	}
	return nil, ""
}

// renderOutputSchema renders a success reply's schema as a document of
// its own: the schema at the root (a named one inlined there, so that the
// root says its type) and the defs it reaches in $defs.
// base is the spec pointer of the schema at the root (the named schema's
// when one is inlined), for locating compile errors.
func renderOutputSchema(ref *openapi3.SchemaRef, pointer string, d *defs) (raw json.RawMessage, used []*def, base string, err error) {
	r := &renderer{defs: d, at: pointer}
	s, err := r.schemaRef(ref)
	if err != nil {
		return nil, nil, "", &specError{Pointer: pointer, Err: fmt.Errorf("response: %w", err)}
	}
	if used, err = closure(r.deps); err != nil {
		return nil, nil, "", err
	}
	root := map[string]any{}
	m, ok := s.(map[string]any)
	if !ok {
		return nil, nil, "", &specError{Pointer: pointer, Err: errors.New("response: the schema is not an object")}
	}
	base = pointer
	if target, ok := m["$ref"].(string); ok && len(m) == 1 {
		if x := d.byName[strings.TrimPrefix(target, "#/$defs/")]; x != nil {
			if v, ok := x.value.(map[string]any); ok {
				m, base = v, x.ref
			}
		}
	}
	for k, v := range m {
		root[k] = v
	}
	root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	if len(used) > 0 {
		defsOut := make(map[string]any, len(used))
		for _, x := range used {
			defsOut[x.name] = x.value
		}
		root["$defs"] = defsOut
	}
	if raw, err = json.Marshal(root); err != nil {
		return nil, nil, "", &specError{Pointer: pointer, Err: fmt.Errorf("response schema: %w", err)}
	}
	return raw, used, base, nil
}

// compileOutput compiles the rendered output schema; on failure the tool
// keeps no output schema and outErr says why (a defect, not a skip).
func (t *Tool) compileOutput(d *defs) {
	if t.OutputSchema == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			t.OutputSchema, t.outErr = nil, &specError{Pointer: t.outPointer, Err: fmt.Errorf("response schema could not be compiled: %v", r)}
			t.outCompiled = nil
		}
	}()
	compiled, err := compileSchema(t.OutputSchema)
	if err != nil {
		loc, msg := compileLocation(err)
		p := d.specPointer(loc)
		if p == "" {
			p = t.outBase + strings.TrimPrefix(loc, "#")
		}
		t.OutputSchema, t.outErr = nil, &specError{Pointer: p, Err: errors.New("response schema: " + msg)}
		return
	}
	t.outCompiled = compiled
}

// MatchesOutput reports whether body, a JSON document, is valid under the
// tool's OutputSchema; false when the tool has none or body is not JSON.
func (t *Tool) MatchesOutput(body []byte) bool {
	if t.outCompiled == nil {
		return false
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return false
	}
	return t.outCompiled.Validate(v) == nil
}
