package connectors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

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

// outCheck is a tool's compiled output schema. Compiling every reply
// schema of a large spec costs several times its load, so a server
// compiles each on its first reply; validate and tools (Options.Defects)
// compile them all at load, to report the defects.
type outCheck struct {
	once     sync.Once
	schema   *jsonschema.Schema // nil when it did not compile
	err      error
	panicked bool // err is the compiler's panic, not a located error
}

func (o *outCheck) compile(raw []byte) {
	o.once.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				o.schema, o.err, o.panicked = nil, fmt.Errorf("response schema could not be compiled: %v", r), true
			}
		}()
		o.schema, o.err = compileSchema(raw)
	})
}

// compileOutput compiles the rendered output schema now; on failure the
// tool keeps no output schema and outErr says why (a defect, not a skip).
func (t *Tool) compileOutput(d *defs) {
	if t.OutputSchema == nil {
		return
	}
	t.out.compile(t.OutputSchema)
	if err := t.out.err; err != nil {
		p := t.outPointer
		if !t.out.panicked {
			loc, msg := compileLocation(err)
			if p = d.specPointer(loc); p == "" {
				p = t.outBase + strings.TrimPrefix(loc, "#")
			}
			err = errors.New("response schema: " + msg)
		}
		t.OutputSchema, t.outErr = nil, &specError{Pointer: p, Err: err}
	}
}

// OutputReady reports whether the tool has an OutputSchema that compiles
// (compiling it on first use): only such a schema should be shown, since
// a client may compile what it is shown. Safe for concurrent use.
func (t *Tool) OutputReady() bool {
	if t.OutputSchema == nil || t.out == nil {
		return false
	}
	t.out.compile(t.OutputSchema)
	return t.out.schema != nil
}

// MatchesOutput reports whether body, a JSON document, is valid under the
// tool's OutputSchema; false when the tool has none, it does not compile,
// or body is not JSON. Safe for concurrent use.
func (t *Tool) MatchesOutput(body []byte) bool {
	if !t.OutputReady() {
		return false
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return false
	}
	return t.out.schema.Validate(v) == nil
}
