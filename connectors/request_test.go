package connectors

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

func decode(t testing.TB, s string) Args {
	t.Helper()
	a, err := DecodeArgs([]byte(s))
	if err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return a
}

func TestDecodeArgs(t *testing.T) {
	cases := []struct {
		name  string
		in    string
		field string // "" with wantErr means a document-level ArgError
		err   bool
	}{
		{"empty object", `{}`, "", false},
		{"all keys", `{"path":{"a":"1"},"query":{"b":[1,2]},"headers":{"c":"d"},"body":{"e":1}}`, "", false},
		{"null sections", `{"path":null,"body":null}`, "", false},
		{"unknown key", `{"pth":{}}`, "pth", true},
		{"duplicate top-level key", `{"path":{"id":"1"},"path":{"id":"../x"}}`, "path", true},
		{"duplicate nested key", `{"body":{"a":1,"a":2}}`, "body.a", true},
		{"trailing data", `{} {}`, "", true},
		{"trailing garbage", `{}x`, "", true},
		{"not an object", `[1]`, "", true},
		{"null document", `null`, "", true},
		{"path not object", `{"path":"x"}`, "path", true},
		{"truncated", `{"body":{`, "body", true},
		{"invalid utf8", "{\"body\":\"\xff\"}", "", true},
		{"too deep", `{"body":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, "", true},
		{"too large", `{"body":"` + strings.Repeat("a", MaxArgsBytes) + `"}`, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeArgs([]byte(tc.in))
			if !tc.err {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var ae *ArgError
			if !errors.As(err, &ae) {
				t.Fatalf("got %v, want *ArgError", err)
			}
			if tc.field != "" && ae.Field != tc.field {
				t.Errorf("field = %q, want %q", ae.Field, tc.field)
			}
		})
	}
	a := decode(t, `{"body":{"n":12345678901234567890}}`)
	if n := a.Body.(map[string]any)["n"]; n != json.Number("12345678901234567890") {
		t.Errorf("big integer = %v (%T), want the exact json.Number", n, n)
	}
}

func TestValidate(t *testing.T) {
	c := mustLoad(t, "test", "testdata/sluice-test.yaml")
	pet := mustLoad(t, "petstore", "testdata/petstore-3.0.yaml")
	cases := []struct {
		name  string
		tool  *Tool
		args  string
		field string // "" means valid
	}{
		{"valid list", tool(t, c, "test.list_pets"), `{"query":{"limit":5,"tags":["a"]},"headers":{"X-Request-Id":"r1"}}`, ""},
		{"unknown query", tool(t, c, "test.list_pets"), `{"query":{"limt":5}}`, "query.limt"},
		{"unknown header", tool(t, c, "test.list_pets"), `{"headers":{"X-Api-Key":"steal"}}`, "headers.X-Api-Key"},
		{"unknown path", tool(t, c, "test.list_pets"), `{"path":{"x":"1"}}`, "path.x"},
		{"limit wrong type", tool(t, c, "test.list_pets"), `{"query":{"limit":"5"}}`, "query.limit"},
		{"limit too big", tool(t, c, "test.list_pets"), `{"query":{"limit":101}}`, "query.limit"},
		{"limit not integer", tool(t, c, "test.list_pets"), `{"query":{"limit":1.5}}`, "query.limit"},
		{"array item type", tool(t, c, "test.list_pets"), `{"query":{"ids":[1,"x"]}}`, "query.ids[1]"},
		{"header CRLF", tool(t, c, "test.list_pets"), `{"headers":{"X-Request-Id":"a\r\nX-Evil: 1"}}`, "headers.X-Request-Id"},
		{"header NUL", tool(t, c, "test.list_pets"), `{"headers":{"X-Request-Id":"a\u0000b"}}`, "headers.X-Request-Id"},
		{"header object", tool(t, c, "test.list_pets"), `{"headers":{"X-Request-Id":{"a":"b"}}}`, "headers.X-Request-Id"},
		{"oversized string", tool(t, c, "test.list_pets"), `{"headers":{"X-Request-Id":"` + strings.Repeat("a", 64<<10+1) + `"}}`, "headers.X-Request-Id"},
		{"missing path param", tool(t, pet, "petstore.show_pet_by_id"), `{}`, "path.petId"},
		{"empty path param", tool(t, pet, "petstore.show_pet_by_id"), `{"path":{"petId":""}}`, "path.petId"},
		{"path param wrong type", tool(t, pet, "petstore.show_pet_by_id"), `{"path":{"petId":5}}`, "path.petId"},
		{"missing required query", tool(t, c, "test.get_pet"), `{"path":{"petId":"1"}}`, "query.verbose"},
		{"path int64", tool(t, c, "test.get_http_photo"), `{"path":{"petId":9007199254740993,"photoId":"p"}}`, ""},
		{"path int64 as string", tool(t, c, "test.get_http_photo"), `{"path":{"petId":"7","photoId":"p"}}`, "path.petId"},
		{"valid body", tool(t, c, "test.create_pet"), `{"body":{"name":"rex","tag":{"label":"dog"},"parent":{"child":{"child":{}}}}}`, ""},
		{"missing body", tool(t, c, "test.create_pet"), `{}`, "body"},
		{"allOf first branch", tool(t, c, "test.create_pet"), `{"body":{"age":3}}`, "body.name"},
		{"allOf second branch", tool(t, c, "test.create_pet"), `{"body":{"name":"rex","age":-1}}`, "body.age"},
		{"external ref", tool(t, c, "test.create_pet"), `{"body":{"name":"rex","tag":{"label":"` + strings.Repeat("x", 21) + `"}}}`, "body.tag.label"},
		{"body wrong type", tool(t, c, "test.create_pet"), `{"body":{"name":7}}`, "body.name"},
		{"oversized body string", tool(t, c, "test.create_pet"), `{"body":{"name":"` + strings.Repeat("a", 64<<10+1) + `"}}`, "body.name"},
		{"body not taken", tool(t, c, "test.list_pets"), `{"body":{}}`, "body"},
		{"form enum", tool(t, c, "test.who_am_i"), `{"body":{"To":"x","Event":["ringing","bogus"]}}`, "body.Event[1]"},
		{"form missing", tool(t, c, "test.who_am_i"), `{"body":{"Count":1}}`, "body.To"},
		{"form not object", tool(t, c, "test.who_am_i"), `{"body":"To=x"}`, "body"},
		{"form nested array", tool(t, c, "test.who_am_i"), `{"body":{"To":"x","Event":[["ringing"]]}}`, "body.Event[0]"},
		{"form optional body absent", tool(t, c, "test.who_am_i"), `{}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.tool.Validate(decode(t, tc.args))
			if tc.field == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var ae *ArgError
			if !errors.As(err, &ae) {
				t.Fatalf("got %v, want *ArgError %s", err, tc.field)
			}
			if ae.Field != tc.field {
				t.Errorf("field = %q (%v), want %q", ae.Field, err, tc.field)
			}
		})
	}
}

func TestNewRequest(t *testing.T) {
	c := mustLoad(t, "test", "testdata/sluice-test.yaml")
	cases := []struct {
		name    string
		tool    string
		args    string
		url     string
		headers map[string]string
		body    string
	}{
		{"no args", "test.list_pets", `{}`, "https://eu.api.example.com/v1/pets", nil, ""},
		{"form explode", "test.list_pets", `{"query":{"tags":["a","b c"]}}`, "https://eu.api.example.com/v1/pets?tags=a&tags=b+c", nil, ""},
		{"form no explode", "test.list_pets", `{"query":{"ids":[1,2,3]}}`, "https://eu.api.example.com/v1/pets?ids=1,2,3", nil, ""},
		{"space delimited", "test.list_pets", `{"query":{"colors":["red","dark blue"]}}`, "https://eu.api.example.com/v1/pets?colors=red%20dark+blue", nil, ""},
		{"pipe delimited", "test.list_pets", `{"query":{"sizes":["s","m|l"]}}`, "https://eu.api.example.com/v1/pets?sizes=s%7Cm%7Cl", nil, ""},
		{"deep object", "test.list_pets", `{"query":{"filter":{"kind":"cat"}}}`, "https://eu.api.example.com/v1/pets?filter%5Bkind%5D=cat", nil, ""},
		{"query injection stays a value", "test.list_pets", `{"query":{"tags":["a&limit=1000"],"limit":5}}`, "https://eu.api.example.com/v1/pets?limit=5&tags=a%26limit%3D1000", nil, ""},
		{"header", "test.list_pets", `{"headers":{"X-Request-Id":"r-1"}}`, "https://eu.api.example.com/v1/pets", map[string]string{"X-Request-Id": "r-1"}, ""},
		{"json body", "test.create_pet", `{"body":{"name":"rex","age":12345678901234567890}}`, "https://eu.api.example.com/v1/pets", map[string]string{"Content-Type": "application/json"}, `{"age":12345678901234567890,"name":"rex"}`},
		{"form body", "test.who_am_i", `{"body":{"To":"+1 555","Count":2,"Event":["ringing","answered"]}}`, "https://eu.api.example.com/v1/search", map[string]string{"Content-Type": formType}, "Count=2&Event=ringing&Event=answered&To=%2B1+555"},
		{"two path params", "test.get_http_photo", `{"path":{"petId":42,"photoId":"a b"}}`, "https://eu.api.example.com/v1/pets/42/photos/a%20b", nil, ""},
		{"bool query", "test.get_pet", `{"path":{"petId":"7"},"query":{"verbose":true}}`, "https://eu.api.example.com/v1/pets/7?verbose=true", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tl := tool(t, c, tc.tool)
			args := decode(t, tc.args)
			if err := tl.Validate(args); err != nil {
				t.Fatalf("validate: %v", err)
			}
			req, err := tl.NewRequest(context.Background(), c.BaseURL, args)
			if err != nil {
				t.Fatal(err)
			}
			if req.Method != tl.Method {
				t.Errorf("method = %s, want %s", req.Method, tl.Method)
			}
			if got := req.URL.String(); got != tc.url {
				t.Errorf("url = %s, want %s", got, tc.url)
			}
			for k, v := range tc.headers {
				if got := req.Header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if req.Header.Get("Authorization") != "" || req.Header.Get("X-API-Key") != "" {
				t.Error("a credential header was set")
			}
			var body string
			if req.Body != nil {
				b, _ := io.ReadAll(req.Body)
				body = string(b)
			}
			if body != tc.body {
				t.Errorf("body = %q, want %q", body, tc.body)
			}
		})
	}

	t.Run("header smuggling refused without Validate", func(t *testing.T) {
		tl := tool(t, c, "test.list_pets")
		_, err := tl.NewRequest(context.Background(), c.BaseURL, Args{Headers: map[string]any{"X-Request-Id": "a\r\nHost: evil"}})
		var ae *ArgError
		if !errors.As(err, &ae) || ae.Field != "headers.X-Request-Id" {
			t.Errorf("got %v, want ArgError headers.X-Request-Id", err)
		}
	})
	t.Run("empty path refused without Validate", func(t *testing.T) {
		tl := tool(t, c, "test.get_pet")
		_, err := tl.NewRequest(context.Background(), c.BaseURL, Args{Path: map[string]any{"petId": ""}})
		var ae *ArgError
		if !errors.As(err, &ae) || ae.Field != "path.petId" {
			t.Errorf("got %v, want ArgError path.petId", err)
		}
	})
}

// traversal lists path-parameter values that try to leave their segment.
var traversal = []struct {
	name  string
	value string
	cite  string
}{
	{"dot dot slash", "../admin", "CWE-22 path traversal"},
	{"encoded slash", "..%2fadmin", "CVE-2021-41773 (Apache httpd encoded traversal)"},
	{"encoded dots", "%2e%2e%2fadmin", "CVE-2021-41773 (Apache httpd %2e traversal)"},
	{"double encoded", "%252e%252e%252f", "CVE-2021-42013 (double encoding)"},
	{"encoded dot dot alone", "%2e%2e", "CVE-2021-41773"},
	{"slash", "a/b", "segment split"},
	{"leading slash", "/etc/passwd", "absolute path injection"},
	{"backslash", `..\..\admin`, "CVE-2019-0230-style backslash normalisation"},
	{"question mark", "1?admin=true", "query injection"},
	{"hash", "1#frag", "fragment injection"},
	{"semicolon", "1;jsessionid=x", "path parameter confusion (CVE-2020-1957 Shiro)"},
	{"nul", "1\x00.json", "NUL truncation"},
	{"crlf", "1\r\nHost: evil", "CRLF injection (CWE-93)"},
	{"unicode", "..／admin", "full-width solidus normalisation"},
	{"space", "a b", "plain escaping"},
}

// Dot segments are refused outright: escaped as %2E they would still be
// decoded and removed by a normalising server (RFC 3986 §6.2.2.2, the
// ".%2e" trick of CVE-2021-41773).
func TestDotSegmentsRefused(t *testing.T) {
	pet := mustLoad(t, "petstore", "testdata/petstore-3.0.yaml")
	tl := tool(t, pet, "petstore.show_pet_by_id")
	for _, v := range []any{".", "..", []any{".."}} {
		args := Args{Path: map[string]any{"petId": v}}
		var ae *ArgError
		if err := tl.Validate(args); !errors.As(err, &ae) || ae.Field != "path.petId" {
			t.Errorf("Validate(%v) = %v, want ArgError path.petId", v, err)
		}
		if _, err := tl.NewRequest(context.Background(), pet.BaseURL, args); !errors.As(err, &ae) || ae.Field != "path.petId" {
			t.Errorf("NewRequest(%v) = %v, want ArgError path.petId", v, err)
		}
	}
}

func TestPathTraversal(t *testing.T) {
	pet := mustLoad(t, "petstore", "testdata/petstore-3.0.yaml")
	tl := tool(t, pet, "petstore.show_pet_by_id")
	seen := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.URL.EscapedPath()
	}))
	defer srv.Close()
	base, _ := url.Parse(srv.URL + "/v1/")

	for _, tc := range traversal {
		t.Run(tc.name, func(t *testing.T) {
			args := Args{Path: map[string]any{"petId": tc.value}}
			if err := tl.Validate(args); err != nil {
				t.Fatalf("validate (%s): %v", tc.cite, err)
			}
			req, err := tl.NewRequest(context.Background(), base, args)
			if err != nil {
				t.Fatal(err)
			}
			checkOneSegment(t, req.URL.EscapedPath(), "/v1/pets/", tc.value)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("send (%s): %v", tc.cite, err)
			}
			resp.Body.Close()
			checkOneSegment(t, <-seen, "/v1/pets/", tc.value)
		})
	}
}

// checkOneSegment asserts that escaped is prefix plus exactly one segment
// that decodes to value and is no dot segment.
func checkOneSegment(t *testing.T, escaped, prefix, value string) {
	t.Helper()
	seg, ok := strings.CutPrefix(escaped, prefix)
	if !ok {
		t.Fatalf("path %q lost its prefix %q", escaped, prefix)
	}
	if strings.Contains(seg, "/") || seg == "." || seg == ".." || seg == "" {
		t.Fatalf("value %q became path %q: not one segment", value, escaped)
	}
	if dec, err := url.PathUnescape(seg); err != nil || dec != value {
		t.Fatalf("segment %q decodes to %q (%v), want %q", seg, dec, err, value)
	}
}
