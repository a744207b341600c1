package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gobwas/glob"
	"github.com/open-policy-agent/opa/v1/ast"
)

// simpleTable is data.sluice.config.rules (see rulesData) as the engine
// matches it in Go: the same candidate terms, and the globs compiled with the
// library glob.match uses, with no delimiters. Each method mirrors a rule of
// main.rego; the differential tests hold them to it.
type simpleTable struct {
	exact  map[string][]*ast.Term
	bySlug map[string][]wildcard
	scan   []wildcard
	any    []*ast.Term
}

// wildcard is a compiled wildcard rule: a prefix (checked like startswith)
// or, when prefix is empty, a glob.
type wildcard struct {
	prefix string
	glob   *glob.Pattern
	cand   *ast.Term
}

func (w wildcard) match(tool string) bool {
	if w.prefix != "" {
		return strings.HasPrefix(tool, w.prefix)
	}
	return w.glob.Match(tool)
}

// newSimpleTable converts the output of rulesData.
func newSimpleTable(data map[string]any) (*simpleTable, error) {
	t := &simpleTable{exact: map[string][]*ast.Term{}, bySlug: map[string][]wildcard{}}
	term := func(entry any) (*ast.Term, error) {
		v, err := ast.InterfaceToValue(entry)
		if err != nil {
			return nil, fmt.Errorf("bug(): policy: rule entry: %w", err)
		}
		return ast.NewTerm(v), nil
	}
	wild := func(entry any) (wildcard, error) {
		m, _ := entry.(map[string]any)
		prefix, _ := m["prefix"].(string)
		match, _ := m["match"].(string)
		cand, err := term(entry)
		if err != nil {
			return wildcard{}, err
		}
		w := wildcard{prefix: prefix, cand: cand}
		if prefix == "" {
			if w.glob, err = glob.Compile(match); err != nil {
				return wildcard{}, fmt.Errorf("policy: %s.match %q: %w", m["rule"], match, err)
			}
		}
		return w, nil
	}
	for name, entries := range data["exact"].(map[string]any) {
		for _, e := range entries.([]any) {
			c, err := term(e)
			if err != nil {
				return nil, err
			}
			t.exact[name] = append(t.exact[name], c)
		}
	}
	for slug, entries := range data["by_slug"].(map[string]any) {
		for _, e := range entries.([]any) {
			w, err := wild(e)
			if err != nil {
				return nil, err
			}
			t.bySlug[slug] = append(t.bySlug[slug], w)
		}
	}
	for _, e := range data["scan"].([]any) {
		w, err := wild(e)
		if err != nil {
			return nil, err
		}
		t.scan = append(t.scan, w)
	}
	for _, e := range data["any"].([]any) {
		c, err := term(e)
		if err != nil {
			return nil, err
		}
		t.any = append(t.any, c)
	}
	return t, nil
}

// candidates is main.rego's `candidates`: the matching simple rules and the
// module candidates (`specific`) when there is any, else the catch-alls
// (`fallback`). Simple rules apply to tool calls only.
func (t *simpleTable) candidates(in *Input, modules []*ast.Term) []*ast.Term {
	var out []*ast.Term
	toolCall := in.Kind == "tool_call"
	if toolCall {
		out = append(out, t.exact[in.Tool]...)
		if slug, ok := toolSlug(in.Tool); ok {
			for _, w := range t.bySlug[slug] {
				if w.match(in.Tool) {
					out = append(out, w.cand)
				}
			}
		}
		for _, w := range t.scan {
			if w.match(in.Tool) {
				out = append(out, w.cand)
			}
		}
	}
	out = append(out, modules...)
	if len(out) == 0 && toolCall {
		return t.any
	}
	return out
}

// toolSlug is main.rego's tool_slug: the part of the tool name before the
// first dot, if that is not empty. indexof and substring count runes and,
// for a name that is not ASCII, turn invalid bytes into U+FFFD, as here.
func toolSlug(tool string) (string, bool) {
	if isASCII(tool) {
		i := strings.IndexByte(tool, '.')
		return tool[:max(i, 0)], i > 0
	}
	runes := []rune(tool)
	i := slices.Index(runes, '.')
	if i <= 0 {
		return "", false
	}
	return string(runes[:i]), true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
