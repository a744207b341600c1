package connectors

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A spec with a defect in some operations and in an unused schema: the
// rest loads, each skipped operation is named with its pointer and reason,
// the defect is reported, and --strict refuses the whole spec listing all.
const lenientSpec = `openapi: 3.0.3
info: {title: t, version: '1'}
servers: [{url: 'https://x.example'}]
paths:
  /ok:
    get:
      operationId: getOk
      parameters:
        - {name: code, in: query, schema: {type: string, pattern: '^(?=[A-Z])[A-Z0-9]{3}$'}}
      responses:
        "200":
          description: ok
          content:
            application/json:
              schema: {type: object, properties: {n: {type: integer, pattern: '(?<broken'}}}
  /risk:
    get:
      operationId: getRisk
      x-sluice-risk: maybe
      responses: {"200": {description: ok}}
  /a/{id}:
    get:
      operationId: getA
      responses: {"200": {description: ok}}
  /dup1:
    get:
      operationId: listPets
      responses: {"200": {description: ok}}
  /dup2:
    get:
      operationId: list-pets
      responses: {"200": {description: ok}}
  /badpattern:
    post:
      operationId: postBad
      requestBody:
        content:
          application/json:
            schema: {$ref: '#/components/schemas/Bad'}
      responses: {"200": {description: ok}}
  /nullable:
    post:
      operationId: postNullable
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              properties:
                choice:
                  nullable: true
                  oneOf:
                    - {type: string, enum: [a, b]}
                    - {type: integer}
                plain: {type: string, nullable: true, enum: [x]}
                amount: {type: number, minimum: 0, exclusiveMinimum: true}
                pet: {nullable: true, allOf: [{$ref: '#/components/schemas/Pet'}]}
components:
  schemas:
    Bad:
      type: object
      properties:
        name: {type: string, pattern: '(?<broken'}
    Unused:
      type: string
      pattern: '[unclosed'
    Pet:
      type: object
      required: [name, name]
      properties:
        name: {type: string}
        children: {type: array, items: {$ref: '#/components/schemas/Pet'}}
`

func writeSpec(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLenientLoad(t *testing.T) {
	spec := writeSpec(t, "lenient.yaml", lenientSpec)
	c, err := Load(context.Background(), Options{Slug: "x", Spec: spec, Defects: true})
	if err != nil {
		t.Fatalf("lenient load: %v", err)
	}
	var names []string
	for _, tl := range c.Tools {
		names = append(names, tl.Name)
	}
	if got, want := strings.Join(names, " "), "x.get_ok x.list_pets x.post_nullable"; got != want {
		t.Errorf("tools = %s, want %s", got, want)
	}
	wantSkips := []struct{ op, pointer, reason string }{
		{"GET /a/{id} (getA)", "#/paths/~1a~1{id}/get", "{id} has no path parameter"},
		{"POST /badpattern (postBad)", "#/components/schemas/Bad/properties/name/pattern", "(?<broken"},
		{"GET /dup2 (list-pets)", "#/paths/~1dup2/get", "x.list_pets is also the name of operation GET /dup1 (listPets)"},
		{"GET /risk (getRisk)", "#/paths/~1risk/get/x-sluice-risk", `must be "read" or "write"`},
	}
	if len(c.Skipped) != len(wantSkips) {
		t.Errorf("skipped = %v, want %d", c.Skipped, len(wantSkips))
	}
	for _, w := range wantSkips {
		found := false
		for _, p := range c.Skipped {
			if p.Operation == w.op {
				found = true
				if p.Pointer != w.pointer || !strings.Contains(p.Reason, w.reason) {
					t.Errorf("skip %s = %s, want pointer %s and a reason with %q", w.op, p, w.pointer, w.reason)
				}
			}
		}
		if !found {
			t.Errorf("%s was not skipped (skipped: %v)", w.op, c.Skipped)
		}
	}
	// The unused schema's defect is reported, and so is the response
	// schema's broken pattern: it drops nothing but getOk's output schema.
	// Bad's defect is already the reason postBad was skipped.
	const outPtr = "#/paths/~1ok/get/responses/200/content/application~1json/schema/properties/n/pattern"
	wantDefects := func(c *Connector, ptrs ...string) {
		t.Helper()
		var got []string
		for _, p := range c.Defects {
			got = append(got, p.Pointer)
		}
		if strings.Join(got, " ") != strings.Join(ptrs, " ") {
			t.Errorf("defects = %v, want at %v", c.Defects, ptrs)
		}
	}
	wantDefects(c, "#/components/schemas/Unused/pattern", outPtr)
	for _, p := range c.Defects {
		if p.Pointer == outPtr && (p.Operation != "GET /ok (getOk)" || !strings.Contains(p.Reason, "(?<broken")) {
			t.Errorf("response defect = %s, want getOk's, naming the pattern", p)
		}
	}
	for _, tl := range c.Tools {
		if tl.Name == "x.get_ok" && (tl.OutputSchema != nil || tl.MatchesOutput([]byte(`{"n":"x"}`))) {
			t.Errorf("x.get_ok kept an output schema that does not compile: %s", tl.OutputSchema)
		}
	}
	// Serve does not look for defects in schemas no tool uses, and
	// compiles a reply schema on first use: get_ok keeps it, but it is
	// not ready to be shown and matches nothing.
	if c2, err := Load(context.Background(), Options{Slug: "x", Spec: spec}); err != nil || len(c2.Tools) != len(c.Tools) {
		t.Errorf("without Defects: %v, %d tools; want the same tools", err, len(c2.Tools))
	} else {
		wantDefects(c2)
		if ok := tool(t, c2, "x.get_ok"); ok.OutputSchema == nil || ok.OutputReady() || ok.MatchesOutput([]byte(`{"n":"x"}`)) {
			t.Errorf("without Defects: get_ok output schema %s, ready %v; want kept, not ready", ok.OutputSchema, ok.OutputReady())
		}
	}

	// --strict: today's all-or-nothing, listing every problem.
	_, err = Load(context.Background(), Options{Slug: "x", Spec: spec, Strict: true})
	if err == nil {
		t.Fatal("strict load succeeded")
	}
	for _, s := range []string{"strict", "getA", "postBad", "getRisk", "list-pets", "#/components/schemas/Unused/pattern"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("strict error does not name %q: %v", s, err)
		}
	}
}

// ECMA-262 patterns (a lookahead RE2 cannot compile) load and are
// enforced; 3.0 nullable beside oneOf and allOf, boolean exclusiveMinimum
// and duplicate required entries are translated, and the advertised
// schema accepts exactly what Validate accepts.
func TestSchemasAsVendorsWriteThem(t *testing.T) {
	c, err := Load(context.Background(), Options{Slug: "x", Spec: writeSpec(t, "v.yaml", lenientSpec)})
	if err != nil {
		t.Fatal(err)
	}
	get := tool(t, c, "x.get_ok")
	cases := []struct {
		code string
		ok   bool
	}{{"A12", true}, {"ABC", true}, {"1AB", false}, {"abc", false}, {"ABCD", false}}
	for _, tc := range cases {
		err := get.Validate(Args{Query: map[string]any{"code": tc.code}})
		if (err == nil) != tc.ok {
			t.Errorf("code %q: err = %v, want ok=%v", tc.code, err, tc.ok)
		}
	}
	post := tool(t, c, "x.post_nullable")
	body := func(kv ...any) Args {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return Args{Body: m}
	}
	n := func(s string) any { return json.Number(s) }
	for _, tc := range []struct {
		name  string
		args  Args
		field string // "" means valid
	}{
		{"null beside oneOf", body("choice", nil), ""},
		{"oneOf string", body("choice", "a"), ""},
		{"oneOf integer", body("choice", n("3")), ""},
		{"oneOf neither", body("choice", true), "body.choice"},
		{"null plain enum", body("plain", nil), ""},
		{"enum value", body("plain", "x"), ""},
		{"not in enum", body("plain", "y"), "body.plain"},
		{"exclusive minimum", body("amount", n("0")), "body.amount"},
		{"above minimum", body("amount", n("0.5")), ""},
		{"null beside allOf", body("pet", nil), ""},
		{"recursive pet", body("pet", map[string]any{"name": "a", "children": []any{map[string]any{"name": "b", "children": []any{}}}}), ""},
		{"recursive pet missing name", body("pet", map[string]any{"name": "a", "children": []any{map[string]any{}}}), "body.pet.children[0].name"},
	} {
		err := post.Validate(tc.args)
		var ae *ArgError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v, want valid", tc.name, err)
		case tc.field != "" && (!errors.As(err, &ae) || ae.Field != tc.field):
			t.Errorf("%s: %v, want an ArgError on %s", tc.name, err, tc.field)
		}
	}
	// The schema agents are given is the one enforced: compile it afresh
	// and check it decides the same cases the same way.
	again, err := compileSchema(post.Schema)
	if err != nil {
		t.Fatalf("advertised schema does not compile: %v", err)
	}
	if err := again.Validate(instance(body("choice", nil))); err != nil {
		t.Errorf("advertised schema refuses a null choice: %v", err)
	}
	if err := again.Validate(instance(body("choice", true))); err == nil {
		t.Error("advertised schema accepts a boolean choice")
	}
}

// A pattern that backtracks catastrophically is cut by the match timeout
// and the argument fails (closed), instead of holding the call.
func TestPatternTimeout(t *testing.T) {
	spec := strings.Replace(lenientSpec, `'^(?=[A-Z])[A-Z0-9]{3}$'`, `'^(a+)+$'`, 1)
	c, err := Load(context.Background(), Options{Slug: "x", Spec: writeSpec(t, "redos.yaml", spec)})
	if err != nil {
		t.Fatal(err)
	}
	evil := strings.Repeat("a", 40) + "!"
	var ae *ArgError
	if err := tool(t, c, "x.get_ok").Validate(Args{Query: map[string]any{"code": evil}}); !errors.As(err, &ae) || ae.Field != "query.code" {
		t.Fatalf("catastrophic pattern: %v, want an ArgError on query.code", err)
	}
}

func TestAliases(t *testing.T) {
	c, err := Load(context.Background(), Options{Slug: "x-y", Spec: writeSpec(t, "a.yaml", lenientSpec)})
	if err != nil {
		t.Fatal(err)
	}
	if got := tool(t, c, "x-y.get_ok").Alias; got != "x-y_get_ok" {
		t.Errorf("alias = %q, want x-y_get_ok", got)
	}
	long := "s." + strings.Repeat("very_long_operation_name_", 4)
	a := aliasFor(long)
	if len(a) != maxAlias || a != aliasFor(long) || !aliasRE.MatchString(a) {
		t.Errorf("alias of a long name = %q (%d bytes): want a stable 64-byte function-safe name", a, len(a))
	}
	if aliasFor(long+"x") == a {
		t.Error("two long names share an alias")
	}
}

// An empty group is as good as none: {"path":{}} for a tool without path
// parameters is valid, as it was before schemas were compiled whole.
func TestEmptyGroupsAreNone(t *testing.T) {
	c, err := Load(context.Background(), Options{Slug: "x", Spec: writeSpec(t, "e.yaml", lenientSpec)})
	if err != nil {
		t.Fatal(err)
	}
	args, err := DecodeArgs([]byte(`{"path":{},"query":{},"headers":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := tool(t, c, "x.list_pets").Validate(args); err != nil {
		t.Errorf("empty groups: %v", err)
	}
}
