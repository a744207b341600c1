package mcp

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// petSchema and petsSchema have the shape connectors renders for the petstore
// spec's showPetById and listPets 200 replies (the door may not import
// connectors; TestOutputSchema* there cover the rendering).
const (
	petSchema  = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","required":["id","name"],"properties":{"id":{"type":"integer","format":"int64"},"name":{"type":"string"},"tag":{"type":"string"}}}`
	petsSchema = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"array","maxItems":100,"items":{"$ref":"#/$defs/Pet"},"$defs":{"Pet":` + petSchema + `}}`
)

// TestDoorOutputSchema: the official Go SDK client sees a tool's success
// reply schema as its outputSchema when it is an object schema, and none
// when the reply is an array; a reply valid under it comes back as structuredContent beside the
// text, and a reply that does not match, an error status or a refusal
// comes back as text alone (never a failed call).
func TestDoorOutputSchema(t *testing.T) {
	in := json.RawMessage(`{"type":"object","properties":{"path":{"type":"object"}}}`)
	tools := []call.Tool{
		{Name: "pets.show_pet_by_id", Alias: "pets_show_pet_by_id", Method: "GET", Path: "/pets/{petId}", Schema: in, OutputSchema: json.RawMessage(petSchema)},
		{Name: "pets.list_pets", Alias: "pets_list_pets", Method: "GET", Path: "/pets", Schema: in, OutputSchema: json.RawMessage(petsSchema)},
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(petSchema))
	if err != nil {
		t.Fatal(err)
	}
	jc := jsonschema.NewCompiler()
	if err := jc.AddResource("pet.json", doc); err != nil {
		t.Fatal(err)
	}
	pet, err := jc.Compile("pet.json")
	if err != nil {
		t.Fatal(err)
	}
	d := New(Deps{
		Identify: func(r *http.Request) (wire.Identity, bool) {
			return wire.Identity{Sandbox: "sb", Agent: "a", Session: "s", User: "u"}, true
		},
		Tools: func(context.Context, wire.Identity) ([]call.Tool, *refusal.Error) { return tools, nil },
		Output: func(name string, body []byte) bool {
			v, err := jsonschema.UnmarshalJSON(strings.NewReader(string(body)))
			return name == "pets.show_pet_by_id" && err == nil && pet.Validate(v) == nil
		},
		Call: func(_ context.Context, r call.Request) call.Outcome {
			var a struct{ Path map[string]any }
			_ = json.Unmarshal(r.Args, &a)
			reply := func(status int, body string) call.Outcome {
				return call.Outcome{RequestID: "r", Status: status, Reply: &call.Reply{Status: status, Body: json.RawMessage(body)}}
			}
			switch a.Path["petId"] {
			case "1":
				return reply(200, `{"id":1,"name":"rex","tag":"dog"}`)
			case "2":
				return reply(200, `{"id":"one","name":"rex"}`) // id is an integer in the spec
			case "3":
				return reply(404, `{"code":404,"message":"no pet"}`)
			case "4":
				return call.Outcome{RequestID: "r", Status: 200, Reply: &call.Reply{Status: 200, Body: `{"id":1,"name":"text, not JSON"}`}}
			case "5":
				return call.Outcome{Status: 200, Answer: []byte(`{"status":200,"headers":{},"body":{"id":5,"name":"held"},"request_id":"r"}`)}
			}
			if r.Tool == "pets.list_pets" {
				return reply(200, `[{"id":1,"name":"rex"}]`)
			}
			e := refusal.New(http.StatusForbidden, refusal.PolicyBlock, "blocked by policy: no")
			return call.Outcome{RequestID: "r", Status: e.Status, Refusal: e}
		},
		Poll: func(context.Context, wire.Identity, string, time.Duration) call.Outcome {
			return call.Outcome{Status: 404, Refusal: refusal.New(http.StatusNotFound, refusal.NotFound, "no such hold")}
		},
		HoldWait: time.Second,
	})
	ctx, cs, listed := sdkSession(t, d)
	show := listed["pets.show_pet_by_id"]
	if show == nil || show.OutputSchema == nil {
		t.Fatalf("show_pet_by_id listed without an outputSchema: %+v", show)
	}
	out, _ := show.OutputSchema.(map[string]any)
	if out["type"] != "object" || !reflect.DeepEqual(out["required"], []any{"id", "name"}) {
		t.Errorf("outputSchema = %v, want Pet's object schema", show.OutputSchema)
	}
	if l := listed["pets.list_pets"]; l == nil || l.OutputSchema != nil {
		t.Errorf("list_pets (an array reply) listed with an outputSchema: %+v", l)
	}

	callPet := func(id string) *sdk.CallToolResult {
		t.Helper()
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "pets.show_pet_by_id", Arguments: map[string]any{"path": map[string]any{"petId": id}}})
		if err != nil {
			t.Fatalf("petId %s: %v", id, err)
		}
		if len(r.Content) == 0 {
			t.Fatalf("petId %s: no content, want the text", id)
		}
		return r
	}
	r := callPet("1")
	if r.IsError || !reflect.DeepEqual(r.StructuredContent, map[string]any{"id": 1.0, "name": "rex", "tag": "dog"}) {
		t.Errorf("a matching reply: isError %v, structuredContent %#v; want the body", r.IsError, r.StructuredContent)
	}
	if txt := r.Content[0].(*sdk.TextContent).Text; !strings.Contains(txt, `"status":200`) || !strings.Contains(txt, `"name":"rex"`) {
		t.Errorf("a matching reply's text = %s", txt)
	}
	r = callPet("5")
	if r.IsError || !reflect.DeepEqual(r.StructuredContent, map[string]any{"id": 5.0, "name": "held"}) {
		t.Errorf("a held call's stored answer: isError %v, structuredContent %#v; want the body", r.IsError, r.StructuredContent)
	}
	// Every other answer is isError with text only: MCP requires a
	// non-error result of a tool with an outputSchema to carry conforming
	// structuredContent (the TypeScript client throws otherwise). A reply
	// that was sent but does not fit (2: not matching, 4: not JSON) says
	// so in a second text, so the agent knows the call went out.
	for id, unfit := range map[string]bool{"2": true, "3": false, "4": true, "9": false} {
		r := callPet(id)
		if !r.IsError || r.StructuredContent != nil {
			t.Errorf("petId %s: isError %v, structuredContent %#v; want isError and text only", id, r.IsError, r.StructuredContent)
		}
		last := r.Content[len(r.Content)-1].(*sdk.TextContent).Text
		if got := len(r.Content) == 2 && last == unfitReply; got != unfit {
			t.Errorf("petId %s: content %d, last %q; want the unfit note %v", id, len(r.Content), last, unfit)
		}
	}
	// A tool without an outputSchema keeps the result document as
	// structuredContent.
	r, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "pets.list_pets", Arguments: map[string]any{}})
	if err != nil || r.IsError {
		t.Fatalf("list_pets: %v %+v", err, r)
	}
	if doc, ok := r.StructuredContent.(map[string]any); !ok || doc["status"] != 200.0 {
		t.Errorf("list_pets structuredContent = %#v, want the result document", r.StructuredContent)
	}
}

// sdkSession serves d and connects the official Go SDK client to it,
// returning its session and tools/list by name; all end with the test.
func sdkSession(t *testing.T, d *Door) (context.Context, *sdk.ClientSession, map[string]*sdk.Tool) {
	t.Helper()
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &sdk.StreamableClientTransport{Endpoint: srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]*sdk.Tool{}
	for _, tl := range lt.Tools {
		listed[tl.Name] = tl
	}
	return ctx, cs, listed
}
