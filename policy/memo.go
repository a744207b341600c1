package policy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

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
// each a sequence of object keys, none covered by another; or why a
// decision may depend on more (off != ""). A path whose shape[i] is set
// is only tested (an expression that is the reference alone, or the
// value a with modifier puts in input's place): the key holds whether
// it is absent, false or another scalar (its text), or which kind of
// collection it is, not the collection's contents.
type inputDeps struct {
	paths [][]*ast.Term
	shape []bool
	off   string
	// envoy is what the paths read of input.envoy, for projectEnvoy.
	envoy *pathTree
}

// pathTree is the keys of the paths under one point of the input: a
// leaf's value is read whole.
type pathTree struct {
	leaf bool
	next map[string]*pathTree
}

// child is the node under key k (nil for none, or on a nil tree).
func (t *pathTree) child(k string) *pathTree {
	if t == nil {
		return nil
	}
	return t.next[k]
}

// add makes the path's node; whole, its value is read whole (a leaf),
// else only its kind is (an object's members the tree does not name are
// skipped).
func (t *pathTree) add(keys []string, whole bool) {
	for _, k := range keys {
		if t.leaf {
			return
		}
		if t.next == nil {
			t.next = map[string]*pathTree{}
		}
		n := t.next[k]
		if n == nil {
			n = &pathTree{}
			t.next[k] = n
		}
		t = n
	}
	if whole && !t.leaf {
		t.leaf, t.next = true, nil
	}
}

// inputRead is one reference into input found by inputPaths.
type inputRead struct {
	keys  []string
	shape bool
}

// maxWithPrefixes bounds the input documents a policy may evaluate
// under (with input as input.x, nested): past it the memo is off.
const maxWithPrefixes = 16

// inputPaths analyses mods (see the file comment). Besides references
// rooted at input it follows two forms opa-envoy-plugin policies are
// written in: an import of part of input (import input.a.b as x: x.c
// reads a.b.c), and `with input as input.p` (the adapter that runs such
// a policy on input.envoy): under it every read q of the input is a read
// of p.q, so each read is keyed both as written and under every chain
// of such prefixes a with may nest.
func inputPaths(mods map[string]*ast.Module) inputDeps {
	nondet := map[string]bool{}
	for _, b := range capabilities().Builtins {
		if b.Nondeterministic || clockBuiltins[b.Name] {
			nondet[b.Name] = true
		}
	}
	var reads []inputRead
	var withs [][]string // the prefixes of with input as input.p
	off := ""
	stop := func(why string) {
		if off == "" {
			off = why
		}
	}
	var aliases map[ast.Var][]string // the module's imports of input's parts
	// resolve is the constant path a reference reads of input (ok false
	// when it is not rooted at input or an import of it), and whether
	// every element after the root is a constant key.
	resolve := func(x ast.Ref) (path []string, whole, ok bool) {
		switch {
		case x[0].Equal(ast.InputRootDocument):
		case isVar(x[0]) && aliases[x[0].Value.(ast.Var)] != nil:
			path = slices.Clone(aliases[x[0].Value.(ast.Var)])
		default:
			return nil, false, false
		}
		whole = true
		for _, t := range x[1:] {
			s, isStr := t.Value.(ast.String)
			if !isStr {
				whole = false
				break
			}
			path = append(path, string(s))
		}
		return path, whole, true
	}
	var vis *ast.GenericVisitor
	vis = ast.NewGenericVisitor(func(x any) bool {
		switch x := x.(type) {
		case *ast.Import:
			return true // resolved where the alias is used
		case *ast.Expr:
			// An expression that is a constant reference alone only tests
			// it: defined and not false.
			t, ok := x.Terms.(*ast.Term)
			if !ok {
				return false
			}
			r, ok := t.Value.(ast.Ref)
			if !ok {
				return false
			}
			if p, whole, in := resolve(r); in && whole && len(p) > 0 {
				reads = append(reads, inputRead{keys: p, shape: true})
				for _, w := range x.With {
					vis.Walk(w)
				}
				return true
			}
		case *ast.With:
			switch t := x.Target.Value.(type) {
			case ast.Ref:
				if _, _, in := resolve(t); !in {
					return false // with data.x as …: its value is walked
				}
				if len(t) == 1 && t[0].Equal(ast.InputRootDocument) {
					if v, ok := x.Value.Value.(ast.Ref); ok {
						if p, whole, in := resolve(v); in && whole && len(p) > 0 {
							withs = append(withs, p)
							reads = append(reads, inputRead{keys: p, shape: true})
							return true
						}
					}
				}
				stop("a with modifier replaces input (" + x.Target.String() + ")")
			case ast.Var:
				if t.Equal(ast.InputRootDocument.Value) || aliases[t] != nil {
					stop("a with modifier replaces input (" + x.Target.String() + ")")
				}
			}
		case ast.Ref:
			if nondet[x.String()] {
				stop("the policy calls " + x.String() + ", which is not a function of its arguments")
			}
			p, _, in := resolve(x)
			if !in {
				return false
			}
			if len(p) == 0 {
				stop("the policy reads input as a whole (" + x.String() + ")")
			}
			reads = append(reads, inputRead{keys: p})
			for _, t := range x[1:] { // a key may itself read input: data.x[input.tool]
				vis.Walk(t)
			}
			return true
		case ast.Var:
			if x.Equal(ast.InputRootDocument.Value) {
				stop("the policy reads input as a whole")
			} else if p := aliases[x]; p != nil {
				reads = append(reads, inputRead{keys: slices.Clone(p)})
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
		m := mods[n]
		aliases = map[ast.Var][]string{}
		for _, imp := range m.Imports {
			r, ok := imp.Path.Value.(ast.Ref)
			if !ok || !r[0].Equal(ast.InputRootDocument) {
				continue
			}
			p, whole, _ := resolve(r)
			if !whole || len(p) == 0 {
				stop("the policy reads input as a whole (import " + imp.Path.String() + ")")
				continue
			}
			aliases[imp.Name()] = p
		}
		vis.Walk(m)
	}
	if off != "" {
		return inputDeps{off: off}
	}
	// Under nested withs a read q is a read of p1.p2….q: every chain of
	// the prefixes, as long as the number of with modifiers.
	chains := [][]string{nil}
	for level, last := 0, [][]string{nil}; level < len(withs); level++ {
		var next [][]string
		for _, c := range last {
			for _, w := range withs {
				next = append(next, append(slices.Clone(c), w...))
			}
		}
		chains, last = append(chains, next...), next
		if len(chains) > maxWithPrefixes {
			return inputDeps{off: "input is replaced by its parts in too many ways (with input as …)"}
		}
	}
	var all []inputRead
	for _, c := range chains {
		for _, r := range reads {
			all = append(all, inputRead{keys: append(slices.Clone(c), r.keys...), shape: r.shape})
		}
	}
	// The Go side reads kind and tool (simpleTable, the query per kind).
	all = append(all, inputRead{keys: []string{"kind"}}, inputRead{keys: []string{"tool"}})
	slices.SortFunc(all, func(a, b inputRead) int {
		if c := slices.Compare(a.keys, b.keys); c != 0 {
			return c
		}
		switch {
		case a.shape == b.shape:
			return 0
		case !a.shape:
			return -1 // a value read covers a test of the same path
		}
		return 1
	})
	// Sorted, a value read comes right before the paths it covers (those
	// it is a prefix of); a test covers only the same test.
	var kept []inputRead
	var cover []string // the last value read kept
	for _, r := range all {
		if cover != nil && isPrefix(cover, r.keys) {
			continue
		}
		if n := len(kept); n > 0 && kept[n-1].shape && r.shape && slices.Equal(kept[n-1].keys, r.keys) {
			continue
		}
		kept = append(kept, r)
		if !r.shape {
			cover = r.keys
		}
	}
	d := inputDeps{paths: make([][]*ast.Term, len(kept)), shape: make([]bool, len(kept)), envoy: &pathTree{}}
	for i, r := range kept {
		if r.keys[0] == "envoy" {
			d.envoy.add(r.keys[1:], !r.shape)
		}
		for _, k := range r.keys {
			d.paths[i] = append(d.paths[i], ast.StringTerm(k))
		}
		d.shape[i] = r.shape
	}
	return d
}

func isVar(t *ast.Term) bool {
	_, ok := t.Value.(ast.Var)
	return ok
}

func isPrefix(p, q []string) bool {
	return len(p) <= len(q) && slices.Equal(p, q[:len(p)])
}

// String names the paths, for tests and logs; a tested path ends in "?".
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
		if d.shape[i] {
			s[i] += "?"
		}
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
// byte when the path is absent. A tested path (d.shape) keeps a
// scalar's text but only the kind of a collection: '{', '[' or '<'
// (set), none of which begins a scalar's text. The text of a value
// cannot contain a raw 0 or 1 byte (strings are quoted), so the key is
// unambiguous.
func (d inputDeps) key(b []byte, v ast.Value) []byte {
	for i, p := range d.paths {
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
		if d.shape[i] {
			switch x.(type) {
			case ast.Object:
				b = append(b, '{')
				continue
			case *ast.Array:
				b = append(b, '[')
				continue
			case ast.Set:
				b = append(b, '<')
				continue
			}
		}
		b = append(b, x.String()...)
	}
	return b
}

// liveMemoBytes bounds the engine's own memo (liveMemo) per policy
// generation: its keys' bytes plus liveEntryBytes per decision held.
const (
	liveMemoBytes  = 16 << 20
	liveEntryBytes = 256
	liveKeyMax     = 64 << 10 // a longer key (a large body the policy reads) is not remembered
)

// liveMemo is Engine.Decide's memo, one per policy generation (so a
// reload, a new bundle or new data starts it empty): the decision of
// each distinct projection of the input onto what the generation's
// policy reads (inputDeps), made once and answered from memory after,
// exactly as Memo does for replay. Only the evaluation is skipped: every
// call is still decided, audited and given its credential by its door.
// When the policy may read more than its projection (inputDeps.off) it
// is not used at all. Safe for concurrent use; when full it is emptied,
// so that what is decided now is what it holds.
type liveMemo struct {
	mu   sync.RWMutex
	m    map[string]Decision
	size int
	max  int

	evals, hits atomic.Int64 // Engine.MemoStats
}

func newLiveMemo(max int) *liveMemo {
	return &liveMemo{m: map[string]Decision{}, max: max}
}

// get answers k from memory, with slices and maps of its own that the
// caller may change.
func (l *liveMemo) get(k []byte) (Decision, bool) {
	l.mu.RLock()
	d, ok := l.m[string(k)]
	l.mu.RUnlock()
	if ok {
		d.Approvers = slices.Clone(d.Approvers)
		d.Obligations = maps.Clone(d.Obligations)
	}
	return d, ok
}

// put remembers d, a decision the policy made, under k.
func (l *liveMemo) put(k []byte, d Decision) {
	if len(k) > liveKeyMax {
		return
	}
	d.Approvers = slices.Clone(d.Approvers)
	d.Obligations = maps.Clone(d.Obligations)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[string(k)]; ok {
		return
	}
	if l.size+len(k)+liveEntryBytes > l.max {
		clear(l.m)
		l.size = 0
	}
	l.m[string(k)] = d
	l.size += len(k) + liveEntryBytes
}

// MemoStats are Decide's evaluations made through its live memo and its
// answers from memory, for the policy generation in force (both 0 when
// the memo is off for it: every decision is then evaluated).
func (e *Engine) MemoStats() (evals, hits int64) {
	if e == nil {
		return 0, 0
	}
	p := e.cur.Load()
	if p == nil || p.live == nil {
		return 0, 0
	}
	return p.live.evals.Load(), p.live.hits.Load()
}

// keyBufs are the live memo's key buffers, reused across decisions.
var keyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// decideLive decides in (items: inputItems's) through p's live memo (see
// liveMemo), building the whole input value only when it evaluates. A
// policy_error (a timeout on a loaded machine, an evaluation error) is
// never remembered.
func (e *Engine) decideLive(ctx context.Context, p *prepared, in *Input, items [][2]*ast.Term) Decision {
	var key []byte
	if p.live != nil && !e.cfg.NoMemo {
		bp := keyBufs.Get().(*[]byte)
		defer keyBufs.Put(bp)
		k, ok := liveKey((*bp)[:0], p.deps(), in, items)
		*bp = k
		if ok {
			if d, hit := p.live.get(k); hit {
				p.live.hits.Add(1)
				return d
			}
			p.live.evals.Add(1)
			key = k
		}
	}
	var ev ast.Value
	if len(in.Envoy) > 0 {
		var err error
		if ev, err = envoyValue(in.Envoy); err != nil {
			return policyError(fmt.Sprintf("policy: build input: %v", err))
		}
	}
	d := e.eval(ctx, p, in, inputObject(items, ev, in.Usage))
	if key != nil && d.Rule != RulePolicyError {
		p.live.put(key, d)
	}
	return d
}

// project parses the JSON value at p.i as value does, building only what
// t names: a leaf whole, an object's members t names (the others checked
// and skipped), anything but an object whole. On the paths of t the
// result holds what value's would, so inputDeps.key gives the same key
// for either.
func (p *jsonParser) project(depth int, t *pathTree) (*ast.Term, error) {
	p.space()
	if t.leaf || p.i >= len(p.b) || p.b[p.i] != '{' || depth >= maxJSONDepth {
		return p.value(depth)
	}
	return p.members(depth, t)
}

// liveKey is the live memo's key of in (items: inputItems's) under deps,
// appended to b, with input.envoy parsed only where deps reads it
// (project); ok false when the memo cannot be used for it (the policy
// may read more than its projection, or input.envoy does not parse:
// then the full value's error decides).
func liveKey(b []byte, deps inputDeps, in *Input, items [][2]*ast.Term) ([]byte, bool) {
	if deps.off != "" {
		return b, false
	}
	var ev ast.Value
	if len(in.Envoy) > 0 {
		p := jsonParser{b: in.Envoy}
		t, err := p.project(0, deps.envoy)
		if err != nil {
			return b, false
		}
		if p.space(); p.i != len(p.b) {
			return b, false
		}
		switch t.Value.(type) {
		case ast.Object:
			ev = t.Value
		case ast.Null:
		default:
			return b, false
		}
	}
	return deps.key(b, inputObject(items, ev, in.Usage)), true
}
