package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	policylib "github.com/sluice-gw/sluice/rego"
)

// libraryPrefix names the embedded library's files in errors and test results.
const libraryPrefix = "sluice:rego/"

// Problem is one compile problem with its place and OPA error code (such as
// rego_parse_error, rego_type_error, rego_compile_error), or
// sluice_package_error for a module in a package reserved by sluice.
type Problem struct {
	File    string
	Row     int
	Col     int
	Code    string
	Message string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d:%d: %s: %s", p.File, p.Row, p.Col, p.Code, p.Message)
}

// CompileError is returned by New, Reload and Test when the policy does not
// compile. Check for it with errors.As.
type CompileError struct {
	Problems []Problem
}

func (e *CompileError) Error() string {
	s := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		s[i] = p.String()
	}
	return "policy: compile: " + strings.Join(s, "; ")
}

// excludedBuiltin reports whether a builtin is removed from the capabilities:
// http.send and every net.* (network, DNS; net.cidr_* too, although pure, so
// that the rule stays "no net.*" and simple to audit) and opa.runtime (the
// environment and configuration of the process).
func excludedBuiltin(name string) bool {
	return name == "http.send" || name == "opa.runtime" || strings.HasPrefix(name, "net.")
}

// capabilities is what policy may use: this OPA version minus excludedBuiltin,
// with no host allowed for network access.
var capabilities = sync.OnceValue(func() *ast.Capabilities {
	c := ast.CapabilitiesForThisVersion()
	kept := make([]*ast.Builtin, 0, len(c.Builtins))
	for _, b := range c.Builtins {
		if !excludedBuiltin(b.Name) {
			kept = append(kept, b)
		}
	}
	c.Builtins = kept
	c.AllowNet = []string{}
	return c
})

// Capabilities returns a copy of the builtins policy may call, for
// `sluice policy` to print or for tooling such as `opa check --capabilities`.
func Capabilities() *ast.Capabilities {
	c := *capabilities()
	c.Builtins = append([]*ast.Builtin(nil), c.Builtins...)
	c.AllowNet = []string{}
	return &c
}

// compile builds one generation: the library and modules (tests excluded),
// the rules as data, the prepared ModuleCandidatesQuery and the rules as the
// engine matches them in Go.
func compile(ctx context.Context, cfg Config, b *Bundle, log *slog.Logger) (*prepared, error) {
	src, err := loadSources(cfg, b)
	if err != nil {
		return nil, err
	}
	pq, err := prepare(ctx, ModuleCandidatesQuery, cfg, src, log)
	if err != nil {
		return nil, err
	}
	pqTool, err := prepare(ctx, PolicyCandidatesQuery, cfg, src, nil)
	if err != nil {
		return nil, err
	}
	data, err := rulesData(cfg.Rules)
	if err != nil {
		return nil, err
	}
	table, err := newSimpleTable(data)
	if err != nil {
		return nil, err
	}
	mods := src.mods
	deps := sync.OnceValue(func() inputDeps { return inputPaths(mods) }) // memo.go: on first use only
	return &prepared{pq: pq, pqTool: pqTool, rules: table, revision: src.revision, deps: deps, live: newLiveMemo(liveMemoBytes)}, nil
}

// sources is what one generation compiles besides the library: the
// modules (the library's, the files' and the bundle's, tests excluded),
// the data documents and bundle data merged into one object, and the
// revision that names them.
type sources struct {
	mods     map[string]*ast.Module
	data     map[string]any
	revision string
}

// loadSources loads the modules and data documents under cfg.Paths and
// adds the bundle's. The revision is the bundle's when there is one (with
// "+files" when Rego files are loaded beside it), else the files' digest.
func loadSources(cfg Config, b *Bundle) (*sources, error) {
	mods, err := loadModules(cfg.Paths, false)
	if err != nil {
		return nil, err
	}
	data, err := loadData(cfg.Paths)
	if err != nil {
		return nil, err
	}
	rev, err := sourceRevision(cfg.Paths)
	if err != nil {
		return nil, err
	}
	if b != nil {
		for name, m := range b.modules {
			mods[name] = m
		}
		if err := mergeData(data, nil, b.data, "the bundle", map[string]string{}); err != nil {
			return nil, &CompileError{Problems: []Problem{{File: "bundle", Row: 1, Col: 1, Code: CodeDataError, Message: err.Error()}}}
		}
		if len(cfg.Paths) > 0 {
			rev = b.Revision + "+files:" + rev
		} else {
			rev = b.Revision
		}
	}
	return &sources{mods: mods, data: data, revision: rev}, nil
}

// prepare compiles query against the library, the modules and the rules.
// Results come back as AST terms (*ast.Term), not converted to Go values:
// the engine reads the candidates where they are.
func prepare(ctx context.Context, query string, cfg Config, src *sources, log *slog.Logger) (rego.PreparedEvalQuery, error) {
	mods := src.mods
	store, err := rulesStore(cfg, src.data)
	if err != nil {
		return rego.PreparedEvalQuery{}, err
	}
	warnMissingDecisions(mods, log)
	opts := []func(*rego.Rego){
		rego.Query(query),
		rego.Store(store),
		rego.Capabilities(capabilities()),
		rego.StrictBuiltinErrors(true),
		rego.SetRegoVersion(ast.RegoV1),
		rego.GenerateJSON(func(t *ast.Term, _ *rego.EvalContext) (any, error) { return t, nil }),
	}
	for _, m := range mods {
		opts = append(opts, rego.ParsedModule(m))
	}
	pq, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return rego.PreparedEvalQuery{}, compileError(err)
	}
	return pq, nil
}

// compileError turns OPA's errors into a *CompileError; other errors are wrapped.
func compileError(err error) error {
	var errs ast.Errors
	if errors.As(err, &errs) {
		ce := &CompileError{}
		for _, e := range errs {
			ce.Problems = append(ce.Problems, problem(e))
		}
		return ce
	}
	var one *ast.Error
	if errors.As(err, &one) {
		return &CompileError{Problems: []Problem{problem(one)}}
	}
	return fmt.Errorf("policy: compile: %w", err)
}

func problem(e *ast.Error) Problem {
	p := Problem{Code: e.Code, Message: e.Message}
	if e.Location != nil {
		p.File, p.Row, p.Col = e.Location.File, e.Location.Row, e.Location.Col
	}
	// Say why a builtin is missing rather than leave "undefined function".
	if name, ok := strings.CutPrefix(e.Message, "undefined function "); ok && excludedBuiltin(name) {
		p.Message += " (" + name + " is disabled in sluice: policy has no network or environment access)"
	}
	return p
}

// loadModules parses the embedded library and the .rego files under paths.
// Tests (_test.rego) are included only if withTests.
func loadModules(paths []string, withTests bool) (map[string]*ast.Module, error) {
	mods := map[string]*ast.Module{}
	var problems []Problem
	parse := func(name string, src []byte, user bool) {
		m, err := ast.ParseModuleWithOpts(name, string(src), ast.ParserOptions{
			RegoVersion:       ast.RegoV1,
			ProcessAnnotation: true,
			Capabilities:      capabilities(),
		})
		if err != nil {
			var errs ast.Errors
			if errors.As(err, &errs) {
				for _, e := range errs {
					problems = append(problems, problem(e))
				}
				return
			}
			problems = append(problems, Problem{File: name, Code: ast.ParseErr, Message: err.Error()})
			return
		}
		if m == nil {
			problems = append(problems, Problem{File: name, Row: 1, Col: 1, Code: ast.ParseErr, Message: "empty module"})
			return
		}
		if user {
			if p, bad := reservedPackage(m); bad {
				problems = append(problems, p)
				return
			}
		}
		mods[name] = m
	}
	for _, n := range policylib.Files(withTests) {
		src, err := policylib.FS.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("bug(): policy: read embedded %s: %w", n, err)
		}
		parse(libraryPrefix+n, src, false)
	}
	files, err := regoFiles(paths)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if !withTests && strings.HasSuffix(f, "_test.rego") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("policy: load %s: %w", f, err)
		}
		parse(f, src, true)
	}
	if len(problems) > 0 {
		return nil, &CompileError{Problems: problems}
	}
	return mods, nil
}

// reservedPackage rejects user modules in sluice's own namespace: data.sluice
// belongs to the library (sluice.main) and the compiled rules (sluice.config);
// only sluice.policies.<name> is open. Deeper packages would be silently
// ignored by the library, so they are an error too.
func reservedPackage(m *ast.Module) (Problem, bool) {
	path := m.Package.Path
	if len(path) < 2 || !path[1].Equal(ast.StringTerm("sluice")) {
		return Problem{}, false
	}
	if len(path) == 4 && path[2].Equal(ast.StringTerm("policies")) {
		return Problem{}, false
	}
	p := Problem{Code: "sluice_package_error",
		Message: fmt.Sprintf("package %s is reserved: use package sluice.policies.<name> or a package outside sluice", path)}
	if loc := m.Package.Location; loc != nil {
		p.File, p.Row, p.Col = loc.File, loc.Row, loc.Col
	}
	return p, true
}

// warnMissingDecisions logs packages under sluice.policies that define no
// `decisions` rule: their rules are never collected.
func warnMissingDecisions(mods map[string]*ast.Module, log *slog.Logger) {
	if log == nil {
		return // the second query of a generation: warned once already
	}
	pkgs := map[string]bool{}
	for _, m := range mods {
		path := m.Package.Path
		if len(path) != 4 || !path[1].Equal(ast.StringTerm("sluice")) || !path[2].Equal(ast.StringTerm("policies")) {
			continue
		}
		k := path.String()
		for _, r := range m.Rules {
			if r.Head.Name.String() == "decisions" || r.Head.Ref().String() == "decisions" {
				pkgs[k] = true
			}
		}
		if !pkgs[k] {
			pkgs[k] = false
		}
	}
	for k, ok := range pkgs {
		if !ok {
			log.Warn("policy: package defines no decisions rule; it decides nothing", "package", k)
		}
	}
}

// regoFiles lists the .rego files under paths, sorted, skipping dot files and
// dot directories (editor swap files, Kubernetes ..data directories). A path
// that does not exist is an error: a missing policy must not mean no policy.
func regoFiles(paths []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("policy: load %s: %w", p, err)
		}
		if !fi.IsDir() {
			if isDataFile(fi.Name()) {
				continue // a data document listed by name: loadData's
			}
			if c := filepath.Clean(p); !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
			continue
		}
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if path != p && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() || !strings.HasSuffix(d.Name(), ".rego") {
				return nil
			}
			if c := filepath.Clean(path); !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("policy: load %s: %w", p, err)
		}
	}
	sort.Strings(out)
	return out, nil
}

// ValidateRules checks the simple rules; errors name the rule (policies[2]).
func ValidateRules(rules []Rule) error {
	_, err := rulesData(rules)
	return err
}

// rulesData compiles the simple rules into the shape the library reads at
// data.sluice.config.rules (see rego/README.md):
//
//	exact:   {tool name: [rule]}           one indexed lookup per call
//	by_slug: {slug: [rule]}                wildcards whose literal prefix
//	                                       (before the first *) has a dot
//	scan:    [rule]                        other wildcards, globbed every call
//	any:     [rule]                        "*": matches without a glob
//
// so a call runs only the globs of its own connector and the scan list.
func rulesData(rules []Rule) (map[string]any, error) {
	exact := map[string]any{}
	bySlug := map[string]any{}
	scan := []any{}
	anyRules := []any{}
	for i, r := range rules {
		id := "policies[" + strconv.Itoa(i) + "]"
		if r.Match == "" {
			return nil, fmt.Errorf("policy: %s.match: empty", id)
		}
		if j := strings.IndexAny(r.Match, `?[]{}\!`); j >= 0 {
			return nil, fmt.Errorf("policy: %s.match %q: %q is not supported (only * is a wildcard)", id, r.Match, r.Match[j])
		}
		if _, err := ParseAction(r.Action); err != nil {
			return nil, fmt.Errorf("policy: %s.action %q: want allow, ask or block", id, r.Action)
		}
		if len(r.Approvers) > 0 && r.Action != "ask" {
			return nil, fmt.Errorf("policy: %s.approvers: only an ask rule has approvers", id)
		}
		approvers := make([]any, 0, len(r.Approvers))
		for k, a := range r.Approvers {
			if strings.TrimSpace(a) == "" {
				return nil, fmt.Errorf("policy: %s.approvers[%d]: empty", id, k)
			}
			approvers = append(approvers, a)
		}
		reason := r.Reason
		if reason == "" {
			reason = "matched " + r.Match
		}
		entry := map[string]any{
			"rule": id, "action": r.Action, "reason": reason, "approvers": approvers,
			"obligations": map[string]any{}, "key": []any{1, i, id, reason},
			"match": r.Match, "prefix": "",
		}
		star := strings.IndexByte(r.Match, '*')
		switch {
		case star < 0:
			exact[r.Match] = append(asList(exact[r.Match]), entry)
			continue
		case strings.Trim(r.Match, "*") == "":
			anyRules = append(anyRules, entry)
			continue
		}
		lit := r.Match[:star]
		if star == len(r.Match)-1 {
			entry["prefix"] = lit
		}
		if dot := strings.IndexByte(lit, '.'); dot > 0 {
			slug := lit[:dot]
			bySlug[slug] = append(asList(bySlug[slug]), entry)
		} else {
			scan = append(scan, entry)
		}
	}
	return map[string]any{
		"exact": exact, "by_slug": bySlug, "scan": scan, "any": anyRules,
	}, nil
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// egressData compiles the agents' egress allowlists into the shape the
// library reads at data.sluice.config.egress (see rego/README.md):
//
//	agents: {agent: {"exact": {host: true}, "suffixes": [".domain"]}}
//	ports:  {"http": [80, 443], "connect": [443, ConnectPorts...]}
//
// "*.domain" becomes the suffix ".domain": any name below domain, at any
// depth, but not domain itself. Entries are lower-cased; a "*" anywhere but
// a leading "*." is an error.
func egressData(cfg Config) (map[string]any, error) {
	agents := map[string]any{}
	for agent, list := range cfg.Egress {
		exact := map[string]any{}
		suffixes := []any{}
		for i, h := range list {
			h = strings.TrimSuffix(strings.ToLower(h), ".")
			rest, wild := strings.CutPrefix(h, "*.")
			if rest == "" || strings.ContainsAny(rest, "*?[]{}\\!/:@ ") {
				return nil, fmt.Errorf("policy: egress[%q][%d] %q: want a host name or *.domain", agent, i, list[i])
			}
			if wild {
				suffixes = append(suffixes, "."+rest)
			} else {
				exact[rest] = true
			}
		}
		agents[agent] = map[string]any{"exact": exact, "suffixes": suffixes}
	}
	connect := []any{443}
	for _, p := range cfg.ConnectPorts {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("policy: connect port %d: want 1-65535", p)
		}
		if p != 443 {
			connect = append(connect, p)
		}
	}
	return map[string]any{
		"agents": agents,
		"ports":  map[string]any{"http": []any{80, 443}, "connect": connect},
	}, nil
}

// rulesStore puts the compiled rules at data.sluice.config.rules and the
// egress allowlists at data.sluice.config.egress. The store keeps AST values
// so that reads per call convert nothing.
//
// docs, the data documents and bundle data, are the rest of data.
func rulesStore(cfg Config, docs map[string]any) (storage.Store, error) {
	data, err := rulesData(cfg.Rules)
	if err != nil {
		return nil, err
	}
	egress, err := egressData(cfg)
	if err != nil {
		return nil, err
	}
	root := make(map[string]any, len(docs)+1)
	for k, v := range docs {
		root[k] = v
	}
	root["sluice"] = map[string]any{"config": map[string]any{"rules": data, "egress": egress}}
	return inmem.NewFromObjectWithOpts(
		root,
		inmem.OptRoundTripOnWrite(false),
		inmem.OptReturnASTValuesOnRead(true),
	), nil
}
