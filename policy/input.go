package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// inputValue builds the input document directly as an AST value: a JSON
// round trip per call would cost more than the evaluation itself. Parts that
// repeat from call to call (the caller, the operation, names such as the
// tool) come from bounded caches of immutable terms; OPA never modifies its
// input, so evaluations running at the same time may share them.
func inputValue(in *Input) (ast.Value, error) {
	items, err := inputItems(in)
	if err != nil {
		return nil, err
	}
	var ev ast.Value
	if len(in.Envoy) > 0 {
		if ev, err = envoyValue(in.Envoy); err != nil {
			return nil, err
		}
	}
	return inputObject(items, ev, in.Usage), nil
}

// inputObject is the document of items (inputItems's) with input.envoy
// (ev; nil for none) and input.usage.
func inputObject(items [][2]*ast.Term, ev ast.Value, u *Usage) ast.Object {
	if ev != nil {
		items = append(items, item("envoy", ast.NewTerm(ev)))
	}
	if u != nil {
		items = append(items, item("usage", usageTerm(u)))
	}
	return ast.NewObject(items...)
}

// inputItems are the members of in's document but input.envoy and
// input.usage (inputObject adds them), with room for both.
func inputItems(in *Input) ([][2]*ast.Term, error) {
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
	items := make([][2]*ast.Term, 0, 12)
	items = append(items,
		item("version", ast.InternedTerm(v)),
		item("kind", names.term(in.Kind)),
		item("caller", callerTerm(in.Caller)),
		item("connector", names.term(in.Connector)),
		item("tool", names.term(in.Tool)),
		item("operation", operationTerm(&in.Operation)),
		item("args", args),
		item("request", requestTerm(&in.Request)),
		item("time", ast.StringTerm(t.UTC().Format(time.RFC3339Nano))),
		item("findings", findingsTerm(in.Findings)),
	)
	return items, nil
}

// envoyValue is input.envoy's value: an object, or nil for null (absent,
// as a nil map was).
func envoyValue(raw json.RawMessage) (ast.Value, error) {
	v, err := ParseJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	switch v.(type) {
	case ast.Object:
		return v, nil
	case ast.Null:
		return nil, nil
	}
	return nil, errors.New("envoy: not an object")
}

// usageTerm builds input.usage.
func usageTerm(u *Usage) *ast.Term {
	win := func(w UsageWindow) *ast.Term {
		if math.IsNaN(w.Sum) || math.IsInf(w.Sum, 0) {
			w.Sum = math.MaxFloat64 // over any limit a policy sets
		}
		return ast.ObjectTerm(item("count", ast.IntNumberTerm(int(w.Count))),
			item("sum", ast.NumberTerm(json.Number(strconv.FormatFloat(w.Sum, 'g', -1, 64)))))
	}
	wins := func(w UsageWindows) *ast.Term {
		return ast.ObjectTerm(item("minute", win(w.Minute)), item("hour", win(w.Hour)), item("day", win(w.Day)))
	}
	return ast.ObjectTerm(item("agent", wins(u.Agent)), item("user", wins(u.User)), item("session", wins(u.Session)),
		item("approved_before", ast.BooleanTerm(u.ApprovedBefore)))
}

// requestTerm builds input.request; port is present only when set (raw egress).
func requestTerm(r *Request) *ast.Term {
	items := make([][2]*ast.Term, 0, 6)
	items = append(items,
		item("method", names.term(r.Method)),
		item("host", names.term(r.Host)),
		item("path", ast.StringTerm(r.Path)),
		item("query", multiTerm(r.Query)),
		item("headers", multiTerm(r.Headers)),
	)
	if r.Port != 0 {
		items = append(items, item("port", ast.InternedTerm(r.Port)))
	}
	if r.Body != "" {
		items = append(items, item("body", ast.StringTerm(r.Body)))
	}
	return ast.ObjectTerm(items...)
}

// internMax bounds each cache (entries), internMaxLen the strings it keeps:
// names an attacker can vary (hosts) must not grow memory without bound.
const (
	internMax    = 4096
	internMaxLen = 256
)

// internCache maps a key to an immutable term built once. When full it
// stops adding: later keys get a fresh term per call, never an error.
type internCache[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

func (c *internCache[K, V]) load(k K) (V, bool) {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	return v, ok
}

func (c *internCache[K, V]) store(k K, v V) {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[K]V{}
	}
	if len(c.m) < internMax {
		c.m[k] = v
	}
	c.mu.Unlock()
}

// stringCache interns string terms.
type stringCache struct{ internCache[string, *ast.Term] }

func (c *stringCache) term(s string) *ast.Term {
	if s == "" {
		return ast.InternedEmptyString
	}
	if len(s) > internMaxLen {
		return ast.StringTerm(s)
	}
	if t, ok := c.load(s); ok {
		return t
	}
	t := ast.StringTerm(s)
	c.store(s, t)
	return t
}

var (
	names      stringCache                             // kind, connector, tool, methods, hosts, operation fields
	callers    internCache[Caller, *ast.Term]          // caller objects
	operations internCache[operationKey, operationVal] // operation objects
)

func callerTerm(c Caller) *ast.Term {
	if t, ok := callers.load(c); ok {
		return t
	}
	t := ast.ObjectTerm(
		item("sandbox", names.term(c.Sandbox)),
		item("agent", names.term(c.Agent)),
		item("session", ast.StringTerm(c.Session)),
		item("user", names.term(c.User)),
	)
	if len(c.Sandbox)+len(c.Agent)+len(c.Session)+len(c.User) <= internMaxLen {
		callers.store(c, t)
	}
	return t
}

// operationKey identifies an operation object up to its tags; the cached
// value keeps the tags, compared on every hit.
type operationKey struct {
	id, method, path, risk, tag0 string
	ntags                        int
}

type operationVal struct {
	tags []string
	term *ast.Term
}

func operationTerm(op *Operation) *ast.Term {
	k := operationKey{id: op.ID, method: op.Method, path: op.Path, risk: op.Risk, ntags: len(op.Tags)}
	if len(op.Tags) > 0 {
		k.tag0 = op.Tags[0]
	}
	if v, ok := operations.load(k); ok && slices.Equal(v.tags, op.Tags) {
		return v.term
	}
	t := ast.ObjectTerm(
		item("id", names.term(op.ID)),
		item("method", names.term(op.Method)),
		item("path", names.term(op.Path)),
		item("risk", names.term(op.Risk)),
		item("tags", stringsTerm(op.Tags)),
	)
	size := len(op.ID) + len(op.Method) + len(op.Path) + len(op.Risk)
	for _, tag := range op.Tags {
		size += len(tag)
	}
	if size <= internMaxLen {
		operations.store(k, operationVal{tags: slices.Clone(op.Tags), term: t})
	}
	return t
}

// keys holds the input's field names as terms, built once.
var keys = map[string]*ast.Term{}

func init() {
	for _, k := range []string{
		"version", "kind", "caller", "sandbox", "agent", "session", "user",
		"connector", "tool", "operation", "id", "method", "path", "risk", "tags",
		"args", "request", "host", "port", "query", "headers", "time", "body", "envoy",
		"usage", "minute", "hour", "day", "count", "sum", "approved_before",
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
	if len(ss) == 0 {
		return ast.InternedEmptyArray
	}
	ts := make([]*ast.Term, len(ss))
	for i, s := range ss {
		ts[i] = ast.StringTerm(s)
	}
	return ast.ArrayTerm(ts...)
}

// multiTerm converts a query or header map: names sorted (as an object's
// keys are anyway) and interned, values fresh per call.
func multiTerm(m map[string][]string) *ast.Term {
	if len(m) == 0 {
		return ast.InternedEmptyObject
	}
	items := make([][2]*ast.Term, 0, len(m))
	for k, vs := range m {
		items = append(items, ast.Item(names.term(k), stringsTerm(vs)))
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
	if len(in.Envoy) > 0 {
		if v, err := envoyValue(in.Envoy); err != nil {
			return nil, fmt.Errorf("policy: decode input: %w", err)
		} else if v == nil {
			in.Envoy = nil // null: absent
		}
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
