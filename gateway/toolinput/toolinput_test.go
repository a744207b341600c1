package toolinput

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/policy"
)

// petstore loads the petstore spec as connector "pets" on a loopback base
// URL with a base path, and returns its tool of operation op.
func petstore(t *testing.T, op string) (*connectors.Connector, *connectors.Tool) {
	t.Helper()
	data, err := os.ReadFile("../../connectors/testdata/petstore-3.0.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := connectors.LoadData(context.Background(), "pets", data, "http://127.0.0.1:9/v1")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(c.Tools, func(tl *connectors.Tool) bool { return tl.OperationID == op })
	if i < 0 {
		t.Fatalf("no tool for %s", op)
	}
	return c, c.Tools[i]
}

// TestStripHeaders: the header arguments only the gateway may set never
// reach the request policy decides on; the agent's own header stays.
func TestStripHeaders(t *testing.T) {
	stripped := []string{"X-Sluice-Agent", "Sluice-Identity", "Proxy-Authorization", "X-Forwarded-For", "Forwarded",
		"X-Envoy-Original-Path", "Host", "Connection", "Transfer-Encoding", "Content-Length", "Accept-Encoding",
		"Range", "If-Range", "Traceparent", "tracestate", "TE", "Upgrade"}
	a := connectors.Args{Headers: map[string]any{"X-Request-Note": "mine"}}
	for _, h := range stripped {
		a.Headers[h] = "forged"
	}
	StripHeaders(&a)
	if len(a.Headers) != 1 || a.Headers["X-Request-Note"] != "mine" {
		t.Fatalf("headers after stripping: %v, want only X-Request-Note", a.Headers)
	}
}

// TestIdempotency: the key goes in the tool's idempotency header only when
// the arguments set none, in any case.
func TestIdempotency(t *testing.T) {
	tool := &connectors.Tool{IdempotencyHeader: "Idempotency-Key"}
	var a connectors.Args
	Idempotency(&a, tool, "hold-1")
	if a.Headers["Idempotency-Key"] != "hold-1" {
		t.Fatalf("no key set: %v", a.Headers)
	}
	a = connectors.Args{Headers: map[string]any{"idempotency-key": "agent's"}}
	Idempotency(&a, tool, "hold-1")
	if len(a.Headers) != 1 || a.Headers["idempotency-key"] != "agent's" {
		t.Fatalf("the agent's key was overridden: %v", a.Headers)
	}
	a = connectors.Args{}
	Idempotency(&a, &connectors.Tool{}, "hold-1")
	if a.Headers != nil {
		t.Fatalf("a key was set on a tool without an idempotency header: %v", a.Headers)
	}
}

// TestFormed: a door's formed request is decided only when it is the
// tool's operation on its connector's base URL; anything else is refused
// with the reason, and the body is read (bounded) and kept on both copies.
func TestFormed(t *testing.T) {
	c, show := petstore(t, "showPetById")
	_, create := petstore(t, "createPets")
	refused := []struct {
		name, method, url string
		tool              *connectors.Tool
		body              string
		want              string
	}{
		{"another method", "DELETE", "http://127.0.0.1:9/v1/pets/7", show, "", "method DELETE is not"},
		{"another host", "GET", "http://127.0.0.2:9/v1/pets/7", show, "", "is not for"},
		{"another scheme", "GET", "https://127.0.0.1:9/v1/pets/7", show, "", "is not for"},
		{"outside the base path", "GET", "http://127.0.0.1:9/v2/pets/7", show, "", "path is not"},
		{"an empty parameter", "GET", "http://127.0.0.1:9/v1/pets/", show, "", "path is not"},
		{"an extra segment", "GET", "http://127.0.0.1:9/v1/pets/7/owner", show, "", "path is not"},
		{"a body over the bound", "POST", "http://127.0.0.1:9/v1/pets", create, strings.Repeat("x", connectors.MaxArgsBytes+1), "larger than"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			hr, err := http.NewRequest(tc.method, tc.url, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req, err := Formed(context.Background(), hr, tc.tool, c.BaseURL)
			if err == nil || req != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Formed = %v, %v; want a refusal saying %q", req, err, tc.want)
			}
		})
	}

	hr, err := http.NewRequest("POST", "http://127.0.0.1:9/v1/pets", strings.NewReader(`{"id":1,"name":"rex"}`))
	if err != nil {
		t.Fatal(err)
	}
	req, err := Formed(context.Background(), hr, create, c.BaseURL)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*http.Request{"formed": hr, "copy": req} {
		b, err := io.ReadAll(r.Body)
		if err != nil || string(b) != `{"id":1,"name":"rex"}` {
			t.Fatalf("%s body = %q, %v", name, b, err)
		}
	}
	if req.ContentLength != int64(len(`{"id":1,"name":"rex"}`)) {
		t.Fatalf("copy's ContentLength = %d", req.ContentLength)
	}
}

// TestBuild: what `sluice policy eval --tool` refuses before policy, with
// the gateway's status and code, and the input it builds otherwise.
func TestBuild(t *testing.T) {
	c, show := petstore(t, "showPetById")
	cfg := &config.Config{Agents: []config.Agent{{Name: "agent-a", Connectors: []string{"pets"}}, {Name: "agent-b"}}}
	caller := policy.Caller{Sandbox: "sb", Agent: "agent-a", Session: "s1", User: "alice"}
	refused := []struct {
		name   string
		agent  string
		args   string
		status int
		code   string
	}{
		{"an agent not granted the connector", "agent-b", `{"path":{"petId":"7"}}`, 403, "not_granted"},
		{"an unknown agent", "agent-z", `{"path":{"petId":"7"}}`, 403, "not_granted"},
		{"arguments over the bound", "agent-a", `{"path":{"petId":"` + strings.Repeat("7", connectors.MaxArgsBytes) + `"}}`, 400, "schema_violation"},
		{"a missing path parameter", "agent-a", `{}`, 400, "schema_violation"},
		{"arguments that are not JSON", "agent-a", `{"path":`, 400, "schema_violation"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			cl := caller
			cl.Agent = tc.agent
			in, err := Build(context.Background(), cfg, show, c.BaseURL, Call{Tool: show.Name, Args: []byte(tc.args), Caller: cl})
			var re *RefusedError
			if in != nil || !errors.As(err, &re) || re.Status != tc.status || re.Code != tc.code {
				t.Fatalf("Build = %v, %v; want %d %s", in, err, tc.status, tc.code)
			}
		})
	}

	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.FixedZone("x", 3600))
	args := `{"path":{"petId":"7"},"headers":{"X-Forwarded-For":"10.0.0.1","X-Sluice-Agent":"agent-b"}}`
	in, err := Build(context.Background(), cfg, show, c.BaseURL, Call{Tool: show.Name, Args: []byte(args), Caller: caller, Time: at})
	if err != nil {
		t.Fatal(err)
	}
	if in.Kind != "tool_call" || in.Tool != show.Name || in.Connector != "pets" || in.Caller != caller {
		t.Fatalf("input names %s %s %s %+v", in.Kind, in.Tool, in.Connector, in.Caller)
	}
	if !in.Time.Equal(at) || in.Time.Location() != time.UTC {
		t.Fatalf("input time %v, want %v in UTC", in.Time, at)
	}
	if in.Request.Method != "GET" || in.Request.Host != "127.0.0.1:9" || in.Request.Path != "/v1/pets/7" {
		t.Fatalf("input request %s %s %s", in.Request.Method, in.Request.Host, in.Request.Path)
	}
	for _, h := range []string{"X-Forwarded-For", "X-Sluice-Agent"} {
		if _, ok := in.Request.Headers[h]; ok {
			t.Errorf("the decided request carries %s", h)
		}
		if _, ok := in.Args.(map[string]any)["headers"].(map[string]any)[h]; ok {
			t.Errorf("the decided arguments carry %s", h)
		}
	}
	if tags := in.Operation.Tags; len(tags) != 1 || tags[0] != "pets" {
		t.Fatalf("operation tags %v", tags)
	}
}

// TestInputWithoutArguments: a tool offered before any call is decided on
// an input with no arguments and no request, and tags that are always an
// array.
func TestInputWithoutArguments(t *testing.T) {
	tool := &connectors.Tool{Connector: "pets", Name: "pets.list", Method: "GET", PathTemplate: "/pets"}
	in := Input("sb", "agent-a", "s1", "alice", tool, nil, nil, time.Unix(0, 0).UTC())
	if in.Args != nil || in.Request.Method != "" || in.Operation.Tags == nil || len(in.Operation.Tags) != 0 {
		t.Fatalf("input without arguments: args %v, request %+v, tags %#v", in.Args, in.Request, in.Operation.Tags)
	}
}
