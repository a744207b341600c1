package connectors

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// loadSource loads opts.Spec as Load does and returns the source too, so
// that a test can count the reads.
func loadSource(t *testing.T, opts Options) (*Connector, *source, error) {
	t.Helper()
	s, err := specSource(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := s.load()
	if err != nil {
		return nil, s, err
	}
	c, err := build(context.Background(), opts.Slug, doc, nil, opts.BaseURL, false, true)
	return c, s, err
}

// writeFiles writes name → content under a new temporary directory.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// bodySchema decodes a tool's schema down to its body.
type argSchema struct {
	Properties struct {
		Path    schemaProps `json:"path"`
		Query   schemaProps `json:"query"`
		Headers schemaProps `json:"headers"`
		Body    schemaProps `json:"body"`
	} `json:"properties"`
}

type schemaProps struct {
	Type       string                    `json:"type"`
	Required   []string                  `json:"required"`
	Properties map[string]map[string]any `json:"properties"`
}

func toolSchema(t *testing.T, tl *Tool) argSchema {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(tl.Schema, &doc); err != nil {
		t.Fatalf("%s: %v", tl.Name, err)
	}
	defs, _ := doc["$defs"].(map[string]any)
	raw, err := json.Marshal(inlineDefs(doc, defs, 8))
	if err != nil {
		t.Fatal(err)
	}
	var s argSchema
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("%s: %v", tl.Name, err)
	}
	return s
}

// inlineDefs replaces {"$ref":"#/$defs/X"} with X, to depth levels, so
// that a test can look into a schema the way it was written.
func inlineDefs(v any, defs map[string]any, depth int) any {
	switch x := v.(type) {
	case map[string]any:
		if ref, ok := x["$ref"].(string); ok && depth > 0 {
			if d, ok := defs[strings.TrimPrefix(ref, "#/$defs/")]; ok {
				return inlineDefs(d, defs, depth-1)
			}
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			if k != "$defs" {
				out[k] = inlineDefs(e, defs, depth)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = inlineDefs(e, defs, depth)
		}
		return out
	}
	return v
}

// TestMultiFile loads testdata/multifile: an operation-level $ref
// (GET /pets), one to a key inside a file whose operation refers to a
// schema local to that file (POST /pets), a path item that is a $ref and
// whose operation is one too (/pets/{id}), an operation-level $ref inside
// the root (GET /owners), string-position $refs to Markdown (info and
// listPets descriptions), and Pet and Owner referring to each other across
// files. Every file is read exactly once.
func TestMultiFile(t *testing.T) {
	c, s, err := loadSource(t, Options{Slug: "pets", Spec: "testdata/multifile/api.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range c.Tools {
		names = append(names, tl.Name+" "+tl.Method+" "+tl.PathTemplate)
	}
	want := []string{"pets.create_pet POST /pets", "pets.get_pet GET /pets/{id}", "pets.list_owners GET /owners", "pets.list_pets GET /pets"}
	if !slices.Equal(names, want) {
		t.Errorf("tools = %q, want %q", names, want)
	}
	files := []string{"api.yaml", "common.yaml", "docs/intro.md", "docs/list-pets.md", "docs/owner.md", "ops/get-pet.yaml",
		"ops/list-pets.yaml", "ops/pets.yaml", "paths/pet.yaml", "schemas/owner.yaml", "schemas/pet.yaml"}
	if len(s.reads) != len(files) {
		t.Errorf("read %d documents, want %d: %v", len(s.reads), len(files), s.reads)
	}
	for _, f := range files {
		abs, _ := filepath.Abs(filepath.Join("testdata/multifile", f))
		if n := s.reads[filepath.ToSlash(abs)]; n != 1 {
			t.Errorf("%s read %d times, want 1", f, n)
		}
	}

	list := tool(t, c, "pets.list_pets")
	if list.Description != "Lists the **pets**, optionally by label.\n" || list.Summary != "List pets" {
		t.Errorf("listPets description %q summary %q: the string-position $ref was not inlined", list.Description, list.Summary)
	}
	q := toolSchema(t, list).Properties.Query.Properties
	if q["limit"]["maximum"] != 100.0 || fmt.Sprint(q["tag"]["enum"]) != "[cat dog]" {
		t.Errorf("listPets query = %v: refs relative to ops/ not resolved", q)
	}
	body := toolSchema(t, tool(t, c, "pets.create_pet")).Properties.Body
	if !slices.Equal(body.Required, []string{"name"}) || body.Properties["name"]["maxLength"] != 40.0 ||
		fmt.Sprint(body.Properties["label"]["enum"]) != "[cat dog]" {
		t.Errorf("createPet body = %+v: the same-file ref in ops/pets.yaml was not rebased", body)
	}
	id := toolSchema(t, tool(t, c, "pets.get_pet")).Properties.Path.Properties["id"]
	if id["pattern"] != "^[a-z0-9]+$" {
		t.Errorf("getPet path id = %v: the path item's parameter ref was not resolved", id)
	}
	if err := tool(t, c, "pets.create_pet").Validate(Args{Body: map[string]any{"name": "rex", "label": "cow"}}); err == nil {
		t.Error("label cow accepted: the enum from common.yaml is not enforced")
	}

	// The cycle Pet → owner → pets[] → Pet resolved to the same schema.
	doc := s.rootDoc.tree.(map[string]any)
	if !strings.HasPrefix(fmt.Sprint(doc["info"].(map[string]any)["description"]), "A pet store split") {
		t.Errorf("info.description = %v, want the text of docs/intro.md", doc["info"])
	}
}

// TestMultiFileCycle: Pet and Owner refer to each other across files
// (schemas/pet.yaml → owner.yaml → pet.yaml) and load as a cycle that can
// be followed as far as one likes.
func TestMultiFileCycle(t *testing.T) {
	s, err := specSource(context.Background(), Options{Slug: "pets", Spec: "testdata/multifile/api.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := s.load()
	if err != nil {
		t.Fatal(err)
	}
	pet := doc.Components.Schemas["Pet"].Value
	// owner.yaml is read by kin-openapi, through readURI: its
	// string-position $ref was inlined relative to schemas/.
	if o := pet.Properties["owner"].Value; o == nil || o.Description != "Someone who keeps pets.\n" {
		t.Errorf("Owner description = %+v, want the text of docs/owner.md", o)
	}
	for i := range 10 {
		if pet == nil || pet.Properties["name"] == nil || pet.Properties["owner"] == nil || pet.Properties["owner"].Value == nil {
			t.Fatalf("round %d: Pet not resolved: %+v", i, pet)
		}
		pets := pet.Properties["owner"].Value.Properties["pets"]
		if pets == nil || pets.Value == nil || pets.Value.Items == nil {
			t.Fatalf("round %d: Owner.pets not resolved", i)
		}
		pet = pets.Value.Items.Value
	}
}

// TestDistinctBytes: a 1 MiB document referenced by 20 operations (20 MiB
// if each reference counted) is read once and counted once against the
// 16 MiB cap; a distinct document that takes the total over it is refused.
func TestDistinctBytes(t *testing.T) {
	big := `{"components": {"schemas": {"Small": {"type": "string", "maxLength": 5}, "Padding": {"description": "` +
		strings.Repeat("x", 1<<20) + `"}}}}`
	var root strings.Builder
	root.WriteString("openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'https://x.example'}]\npaths:\n")
	for i := range 20 {
		fmt.Fprintf(&root, "  /r%d:\n    get:\n      operationId: op%d\n      parameters: [{name: q, in: query, schema: {$ref: 'big.json#/components/schemas/Small'}}]\n      responses: {'200': {description: ok}}\n", i, i)
	}
	dir := writeFiles(t, map[string]string{"api.yaml": root.String(), "big.json": big})
	c, s, err := loadSource(t, Options{Slug: "x", Spec: filepath.Join(dir, "api.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Tools) != 20 {
		t.Errorf("got %d tools, want 20", len(c.Tools))
	}
	if n := s.reads[filepath.ToSlash(filepath.Join(dir, "big.json"))]; n != 1 {
		t.Errorf("big.json read %d times, want 1", n)
	}
	if used, want := maxSpecBytes-s.left, int64(root.Len()+len(big)); used != want {
		t.Errorf("budget used %d bytes, want %d (each document once)", used, want)
	}
	if err := tool(t, c, "x.op7").Validate(Args{Query: map[string]any{"q": "toolong"}}); err == nil {
		t.Error("q over maxLength 5 validated: the shared schema was not applied")
	}

	t.Run("over the cap", func(t *testing.T) {
		huge := `{"components": {"schemas": {"Small": {"description": "` + strings.Repeat("x", maxSpecBytes) + `"}}}}`
		dir := writeFiles(t, map[string]string{"api.yaml": root.String(), "big.json": huge})
		_, err := Load(context.Background(), Options{Slug: "x", Spec: filepath.Join(dir, "api.yaml")})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("specs are capped at %d bytes in total", maxSpecBytes)) {
			t.Errorf("got %v, want the size cap", err)
		}
	})
}

// TestInlineCap: a Markdown file read once but inlined 1000 times (20 MB
// of copies) is refused: inlining has its own cap, so a small spec cannot
// expand without bound.
func TestInlineCap(t *testing.T) {
	var root strings.Builder
	root.WriteString("openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'https://x.example'}]\npaths:\n")
	for i := range 1000 {
		fmt.Fprintf(&root, "  /r%d:\n    get:\n      operationId: op%d\n      description: {$ref: doc.md}\n      responses: {'200': {description: ok}}\n", i, i)
	}
	dir := writeFiles(t, map[string]string{"api.yaml": root.String(), "doc.md": strings.Repeat("twenty k of text. ", 20<<10/18)})
	_, s, err := loadSource(t, Options{Slug: "x", Spec: filepath.Join(dir, "api.yaml")})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("$refs inline more than %d bytes", maxInlineBytes)) {
		t.Fatalf("got %v, want the inline cap", err)
	}
	if n := s.reads[filepath.ToSlash(filepath.Join(dir, "doc.md"))]; n != 1 {
		t.Errorf("doc.md read %d times, want 1", n)
	}
}

// TestRefErrors: $refs that must not load, each with the reason named.
func TestRefErrors(t *testing.T) {
	const head = "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'https://x.example'}]\n"
	cases := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"operation-level cycle", map[string]string{
			"api.yaml": head + "paths:\n  /a:\n    get: {$ref: 'a.yaml'}\n",
			"a.yaml":   "$ref: b.yaml\n",
			"b.yaml":   "$ref: a.yaml\n",
		}, "paths./a.get: $ref a.yaml: more than 16 $refs in a chain"},
		{"operation-level ref outside the spec's directory", map[string]string{
			"sub/api.yaml": head + "paths:\n  /a:\n    get: {$ref: '../op.yaml'}\n",
			"op.yaml":      "operationId: a\nresponses: {'200': {description: ok}}\n",
		}, "outside the spec's directory"},
		{"string-position ref outside the spec's directory", map[string]string{
			"sub/api.yaml": head + "paths: {}\ncomponents:\n  schemas:\n    A: {type: string, description: {$ref: '../secret.md'}}\n",
			"secret.md":    "not for the spec\n",
		}, "outside the spec's directory"},
		{"operation-level ref over https from a file spec", map[string]string{
			"api.yaml": head + "paths:\n  /a:\n    get: {$ref: 'https://127.0.0.1/op.yaml'}\n",
		}, "a file spec may refer only to files beside it"},
		{"operation-level ref to a scalar", map[string]string{
			"api.yaml": head + "paths:\n  /a:\n    get: {$ref: '#/info/title'}\n",
		}, "paths./a.get: $ref #/info/title: not an object"},
		{"operation-level ref to a missing key", map[string]string{
			"api.yaml": head + "paths:\n  /a:\n    get: {$ref: '#/x-ops/nope'}\nx-ops: {}\n",
		}, `no "nope"`},
		{"string-position ref to a binary file", map[string]string{
			"api.yaml": head + "paths: {}\ncomponents:\n  schemas:\n    A: {type: string, description: {$ref: 'logo.png'}}\n",
			"logo.png": "\x89PNG\r\n\x1a\n\xff\xfe",
		}, "must name a UTF-8 text file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFiles(t, tc.files)
			spec := filepath.Join(dir, "api.yaml")
			if _, ok := tc.files["sub/api.yaml"]; ok {
				spec = filepath.Join(dir, "sub", "api.yaml")
			}
			c, err := Load(context.Background(), Options{Slug: "x", Spec: spec})
			if err == nil {
				t.Fatalf("loaded %d tools, want an error", len(c.Tools))
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "connectors: load ") {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "not for the spec") {
				t.Errorf("error %q leaks the refused file's content", err)
			}
		})
	}
}

// TestLoadDataRefs: in memory, an operation-level $ref inside the document
// resolves; one to another document is refused.
func TestLoadDataRefs(t *testing.T) {
	const head = "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'https://x.example'}]\n"
	c, err := LoadData(context.Background(), "x", []byte(head+"paths:\n  /a:\n    get: {$ref: '#/x-ops/a'}\nx-ops:\n  a: {operationId: getA, responses: {'200': {description: ok}}}\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Tools) != 1 || c.Tools[0].Name != "x.get_a" {
		t.Errorf("tools = %v, want x.get_a", c.Tools)
	}
	for _, ref := range []string{"op.yaml", "docs/a.md"} {
		_, err := LoadData(context.Background(), "x", []byte(head+"paths:\n  /a:\n    get: {$ref: '"+ref+"'}\n"), "")
		if err == nil || !strings.Contains(err.Error(), "external refs are not allowed in an in-memory spec") {
			t.Errorf("$ref %s: got %v, want external refs refused", ref, err)
		}
	}
}

// TestNotOpenAPI: a file that is not OpenAPI or Swagger 2.0 is refused
// with an error that says what it is.
func TestNotOpenAPI(t *testing.T) {
	cases := []struct{ name, file, body, want string }{
		{"JSON Schema", "s.json", `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "properties": {"a": {"type": "string"}}}`, "is a JSON Schema document, not an OpenAPI 3 or Swagger 2.0 document"},
		{"JSON Schema without $schema", "s.yaml", "type: object\nproperties: {a: {type: string}}\n", "is a JSON Schema document"},
		{"AsyncAPI", "a.yaml", "asyncapi: 2.6.0\ninfo: {title: t, version: '1'}\nchannels: {}\n", "is an AsyncAPI 2.6.0 document"},
		{"Postman collection", "p.json", `{"info": {"_postman_id": "5e0c", "name": "api", "schema": "https://schema.getpostman.com/json/collection/v2.1.0/collection.json"}, "item": []}`, "is a Postman collection"},
		{"OpenRPC", "r.json", `{"openrpc": "1.2.6", "info": {"title": "t", "version": "1"}, "methods": []}`, "is an OpenRPC document"},
		{"Swagger 1.2", "w.json", `{"swaggerVersion": "1.2", "apis": []}`, "is a Swagger 1.2 resource listing"},
		{"Swagger 3.0", "w.yaml", "swagger: '3.0'\ninfo: {title: t, version: '1'}\npaths: {}\n", `swagger "3.0" is not supported`},
		{"YAML without openapi", "k.yaml", "title: my api\npaths: {}\n", "not an OpenAPI document: YAML with no openapi or swagger key (top-level keys: paths, title)"},
		{"JSON without openapi", "k.json", `{"name": "x"}`, "not an OpenAPI document: JSON with no openapi or swagger key (top-level keys: name)"},
		{"HTML", "page.yaml", "\n<!DOCTYPE html>\n<html><head><title>API reference</title></head></html>\n", "the file is HTML (a saved web page?)"},
		{"XML", "x.xml", `<?xml version="1.0"?><wadl/>`, "the file is XML"},
		{"not JSON or YAML", "bin.yaml", "key: [unclosed\n\t- : :\n", "not JSON or YAML"},
		{"plain text", "t.yaml", "just some words\n", "YAML whose top level is a string (plain text?)"},
		{"list", "l.json", `[{"openapi": "3.0.0"}]`, "JSON whose top level is a list"},
		{"empty", "e.yaml", "\n\n", "the file is empty"},
		{"YAML alias bomb", "bomb.yaml", aliasBomb(), fmt.Sprintf("more than %d nodes once aliases are expanded", maxYAMLNodes)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFiles(t, map[string]string{tc.file: tc.body})
			_, err := Load(context.Background(), Options{Slug: "x", Spec: filepath.Join(dir, tc.file)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
			if tc.name == "YAML alias bomb" {
				return // once is enough: expanding to the cap takes a while
			}
			_, err = LoadData(context.Background(), "x", []byte(tc.body), "https://x.example")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("LoadData: got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// aliasBomb is a "billion laughs" YAML document: ten levels of ten aliases.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	return b.String()
}

// TestSwaggerSlack loads Slack's published Swagger 2.0 spec: 174
// operations (80 GET, 94 POST, counted in the file), form bodies from
// formData parameters, the OAuth2 securityDefinition as a scheme, and
// host + basePath + schemes as the base URL.
func TestSwaggerSlack(t *testing.T) {
	c := mustLoad(t, "slack", "testdata/slack_web_swagger-2.0.json")
	if len(c.Tools) != 174 || len(c.Skipped) != 0 {
		t.Errorf("got %d tools and %d skipped, want 174 and 0: %q", len(c.Tools), len(c.Skipped), c.Skipped)
	}
	if c.BaseURL == nil || c.BaseURL.String() != "https://slack.com/api" {
		t.Errorf("base URL = %v, want https://slack.com/api", c.BaseURL)
	}
	if s := c.Schemes["slackAuth"]; s == nil || s.Type != "oauth2" {
		t.Errorf("slackAuth = %+v, want an oauth2 scheme", s)
	}
	forms, gets := 0, 0
	for _, tl := range c.Tools {
		if tl.BodyType == formType {
			forms++
		}
		if tl.Method == http.MethodGet {
			gets++
		}
	}
	if forms != 91 || gets != 80 {
		t.Errorf("%d form bodies and %d GETs, want 91 (operations with formData parameters) and 80", forms, gets)
	}

	post := tool(t, c, "slack.chat_post_message")
	if post.Method != http.MethodPost || post.PathTemplate != "/chat.postMessage" || post.BodyType != formType {
		t.Fatalf("chat_post_message: %s %s body %q", post.Method, post.PathTemplate, post.BodyType)
	}
	if !slices.EqualFunc(post.Security, [][]string{{"slackAuth"}}, slices.Equal) {
		t.Errorf("security = %v, want slackAuth", post.Security)
	}
	s := toolSchema(t, post)
	body := s.Properties.Body
	var props []string
	for k := range body.Properties {
		props = append(props, k)
	}
	slices.Sort(props)
	wantProps := []string{"as_user", "attachments", "blocks", "channel", "icon_emoji", "icon_url", "link_names", "mrkdwn",
		"parse", "reply_broadcast", "text", "thread_ts", "unfurl_links", "unfurl_media", "username"}
	if body.Type != "object" || !slices.Equal(props, wantProps) || !slices.Equal(body.Required, []string{"channel"}) {
		t.Errorf("body = type %q props %q required %q, want the 15 formData parameters, channel required", body.Type, props, body.Required)
	}
	if body.Properties["link_names"]["type"] != "boolean" || body.Properties["channel"]["type"] != "string" {
		t.Errorf("link_names %v channel %v, want boolean and string", body.Properties["link_names"], body.Properties["channel"])
	}
	if h := s.Properties.Headers; h.Properties["token"]["type"] != "string" || !slices.Equal(h.Required, []string{"token"}) {
		t.Errorf("headers = %+v, want the required token header", h)
	}
	args := Args{Headers: map[string]any{"token": "xoxb-test"}, Body: map[string]any{"channel": "C123", "text": "hi", "link_names": true}}
	if err := post.Validate(args); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if err := post.Validate(Args{Headers: args.Headers, Body: map[string]any{"text": "hi"}}); err == nil {
		t.Error("a body without channel validated")
	}
	req, err := post.NewRequest(context.Background(), c.BaseURL, args)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.ParseForm(); err != nil {
		t.Fatal(err)
	}
	if req.URL.String() != "https://slack.com/api/chat.postMessage" || req.PostForm.Get("channel") != "C123" || req.PostForm.Get("link_names") != "true" {
		t.Errorf("request %s form %v", req.URL, req.PostForm)
	}

	hist := toolSchema(t, tool(t, c, "slack.conversations_history")).Properties.Query.Properties
	if hist["limit"]["type"] != "integer" || hist["latest"]["type"] != "number" || hist["inclusive"]["type"] != "boolean" {
		t.Errorf("conversations_history query = %v", hist)
	}
}

// TestSwaggerConvert: a small Swagger 2.0 document with each kind of
// securityDefinition, http and https schemes, a formData operation and a
// draft-4 `type: [string, "null"]`.
func TestSwaggerConvert(t *testing.T) {
	const spec = `swagger: "2.0"
info: {title: t, version: "1"}
host: api.example.com
basePath: /v2
schemes: [http, https]
securityDefinitions:
  basic: {type: basic}
  key: {type: apiKey, in: header, name: X-Key}
  oauth: {type: oauth2, flow: application, tokenUrl: "https://api.example.com/token", scopes: {read: read}}
security: [{key: []}]
paths:
  /notes:
    post:
      operationId: createNote
      consumes: [application/x-www-form-urlencoded]
      security: [{basic: []}, {oauth: [read]}]
      parameters:
        - {name: title, in: formData, type: string, required: true, maxLength: 10}
        - {name: pinned, in: formData, type: boolean}
        - {name: tags, in: formData, type: array, items: {type: string}, collectionFormat: multi}
      responses:
        "200":
          description: ok
          schema: {$ref: "#/definitions/Note"}
definitions:
  Note:
    type: object
    properties:
      title: {type: [string, "null"]}
      parts: {type: array, items: [{type: string}, {type: "null"}]}
`
	c, err := LoadData(context.Background(), "notes", []byte(spec), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.BaseURL.String() != "https://api.example.com/v2" {
		t.Errorf("base URL = %s, want the https server first", c.BaseURL)
	}
	if s := c.Schemes["basic"]; s == nil || s.Type != "http" || s.Scheme != "basic" {
		t.Errorf("basic = %+v", s)
	}
	if s := c.Schemes["key"]; s == nil || s.Type != "apiKey" || s.In != "header" || s.Param != "X-Key" {
		t.Errorf("key = %+v", s)
	}
	if s := c.Schemes["oauth"]; s == nil || s.Type != "oauth2" {
		t.Errorf("oauth = %+v", s)
	}
	tl := tool(t, c, "notes.create_note")
	if tl.BodyType != formType || !slices.EqualFunc(tl.Security, [][]string{{"basic"}, {"oauth"}}, slices.Equal) {
		t.Errorf("create_note body %q security %v", tl.BodyType, tl.Security)
	}
	body := toolSchema(t, tl).Properties.Body
	if !slices.Equal(body.Required, []string{"title"}) || body.Properties["title"]["maxLength"] != 10.0 || body.Properties["tags"]["type"] != "array" {
		t.Errorf("body = %+v", body)
	}
	if err := tl.Validate(Args{Body: map[string]any{"title": "much too long"}}); err == nil {
		t.Error("title over maxLength validated")
	}
}

// TestHTTPSMultiFile: an https spec's operation-level and string-position
// $refs are fetched from the same host, each URL once; a $ref to another
// host is refused before any fetch.
func TestHTTPSMultiFile(t *testing.T) {
	docs := map[string]string{
		"/v1/api.yaml": `openapi: 3.0.3
info: {title: remote, version: "1", description: {$ref: docs/intro.md}}
servers: [{url: https://api.example.com}]
paths:
  /a:
    get: {$ref: ops/a.yaml}
  /b:
    get: {$ref: ops/b.yaml}
`,
		"/v1/ops/a.yaml":    "operationId: getA\ndescription: {$ref: ../docs/intro.md}\nparameters: [{$ref: '../common.yaml#/Id'}]\nresponses: {'200': {description: ok}}\n",
		"/v1/ops/b.yaml":    "operationId: getB\nparameters: [{$ref: '../common.yaml#/Id'}]\nresponses: {'200': {description: ok}}\n",
		"/v1/common.yaml":   "Id: {name: id, in: query, required: true, schema: {type: string}}\n",
		"/v1/docs/intro.md": "Remote, split spec.\n",
		"/v1/other.yaml":    "openapi: 3.0.3\ninfo: {title: t, version: '1'}\npaths:\n  /a:\n    get: {$ref: 'https://evil.example/op.yaml'}\n",
		"/v1/hop.yaml":      "openapi: 3.0.3\ninfo: {title: t, version: '1'}\npaths:\n  /a:\n    get: {$ref: 'moved.yaml'}\n",
	}
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path]++
		mu.Unlock()
		if r.URL.Path == "/v1/moved.yaml" { // same server, another host name
			http.Redirect(w, r, "https://localhost:"+r.URL.Port()+"/v1/ops/a.yaml", http.StatusFound)
			return
		}
		if body, ok := docs[r.URL.Path]; ok {
			w.Write([]byte(body))
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()

	c, err := Load(context.Background(), Options{Slug: "remote", Spec: srv.URL + "/v1/api.yaml", Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Tools) != 2 || tool(t, c, "remote.get_a").Description != "Remote, split spec.\n" {
		t.Errorf("tools = %v", c.Tools)
	}
	if q := toolSchema(t, tool(t, c, "remote.get_b")).Properties.Query; !slices.Equal(q.Required, []string{"id"}) {
		t.Errorf("get_b query = %+v, want id required (from common.yaml)", q)
	}
	mu.Lock()
	for p := range docs {
		if p == "/v1/other.yaml" || p == "/v1/hop.yaml" {
			continue
		}
		if seen[p] != 1 {
			t.Errorf("%s fetched %d times, want 1", p, seen[p])
		}
	}
	mu.Unlock()

	_, err = Load(context.Background(), Options{Slug: "remote", Spec: srv.URL + "/v1/other.yaml", Client: srv.Client()})
	if err == nil || !strings.Contains(err.Error(), "an https spec may refer only to https documents on "+strings.TrimPrefix(srv.URL, "https://")) {
		t.Errorf("got %v, want the other host refused", err)
	}

	_, err = Load(context.Background(), Options{Slug: "remote", Spec: srv.URL + "/v1/hop.yaml", Client: srv.Client()})
	if err == nil || !strings.Contains(err.Error(), "redirect of a $ref to https://localhost:") {
		t.Errorf("got %v, want the $ref's redirect to another host refused", err)
	}
}

// TestPlainOpenAPI: the shortcut that skips parsing the raw tree is taken
// only for a YAML OpenAPI document whose $refs all point into its own
// components.
func TestPlainOpenAPI(t *testing.T) {
	const head = "openapi: 3.0.3\ninfo: {title: t, version: '1'}\n"
	cases := []struct {
		name, doc string
		want      bool
	}{
		{"component refs only", head + "paths:\n  /a:\n    get:\n      parameters: [{$ref: '#/components/parameters/A'}]\n", true},
		{"no refs", head + "paths: {}\n", true},
		{"operation-level ref in the document", head + "paths:\n  /a:\n    get: {$ref: '#/x-ops/a'}\n", false},
		{"operation-level ref into components", head + "paths:\n  /a:\n    get: {$ref: '#/components/x-ops/a'}\n", false},
		{"path item ref into components", head + "paths:\n  /a: {$ref: '#/components/pathItems/A'}\n", false},
		{"operation-level ref to a file", head + "paths:\n  /a:\n    get:\n      $ref: ops/a.yaml\n", false},
		{"string-position ref", head + "  description: {$ref: \"docs/a.md\"}\npaths: {}\n", false},
		{"ref with an empty value", head + "paths:\n  /a:\n    get:\n      $ref:\n        x\n", false},
		{"JSON", `{"openapi": "3.0.3", "paths": {}}`, false},
		{"Swagger", "swagger: '2.0'\npaths: {}\n", false},
		{"openapi only nested", "info:\n  openapi: 3.0.3\n", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := plainOpenAPI([]byte(tc.doc)); got != tc.want {
				t.Errorf("plainOpenAPI = %v, want %v", got, tc.want)
			}
		})
	}
	twilio, err := os.ReadFile("testdata/twilio_api_v2010.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !plainOpenAPI(twilio) {
		t.Error("twilio_api_v2010.yaml: want the shortcut (all its $refs are #/components/)")
	}
}
