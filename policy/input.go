package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// inputValue builds the input document directly as an AST value: a JSON
// round trip per call would cost more than the evaluation itself.
func inputValue(in *Input) (ast.Value, error) {
	v := in.Version
	if v == 0 {
		v = InputVersion
	}
	t := in.Time
	if t.IsZero() {
		t = time.Now()
	}
	args := ast.NullTerm()
	if in.Args != nil {
		av, err := ast.InterfaceToValue(in.Args)
		if err != nil {
			return nil, fmt.Errorf("args: %w", err)
		}
		args = ast.NewTerm(av)
	}
	return ast.NewObject(
		item("version", ast.InternedTerm(v)),
		item("kind", ast.StringTerm(in.Kind)),
		item("caller", ast.ObjectTerm(
			item("sandbox", ast.StringTerm(in.Caller.Sandbox)),
			item("agent", ast.StringTerm(in.Caller.Agent)),
			item("session", ast.StringTerm(in.Caller.Session)),
			item("user", ast.StringTerm(in.Caller.User)),
		)),
		item("connector", ast.StringTerm(in.Connector)),
		item("tool", ast.StringTerm(in.Tool)),
		item("operation", ast.ObjectTerm(
			item("id", ast.StringTerm(in.Operation.ID)),
			item("method", ast.StringTerm(in.Operation.Method)),
			item("path", ast.StringTerm(in.Operation.Path)),
			item("risk", ast.StringTerm(in.Operation.Risk)),
			item("tags", stringsTerm(in.Operation.Tags)),
		)),
		item("args", args),
		item("request", ast.ObjectTerm(
			item("method", ast.StringTerm(in.Request.Method)),
			item("host", ast.StringTerm(in.Request.Host)),
			item("path", ast.StringTerm(in.Request.Path)),
			item("query", multiTerm(in.Request.Query)),
			item("headers", multiTerm(in.Request.Headers)),
		)),
		item("time", ast.StringTerm(t.UTC().Format(time.RFC3339Nano))),
	), nil
}

// keys holds the input's field names as terms, built once.
var keys = map[string]*ast.Term{}

func init() {
	for _, k := range []string{
		"version", "kind", "caller", "sandbox", "agent", "session", "user",
		"connector", "tool", "operation", "id", "method", "path", "risk", "tags",
		"args", "request", "host", "query", "headers", "time",
	} {
		keys[k] = ast.StringTerm(k)
	}
}

func item(k string, v *ast.Term) [2]*ast.Term {
	kt, ok := keys[k]
	if !ok {
		kt = ast.StringTerm(k)
	}
	return ast.Item(kt, v)
}

func stringsTerm(ss []string) *ast.Term {
	ts := make([]*ast.Term, len(ss))
	for i, s := range ss {
		ts[i] = ast.StringTerm(s)
	}
	return ast.ArrayTerm(ts...)
}

func multiTerm(m map[string][]string) *ast.Term {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	items := make([][2]*ast.Term, len(keys))
	for i, k := range keys {
		items[i] = item(k, stringsTerm(m[k]))
	}
	return ast.ObjectTerm(items...)
}

// DecodeInput decodes one input document strictly: unknown fields, trailing
// data, an unknown kind or a version other than InputVersion are errors.
// A missing version means InputVersion.
func DecodeInput(raw []byte) (*Input, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var in Input
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("policy: decode input: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("policy: decode input: trailing data after the input document")
	}
	if in.Version == 0 {
		in.Version = InputVersion
	}
	if in.Version != InputVersion {
		return nil, fmt.Errorf("policy: decode input: version %d: want %d", in.Version, InputVersion)
	}
	if !validKind(in.Kind) {
		return nil, fmt.Errorf("policy: decode input: kind %q: want tool_call, http, connect or dns", in.Kind)
	}
	return &in, nil
}

// Eval decodes an input document (strictly, see DecodeInput) and decides it,
// for `sluice policy eval --input F`. The error is for bad input only; policy
// failures are Block decisions with Rule "policy_error", as in Decide.
func (e *Engine) Eval(ctx context.Context, raw []byte) (Decision, error) {
	in, err := DecodeInput(raw)
	if err != nil {
		return policyError("policy: bad input"), err
	}
	return e.Decide(ctx, in), nil
}
