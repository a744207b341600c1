package policy

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Lint is what Check found in the security team's modules beyond compile
// errors: what compiles but will not decide as its author meant.
type Lint struct {
	// Modules is the number of modules loaded from the paths (the shipped
	// library and _test.rego files not counted).
	Modules int
	// Errors will misdecide at every call that reaches them: a decision
	// whose action is a literal other than allow, ask or block (the engine
	// turns it into a block, reason "invalid action"), or that has no action.
	Errors []Problem
	// Warnings decide nothing: a sluice.policies package without a
	// decisions rule, a package outside sluice.policies that no module uses.
	Warnings []Problem
}

// Lint codes, in Problem.Code.
const (
	CodeBadAction     = "sluice_action_error"   // an action literal other than allow, ask, block
	CodeNoDecisions   = "sluice_no_decisions"   // a sluice.policies package without decisions
	CodeUnusedPackage = "sluice_package_unused" // outside sluice.policies and used by no module
)

// Check compiles the modules under paths (tests excluded) as New does and
// walks the compiled AST for what can be seen without an input:
//
//   - in a sluice.policies.<name> package, every object literal inside a
//     decisions rule (its head or its body) with an "action" key whose
//     value is a string literal must say allow, ask or block, and a
//     decision written as a literal object must have an action;
//   - a sluice.policies.<name> package must define decisions;
//   - a package outside sluice.policies is a helper: one that no other
//     module refers to decides nothing.
//
// Problems name file:row:col. The error is for modules that do not load
// or compile (as New reports them).
func Check(ctx context.Context, paths []string) (*Lint, error) {
	mods, err := loadModules(paths, false)
	if err != nil {
		return nil, err
	}
	c := ast.NewCompiler().
		WithCapabilities(capabilities()).
		WithDefaultRegoVersion(ast.RegoV1)
	c.Compile(mods)
	if c.Failed() {
		return nil, compileError(c.Errors)
	}
	l := &Lint{}
	var names []string
	for name := range mods {
		if !strings.HasPrefix(name, libraryPrefix) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	l.Modules = len(names)

	type pkgInfo struct {
		loc       *ast.Location
		decisions bool
	}
	policies := map[string]*pkgInfo{}
	var pkgOrder []string
	for _, name := range names {
		m := c.Modules[name]
		path := m.Package.Path
		if !isPolicyPackage(path) {
			continue
		}
		k := path.String()
		pi := policies[k]
		if pi == nil {
			pi = &pkgInfo{loc: m.Package.Location}
			policies[k] = pi
			pkgOrder = append(pkgOrder, k)
		}
		for _, r := range m.Rules {
			if ruleName(r) != "decisions" {
				continue
			}
			pi.decisions = true
			l.Errors = append(l.Errors, actionProblems(r)...)
		}
	}
	for _, k := range pkgOrder {
		if pi := policies[k]; !pi.decisions {
			l.Warnings = append(l.Warnings, at(pi.loc, CodeNoDecisions,
				fmt.Sprintf("package %s defines no decisions rule: it decides nothing (write `decisions contains {\"action\": …} if {…}`)", strings.TrimPrefix(k, "data."))))
		}
	}
	for _, name := range names {
		m := c.Modules[name]
		path := m.Package.Path
		if isPolicyPackage(path) || usedElsewhere(c, names, name, path) {
			continue
		}
		l.Warnings = append(l.Warnings, at(m.Package.Location, CodeUnusedPackage,
			fmt.Sprintf("package %s is outside sluice.policies.* and no module uses it: it decides nothing (only a sluice.policies.<name> package's decisions are collected)", strings.TrimPrefix(path.String(), "data."))))
	}
	return l, ctx.Err()
}

// isPolicyPackage says whether path is data.sluice.policies.<name>.
func isPolicyPackage(path ast.Ref) bool {
	return len(path) == 4 && path[1].Equal(ast.StringTerm("sluice")) && path[2].Equal(ast.StringTerm("policies"))
}

// ruleName is the rule's name: "decisions" for `decisions contains …`.
func ruleName(r *ast.Rule) string {
	ref := r.Head.Ref()
	if len(ref) == 0 {
		return ""
	}
	if v, ok := ref[0].Value.(ast.Var); ok {
		return string(v)
	}
	return ref[0].String()
}

// actionProblems walks one decisions rule for action literals that are not
// an action, and for a literal decision without one.
func actionProblems(r *ast.Rule) []Problem {
	var out []Problem
	actionKey := ast.StringTerm("action")
	if k := r.Head.Key; k != nil {
		if obj, ok := k.Value.(ast.Object); ok && obj.Get(actionKey) == nil {
			out = append(out, at(locOf(k, r), CodeBadAction, "a decision without \"action\": it is blocked with reason \"invalid action\" at every call it matches; add \"action\": \"allow\", \"ask\" or \"block\""))
		}
	}
	ast.WalkTerms(r, func(t *ast.Term) bool {
		obj, ok := t.Value.(ast.Object)
		if !ok {
			return false
		}
		v := obj.Get(actionKey)
		if v == nil {
			return false
		}
		s, ok := v.Value.(ast.String)
		if !ok {
			return false // not a literal: decided per call
		}
		if _, err := ParseAction(string(s)); err != nil {
			out = append(out, at(locOf(v, r), CodeBadAction,
				fmt.Sprintf("action %q: want allow, ask or block; the engine blocks every call this decision matches (reason \"invalid action\")", string(s))))
		}
		return false
	})
	return out
}

// usedElsewhere says whether a module other than name refers to a rule
// under path (compiled refs are absolute, imports resolved).
func usedElsewhere(c *ast.Compiler, names []string, name string, path ast.Ref) bool {
	for _, other := range names {
		if other == name {
			continue
		}
		used := false
		ast.WalkRefs(c.Modules[other], func(r ast.Ref) bool {
			if r.HasPrefix(path) || path.HasPrefix(r) && len(r) > 1 {
				used = true
			}
			return used
		})
		if used {
			return true
		}
	}
	return false
}

func locOf(t *ast.Term, r *ast.Rule) *ast.Location {
	if t != nil && t.Location != nil {
		return t.Location
	}
	return r.Location
}

func at(loc *ast.Location, code, msg string) Problem {
	p := Problem{Code: code, Message: msg}
	if loc != nil {
		p.File, p.Row, p.Col = loc.File, loc.Row, loc.Col
	}
	return p
}
