// Package connectors turns OpenAPI 3.0 and 3.1 documents into tools: named,
// schema-checked operations that the gateway can call on an agent's behalf.
//
// A connector is one API (one spec plus a base URL). Each operation becomes a
// Tool named "<slug>.<operationId in snake_case>" with a JSON Schema for its
// arguments ({"path","query","headers","body"}) and a risk class. Arguments
// are validated here, before any policy runs, and the upstream request is
// built here so that path parameters can never change the upstream path.
//
// This package imports no other package of sluice; its one dependency is
// kin-openapi.
package connectors

import (
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/getkin/kin-openapi/openapi3"
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
}

// Connector is one loaded API.
type Connector struct {
	Slug    string
	BaseURL *url.URL                   // from Options.BaseURL or the spec's first server; nil if neither
	Tools   []*Tool                    // sorted by Name
	Schemes map[string]*SecurityScheme // the spec's components.securitySchemes by name
	// Skipped lists operations that yield no tool, each as
	// "METHOD /path (operationId): reason" (for example a request body
	// only in multipart/form-data).
	Skipped []string
}

// Tool is one operation an agent may call.
type Tool struct {
	Name         string // "<slug>.<snake_case operationId>"
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

	params       []*param // path, query and header parameters, sorted by in then name
	body         *openapi3.Schema
	bodyRequired bool
	schema2020   bool // validate with JSON Schema 2020-12 (OpenAPI 3.1 documents)

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
