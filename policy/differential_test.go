package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"

	policylib "github.com/sluice-gw/sluice/rego"
)

// regoDecider decides with data.sluice.main.decision, combined in Rego: the
// way the engine decided before the combining moved to Go (combine). It is
// the reference the differential tests hold the engine to.
type regoDecider struct {
	pq       rego.PreparedEvalQuery
	revision string // the engine stamps every decision with it
}

func newRegoDecider(t testing.TB, cfg Config) *regoDecider {
	t.Helper()
	src, err := loadSources(cfg, nil)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	pq, err := prepare(context.Background(), Query, cfg, src, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("prepare %s: %v", Query, err)
	}
	return &regoDecider{pq: pq, revision: src.revision}
}

// Decide is Engine.Decide as it was, with the result converted by the rego
// package's default (ast.JSON) and checked by decisionFrom.
func (r *regoDecider) Decide(ctx context.Context, in *Input) (d Decision) {
	defer func() { d.Revision = r.revision }()
	if in == nil {
		return policyError("policy: no input")
	}
	if !validKind(in.Kind) {
		return policyError(fmt.Sprintf("policy: unknown input kind %q", in.Kind))
	}
	val, err := inputValue(in)
	if err != nil {
		return policyError(fmt.Sprintf("policy: build input: %v", err))
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	rs, err := r.pq.Eval(ctx, rego.EvalParsedInput(val),
		rego.EvalGenerateJSON(func(t *ast.Term, _ *rego.EvalContext) (any, error) { return ast.JSON(t.Value) }))
	if err != nil {
		return policyError(evalReason(ctx, false, err))
	}
	d, err = decisionFrom(rs)
	if err != nil {
		return policyError(err.Error())
	}
	return d
}

// decisionFrom checks the result has exactly the shape README.md promises.
func decisionFrom(rs rego.ResultSet) (Decision, error) {
	switch {
	case len(rs) == 0:
		return Decision{}, errors.New("policy: decision undefined")
	case len(rs) > 1 || len(rs[0].Expressions) != 1:
		return Decision{}, errors.New("policy: multiple decisions")
	}
	m, ok := rs[0].Expressions[0].Value.(map[string]any)
	if !ok {
		return Decision{}, fmt.Errorf("policy: decision is %T, want object", rs[0].Expressions[0].Value)
	}
	for k := range m {
		switch k {
		case "action", "reason", "rule", "approvers", "obligations":
		default:
			return Decision{}, fmt.Errorf("policy: decision has unknown field %q", k)
		}
	}
	as, _ := m["action"].(string)
	a, err := ParseAction(as)
	if err != nil {
		return Decision{}, fmt.Errorf("policy: decision action %v: want allow, ask or block", m["action"])
	}
	reason, ok := m["reason"].(string)
	if !ok {
		return Decision{}, fmt.Errorf("policy: decision reason is %T, want string", m["reason"])
	}
	rule, ok := m["rule"].(string)
	if !ok || rule == "" {
		return Decision{}, fmt.Errorf("policy: decision rule %v: want a non-empty string", m["rule"])
	}
	d := Decision{Action: a, Reason: reason, Rule: rule}
	if v, ok := m["approvers"]; ok && v != nil {
		list, ok := v.([]any)
		if !ok {
			return Decision{}, fmt.Errorf("policy: decision approvers is %T, want array", v)
		}
		for _, x := range list {
			s, ok := x.(string)
			if !ok || s == "" {
				return Decision{}, fmt.Errorf("policy: decision approver %v: want a non-empty string", x)
			}
			d.Approvers = append(d.Approvers, s)
		}
	}
	if v, ok := m["obligations"]; ok && v != nil {
		ob, ok := v.(map[string]any)
		if !ok {
			return Decision{}, fmt.Errorf("policy: decision obligations is %T, want object", v)
		}
		if len(ob) > 0 {
			d.Obligations = ob
		}
	}
	return d, nil
}

// oddModule emits decisions of every shape the combining must handle, each
// for its own tool name under "w.", so that one module covers them all.
const oddModule = `package sluice.policies.odd

decisions contains {"action": "deny", "rule": "odd.deny"} if input.tool == "w.deny"
decisions contains {"rule": "odd.noaction"} if input.tool == "w.noaction"
decisions contains {"action": 1} if input.tool == "w.num_action"
decisions contains {"action": "Allow", "reason": "case"} if input.tool == "w.case_action"
decisions contains "just a string" if input.tool == "w.string"
decisions contains {"action": "allow"} if input.tool == "w.defaults"
decisions contains {"action": "ask", "rule": "odd.tie", "reason": "same", "approvers": ["z"]} if input.tool == "w.tie"
decisions contains {"action": "ask", "rule": "odd.tie", "reason": "same", "approvers": ["a"], "obligations": {"log": true}} if input.tool == "w.tie"
decisions contains {"action": "block", "rule": "odd.ob", "obligations": {"notify": ["secops"], "n": 1.5, "s": {1, "x"}}} if input.tool == "w.obligations"
decisions contains {"action": "allow", "rule": "odd.nullob", "obligations": null} if input.tool == "w.nullob"
decisions contains {"action": "allow", "rule": "odd.strob", "obligations": "log"} if input.tool == "w.strob"
decisions contains {"action": "ask", "rule": "odd.numappr", "approvers": ["x", 1]} if input.tool == "w.numappr"
decisions contains {"action": "ask", "rule": "odd.setappr", "approvers": {"x", "b"}} if input.tool == "w.setappr"
decisions contains {"action": "ask", "rule": "odd.objappr", "approvers": {"k": "v", "j": "b"}} if input.tool == "w.objappr"
decisions contains {"action": "ask", "rule": "odd.strappr", "approvers": "solo"} if input.tool == "w.strappr"
decisions contains {"action": "ask", "rule": "odd.emptyappr", "approvers": ["", "x"]} if input.tool == "w.emptyappr"
decisions contains {"action": "ask", "rule": "odd.dupappr", "approvers": ["b", "a", "b"]} if input.tool == "w.dupappr"
decisions contains {"action": "allow", "rule": "odd.numreason", "reason": 7} if input.tool == "w.numreason"
decisions contains {"action": "allow", "rule": 7} if input.tool == "w.numrule"
decisions contains {"action": "allow", "rule": ""} if input.tool == "w.emptyrule"
decisions contains {"action": "allow", "rule": "odd.a", "reason": "b"} if input.tool == "w.reasons"
decisions contains {"action": "allow", "rule": "odd.a", "reason": "a"} if input.tool == "w.reasons"
decisions contains {"action": "block", "rule": "odd.z"} if input.tool == "w.multi"
decisions contains {"action": "block", "rule": "odd.b"} if input.tool == "w.multi"
decisions contains {"action": "ask", "rule": "odd.lowask", "approvers": ["m"]} if input.tool == "w.multi"
decisions contains {"action": "ask", "rule": "odd.ask", "approvers": ["m", "group:finance"]} if input.tool == "w.ask"
decisions contains {"action": "allow", "rule": "odd.egress", "reason": "pypi"} if {
	input.kind in {"http", "connect", "dns"}
	input.request.host == "pypi.org"
}
decisions contains {"action": "ask", "rule": "odd.big", "approvers": ["group:cfo"]} if input.args.body.amount > 1000
`

// teamModule is a second module: decisions from two packages are combined.
const teamModule = `package sluice.policies.team

decisions contains {"action": "block", "reason": "frozen"} if input.tool == "billing-api.get_invoice"
decisions contains {"action": "allow", "reason": "team ok", "rule": "team.ok"} if input.tool == "crm.get_contact"
decisions contains {"action": "ask", "rule": "odd.tie", "reason": "same", "approvers": ["t"]} if input.tool == "w.tie"
decisions contains {"action": "ask", "rule": "team.ask", "approvers": ["group:finance", "team"]} if input.tool == "w.ask"
`

// diffRuleSets are the simple rule sets of the differential test.
func diffRuleSets() map[string][]Rule {
	w := []Rule{
		{Match: "w.multi", Action: "ask", Approvers: []string{"r"}},
		{Match: "w.ask", Action: "ask", Approvers: []string{"s", "group:finance"}},
		{Match: "w.*", Action: "allow", Reason: "w prefix"},
		{Match: "w.t*", Action: "block"},
		{Match: "*.reasons", Action: "allow"},
		{Match: "w.reasons", Action: "allow"},
		{Match: "crm.list_contacts", Action: "ask"},
	}
	return map[string][]Rule{
		"none":    nil,
		"gateway": gatewayRules,
		"gateway, w and catch-all allow": append(append(append([]Rule(nil), gatewayRules...), w...),
			Rule{Match: "*", Action: "allow"}),
		"catch-alls only": {
			{Match: "*", Action: "ask", Approvers: []string{"b", "a"}},
			{Match: "**", Action: "ask", Approvers: []string{"c"}},
			{Match: "*", Action: "allow"},
		},
		"1000 rules": rules1000(),
	}
}

// diffInputs are the inputs of the differential test: every tool of the
// modules and rules above, raw egress, odd kinds and tool names.
func diffInputs() []*Input {
	tools := []string{
		"w.deny", "w.noaction", "w.num_action", "w.case_action", "w.string", "w.defaults", "w.tie",
		"w.obligations", "w.nullob", "w.strob", "w.numappr", "w.setappr", "w.objappr", "w.strappr",
		"w.emptyappr", "w.dupappr", "w.numreason", "w.numrule", "w.emptyrule", "w.reasons", "w.multi",
		"w.ask", "w.tx", "w.other", "w", "",
		"billing-api.get_customer", "billing-api.get_invoice", "billing-api.create_refund",
		"billing-api.get_x.y_admin", "crm.delete_contact", "crm.list_contacts", "crm.get_contact",
		"nodot", ".leading", "legacy-thing", "conn-007.x_danger", "conn-014.purge",
	}
	var ins []*Input
	for _, tool := range tools {
		ins = append(ins, toolCall(tool))
	}
	ins = append(ins, benchInputs()...)
	big := toolCall("billing-api.create_refund")
	big.Args = map[string]any{"body": map[string]any{"amount": 5000}}
	bigOther := toolCall("crm.get_contact")
	bigOther.Args = map[string]any{"body": map[string]any{"amount": 5000}}
	ins = append(ins, big, bigOther,
		&Input{Kind: "connect", Request: Request{Host: "pypi.org"}},
		&Input{Kind: "http", Tool: "w.deny", Request: Request{Host: "evil.example"}},
		&Input{Kind: "dns", Request: Request{Host: "pypi.org"}},
		&Input{Kind: "smtp", Tool: "w.defaults"},
		nil,
	)
	// Raw egress against diffEgress: listed, unlisted, wrong port, other agent,
	// and a tool call that must not be opened by the allowlist.
	builder := Caller{Agent: "builder"}
	for _, r := range []struct {
		kind, host string
		port       int
		caller     Caller
	}{
		{"connect", "pypi.org", 443, builder},
		{"connect", "pypi.org", 8443, builder},
		{"connect", "pypi.org", 22, builder},
		{"http", "pypi.org", 80, builder},
		{"http", "pypi.org", 8443, builder},
		{"connect", "files.pythonhosted.org", 443, builder},
		{"connect", "pythonhosted.org", 443, builder},
		{"connect", "evilpythonhosted.org", 443, builder},
		{"dns", "a.b.pythonhosted.org", 0, builder},
		{"dns", "evil.example", 0, builder},
		{"connect", "pypi.org", 443, Caller{Agent: "other"}},
		{"tool_call", "pypi.org", 443, builder},
	} {
		ins = append(ins, &Input{Kind: r.kind, Caller: r.caller, Tool: "w.defaults", Request: Request{Host: r.host, Port: r.port}})
	}
	return ins
}

// diffEgress is the agents' egress allowlist of the differential test.
var diffEgress = map[string][]string{"builder": {"pypi.org", "*.pythonhosted.org"}, "empty": nil}

// TestCandidatesMatchDecision holds the engine (ModuleCandidatesQuery, the
// simple rules matched and all combined in Go) to data.sluice.main.decision combined in Rego: the same Decision, field
// for field, policy errors included, over every rule set, module set and input.
func TestCandidatesMatchDecision(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "odd.rego", oddModule)
	writeFile(t, dir, "team.rego", teamModule)
	ctx := context.Background()
	for rname, rules := range diffRuleSets() {
		for _, mods := range []struct {
			name  string
			paths []string
		}{{"no modules", nil}, {"modules", []string{dir}}} {
			t.Run(rname+"/"+mods.name, func(t *testing.T) {
				cfg := Config{Rules: rules, Paths: mods.paths, Egress: diffEgress, ConnectPorts: []int{8443}}
				e, ref := newEngine(t, cfg), newRegoDecider(t, cfg)
				errs := 0
				for _, in := range diffInputs() {
					got, want := e.Decide(ctx, in), ref.Decide(ctx, in)
					if !reflect.DeepEqual(got, want) {
						t.Errorf("input %s: engine decided %+v, decision rule %+v", describe(in), got, want)
					}
					if got.Rule == RulePolicyError {
						errs++
					}
				}
				// The odd module must exercise the failure paths too.
				if mods.paths != nil && errs < 6 {
					t.Errorf("only %d policy errors: the odd module no longer reaches the failure paths", errs)
				}
			})
		}
	}
}

// TestCandidatesMatchDecisionRandom compares the two on random rule sets over
// a small alphabet of tool names, so that ties, overlaps, prefixes, globs and
// catch-alls meet in every combination. The seed is fixed: a failure repeats.
func TestCandidatesMatchDecisionRandom(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "odd.rego", oddModule)
	matches := []string{
		"a.x", "a.y", "b.x", "w.ask", "w.tie", "w.multi", "a.*", "b.*", "w.*", "a.x*", "*.x", "*x",
		"a*", "*.*", "*", "**", "a.*x", "w.m*",
	}
	tools := []string{"a.x", "a.y", "a.xx", "b.x", "b.y", "ax", "c.x", "w.ask", "w.tie", "w.multi", "w.deny", "w.dupappr"}
	actions := []string{"allow", "ask", "block"}
	approvers := []string{"p", "q", "group:r"}
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	const sets = 40
	for i := range sets {
		var rules []Rule
		for range 1 + rng.IntN(8) {
			r := Rule{Match: matches[rng.IntN(len(matches))], Action: actions[rng.IntN(len(actions))]}
			if r.Action == "ask" {
				for _, a := range approvers {
					if rng.IntN(2) == 0 {
						r.Approvers = append(r.Approvers, a)
					}
				}
			}
			if rng.IntN(3) == 0 {
				r.Reason = fmt.Sprintf("reason %d", rng.IntN(3))
			}
			rules = append(rules, r)
		}
		var paths []string
		if i%2 == 1 {
			paths = []string{dir}
		}
		cfg := Config{Rules: rules, Paths: paths}
		e, ref := newEngine(t, cfg), newRegoDecider(t, cfg)
		for _, tool := range tools {
			got, want := e.Decide(ctx, toolCall(tool)), ref.Decide(ctx, toolCall(tool))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("rules %+v, modules %v, tool %s: engine decided %+v, decision rule %+v", rules, paths, tool, got, want)
			}
		}
	}
}

// TestCombineOddCandidates feeds combine candidate sets that neither the
// library nor Go's compiled rules produce (missing fields, unknown actions),
// and checks it answers what data.sluice.main.decision answers for them.
func TestCombineOddCandidates(t *testing.T) {
	tests := []struct {
		name       string
		candidates string
	}{
		{"empty", `set()`},
		{"not objects", `{1, "x"}`},
		{"no rank at all", `{{"action": "deny", "key": [0], "reason": "", "rule": "r", "obligations": {}}}`},
		{"winner without key", `{{"action": "allow", "reason": "", "rule": "r", "obligations": {}}}`},
		{"winner without reason", `{{"action": "allow", "key": [1], "rule": "r", "obligations": {}}}`},
		{"winner without obligations", `{{"action": "allow", "key": [1], "reason": "", "rule": "r"}}`},
		{"unranked ignored", `{{"action": "deny", "key": [0]}, {"action": "allow", "key": [1], "reason": "x", "rule": "r", "obligations": {}}}`},
		{"ask without approvers", `{{"action": "ask", "key": [1], "reason": "x", "rule": "r", "obligations": {}}}`},
		{"tie on key, object decides", `{{"action": "block", "key": [1], "reason": "b", "rule": "r", "obligations": {}}, {"action": "block", "key": [1], "reason": "a", "rule": "s", "obligations": {}}}`},
		{"numbers as keys", `{{"action": "allow", "key": [2], "reason": "b", "rule": "two", "obligations": {}}, {"action": "allow", "key": [10], "reason": "a", "rule": "ten", "obligations": {}}}`},
		{"approvers numbers equal", `{{"action": "ask", "key": [1], "reason": "", "rule": "r", "obligations": {}, "approvers": [1, 1.0]}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cands, err := ast.ParseTerm(tc.candidates)
			if err != nil {
				t.Fatal(err)
			}
			mod := "package sluice.main_ref\n\nd := x if {\n\tx := data.sluice.main.decision with data.sluice.main.candidates as " + tc.candidates + "\n}\n"
			pq, err := rego.New(rego.Query("data.sluice.main_ref.d"), rego.Module("ref.rego", mod),
				rego.Module("main.rego", mainRego(t))).PrepareForEval(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			rs, err := pq.Eval(context.Background(), rego.EvalInput(map[string]any{}))
			if err != nil {
				t.Fatal(err)
			}
			want, wantErr := decisionFrom(rs)
			got, gotErr := combine(cands.Value.(ast.Set).Slice())
			if !reflect.DeepEqual(got, want) || (gotErr == nil) != (wantErr == nil) ||
				gotErr != nil && gotErr.Error() != wantErr.Error() {
				t.Errorf("combine = %+v, %v; decision = %+v, %v", got, gotErr, want, wantErr)
			}
		})
	}
}

func mainRego(t *testing.T) string {
	t.Helper()
	src, err := policylib.FS.ReadFile("main.rego")
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}

// describe names an input in a failure message.
func describe(in *Input) string {
	if in == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s %q host %q args %v", in.Kind, in.Tool, in.Request.Host, in.Args)
}
