// Package connectors turns OpenAPI 3.0 and 3.1 documents (and Swagger 2.0,
// converted on load) into tools: named, schema-checked operations that the
// gateway can call on an agent's behalf.
//
// A connector is one API (one spec plus a base URL). Each operation becomes a
// Tool named "<slug>.<operationId in snake_case>" (with a function-safe
// alias) with a JSON Schema 2020-12 document for its arguments
// ({"path","query","headers","body"}) and a risk class. That document is
// both what agents are shown and what is compiled to validate their
// arguments. Arguments are validated here, before any policy runs, and the
// upstream request is built here so that path parameters can never change
// the upstream path.
//
// Loading is lenient: an operation that cannot be understood is skipped
// with its JSON pointer and reason (Connector.Skipped), a defect that
// touches no operation is reported (Connector.Defects), and only
// Options.Strict turns either into a failed load.
//
// This package imports no other package of sluice. It reads specs with
// kin-openapi (and source.go reads a spec's raw tree with the YAML parser
// kin-openapi links, go.yaml.in/yaml/v3, before kin-openapi does), and
// validates arguments with santhosh-tekuri/jsonschema, whose patterns are
// ECMA-262 (dlclark/regexp2, with a match timeout).
package connectors

import (
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Risk classifies what a tool does to the world.
type Risk int

const (
	RiskRead  Risk = iota // GET and HEAD
	RiskWrite             // everything else, unless x-sluice-risk says otherwise
)

// String returns "read" or "write".
func (r Risk) String() string {
	if r == RiskRead {
		return "read"
	}
	return "write"
}

// Options says where a connector's spec is and how to reach its API.
type Options struct {
	Slug    string       // the connector's name, the tool-name prefix
	Spec    string       // a file path or an https:// URL
	BaseURL string       // overrides the spec's servers when set
	Client  *http.Client // used to fetch an https spec; nil means a default client with a timeout
	// Strict fails the load on any skipped operation or defect, and on
	// anything kin-openapi's validator finds in the document, instead of
	// loading what can be loaded.
	Strict bool
	// Defects also compiles every named schema no tool uses, to report a
	// defect there (Connector.Defects): what validate and tools show. Serve
	// need not pay for it. Strict implies it.
	Defects bool
}

// Connector is one loaded API.
type Connector struct {
	Slug    string
	BaseURL *url.URL                   // from Options.BaseURL or the spec's first server; nil if neither
	Tools   []*Tool                    // sorted by Name
	Schemes map[string]*SecurityScheme // the spec's components.securitySchemes by name
	// Skipped lists the operations that yield no tool, each with the JSON
	// pointer of the part at fault and why.
	Skipped []Problem
	// Defects lists what is wrong in the spec but dropped no tool: a
	// tool's success reply schema that would not render or compile (the
	// tool is kept without Tool.OutputSchema), and, only with
	// Options.Defects or Strict, a named schema no tool uses that would
	// not compile.
	Defects []Problem

	match matcher // Match's routes, compiled on first use (match.go)
}

// Problem is one thing in a spec that was left out or is defective.
type Problem struct {
	Operation string // "POST /pets (createPet)"; empty for a defect outside operations
	Pointer   string // JSON pointer into the spec ("#/paths/~1pets/post/requestBody")
	Reason    string
}

func (p Problem) String() string {
	s := p.Pointer + ": " + p.Reason
	if p.Operation != "" {
		s = p.Operation + ": " + s
	}
	return s
}

// Tool is one operation an agent may call.
type Tool struct {
	Name string // "<slug>.<snake_case operationId>"
	// Alias is a function-safe name (^[a-zA-Z0-9_-]{1,64}$, as OpenAI's
	// and Anthropic's function names must be) that a call may use instead
	// of Name; stable for a given Name and unique within a catalogue.
	Alias        string
	Connector    string // the slug
	OperationID  string // as written in the spec (or derived from method and path)
	Method       string // upper case
	PathTemplate string // "/pets/{petId}"
	Risk         Risk
	Tags         []string
	Summary      string
	Description  string
	// Schema is the JSON Schema (as a JSON object) of the arguments document
	// {"path":{…},"query":{…},"headers":{…},"body":…}.
	Schema json.RawMessage
	// Security lists the alternatives of the operation's effective security
	// requirement (operation-level, else the document's); each alternative
	// names schemes that must all be satisfied.
	Security [][]string
	// BodyType is the request body's media type ("application/json",
	// "application/x-www-form-urlencoded", "multipart/form-data" or a binary
	// type such as "application/octet-stream" or "image/png") or "" if the
	// operation takes none.
	BodyType string
	// IdempotencyHeader is the name of the operation's header parameter
	// Idempotency-Key, as the spec spells it (matched case-insensitively),
	// or "" if it declares none. An operation that declares it promises
	// that a repeated request with the same key is answered with the first
	// reply and applied once (Stripe's convention), which is what lets the
	// gateway re-send an approved call whose outcome a crash left unknown.
	IdempotencyHeader string
	// OutputSchema is the JSON Schema 2020-12 (as a JSON object) of the
	// operation's success reply body, rendered as Schema is: its 200
	// response's JSON content, else 201's, else another 2xx's. nil when
	// the operation declares none, or when it could not be rendered or
	// compiled (then a defect: Connector.Defects; it is compiled at load
	// only with Options.Defects or Strict, else on first use, where a
	// failure makes OutputReady and MatchesOutput false). It may be any
	// schema (an array, a scalar); MatchesOutput checks a reply against it.
	OutputSchema json.RawMessage

	params       []*param // path, query and header parameters, sorted by in then name
	body         *openapi3.Schema
	bodyRef      *openapi3.SchemaRef // as written, for rendering ($ref kept)
	bodyPointer  string              // JSON pointer of the body's schema in the spec
	bodyRequired bool
	fixedQuery   string             // sent with every call: from a path key "/x?beta=true"
	compiled     *jsonschema.Schema // Schema, compiled: what Validate enforces
	outPointer   string             // JSON pointer of the success reply's schema in the spec
	outBase      string             // spec pointer of OutputSchema's root (a named schema's when inlined)
	outUsed      []*def             // defs OutputSchema carries
	outErr       error              // why the reply's schema is left out (a defect)
	out          *outCheck          // OutputSchema, compiled (output.go)

	// codec is how the body is checked and encoded (body.go).
	codec *bodyCodec
}

// SecurityScheme is an OpenAPI security scheme the gateway knows how to satisfy.
type SecurityScheme struct {
	Name   string // key in components.securitySchemes
	Type   string // "apiKey" or "http" (others are kept but cannot be attached)
	In     string // apiKey: "header", "query" or "cookie"
	Param  string // apiKey: the header, query or cookie name
	Scheme string // http: "bearer" or "basic" (lower case)
	// Flows are an oauth2 scheme's flows by their OpenAPI name
	// ("authorizationCode", "clientCredentials"): where the gateway, as
	// the OAuth client, sends the person and exchanges tokens.
	Flows map[string]OAuthFlow
}

// OAuthFlow is one flow of an oauth2 securityScheme.
type OAuthFlow struct {
	AuthorizationURL string
	TokenURL         string
	RefreshURL       string
	Scopes           []string // the scope names the spec lists, sorted
}

// Args is a decoded tool-call arguments document.
type Args struct {
	Path    map[string]any `json:"path,omitempty"`
	Query   map[string]any `json:"query,omitempty"`
	Headers map[string]any `json:"headers,omitempty"`
	Body    any            `json:"body,omitempty"`
}

// ArgError says which argument was wrong. Field is a dotted path such as
// "path.petId" or "body.items[2].name".
type ArgError struct {
	Field  string
	Reason string
}

func (e *ArgError) Error() string {
	if e.Field == "" {
		return "arguments: " + e.Reason
	}
	return "argument " + e.Field + ": " + e.Reason
}

// MaxArgsBytes bounds a tool-call arguments document.
const MaxArgsBytes = 1 << 20

// IdempotencyKey is the header an operation declares to be
// idempotency-keyed (see Tool.IdempotencyHeader).
const IdempotencyKey = "Idempotency-Key"
