package connectors

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The real vendor specs in testdata (provenance in testdata/README.md) load
// with no connector-level failure; per spec, the tool count, the skipped
// operations with their reasons, and argument schemas checked by hand
// against the spec.

var realSpecs = []struct {
	file, slug string
	tools      int
	skipped    map[string]string // operation → a part of its reason
}{
	{"discord-3.1.json", "discord", 242, nil},
	{"openai-3.1.yaml", "openai", 288, nil},
	{"slack_web_swagger-2.0.json", "slack", 174, nil},
	{"twilio_api_v2010.yaml", "twilio", 197, nil},
	{"twilio_messaging_v1.yaml", "twilio-messaging", 58, nil},
	{"petstore-3.0.yaml", "petstore", 3, nil},
	{"petstore-expanded-3.0.yaml", "petstore", 4, nil},
	{"webhook-example-3.1.yaml", "webhooks", 1, nil},
}

var (
	specOnce sync.Map // file → *loadedSpec
)

type loadedSpec struct {
	once sync.Once
	c    *Connector
	err  error
}

// loadReal loads a testdata spec once per test binary.
func loadReal(t *testing.T, file, slug string) *Connector {
	t.Helper()
	v, _ := specOnce.LoadOrStore(file, &loadedSpec{})
	ls := v.(*loadedSpec)
	ls.once.Do(func() {
		ls.c, ls.err = Load(context.Background(), Options{Slug: slug, Spec: filepath.Join("testdata", file), BaseURL: "https://api.example", Defects: true})
	})
	if ls.err != nil {
		t.Fatalf("%s: %v", file, ls.err)
	}
	return ls.c
}

func TestRealSpecs(t *testing.T) {
	for _, rs := range realSpecs {
		t.Run(rs.file, func(t *testing.T) {
			c := loadReal(t, rs.file, rs.slug)
			if len(c.Tools) != rs.tools {
				t.Errorf("%d tools, want %d", len(c.Tools), rs.tools)
			}
			if len(c.Defects) != 0 {
				t.Errorf("defects: %v", c.Defects)
			}
			if len(c.Skipped) != len(rs.skipped) {
				t.Errorf("skipped %v, want %d", c.Skipped, len(rs.skipped))
			}
			for _, p := range c.Skipped {
				if want, ok := rs.skipped[p.Operation]; !ok || !strings.Contains(p.Reason, want) || !strings.HasPrefix(p.Pointer, "#/paths/") {
					t.Errorf("unexpected skip %s", p)
				}
			}
			aliases := map[string]bool{}
			for _, tl := range c.Tools {
				if !aliasRE.MatchString(tl.Alias) || aliases[tl.Alias] {
					t.Errorf("%s: alias %q is not a unique function name", tl.Name, tl.Alias)
				}
				aliases[tl.Alias] = true
				if tl.compiled == nil || !json.Valid(tl.Schema) {
					t.Errorf("%s: no compiled schema", tl.Name)
				}
			}
		})
	}
}

// OpenAI's file upload (multipart/form-data, file: format binary): the
// schema agents see says the file is base64 text, with an optional
// filename beside it, and that is what is enforced.
func TestOpenAIUpload(t *testing.T) {
	c := loadReal(t, "openai-3.1.yaml", "openai")
	up := tool(t, c, "openai.create_file")
	if up.BodyType != "multipart/form-data" {
		t.Fatalf("create_file body type %q", up.BodyType)
	}
	body := toolSchema(t, up).Properties.Body
	if body.Properties["file"]["contentEncoding"] != "base64" || body.Properties["file_filename"]["type"] != "string" {
		t.Errorf("create_file body schema %+v: want file as base64 and file_filename", body)
	}
	checkArgs(t, up, []argCase{
		{"upload", `{"body":{"file":"aGVsbG8=","file_filename":"a.jsonl","purpose":"batch"}}`, ""},
		{"no file", `{"body":{"purpose":"batch"}}`, "body.file"},
	})
}

type argCase struct {
	name  string
	args  string // the arguments document as an agent sends it
	field string // "" means valid; else the field the ArgError names
}

func checkArgs(t *testing.T, tl *Tool, cases []argCase) {
	t.Helper()
	for _, tc := range cases {
		args, err := DecodeArgs([]byte(tc.args))
		if err == nil {
			err = tl.Validate(args)
		}
		var ae *ArgError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s %s: %v, want valid", tl.Name, tc.name, err)
		case tc.field != "" && (!errors.As(err, &ae) || ae.Field != tc.field):
			t.Errorf("%s %s: %v, want an ArgError on %s", tl.Name, tc.name, err, tc.field)
		}
	}
}

func TestRealSpecArguments(t *testing.T) {
	openai := loadReal(t, "openai-3.1.yaml", "openai")
	// CreateEmbeddingRequest: additionalProperties false, required model
	// and input; input is oneOf a string or non-empty arrays; dimensions
	// minimum 1; encoding_format enum float|base64.
	checkArgs(t, tool(t, openai, "openai.create_embedding"), []argCase{
		{"string input", `{"body":{"model":"text-embedding-3-small","input":"hi"}}`, ""},
		{"token arrays", `{"body":{"model":"m","input":[[1,2],[3]]}}`, ""},
		{"empty array", `{"body":{"model":"m","input":[]}}`, "body.input"},
		{"no model", `{"body":{"input":"hi"}}`, "body.model"},
		{"dimensions 0", `{"body":{"model":"m","input":"hi","dimensions":0}}`, "body.dimensions"},
		{"bad format", `{"body":{"model":"m","input":"hi","encoding_format":"hex"}}`, "body.encoding_format"},
		{"unknown field", `{"body":{"model":"m","input":"hi","temperature":1}}`, "body.temperature"},
	})
	// VectorStoreSearchRequest.filters: ComparisonFilter or CompoundFilter,
	// whose filters items are ComparisonFilter or $recursiveRef "#" (the
	// CompoundFilter itself).
	search := tool(t, openai, "openai.search_vector_store")
	checkArgs(t, search, []argCase{
		{"nested compound", `{"path":{"vector_store_id":"vs_1"},"body":{"query":"q","filters":{"type":"and","filters":[{"type":"or","filters":[{"type":"eq","key":"a","value":"x"}]}]}}}`, ""},
		{"bad nested op", `{"path":{"vector_store_id":"vs_1"},"body":{"query":"q","filters":{"type":"and","filters":[{"type":"or","filters":[{"type":"like","key":"a","value":"x"}]}]}}}`, "body.filters.filters[0].filters[0].type"},
		{"results over 50", `{"path":{"vector_store_id":"vs_1"},"body":{"query":"q","max_num_results":51}}`, "body.max_num_results"},
	})
	if !strings.Contains(string(search.Schema), `"$ref":"#/$defs/CompoundFilter"`) {
		t.Error("search schema does not refer to CompoundFilter by $ref")
	}

	discord := loadReal(t, "discord-3.1.json", "discord")
	// update_guild_member: nick [string,null] maxLength 32; roles
	// [array,null] of null or SnowflakeType (pattern ^(0|[1-9][0-9]*)$),
	// uniqueItems, maxItems 350.
	checkArgs(t, tool(t, discord, "discord.update_guild_member"), []argCase{
		{"nulls", `{"path":{"guild_id":"1","user_id":"2"},"body":{"nick":null,"roles":null,"channel_id":null}}`, ""},
		{"roles", `{"path":{"guild_id":"1","user_id":"2"},"body":{"roles":["123",null]}}`, ""},
		{"bad snowflake", `{"path":{"guild_id":"1","user_id":"2"},"body":{"roles":["012"]}}`, "body.roles[0]"},
		{"duplicate roles", `{"path":{"guild_id":"1","user_id":"2"},"body":{"roles":["1","1"]}}`, "body.roles"},
		{"long nick", `{"path":{"guild_id":"1","user_id":"2"},"body":{"nick":"` + strings.Repeat("n", 33) + `"}}`, "body.nick"},
		{"no path", `{"body":{}}`, "path.guild_id"},
	})

	twilio := loadReal(t, "twilio_api_v2010.yaml", "twilio")
	// CreateMessage: a form body with To required.
	checkArgs(t, tool(t, twilio, "twilio.create_message"), []argCase{
		{"to", `{"path":{"AccountSid":"AC00000000000000000000000000000000"},"body":{"To":"+15550000000","Body":"hi"}}`, ""},
		{"no to", `{"path":{"AccountSid":"AC00000000000000000000000000000000"},"body":{"Body":"hi"}}`, "body.To"},
	})
}

// tools --json stays small: shared schemas are $defs, not inlined into
// every use (Discord's tools were 5 MB with every $ref inlined).
func TestSchemasStaySmall(t *testing.T) {
	for _, rs := range []struct {
		file, slug string
		max        int
	}{{"discord-3.1.json", "discord", 1 << 20}, {"openai-3.1.yaml", "openai", 2 << 20}} {
		c := loadReal(t, rs.file, rs.slug)
		n := 0
		for _, tl := range c.Tools {
			n += len(tl.Schema)
		}
		if n > rs.max {
			t.Errorf("%s: tool schemas total %d bytes, want at most %d", rs.file, n, rs.max)
		}
	}
}

// OpenAI's "/responses?beta=true" path keys: the template is the part
// before "?", and the fixed query goes with every call.
func TestFixedQueryInPathKey(t *testing.T) {
	c := loadReal(t, "openai-3.1.yaml", "openai")
	tl := tool(t, c, "openai.beta_get_response")
	if tl.PathTemplate != "/responses/{response_id}" {
		t.Errorf("template %q", tl.PathTemplate)
	}
	base, _ := url.Parse("https://api.example/v1")
	req, err := tl.NewRequest(context.Background(), base, Args{Path: map[string]any{"response_id": "resp_1"}, Query: map[string]any{"include": []any{"a"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := req.URL.String(); got != "https://api.example/v1/responses/resp_1?beta=true&include=a" {
		t.Errorf("url %s", got)
	}
}
