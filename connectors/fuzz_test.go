package connectors

import (
	"context"
	"errors"
	"net/url"
	"os"
	"testing"
)

func FuzzLoad(f *testing.F) {
	// The smallest valid document: no paths.
	f.Add([]byte("openapi: 3.0.0\ninfo: {title: t, version: '1'}\npaths: {}\n"))
	// A real spec with refs, arrays and a JSON body.
	if b, err := os.ReadFile("testdata/petstore-3.0.yaml"); err == nil {
		f.Add(b)
	}
	// A 3.1 document with webhooks.
	if b, err := os.ReadFile("testdata/webhook-example-3.1.yaml"); err == nil {
		f.Add(b)
	}
	// A self-referencing schema (recursion guard).
	f.Add([]byte(`{"openapi":"3.0.0","info":{"title":"t","version":"1"},"paths":{"/a":{"post":{"requestBody":{"content":{"application/json":{"schema":{"$ref":"#/components/schemas/N"}}}},"responses":{"200":{"description":"x"}}}}},"components":{"schemas":{"N":{"type":"object","properties":{"n":{"$ref":"#/components/schemas/N"}}}}}}`))
	// An external ref, which LoadData must refuse rather than read.
	f.Add([]byte("openapi: 3.0.0\ninfo: {title: t, version: '1'}\npaths:\n  /a:\n    get:\n      parameters: [{$ref: '/etc/passwd#/x'}]\n      responses: {'200': {description: x}}\n"))
	// Not a spec at all.
	f.Add([]byte("\x00\xff{["))
	// Swagger 2.0 with a formData operation and draft-4 type arrays (converted on load).
	f.Add([]byte("swagger: '2.0'\ninfo: {title: t, version: '1'}\nhost: a.example\npaths:\n  /n:\n    post:\n      consumes: [application/json, application/x-www-form-urlencoded]\n      parameters: [{name: a, in: formData, type: string}]\n      responses: {'200': {description: x, schema: {type: [string, 'null'], items: [{type: string}]}}}\n"))
	// An operation-level $ref inside the document, and a chain that loops.
	f.Add([]byte("openapi: 3.0.0\ninfo: {title: t, version: '1'}\npaths:\n  /a:\n    get: {$ref: '#/x/a'}\n  /b:\n    get: {$ref: '#/x/b'}\nx:\n  a: {operationId: a, responses: {'200': {description: x}}}\n  b: {$ref: '#/x/b'}\n"))
	// YAML aliases and a merge key (expanded, within bounds).
	f.Add([]byte("openapi: 3.0.0\ninfo: &i {title: t, version: '1'}\nx-copy: *i\nx-merged: {<<: *i, title: u}\npaths: {}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := LoadData(context.Background(), "fuzz", data, "https://api.example.com")
		if err != nil {
			return
		}
		for _, tl := range c.Tools {
			if len(tl.Schema) == 0 {
				t.Fatalf("%s: empty schema", tl.Name)
			}
			// A loaded tool must build a request from empty args or say why.
			_, _ = tl.NewRequest(context.Background(), c.BaseURL, Args{})
		}
	})
}

func FuzzDecodeArgs(f *testing.F) {
	f.Add([]byte(`{}`))                                                // empty
	f.Add([]byte(`{"path":{"petId":"1"},"query":{"a":[1,2]}}`))        // typical
	f.Add([]byte(`{"body":{"a":1,"a":2}}`))                            // duplicate key
	f.Add([]byte(`{"body":1e400}`))                                    // number out of float range
	f.Add([]byte(`{"path":{}} trailing`))                              // trailing data
	f.Add([]byte(`{"body":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]`)) // deep, unterminated
	pet, err := LoadData(context.Background(), "petstore", mustRead(f, "testdata/petstore-3.0.yaml"), "")
	if err != nil {
		f.Fatal(err)
	}
	tl := tool(f, pet, "petstore.show_pet_by_id")
	f.Fuzz(func(t *testing.T, data []byte) {
		args, err := DecodeArgs(data)
		if err != nil {
			var ae *ArgError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is not *ArgError", err)
			}
			return
		}
		// Whatever decodes must validate or fail cleanly, never panic.
		if tl.Validate(args) == nil {
			if _, err := tl.NewRequest(context.Background(), pet.BaseURL, args); err != nil {
				t.Fatalf("validated args did not build a request: %v", err)
			}
		}
	})
}

func FuzzNewRequestPath(f *testing.F) {
	for _, tc := range traversal { // the named traversal table
		f.Add(tc.value)
	}
	f.Add("..")     // dot segment: must be refused
	f.Add("%")      // lone percent
	f.Add("%zz")    // invalid escape
	f.Add("\u202e") // right-to-left override
	pet, err := LoadData(context.Background(), "petstore", mustRead(f, "testdata/petstore-3.0.yaml"), "https://api.example.com/v1")
	if err != nil {
		f.Fatal(err)
	}
	tl := tool(f, pet, "petstore.show_pet_by_id")
	f.Fuzz(func(t *testing.T, value string) {
		args := Args{Path: map[string]any{"petId": value}}
		req, err := tl.NewRequest(context.Background(), pet.BaseURL, args)
		if value == "" || value == "." || value == ".." {
			if err == nil {
				t.Fatalf("path value %q accepted", value)
			}
			return
		}
		if err != nil {
			t.Fatalf("value %q: %v", value, err)
		}
		checkOneSegment(t, req.URL.EscapedPath(), "/v1/pets/", value)
		// What a server parses from the request line is the same one segment.
		u, err := url.ParseRequestURI(req.URL.RequestURI())
		if err != nil {
			t.Fatalf("request URI %q does not parse: %v", req.URL.RequestURI(), err)
		}
		checkOneSegment(t, u.EscapedPath(), "/v1/pets/", value)
		if u.RawQuery != "" || u.Fragment != "" {
			t.Fatalf("value %q leaked into query %q or fragment %q", value, u.RawQuery, u.Fragment)
		}
	})
}

func mustRead(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func BenchmarkValidateNewRequest(b *testing.B) {
	pet, err := LoadData(context.Background(), "petstore", mustRead(b, "testdata/petstore-3.0.yaml"), "")
	if err != nil {
		b.Fatal(err)
	}
	tl := tool(b, pet, "petstore.show_pet_by_id")
	args, err := DecodeArgs([]byte(`{"path":{"petId":"pet-42"}}`))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := tl.Validate(args); err != nil {
			b.Fatal(err)
		}
		if _, err := tl.NewRequest(ctx, pet.BaseURL, args); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLoadTwilio(b *testing.B) {
	for b.Loop() {
		if _, err := Load(context.Background(), Options{Slug: "twilio", Spec: "testdata/twilio_api_v2010.yaml"}); err != nil {
			b.Fatal(err)
		}
	}
}
