package connectors

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// twilio is loaded once per test binary: the spec is 1.5 MB.
var twilio struct {
	once sync.Once
	c    *Connector
	err  error
}

func loadTwilio(t testing.TB) *Connector {
	t.Helper()
	twilio.once.Do(func() {
		twilio.c, twilio.err = Load(context.Background(), Options{Slug: "twilio", Spec: "testdata/twilio_api_v2010.yaml"})
	})
	if twilio.err != nil {
		t.Fatalf("load twilio: %v", twilio.err)
	}
	return twilio.c
}

func mustLoad(t testing.TB, slug, spec string) *Connector {
	t.Helper()
	c, err := Load(context.Background(), Options{Slug: slug, Spec: spec})
	if err != nil {
		t.Fatalf("load %s: %v", spec, err)
	}
	return c
}

func tool(t testing.TB, c *Connector, name string) *Tool {
	t.Helper()
	for _, tl := range c.Tools {
		if tl.Name == name {
			return tl
		}
	}
	t.Fatalf("no tool %s", name)
	return nil
}

// goldenTool is what a golden file records of each tool.
type goldenTool struct {
	Name     string          `json:"name"`
	Method   string          `json:"method"`
	Path     string          `json:"path"`
	Risk     string          `json:"risk"`
	Security [][]string      `json:"security"`
	BodyType string          `json:"body_type,omitempty"`
	Schema   json.RawMessage `json:"schema"`
}

func TestGolden(t *testing.T) {
	cases := []struct {
		name  string
		spec  string
		slug  string
		tools int
	}{
		{"petstore-3.0", "petstore-3.0.yaml", "petstore", 3},
		{"petstore-expanded-3.0", "petstore-expanded-3.0.yaml", "petstore", 4},
		{"webhook-example-3.1", "webhook-example-3.1.yaml", "webhooks", 1}, // webhooks are not tools,
		{"twilio_api_v2010", "twilio_api_v2010.yaml", "twilio", 197},
		{"twilio_messaging_v1", "twilio_messaging_v1.yaml", "twilio-messaging", 58},
		{"sluice-test", "sluice-test.yaml", "test", 7}, // the multipart upload is a tool
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c *Connector
			if tc.slug == "twilio" {
				c = loadTwilio(t)
			} else {
				c = mustLoad(t, tc.slug, filepath.Join("testdata", tc.spec))
			}
			if len(c.Tools) != tc.tools {
				t.Errorf("got %d tools, want %d", len(c.Tools), tc.tools)
			}
			got := make([]goldenTool, 0, len(c.Tools))
			for i, tl := range c.Tools {
				if i > 0 && c.Tools[i-1].Name >= tl.Name {
					t.Errorf("tools not sorted: %s before %s", c.Tools[i-1].Name, tl.Name)
				}
				if !json.Valid(tl.Schema) {
					t.Errorf("%s: schema is not JSON", tl.Name)
				}
				got = append(got, goldenTool{tl.Name, tl.Method, tl.PathTemplate, tl.Risk.String(), tl.Security, tl.BodyType, tl.Schema})
			}
			out, err := json.MarshalIndent(got, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, '\n')
			file := filepath.Join("testdata", tc.name+".golden")
			if *update {
				if err := os.WriteFile(file, out, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("read golden (run with -update to create it): %v", err)
			}
			if string(want) != string(out) {
				t.Errorf("%s differs from the generated tools; rerun with -update and review the diff", file)
			}
		})
	}
}

func TestTwilio(t *testing.T) {
	c := loadTwilio(t)
	if len(c.Tools) != 197 {
		t.Fatalf("got %d tools, want 197", len(c.Tools))
	}
	s := c.Schemes["accountSid_authToken"]
	if s == nil || s.Type != "http" || s.Scheme != "basic" {
		t.Fatalf("accountSid_authToken scheme = %+v, want http basic", s)
	}
	if c.BaseURL == nil || c.BaseURL.String() != "https://api.twilio.com" {
		t.Errorf("base URL = %v, want https://api.twilio.com", c.BaseURL)
	}
	forms := 0
	for _, tl := range c.Tools {
		if !slices.EqualFunc(tl.Security, [][]string{{"accountSid_authToken"}}, slices.Equal) {
			t.Errorf("%s: security = %v, want basic auth", tl.Name, tl.Security)
		}
		if tl.BodyType == formType {
			forms++
		}
	}
	if forms == 0 {
		t.Error("no tool has a form body")
	}

	call := tool(t, c, "twilio.create_call")
	if call.BodyType != formType || call.Risk != RiskWrite {
		t.Fatalf("create_call: body %q risk %v", call.BodyType, call.Risk)
	}
	args := Args{
		Path: map[string]any{"AccountSid": "AC" + strings.Repeat("0", 32)},
		Body: map[string]any{
			"To": "+15005550006", "From": "+15005550001", "Url": "https://example.com/twiml",
			"StatusCallbackEvent": []any{"initiated", "answered"},
		},
	}
	if err := call.Validate(args); err != nil {
		t.Fatalf("validate: %v", err)
	}
	req, err := call.NewRequest(context.Background(), c.BaseURL, args)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := req.URL.String(), "https://api.twilio.com/2010-04-01/Accounts/AC00000000000000000000000000000000/Calls.json"; got != want {
		t.Errorf("url = %s, want %s", got, want)
	}
	if err := req.ParseForm(); err != nil {
		t.Fatal(err)
	}
	if got := req.PostForm["StatusCallbackEvent"]; !slices.Equal(got, []string{"initiated", "answered"}) {
		t.Errorf("StatusCallbackEvent = %v, want repeated keys", got)
	}
	if req.PostForm.Get("To") != "+15005550006" || req.Header.Get("Content-Type") != formType {
		t.Errorf("form = %v, content type %q", req.PostForm, req.Header.Get("Content-Type"))
	}

	// Missing required form field, reported by kin-openapi's validator.
	bad := Args{Path: args.Path, Body: map[string]any{"From": "+15005550001"}}
	var ae *ArgError
	if err := call.Validate(bad); !errors.As(err, &ae) || ae.Field != "body.To" {
		t.Errorf("missing To: got %v, want ArgError body.To", err)
	}
}

func TestSnakeCase(t *testing.T) {
	cases := map[string]string{
		"listTickets":     "list_tickets",
		"whoAmI":          "who_am_i",
		"getHTTPResponse": "get_http_response",
		"CreateMessage":   "create_message",
		"list-pets":       "list_pets",
		"v2ListPets":      "v2_list_pets",
		"list__pets--x":   "list_pets_x",
		"HTTP":            "http",
		"_x_":             "x",
		"héllo":           "h_llo",
	}
	for in, want := range cases {
		t.Run(in, func(t *testing.T) {
			if got := snakeCase(in); got != want {
				t.Errorf("snakeCase(%q) = %q, want %q", in, got, want)
			}
		})
	}
	if got := derivedOperationID("GET", "/pets/{petId}"); got != "get_pets_pet_id" {
		t.Errorf("derived = %q, want get_pets_pet_id", got)
	}
}

func TestSluiceSpec(t *testing.T) {
	c := mustLoad(t, "test", "testdata/sluice-test.yaml")
	if got := c.BaseURL.String(); got != "https://eu.api.example.com/v1" {
		t.Errorf("base URL = %s (server variable default not applied)", got)
	}
	if len(c.Skipped) != 0 {
		t.Errorf("skipped = %q, want none (the multipart upload is a tool)", c.Skipped)
	}
	if s := c.Schemes["bearer"]; s == nil || s.Scheme != "bearer" {
		t.Errorf("bearer scheme = %+v, want lower-case bearer", s)
	}
	if s := c.Schemes["apiKey"]; s == nil || s.In != "header" || s.Param != "X-API-Key" {
		t.Errorf("apiKey scheme = %+v", s)
	}
	cases := []struct {
		name     string
		risk     Risk
		security [][]string
		body     string
	}{
		{"test.list_pets", RiskRead, [][]string{{"apiKey"}}, ""},
		{"test.create_pet", RiskWrite, [][]string{{"apiKey"}}, "application/json"},
		{"test.get_pet", RiskWrite, [][]string{{"apiKey"}}, ""},                                  // x-sluice-risk: write on a GET
		{"test.delete_pets_pet_id", RiskWrite, [][]string{}, ""},                                 // no operationId; security: []
		{"test.get_http_photo", RiskRead, [][]string{{"basic"}, {"apiKey", "bearer"}}, ""},       // operation security wins
		{"test.who_am_i", RiskRead, [][]string{{"apiKey"}}, "application/x-www-form-urlencoded"}, // x-sluice-risk: read on a POST
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tl := tool(t, c, tc.name)
			if tl.Risk != tc.risk {
				t.Errorf("risk = %v, want %v", tl.Risk, tc.risk)
			}
			if !slices.EqualFunc(tl.Security, tc.security, slices.Equal) {
				t.Errorf("security = %v, want %v", tl.Security, tc.security)
			}
			if tl.BodyType != tc.body {
				t.Errorf("body type = %q, want %q", tl.BodyType, tc.body)
			}
		})
	}

	// The credential header and Authorization never become arguments.
	var schema struct {
		Properties struct {
			Headers struct {
				Properties map[string]any `json:"properties"`
			} `json:"headers"`
		} `json:"properties"`
		AdditionalProperties bool `json:"additionalProperties"`
	}
	if err := json.Unmarshal(tool(t, c, "test.list_pets").Schema, &schema); err != nil {
		t.Fatal(err)
	}
	if h := schema.Properties.Headers.Properties; len(h) != 1 || h["X-Request-Id"] == nil {
		t.Errorf("header arguments = %v, want only X-Request-Id", h)
	}
	// The path-level verbose (string) is overridden by getPet's (boolean, required).
	var ae *ArgError
	err := tool(t, c, "test.get_pet").Validate(Args{Path: map[string]any{"petId": "1"}, Query: map[string]any{"verbose": "yes"}})
	if !errors.As(err, &ae) || ae.Field != "query.verbose" {
		t.Errorf("verbose as string: got %v, want ArgError query.verbose", err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const head = "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'https://x.example'}]\n"
	cases := []struct {
		name    string
		opts    Options
		wantSub []string
	}{
		{"http scheme", Options{Slug: "x", Spec: "http://127.0.0.1/spec.yaml"}, []string{`scheme "http" is not allowed`}},
		{"file scheme", Options{Slug: "x", Spec: "file:///etc/passwd"}, []string{`scheme "file" is not allowed`}},
		{"bad slug", Options{Slug: "Bad_Slug", Spec: "testdata/petstore-3.0.yaml"}, []string{"slug", "must match"}},
		{"missing file", Options{Slug: "x", Spec: filepath.Join(dir, "nope.yaml")}, []string{"open spec"}},
		{"relative server without base", Options{Slug: "x", Spec: write("rel.yaml", "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: /api}]\npaths: {}\n")}, []string{"relative", "base_url"}},
		{"base_url with user info", Options{Slug: "x", Spec: "testdata/petstore-3.0.yaml", BaseURL: "https://u:p@x.example"}, []string{"base_url"}},
		{"ref outside the spec dir", Options{Slug: "x", Spec: write("out.yaml", head+`paths:
  /a:
    get:
      operationId: getA
      parameters:
        - $ref: '../../etc/passwd#/x'
      responses: {"200": {description: ok}}
`)}, []string{"outside the spec's directory"}},
		{"swagger 1.2", Options{Slug: "x", Spec: write("sw.json", `{"swaggerVersion": "1.2", "apis": []}`)}, []string{"sw.json", "is a Swagger 1.2 resource listing"}}, // 2.0 is converted (source_test.go)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(context.Background(), tc.opts)
			if err == nil {
				t.Fatalf("loaded %d tools, want an error", len(c.Tools))
			}
			for _, s := range tc.wantSub {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if !strings.HasPrefix(err.Error(), "connectors: load ") {
				t.Errorf("error %q lacks the step prefix", err)
			}
		})
	}
}

func TestLoadHTTPS(t *testing.T) {
	main := `openapi: 3.1.0
info: {title: remote, version: "1"}
servers: [{url: /api/v2}]
paths:
  /items/{id}:
    parameters:
      - $ref: 'params.yaml#/components/parameters/Id'
    put:
      operationId: putItem
      requestBody:
        required: true
        content:
          application/merge-patch+json:
            schema:
              type: object
              required: [count]
              properties:
                count: {type: [integer, "null"], maximum: 10}
      responses: {"200": {description: ok}}
`
	params := `components:
  parameters:
    Id:
      name: id
      in: path
      required: true
      schema: {type: string}
`
	fetched := map[string]int{}
	var mu sync.Mutex
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		fetched[r.URL.Path]++
		mu.Unlock()
		switch r.URL.Path {
		case "/specs/api.yaml":
			w.Write([]byte(main))
		case "/specs/params.yaml":
			w.Write([]byte(params))
		case "/redirect":
			http.Redirect(w, r, "http://"+r.Host+"/specs/api.yaml", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	c, err := Load(context.Background(), Options{Slug: "remote", Spec: srv.URL + "/specs/api.yaml", Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.BaseURL.String(), srv.URL+"/api/v2"; got != want {
		t.Errorf("base URL = %s, want %s (relative server resolved against the spec URL)", got, want)
	}
	if fetched["/specs/params.yaml"] != 1 {
		t.Errorf("relative $ref fetched %d times, want 1", fetched["/specs/params.yaml"])
	}
	tl := tool(t, c, "remote.put_item")
	if tl.BodyType != "application/merge-patch+json" {
		t.Errorf("body type = %q", tl.BodyType)
	}
	var ae *ArgError
	if err := tl.Validate(Args{Path: map[string]any{"id": "a"}, Body: map[string]any{"count": json.Number("11")}}); !errors.As(err, &ae) || ae.Field != "body.count" {
		t.Errorf("count 11: got %v, want ArgError body.count (3.1 schema)", err)
	}
	if err := tl.Validate(Args{Path: map[string]any{"id": "a"}, Body: map[string]any{"count": nil}}); err != nil {
		t.Errorf("count null: %v (3.1 type array allows null)", err)
	}

	t.Run("redirect to http refused", func(t *testing.T) {
		_, err := Load(context.Background(), Options{Slug: "remote", Spec: srv.URL + "/redirect", Client: srv.Client()})
		if err == nil || !strings.Contains(err.Error(), `redirect to scheme "http" refused`) {
			t.Errorf("got %v, want the redirect refused", err)
		}
	})
	t.Run("status 404", func(t *testing.T) {
		_, err := Load(context.Background(), Options{Slug: "remote", Spec: srv.URL + "/nope.yaml", Client: srv.Client()})
		if err == nil || !strings.Contains(err.Error(), "status 404") {
			t.Errorf("got %v, want status 404", err)
		}
	})
	t.Run("untrusted certificate", func(t *testing.T) {
		_, err := Load(context.Background(), Options{Slug: "remote", Spec: srv.URL + "/specs/api.yaml"})
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("got %v, want a certificate error with the default client", err)
		}
	})
}
