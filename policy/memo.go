package policy

import (
	"context"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// This file decides each distinct projection of the input once, for
// `sluice policy replay`: most recorded calls differ only in fields the
// policy never reads (the time, the session, a request id), and
// evaluating the same policy on the same read fields gives the same
// decision.
//
// The projection is exact, not approximate. inputPaths walks every
// module of the generation (the library's, the files', the bundle's) and
// collects each reference into input by its constant prefix:
// input.args.body.amount reads the value at args.body.amount and nothing
// else; input.args[k] reads all of args. The memo's key is the value at
// each of those paths (or its absence), plus the kind and tool the Go
// side matches simple rules on. Anything that could make a decision
// depend on more than that turns the memo off for the generation:
// input read whole (`x := input`, input[k], `import input`), a `with`
// that replaces input or part of it, and a built-in that is not a
// function of its arguments (time.now_ns, rand.intn, uuid.rfc4122, or
// one that reads the clock: io.jwt.decode_verify, x509 verification).

// memoDefaultBytes bounds a Memo's keys when NewMemo is given no bound:
// a key holds the values the policy reads, which may be a whole argument
// body, so the bound is on bytes, not entries.
const memoDefaultBytes = 32 << 20

// clockBuiltins read the evaluation's clock although OPA does not mark
// them non-deterministic.
var clockBuiltins = map[string]bool{
	"io.jwt.decode_verify":                                   true,
	"crypto.x509.parse_and_verify_certificates":              true,
	"crypto.x509.parse_and_verify_certificates_with_options": true,
}

// inputDeps is what a generation's decision reads of the input: paths,
// each a sequence of object keys, none a prefix of another; or why a
// decision may depend on more (off != "").
type inputDeps struct {
	paths [][]*ast.Term
	off   string
}

// inputPaths analyses mods (see the file comment).
func inputPaths(mods map[string]*ast.Module) inputDeps {
	nondet := map[string]bool{}
	for _, b := range capabilities().Builtins {
		if b.Nondeterministic || clockBuiltins[b.Name] {
			nondet[b.Name] = true
		}
	}
	var paths [][]string
	off := ""
	stop := func(why string) {
		if off == "" {
			off = why
		}
	}
	var vis *ast.GenericVisitor
	vis = ast.NewGenericVisitor(func(x any) bool {
		switch x := x.(type) {
		case *ast.With:
			if isInputRef(x.Target) {
				stop("a with modifier replaces input (" + x.Target.String() + ")")
			}
		case ast.Ref:
			if nondet[x.String()] {
				stop("the policy calls " + x.String() + ", which is not a function of its arguments")
			}
			if !x[0].Equal(ast.InputRootDocument) {
				return false
			}
			var p []string
			for _, t := range x[1:] {
				s, ok := t.Value.(ast.String)
				if !ok {
					break
				}
				p = append(p, string(s))
			}
			if len(p) == 0 {
				stop("the policy reads input as a whole (" + x.String() + ")")
			}
			paths = append(paths, p)
			for _, t := range x[1:] { // a key may itself read input: data.x[input.tool]
				vis.Walk(t)
			}
			return true
		case ast.Var:
			if x.Equal(ast.InputRootDocument.Value) {
				stop("the policy reads input as a whole")
			}
		}
		return false
	})
	names := make([]string, 0, len(mods))
	for n := range mods {
		names = append(names, n)
	}
	slices.Sort(names) // the first reason found is the same every time
	for _, n := range names {
		vis.Walk(mods[n])
	}
	if off != "" {
		return inputDeps{off: off}
	}
	// The Go side reads kind and tool (simpleTable, the query per kind).
	paths = append(paths, []string{"kind"}, []string{"tool"})
	slices.SortFunc(paths, func(a, b []string) int { return slices.Compare(a, b) })
	var kept [][]string
	for _, p := range paths {
		if n := len(kept); n > 0 && isPrefix(kept[n-1], p) {
			continue // sorted: a prefix comes right before what it covers
		}
		kept = append(kept, p)
	}
	d := inputDeps{paths: make([][]*ast.Term, len(kept))}
	for i, p := range kept {
		for _, k := range p {
			d.paths[i] = append(d.paths[i], ast.StringTerm(k))
		}
	}
	return d
}

func isInputRef(t *ast.Term) bool {
	switch v := t.Value.(type) {
	case ast.Ref:
		return v[0].Equal(ast.InputRootDocument)
	case ast.Var:
		return v.Equal(ast.InputRootDocument.Value)
	}
	return false
}

func isPrefix(p, q []string) bool {
	return len(p) <= len(q) && slices.Equal(p, q[:len(p)])
}

// String names the paths, for tests and logs.
func (d inputDeps) String() string {
	if d.off != "" {
		return "off: " + d.off
	}
	s := make([]string, len(d.paths))
	for i, p := range d.paths {
		k := make([]string, len(p))
		for j, t := range p {
			k[j] = string(t.Value.(ast.String))
		}
		s[i] = strings.Join(k, ".")
	}
	return strings.Join(s, " ")
}

// Memo decides parsed inputs (ParsedInput) as Engine.DecideParsed does,
// evaluating the policy once per distinct projection of the input onto
// what the policy reads (see the file comment) and answering the rest
// from memory. It is not safe for concurrent use: give each goroutine
// its own. A reload of the engine empties it.
type Memo struct {
	e     *Engine
	p     *prepared
	deps  inputDeps
	m     map[string]Decision
	max   int // bytes of keys
	size  int // bytes of keys held
	buf   []byte
	evals int
	hits  int
}

// NewMemo returns a memo over e whose keys hold at most maxBytes (0: 32
// MiB); once full, projections it does not hold are evaluated every time.
func NewMemo(e *Engine, maxBytes int) *Memo {
	if maxBytes <= 0 {
		maxBytes = memoDefaultBytes
	}
	return &Memo{e: e, max: maxBytes}
}

// Off says why the memo evaluates every input of the policy in force
// ("" when it memoizes).
func (m *Memo) Off() string {
	if m.e == nil {
		return "no policy"
	}
	p := m.e.cur.Load()
	if p == nil {
		return "no policy"
	}
	return p.deps().off
}

// Stats are the evaluations made and the decisions answered from memory.
func (m *Memo) Stats() (evals, hits int) { return m.evals, m.hits }

// DecideParsed is Engine.DecideParsed. A decision is remembered only
// when the policy made it: a policy_error (a timeout on a loaded
// machine, an evaluation error) is never answered from memory. The
// Approvers and Obligations of a remembered decision are shared with
// every answer of it: do not modify them.
func (m *Memo) DecideParsed(ctx context.Context, pi *ParsedInput) Decision {
	return m.e.guarded(func(p *prepared) Decision {
		if pi == nil {
			return policyError("policy: no input")
		}
		in := &Input{Kind: pi.Kind, Tool: pi.Tool}
		if p != m.p {
			m.p, m.deps, m.m, m.size = p, p.deps(), map[string]Decision{}, 0
		}
		if m.deps.off != "" {
			m.evals++
			return m.e.eval(ctx, p, in, pi.value)
		}
		m.buf = m.deps.key(m.buf[:0], pi.value)
		if d, ok := m.m[string(m.buf)]; ok {
			m.hits++
			return d
		}
		m.evals++
		d := m.e.eval(ctx, p, in, pi.value)
		if d.Rule != RulePolicyError && m.size+len(m.buf) <= m.max {
			m.m[string(m.buf)] = d
			m.size += len(m.buf)
		}
		return d
	})
}

// key appends the projection of v onto d.paths to b: for each path a
// 0 byte and the value's text (ast's, which quotes strings and keeps a
// number's text, so distinct JSON values have distinct texts), or a 1
// byte when the path is absent. The text of a value cannot contain a
// raw 0 or 1 byte (strings are quoted), so the key is unambiguous.
func (d inputDeps) key(b []byte, v ast.Value) []byte {
	for _, p := range d.paths {
		x := v
		for _, k := range p {
			obj, ok := x.(ast.Object)
			if !ok {
				x = nil
				break
			}
			t := obj.Get(k)
			if t == nil {
				x = nil
				break
			}
			x = t.Value
		}
		if x == nil {
			b = append(b, 1)
			continue
		}
		b = append(b, 0)
		b = append(b, x.String()...)
	}
	return b
}
