package policy

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/tester"
)

// TestTimeout bounds each Rego test.
const TestTimeout = 5 * time.Second

// TestResult is the outcome of one Rego test rule.
type TestResult struct {
	Package  string        `json:"package"` // e.g. data.sluice.main_test
	Name     string        `json:"name"`    // e.g. test_no_rule_blocks
	File     string        `json:"file"`
	Row      int           `json:"row"`
	Outcome  string        `json:"outcome"` // "pass", "fail", "error" or "skip"
	Error    string        `json:"error,omitempty"`
	Duration time.Duration `json:"duration"`
}

// TestReport is what Test found: every result, sorted by file and row, and
// the counts.
type TestReport struct {
	Results []TestResult `json:"results"`
	Passed  int          `json:"passed"`
	Failed  int          `json:"failed"`
	Errored int          `json:"errored"`
	Skipped int          `json:"skipped"`
}

// OK reports whether there was at least one test and none failed or errored.
func (r *TestReport) OK() bool {
	return r != nil && r.Failed == 0 && r.Errored == 0 && r.Passed > 0
}

// Test runs every test rule in the shipped library's _test.rego files and in
// the .rego files under paths, with OPA's tester, the same capabilities and
// strict builtin errors as the engine, and rules compiled into data as for
// New. The files also pass under `opa test` (the library's tests bring their
// own data with `with`). A failing test is a result; the error is for files
// that do not load or compile.
func Test(ctx context.Context, paths []string, rules []Rule) (*TestReport, error) {
	return TestWith(ctx, paths, Config{Rules: rules})
}

// TestWith is Test with the data of cfg — its rules and its egress
// allowlists and ports, compiled as New compiles them — at
// data.sluice.config, for `sluice policy test --with-config`: a test can
// then decide through the configuration's own simple rules. cfg.Paths is
// not used (paths says which modules and tests run).
func TestWith(ctx context.Context, paths []string, cfg Config) (*TestReport, error) {
	mods, err := loadModules(paths, true)
	if err != nil {
		return nil, err
	}
	docs, err := loadData(paths)
	if err != nil {
		return nil, err
	}
	store, err := rulesStore(cfg, docs)
	if err != nil {
		return nil, err
	}
	compiler := ast.NewCompiler().
		WithCapabilities(capabilities()).
		WithDefaultRegoVersion(ast.RegoV1)
	ch, err := tester.NewRunner().
		SetCompiler(compiler).
		SetStore(store).
		SetDefaultRegoVersion(ast.RegoV1).
		RaiseBuiltinErrors(true).
		SetTimeout(TestTimeout).
		SetModules(mods).
		RunTests(ctx, nil)
	if err != nil {
		return nil, compileError(err)
	}
	rep := &TestReport{}
	for r := range ch {
		tr := TestResult{Package: r.Package, Name: r.Name, Duration: r.Duration}
		if r.Location != nil {
			tr.File, tr.Row = r.Location.File, r.Location.Row
		}
		switch {
		case r.Skip:
			tr.Outcome = "skip"
			rep.Skipped++
		case r.Error != nil:
			tr.Outcome = "error"
			tr.Error = r.Error.Error()
			rep.Errored++
		case r.Fail:
			tr.Outcome = "fail"
			rep.Failed++
		default:
			tr.Outcome = "pass"
			rep.Passed++
		}
		rep.Results = append(rep.Results, tr)
	}
	slices.SortFunc(rep.Results, func(a, b TestResult) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Row, b.Row), cmp.Compare(a.Name, b.Name))
	})
	return rep, ctx.Err()
}
