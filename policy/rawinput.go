package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// This file decides input documents straight from their JSON, for
// `sluice policy replay`: one pass from the recorded bytes to the AST
// value OPA evaluates, where DecodeInput + Decide take three (the strict
// decoder's scan, its reflection into Input, the AST built from that).
//
// The fast path takes only what the gateway itself records: the exact
// shape json.Marshal gives an Input (every field of the right type, no
// unknown key). On that shape its value is the one inputValue builds
// (TestParsedInputMatchesDecide checks it, field by field, over varied
// inputs); anything else is ErrNotCanonical and the caller decodes the
// input strictly (DecodeInput) instead, so the fast path never decides
// on an input the strict path would refuse or read otherwise.

// ErrNotCanonical is an input document that is valid JSON but not in
// the shape the gateway records: decide it with DecodeInput and Decide.
var ErrNotCanonical = errors.New("policy: input not in the recorded shape")

// maxJSONDepth is encoding/json's nesting limit: the fast parser refuses
// what the strict decoder refuses.
const maxJSONDepth = 10000

// ParseJSON parses one JSON document into an AST value as
// ast.InterfaceToValue would give for encoding/json's decoding of it with
// UseNumber (numbers keep their text, a repeated key keeps its last
// value, invalid UTF-8 becomes U+FFFD). Trailing data is an error.
func ParseJSON(raw []byte) (ast.Value, error) {
	p := jsonParser{b: raw}
	t, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.i != len(p.b) {
		return nil, p.errorf("trailing data after the document")
	}
	return t.Value, nil
}

type jsonParser struct {
	b []byte
	i int
}

func (p *jsonParser) errorf(format string, a ...any) error {
	return fmt.Errorf("policy: json offset %d: %s", p.i, fmt.Sprintf(format, a...))
}

func (p *jsonParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (*ast.Term, error) {
	if depth >= maxJSONDepth { // the outermost value is depth 0
		return nil, p.errorf("nested too deep")
	}
	p.space()
	if p.i >= len(p.b) {
		return nil, p.errorf("unexpected end of the document")
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		return ast.StringTerm(s), nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case p.lit("true"):
		return ast.InternedTerm(true), nil
	case p.lit("false"):
		return ast.InternedTerm(false), nil
	case p.lit("null"):
		return ast.NullTerm(), nil
	}
	return nil, p.errorf("invalid character %q looking for a value", p.b[p.i])
}

func (p *jsonParser) lit(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

func (p *jsonParser) object(depth int) (*ast.Term, error) {
	return p.members(depth, nil)
}

// members parses the object at p.i: every member when t is nil, else
// only those t names (memo.go's project), the others checked and
// skipped.
func (p *jsonParser) members(depth int, t *pathTree) (*ast.Term, error) {
	p.i++ // {
	var items [][2]*ast.Term
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return ast.NewTerm(ast.NewObject()), nil
	}
	for {
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, p.errorf("want a string key")
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, p.errorf("want ':' after a key")
		}
		p.i++
		var v *ast.Term
		switch n := t.child(k); {
		case t == nil:
			v, err = p.value(depth + 1)
		case n != nil:
			v, err = p.project(depth+1, n)
		default:
			err = p.skip(depth + 1)
		}
		if err != nil {
			return nil, err
		}
		if v != nil {
			items = append(items, [2]*ast.Term{names.term(k), v})
		}
		end, err := p.memberEnd()
		if err != nil {
			return nil, err
		}
		if end {
			return ast.NewTerm(newObject(items)), nil
		}
	}
}

// skip checks the value at p.i and moves past it, building nothing.
func (p *jsonParser) skip(depth int) error {
	if depth >= maxJSONDepth {
		return p.errorf("nested too deep")
	}
	p.space()
	if p.i >= len(p.b) {
		return p.errorf("unexpected end of the document")
	}
	switch c := p.b[p.i]; {
	case c == '{', c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		p.i++
		p.space()
		if p.i < len(p.b) && p.b[p.i] == end {
			p.i++
			return nil
		}
		for {
			if c == '{' {
				p.space()
				if p.i >= len(p.b) || p.b[p.i] != '"' {
					return p.errorf("want a string key")
				}
				if err := p.skipStr(); err != nil {
					return err
				}
				p.space()
				if p.i >= len(p.b) || p.b[p.i] != ':' {
					return p.errorf("want ':' after a key")
				}
				p.i++
			}
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			p.space()
			if p.i >= len(p.b) {
				return p.errorf("unexpected end of a container")
			}
			switch p.b[p.i] {
			case ',':
				p.i++
			case end:
				p.i++
				return nil
			default:
				return p.errorf("want ',' or %q", end)
			}
		}
	case c == '"':
		return p.skipStr()
	case c == '-' || c >= '0' && c <= '9':
		return p.scanNumber()
	case p.lit("true"), p.lit("false"), p.lit("null"):
		return nil
	}
	return p.errorf("invalid character %q looking for a value", p.b[p.i])
}

// skipStr checks the string at p.i as str does, and moves past it.
func (p *jsonParser) skipStr() error {
	start := p.i
	p.i++
	plain := true
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			if plain {
				return nil // any bytes are a string to encoding/json (invalid UTF-8 is replaced)
			}
			if !json.Valid(p.b[start:p.i]) {
				return p.errorf("invalid escape in a string")
			}
			return nil
		case c == '\\':
			plain = false
			p.i += 2
		case c < 0x20:
			return p.errorf("control character in a string")
		default:
			p.i++
		}
	}
	return p.errorf("unterminated string")
}

// ParseObjectFields parses a JSON object once, building the AST only for
// the values of the keys in want (the others are checked and skipped):
// the values, in want's order (nil where absent; a repeated key's last).
// The value of a key in inputs is built as an input document, its
// caller, operation, request and findings shared with earlier
// documents that had the same bytes (immutable terms, as inputValue's
// caches). A JSON null document has no fields.
func ParseObjectFields(raw []byte, want []string, inputs string) ([]*ast.Term, error) {
	p := jsonParser{b: raw}
	out := make([]*ast.Term, len(want))
	p.space()
	if p.lit("null") {
		p.space()
		if p.i != len(p.b) {
			return nil, p.errorf("trailing data after the document")
		}
		return out, nil
	}
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return nil, p.errorf("want an object")
	}
	p.i++
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
	} else {
		for {
			p.space()
			if p.i >= len(p.b) || p.b[p.i] != '"' {
				return nil, p.errorf("want a string key")
			}
			k, err := p.str()
			if err != nil {
				return nil, err
			}
			p.space()
			if p.i >= len(p.b) || p.b[p.i] != ':' {
				return nil, p.errorf("want ':' after a key")
			}
			p.i++
			idx := -1
			for j, w := range want {
				if w == k {
					idx = j
					break
				}
			}
			switch {
			case idx < 0:
				err = p.skip(1)
			case k == inputs:
				out[idx], err = p.input()
			default:
				out[idx], err = p.value(1)
			}
			if err != nil {
				return nil, err
			}
			end, err := p.memberEnd()
			if err != nil {
				return nil, err
			}
			if end {
				break
			}
		}
	}
	p.space()
	if p.i != len(p.b) {
		return nil, p.errorf("trailing data after the document")
	}
	return out, nil
}

// input parses an input document (an object; anything else is parsed as
// any value), its parts that repeat from call to call from spans.
func (p *jsonParser) input() (*ast.Term, error) {
	p.space()
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return p.value(1)
	}
	save := p.i
	p.i++
	var items [][2]*ast.Term
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i = save
		return p.value(1)
	}
	for {
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, p.errorf("want a string key")
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, p.errorf("want ':' after a key")
		}
		p.i++
		var v *ast.Term
		switch k {
		case "caller", "operation", "request", "findings":
			v, err = p.shared(2)
		default:
			v, err = p.value(2)
		}
		if err != nil {
			return nil, err
		}
		items = append(items, [2]*ast.Term{names.term(k), v})
		end, err := p.memberEnd()
		if err != nil {
			return nil, err
		}
		if end {
			return ast.NewTerm(newObject(items)), nil
		}
	}
}

// spanMax bounds the values spans keeps (bytes of JSON).
const spanMax = 1024

// spans maps the JSON of a value to its term, built once; bounded as the
// other caches are (internMax entries, then no more added).
var spans struct {
	mu sync.RWMutex
	m  map[string]*ast.Term
}

// shared is the value at p.i, from spans when the same bytes were parsed before.
func (p *jsonParser) shared(depth int) (*ast.Term, error) {
	p.space()
	start := p.i
	if err := p.skip(depth); err != nil {
		return nil, err
	}
	span := p.b[start:p.i]
	if len(span) > spanMax {
		p.i = start
		return p.value(depth)
	}
	spans.mu.RLock()
	t, ok := spans.m[string(span)]
	spans.mu.RUnlock()
	if ok {
		return t, nil
	}
	p.i = start
	t, err := p.value(depth)
	if err != nil {
		return nil, err
	}
	spans.mu.Lock()
	if spans.m == nil {
		spans.m = map[string]*ast.Term{}
	}
	if len(spans.m) < internMax {
		spans.m[string(span)] = t
	}
	spans.mu.Unlock()
	return t, nil
}

// newObject is the object of items; a repeated key keeps its last value,
// as in encoding/json's map (ast.NewObject would keep both).
func newObject(items [][2]*ast.Term) ast.Object {
	dup := false
	if len(items) <= 16 {
		for i := 1; i < len(items) && !dup; i++ {
			for j := range i {
				if items[i][0].Value.Compare(items[j][0].Value) == 0 {
					dup = true
					break
				}
			}
		}
	} else {
		seen := make(map[string]struct{}, len(items))
		for _, it := range items {
			k := string(it[0].Value.(ast.String))
			if _, ok := seen[k]; ok {
				dup = true
				break
			}
			seen[k] = struct{}{}
		}
	}
	if !dup {
		return ast.NewObject(items...)
	}
	o := ast.NewObjectWithCapacity(len(items))
	for _, it := range items {
		o.Insert(it[0], it[1])
	}
	return o
}

func (p *jsonParser) array(depth int) (*ast.Term, error) {
	p.i++ // [
	p.space()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return ast.InternedEmptyArray, nil
	}
	var ts []*ast.Term
	for {
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		ts = append(ts, v)
		p.space()
		if p.i >= len(p.b) {
			return nil, p.errorf("unexpected end of an array")
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return ast.ArrayTerm(ts...), nil
		default:
			return nil, p.errorf("want ',' or ']' in an array")
		}
	}
}

// str reads a string at p.i. The common string (no escape, valid UTF-8)
// is taken as it is; any other is left to encoding/json, whose unescaping
// and U+FFFD replacement it then is exactly.
func (p *jsonParser) str() (string, error) {
	start := p.i
	p.i++ // "
	plain := true
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			raw := p.b[start+1 : p.i-1]
			if plain && utf8.Valid(raw) {
				return string(raw), nil
			}
			var s string
			if err := json.Unmarshal(p.b[start:p.i], &s); err != nil {
				return "", fmt.Errorf("policy: json offset %d: %w", start, err)
			}
			return s, nil
		case c == '\\':
			plain = false
			p.i += 2
		case c < 0x20:
			return "", p.errorf("control character in a string")
		default:
			p.i++
		}
	}
	return "", p.errorf("unterminated string")
}

// number reads a number with JSON's grammar, keeping its text.
func (p *jsonParser) number() (*ast.Term, error) {
	start := p.i
	if err := p.scanNumber(); err != nil {
		return nil, err
	}
	// OPA's own check, as the strict decoder's ast.InterfaceToValue
	// makes it: a number whose exponent OPA cannot evaluate is refused.
	n, err := ast.NumberChecked(string(p.b[start:p.i]))
	if err != nil {
		return nil, p.errorf("%v", err)
	}
	return ast.NewTerm(n), nil
}

// scanNumber moves past a number, checking its grammar.
func (p *jsonParser) scanNumber() error {
	digits := func() int {
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case digits() == 0:
		return p.errorf("invalid number")
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return p.errorf("invalid number")
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return p.errorf("invalid number")
		}
	}
	return nil
}

// ParsedInput is an input document ready to decide: its AST value as
// inputValue builds it, and what the simple rules read of it.
type ParsedInput struct {
	value      ast.Value
	Kind, Tool string
}

// field kinds of the recorded shape.
const (
	fString = iota
	fStrings
	fMulti // map[string][]string: an object of string arrays, or null
	fAny
	fObject
	fInt
	fStruct
	fFindings
	fUsage
)

type shapeField struct {
	kind     int
	optional bool // omitempty: may be absent; never null
	sub      map[string]shapeField
}

var (
	callerShape = map[string]shapeField{
		"sandbox": {kind: fString}, "agent": {kind: fString}, "session": {kind: fString}, "user": {kind: fString},
	}
	operationShape = map[string]shapeField{
		"id": {kind: fString}, "method": {kind: fString}, "path": {kind: fString}, "risk": {kind: fString}, "tags": {kind: fStrings},
	}
	requestShape = map[string]shapeField{
		"method": {kind: fString}, "host": {kind: fString}, "port": {kind: fInt, optional: true}, "path": {kind: fString},
		"query": {kind: fMulti}, "headers": {kind: fMulti}, "body": {kind: fString, optional: true},
	}
	inputShape = map[string]shapeField{
		"version": {kind: fInt}, "kind": {kind: fString}, "caller": {kind: fStruct, sub: callerShape},
		"connector": {kind: fString}, "tool": {kind: fString}, "operation": {kind: fStruct, sub: operationShape},
		"args": {kind: fAny}, "request": {kind: fStruct, sub: requestShape}, "time": {kind: fString},
		"envoy": {kind: fObject, optional: true}, "findings": {kind: fFindings}, "usage": {kind: fUsage, optional: true},
	}
	findingShape = map[string]shapeField{
		"kind": {kind: fString}, "location": {kind: fString}, "fingerprint": {kind: fString, optional: true}, "reason": {kind: fString, optional: true},
	}
)

// InputFromJSON parses an input document in the shape the gateway records
// (json.Marshal of an Input whose findings were filled in by Decide) into
// a ParsedInput. Malformed JSON is an error; well-formed JSON in another
// shape is ErrNotCanonical (decide it with DecodeInput and Decide).
func InputFromJSON(raw []byte) (*ParsedInput, error) {
	v, err := ParseJSON(raw)
	if err != nil {
		return nil, err
	}
	return InputFromValue(v)
}

// InputFromValue is InputFromJSON on a value ParseJSON gave. v is not
// modified: where inputValue differs from the JSON (null tags, query and
// headers are empty; the time is in UTC) the parts are built anew, since
// an object's hash is computed once from its values.
func InputFromValue(v ast.Value) (*ParsedInput, error) {
	obj, ok := v.(ast.Object)
	if !ok {
		return nil, ErrNotCanonical
	}
	if err := checkShape(obj, inputShape); err != nil {
		return nil, err
	}
	if n := obj.Get(keys["version"]).Value.(ast.Number); string(n) != inputVersionText {
		return nil, ErrNotCanonical
	}
	kind := string(obj.Get(keys["kind"]).Value.(ast.String))
	if !validKind(kind) {
		return nil, ErrNotCanonical
	}
	ts := string(obj.Get(keys["time"]).Value.(ast.String))
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil || t.IsZero() { // zero: Decide would take the time of the call
		return nil, ErrNotCanonical
	}
	req := obj.Get(keys["request"]).Value.(ast.Object)
	if p := req.Get(keys["port"]); p != nil && p.Value.Compare(ast.Number("0")) == 0 {
		return nil, ErrNotCanonical // omitempty: a recorded port is never 0
	}
	if b := req.Get(keys["body"]); b != nil && b.Value.Compare(ast.String("")) == 0 {
		return nil, ErrNotCanonical
	}
	op := obj.Get(keys["operation"]).Value.(ast.Object)
	var repl [][2]*ast.Term
	if u := t.UTC().Format(time.RFC3339Nano); u != ts {
		repl = append(repl, item("time", ast.StringTerm(u)))
	}
	if o, ok := withEmpty(op, map[string]*ast.Term{"tags": ast.InternedEmptyArray}); ok {
		repl = append(repl, item("operation", ast.NewTerm(o)))
	}
	if o, ok := withEmpty(req, map[string]*ast.Term{"query": ast.InternedEmptyObject, "headers": ast.InternedEmptyObject}); ok {
		repl = append(repl, item("request", ast.NewTerm(o)))
	}
	if len(repl) > 0 {
		obj = replaced(obj, repl)
	}
	return &ParsedInput{value: obj, Kind: kind, Tool: string(obj.Get(keys["tool"]).Value.(ast.String))}, nil
}

var inputVersionText = fmt.Sprint(InputVersion)

// withEmpty is o with its null fields among empty replaced by their empty
// values, and whether any was.
func withEmpty(o ast.Object, empty map[string]*ast.Term) (ast.Object, bool) {
	var repl [][2]*ast.Term
	for k, e := range empty {
		if t := o.Get(keys[k]); isNull(t) {
			repl = append(repl, item(k, e))
		}
	}
	if len(repl) == 0 {
		return o, false
	}
	return replaced(o, repl), true
}

// replaced is a new object: o's items with those of repl in their place.
func replaced(o ast.Object, repl [][2]*ast.Term) ast.Object {
	items := make([][2]*ast.Term, 0, o.Len())
	o.Foreach(func(k, v *ast.Term) {
		for _, r := range repl {
			if r[0].Value.Compare(k.Value) == 0 {
				v = r[1]
				break
			}
		}
		items = append(items, [2]*ast.Term{k, v})
	})
	return ast.NewObject(items...)
}

// checkShape says whether o has exactly the fields of shape, each of its
// type (o has no repeated key: see newObject).
func checkShape(o ast.Object, shape map[string]shapeField) error {
	required, bad := 0, false
	o.Foreach(func(k, v *ast.Term) {
		ks, ok := k.Value.(ast.String)
		f, known := shape[string(ks)]
		switch {
		case !ok || !known:
			bad = true
		case f.optional && isNull(v): // omitempty: absent, never null
			bad = true
		case !fieldOK(v, f):
			bad = true
		case !f.optional:
			required++
		}
	})
	if bad || required != requiredFields(shape) {
		return ErrNotCanonical
	}
	return nil
}

func requiredFields(shape map[string]shapeField) int {
	n := 0
	for _, f := range shape {
		if !f.optional {
			n++
		}
	}
	return n
}

func fieldOK(v *ast.Term, f shapeField) bool {
	switch f.kind {
	case fString:
		_, ok := v.Value.(ast.String)
		return ok
	case fInt:
		n, ok := v.Value.(ast.Number)
		_, isInt := n.Int()
		return ok && isInt
	case fStrings:
		if isNull(v) {
			return true
		}
		a, ok := v.Value.(*ast.Array)
		if !ok {
			return false
		}
		for i := range a.Len() {
			if _, ok := a.Elem(i).Value.(ast.String); !ok {
				return false
			}
		}
		return true
	case fMulti:
		if isNull(v) {
			return true
		}
		o, ok := v.Value.(ast.Object)
		if !ok {
			return false
		}
		good := true
		o.Foreach(func(_, e *ast.Term) {
			// A nil value slice is null in JSON, [] in inputValue: strict path.
			if _, ok := e.Value.(*ast.Array); !ok || !fieldOK(e, shapeField{kind: fStrings}) {
				good = false
			}
		})
		return good
	case fAny:
		return true
	case fObject:
		_, ok := v.Value.(ast.Object)
		return ok
	case fStruct:
		o, ok := v.Value.(ast.Object)
		return ok && checkShape(o, f.sub) == nil
	case fFindings:
		// null: recorded before the scan; the strict path scans it.
		a, ok := v.Value.(*ast.Array)
		if !ok {
			return false
		}
		for i := range a.Len() {
			o, ok := a.Elem(i).Value.(ast.Object)
			if !ok || checkShape(o, findingShape) != nil {
				return false
			}
		}
		return true
	case fUsage:
		// Rare (counted tools only) and holds floats the engine formats
		// its own way: the strict path decides it.
		return false
	}
	return false
}

// DecideParsed decides p as Decide decides the input it was parsed from.
func (e *Engine) DecideParsed(ctx context.Context, pi *ParsedInput) Decision {
	return e.guarded(func(p *prepared) Decision {
		if pi == nil {
			return policyError("policy: no input")
		}
		return e.eval(ctx, p, &Input{Kind: pi.Kind, Tool: pi.Tool}, pi.value)
	})
}

func isNull(t *ast.Term) bool {
	if t == nil {
		return false
	}
	_, ok := t.Value.(ast.Null)
	return ok
}

// memberEnd reads what follows an object's member: ',' (more follow) or
// '}' (end is true), after optional space; anything else is an error.
func (p *jsonParser) memberEnd() (end bool, err error) {
	p.space()
	if p.i >= len(p.b) {
		return false, p.errorf("unexpected end of an object")
	}
	switch p.b[p.i] {
	case ',':
		p.i++
		return false, nil
	case '}':
		p.i++
		return true, nil
	}
	return false, p.errorf("want ',' or '}' in an object")
}
