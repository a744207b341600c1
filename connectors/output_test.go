package connectors

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
)

// outSchema decodes a tool's OutputSchema.
func outSchema(t *testing.T, tl *Tool) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(tl.OutputSchema, &m); err != nil {
		t.Fatalf("%s: output schema %q: %v", tl.Name, tl.OutputSchema, err)
	}
	return m
}

func defNames(m map[string]any) []string {
	var out []string
	for k := range m["$defs"].(map[string]any) {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// OpenAI's createEmbedding answers 200 with $ref CreateEmbeddingResponse:
// the named schema is inlined at the root (so the root says "object") and
// what it reaches (Embedding) is in $defs; replies are checked against it.
func TestOutputSchemaOpenAIEmbedding(t *testing.T) {
	c := loadReal(t, "openai-3.1.yaml", "openai")
	tl := tool(t, c, "openai.create_embedding")
	m := outSchema(t, tl)
	if m["type"] != "object" || m["$ref"] != nil || m["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("root = type %v, $ref %v, $schema %v; want an object schema of 2020-12 with no $ref", m["type"], m["$ref"], m["$schema"])
	}
	if got, _ := json.Marshal(m["required"]); string(got) != `["object","model","data","usage"]` {
		t.Errorf("required = %s", got)
	}
	if d := defNames(m); !slices.Contains(d, "Embedding") {
		t.Errorf("$defs = %v, want Embedding", d)
	}
	if items, _ := json.Marshal(m["properties"].(map[string]any)["data"].(map[string]any)["items"]); string(items) != `{"$ref":"#/$defs/Embedding"}` {
		t.Errorf("data.items = %s", items)
	}
	good := `{"object":"list","model":"text-embedding-3-small","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]}],"usage":{"prompt_tokens":2,"total_tokens":2}}`
	if !tl.MatchesOutput([]byte(good)) {
		t.Errorf("a reply as the spec describes it does not match")
	}
	for name, bad := range map[string]string{
		"no usage":          `{"object":"list","model":"m","data":[]}`,
		"a string vector":   `{"object":"list","model":"m","data":[{"object":"embedding","index":0,"embedding":["x"]}],"usage":{"prompt_tokens":1,"total_tokens":1}}`,
		"object not list":   `{"object":"dict","model":"m","data":[],"usage":{"prompt_tokens":1,"total_tokens":1}}`,
		"not JSON":          `{"object":`,
		"an array at root":  `[]`,
		"usage tokens text": `{"object":"list","model":"m","data":[],"usage":{"prompt_tokens":"1","total_tokens":1}}`,
	} {
		if tl.MatchesOutput([]byte(bad)) {
			t.Errorf("%s: %s matches", name, bad)
		}
	}
}

// Discord: getUser's 200 is $ref UserResponse (an object, with the
// snowflake pattern through $defs); listGuildRoles answers an array, which
// connectors carry (a door that needs an object omits it); a 204 delete
// has none.
func TestOutputSchemaDiscord(t *testing.T) {
	c := loadReal(t, "discord-3.1.json", "discord")
	u := tool(t, c, "discord.get_user")
	m := outSchema(t, u)
	if m["type"] != "object" || !slices.Contains(defNames(m), "SnowflakeType") {
		t.Errorf("get_user: type %v, $defs %v; want object with SnowflakeType", m["type"], defNames(m))
	}
	if !u.MatchesOutput([]byte(`{"id":"80351110224678912","username":"nelly","avatar":null,"discriminator":"1337","public_flags":64,"flags":64,"global_name":null,"primary_guild":null}`)) {
		t.Errorf("get_user: a user as Discord documents it does not match")
	}
	if u.MatchesOutput([]byte(`{"id":"0123","username":"nelly","avatar":null,"discriminator":"1337","public_flags":64,"flags":64,"global_name":null,"primary_guild":null}`)) {
		t.Errorf("get_user: an id that is not a snowflake matches")
	}
	roles := outSchema(t, tool(t, c, "discord.list_guild_roles"))
	if roles["type"] != "array" {
		t.Errorf("list_guild_roles: type %v, want array", roles["type"])
	}
	if del := tool(t, c, "discord.delete_application_command"); del.OutputSchema != nil {
		t.Errorf("delete_application_command (204) has an output schema: %s", del.OutputSchema)
	}
}

// The success reply is 200's JSON, else 201's, else another 2xx's; a
// non-JSON reply gives none.
func TestOutputSchemaPick(t *testing.T) {
	spec := writeSpec(t, "pick.yaml", `openapi: 3.0.3
info: {title: pick, version: "1"}
paths:
  /a:
    post:
      operationId: a
      responses:
        "202": {description: x, content: {application/json: {schema: {type: object, properties: {c: {type: string}}}}}}
        "201": {description: x, content: {application/json: {schema: {type: object, properties: {b: {type: string}}}}}}
        "200": {description: x, content: {text/plain: {schema: {type: string}}, application/problem+json: {schema: {type: object, properties: {a: {type: string}}}}}}
  /b:
    post:
      operationId: b
      responses:
        "202": {description: x, content: {application/json: {schema: {type: object, properties: {c: {type: string}}}}}}
        "201": {description: x, content: {application/json: {schema: {type: object, properties: {b: {type: string}}}}}}
  /c:
    get:
      operationId: c
      responses:
        "200": {description: x, content: {text/csv: {schema: {type: string}}}}
        default: {description: x, content: {application/json: {schema: {type: object}}}}
`)
	c, err := Load(context.Background(), Options{Slug: "p", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"p.a": "a", "p.b": "b"} {
		props, _ := outSchema(t, tool(t, c, name))["properties"].(map[string]any)
		if _, ok := props[want]; !ok || len(props) != 1 {
			t.Errorf("%s: properties %v, want only %s", name, props, want)
		}
	}
	if s := tool(t, c, "p.c").OutputSchema; s != nil {
		t.Errorf("p.c: output schema %s from a non-JSON 200", s)
	}
	if len(c.Defects) != 0 {
		t.Errorf("defects: %v", c.Defects)
	}
}
