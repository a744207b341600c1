// Package toolinput turns a tool call's arguments into what the gateway
// decides on and sends: the arguments decoded, stripped of the headers
// only the gateway may set and validated against the tool's schema, the
// upstream request made from them (or a door's formed request checked
// against the tool's operation), and the policy input document
// (rego/README.md) built from both before any credential is attached.
//
// The gateway's pipeline (gateway.Server.Call) and `sluice policy eval
// --tool` / `sluice policy input` run the same functions here, so that
// the input a person evaluates is the input the gateway decides. It
// decides nothing, holds nothing and attaches no credential.
package toolinput

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/policy"
)

// Prepare is what every tool call's arguments pass before its decision:
// decoded (an empty body is {}), stripped of the headers only the gateway
// may set (StripHeaders), validated against the tool's schema, and made
// into the upstream request that policy sees and that is sent. `sluice
// policy eval --tool` runs it too (Build), so that the input it decides
// is the gateway's.
func Prepare(ctx context.Context, tool *connectors.Tool, base *url.URL, body []byte) (connectors.Args, *http.Request, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	args, err := connectors.DecodeArgs(body)
	if err == nil {
		StripHeaders(&args)
		err = tool.Validate(args)
	}
	var req *http.Request
	if err == nil {
		req, err = tool.NewRequest(ctx, base, args)
	}
	return args, req, err
}

// Input builds the policy input document of a tool call
// (rego/README.md). The request part is taken before any credential is
// attached; args and req may be nil (a tool offered before any call).
func Input(sandbox, agent, session, user string, t *connectors.Tool, args *connectors.Args, req *http.Request, now time.Time) *policy.Input {
	in := &policy.Input{
		Version:   policy.InputVersion,
		Kind:      "tool_call",
		Caller:    policy.Caller{Sandbox: sandbox, Agent: agent, Session: session, User: user},
		Connector: t.Connector,
		Tool:      t.Name,
		Operation: policy.Operation{ID: t.OperationID, Method: t.Method, Path: t.PathTemplate, Risk: t.Risk.String(), Tags: orNone(t.Tags)},
		Time:      now,
	}
	if args != nil {
		in.Args = map[string]any{"path": orEmpty(args.Path), "query": orEmpty(args.Query), "headers": orEmpty(args.Headers), "body": args.Body}
	}
	if req != nil {
		in.Request = policy.Request{Method: req.Method, Host: req.URL.Host, Path: req.URL.Path, Query: req.URL.Query(), Headers: req.Header.Clone()}
	}
	return in
}

func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// orNone is tags as the input document states them: always an array.
func orNone(tags []string) []string {
	if tags == nil {
		return []string{}
	}
	return tags
}

// Call is one tool call as `sluice policy eval --tool` states it: the
// tool (name or alias), the arguments as the agent would POST them, and
// who calls. A zero Time means now.
type Call struct {
	Tool   string
	Args   []byte
	Caller policy.Caller
	Time   time.Time
}

// RefusedError is a call the gateway refuses before any policy runs, with
// the status and stable code the agent would get.
type RefusedError struct {
	Status  int
	Code    string
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the gateway refuses this call before policy: %d %s: %s", e.Status, e.Code, e.Message)
}

// UnknownTool is the refusal of a call to a tool the catalog does not
// hold by that name or alias.
func UnknownTool(name string) *RefusedError {
	return &RefusedError{http.StatusNotFound, "unknown_tool", fmt.Sprintf("no tool is named %q", name)}
}

// Build builds the policy input the gateway builds for call to tool, a
// tool of the catalog whose connector's base URL is base, with the
// functions POST /v1/tools/{tool} runs: the caller's agent checked for
// the grant, the arguments through Prepare and the document through
// Input. A call the gateway would refuse before its decision
// (not_granted, schema_violation) is a *RefusedError.
func Build(ctx context.Context, cfg *config.Config, tool *connectors.Tool, base *url.URL, call Call) (*policy.Input, error) {
	agent := cfg.Agent(call.Caller.Agent)
	if agent == nil || !slices.Contains(agent.Connectors, tool.Connector) {
		return nil, &RefusedError{http.StatusForbidden, "not_granted", fmt.Sprintf("agent %q is not granted connector %q", call.Caller.Agent, tool.Connector)}
	}
	if len(call.Args) > connectors.MaxArgsBytes {
		return nil, &RefusedError{http.StatusBadRequest, "schema_violation", fmt.Sprintf("arguments: larger than %d bytes", connectors.MaxArgsBytes)}
	}
	args, req, err := Prepare(ctx, tool, base, call.Args)
	if err != nil {
		msg := "arguments: " + err.Error()
		var ae *connectors.ArgError
		if errors.As(err, &ae) {
			msg = ae.Error()
		}
		return nil, &RefusedError{http.StatusBadRequest, "schema_violation", msg}
	}
	now := call.Time
	if now.IsZero() {
		now = time.Now()
	}
	c := call.Caller
	return Input(c.Sandbox, c.Agent, c.Session, c.User, tool, &args, req, now.UTC()), nil
}

// StripHeaders removes headers that only the gateway may set: identity,
// client-address claims (egress.IsForwardingField, as on every egress path),
// hop-by-hop and framing headers, and content codings and ranges the
// scrubber could not see through.
func StripHeaders(a *connectors.Args) {
	for k := range a.Headers {
		lk := strings.ToLower(k)
		switch {
		case strings.HasPrefix(lk, "x-sluice-"), strings.HasPrefix(lk, "sluice-"), strings.HasPrefix(lk, "proxy-"),
			egress.IsForwardingField(lk),
			lk == "host", lk == "connection", lk == "keep-alive", lk == "te", lk == "trailer",
			lk == "transfer-encoding", lk == "upgrade", lk == "content-length", lk == "accept-encoding",
			lk == "range", lk == "if-range",
			lk == "traceparent", lk == "tracestate": // the gateway's own trace context is sent (gateway/calltrace.go)
			delete(a.Headers, k)
		}
	}
}

// Idempotency sends key in tool's idempotency header when the arguments
// set none (call.Request.IdempotencyKey): before validation, so the key
// is checked, decided and held as part of the call.
func Idempotency(a *connectors.Args, tool *connectors.Tool, key string) {
	if key == "" || tool.IdempotencyHeader == "" {
		return
	}
	for k := range a.Headers {
		if strings.EqualFold(k, tool.IdempotencyHeader) {
			return
		}
	}
	if a.Headers == nil {
		a.Headers = map[string]any{}
	}
	a.Headers[tool.IdempotencyHeader] = key
}

// Formed checks that a door's formed request (call.Request.HTTP) is
// tool's operation on its connector's base URL: the same method, scheme
// and host, and a path the tool's template matches under the base path.
// It returns a copy for the pipeline to decide on and put the credential
// on, with its body read (bounded) and replaced on both.
func Formed(ctx context.Context, hr *http.Request, tool *connectors.Tool, base *url.URL) (*http.Request, error) {
	if hr.URL == nil || base == nil {
		return nil, errors.New("the request has no URL")
	}
	if hr.Method != tool.Method {
		return nil, fmt.Errorf("the request's method %s is not %s's (%s)", hr.Method, tool.Name, tool.Method)
	}
	if !strings.EqualFold(hr.URL.Scheme, base.Scheme) || !strings.EqualFold(hr.URL.Host, base.Host) {
		return nil, fmt.Errorf("the request is not for %s's connector (%s://%s)", tool.Name, base.Scheme, base.Host)
	}
	rest, ok := strings.CutPrefix(hr.URL.EscapedPath(), strings.TrimRight(base.EscapedPath(), "/"))
	if !ok || !matchTemplate(tool.PathTemplate, rest) {
		return nil, fmt.Errorf("the request's path is not %s's (%s)", tool.Name, tool.PathTemplate)
	}
	var body []byte
	if hr.Body != nil && hr.Body != http.NoBody {
		b, err := io.ReadAll(io.LimitReader(hr.Body, connectors.MaxArgsBytes+1))
		hr.Body.Close()
		if err != nil {
			return nil, errors.New("the request's body could not be read")
		}
		if len(b) > connectors.MaxArgsBytes {
			return nil, fmt.Errorf("the request's body is larger than %d bytes", connectors.MaxArgsBytes)
		}
		body = b
		hr.Body = io.NopCloser(bytes.NewReader(b))
	}
	req := hr.Clone(ctx)
	req.Body, req.ContentLength = http.NoBody, 0
	if body != nil {
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	return req, nil
}

// matchTemplate says whether an escaped path is an OpenAPI path template's:
// literal segments equal, each {param} segment one non-empty segment.
func matchTemplate(tmpl, path string) bool {
	ts, ps := strings.Split(tmpl, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		return false
	}
	for i, t := range ts {
		if strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") {
			if ps[i] == "" {
				return false
			}
			continue
		}
		if t != ps[i] {
			return false
		}
	}
	return true
}
