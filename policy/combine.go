package policy

import (
	"errors"
	"fmt"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
)

// ModuleCandidatesQuery is the query the engine evaluates: the decisions of
// the security team's modules as candidates. The engine matches the simple
// rules itself (simpleTable) and combines all candidates with combine: both
// mirror main.rego's `decision` rule by rule, and the differential tests keep
// the two identical. In Rego, the matching and the comprehensions over the
// candidates cost several times the rest of the evaluation.
const ModuleCandidatesQuery = "data.sluice.main.module_candidates"

// PolicyCandidatesQuery is what the engine evaluates for a tool call: the
// modules' decisions only. main.rego's egress candidates apply to kinds
// http, connect and dns, so for a tool call the two queries agree, and the
// smaller one skips evaluating the allowlist rules on the hot path.
const PolicyCandidatesQuery = "data.sluice.main.policy_candidates"

// Field names of a candidate, built once.
var (
	keyAction      = ast.StringTerm("action")
	keyReason      = ast.StringTerm("reason")
	keyRule        = ast.StringTerm("rule")
	keyApprovers   = ast.StringTerm("approvers")
	keyObligations = ast.StringTerm("obligations")
	keyKey         = ast.StringTerm("key")
)

// defaultDecision is main.rego's default_decision as Decide returns it.
var defaultDecision = Decision{Action: Block, Reason: "no rule matched", Rule: "default"}

// rankOf is main.rego's rank: 0 for anything that is not an action.
func rankOf(v ast.Value) int {
	s, ok := v.(ast.String)
	if !ok {
		return 0
	}
	switch s {
	case "allow":
		return 1
	case "ask":
		return 2
	case "block":
		return 3
	}
	return 0
}

const rankAsk = 2

// actionOfRank maps a rank back to the Action.
var actionOfRank = [...]Action{1: Allow, 2: Ask, 3: Block}

// combine turns the elements of data.sluice.main.candidates into the decision
// that data.sluice.main.decision would give, including the checks that the
// result has the shape README.md promises (policyError reasons included).
//
// In main.rego terms:
//
//	top       := max({rank[c.action] | some c in candidates})
//	winner    := min({[c.key, c] | some c in candidates; rank[c.action] == top})[1]
//	approvers := sort({a | some c in candidates; c.action == "ask"; some a in c.approvers}) if top is ask, else []
//	decision  := {action, reason, rule, approvers, obligations} of winner if defined, else default_decision
//
// cands holds each candidate once (a set's elements).
func combine(cands []*ast.Term) (Decision, error) {
	if len(cands) == 0 {
		return defaultDecision, nil
	}
	// top: the highest rank; candidates without a rank take no part.
	top := 0
	for _, c := range cands {
		if obj, ok := c.Value.(ast.Object); ok {
			if a := obj.Get(keyAction); a != nil {
				top = max(top, rankOf(a.Value))
			}
		}
	}
	if top == 0 {
		return defaultDecision, nil // max of nothing is undefined, so is decision's body
	}
	// winner: the least [key, candidate] among those of rank top.
	var winner ast.Object
	var winnerKey ast.Value
	for _, c := range cands {
		obj, ok := c.Value.(ast.Object)
		if !ok {
			continue
		}
		a, k := obj.Get(keyAction), obj.Get(keyKey)
		if a == nil || k == nil || rankOf(a.Value) != top {
			continue
		}
		if winner == nil {
			winner, winnerKey = obj, k.Value
			continue
		}
		cmp := ast.Compare(k.Value, winnerKey)
		if cmp < 0 || cmp == 0 && ast.Compare(obj, winner) < 0 {
			winner, winnerKey = obj, k.Value
		}
	}
	if winner == nil {
		return defaultDecision, nil
	}
	reason, rule, obligations := winner.Get(keyReason), winner.Get(keyRule), winner.Get(keyObligations)
	if reason == nil || rule == nil || obligations == nil {
		return defaultDecision, nil // the decision object is undefined
	}
	d := Decision{Action: actionOfRank[top]}
	s, ok := reason.Value.(ast.String)
	if !ok {
		return Decision{}, fmt.Errorf("policy: decision reason is %T, want string", jsonOf(reason.Value))
	}
	d.Reason = string(s)
	if s, ok = rule.Value.(ast.String); !ok || s == "" {
		return Decision{}, fmt.Errorf("policy: decision rule %v: want a non-empty string", jsonOf(rule.Value))
	}
	d.Rule = string(s)
	if top == rankAsk {
		approvers, err := askApprovers(cands)
		if err != nil {
			return Decision{}, err
		}
		d.Approvers = approvers
	}
	switch ob := obligations.Value.(type) {
	case ast.Null:
	case ast.Object:
		if ob.Len() > 0 {
			m, ok := jsonOf(ob).(map[string]any)
			if !ok {
				return Decision{}, errors.New("bug(): policy: obligations did not convert to an object")
			}
			d.Obligations = m
		}
	default:
		return Decision{}, fmt.Errorf("policy: decision obligations is %T, want object", jsonOf(ob))
	}
	return d, nil
}

// askApprovers is the sorted union of the approvers of every ask candidate,
// each a non-empty string. Like Rego's `some a in x`, it takes the elements of
// an array or set and the values of an object, and nothing from a scalar; the
// order and the deduplication are Rego's (ast.Compare), as sort() of a set.
func askApprovers(cands []*ast.Term) ([]string, error) {
	var all []*ast.Term
	for _, c := range cands {
		obj, ok := c.Value.(ast.Object)
		if !ok {
			continue
		}
		a, as := obj.Get(keyAction), obj.Get(keyApprovers)
		if a == nil || as == nil || a.Value.Compare(ast.String("ask")) != 0 {
			continue
		}
		add := func(t *ast.Term) { all = append(all, t) }
		switch x := as.Value.(type) {
		case *ast.Array:
			x.Foreach(add)
		case ast.Set:
			x.Foreach(add)
		case ast.Object:
			x.Foreach(func(_, v *ast.Term) { add(v) })
		}
	}
	if len(all) == 0 {
		return nil, nil
	}
	slices.SortFunc(all, func(x, y *ast.Term) int { return ast.Compare(x.Value, y.Value) })
	all = slices.CompactFunc(all, func(x, y *ast.Term) bool { return ast.Compare(x.Value, y.Value) == 0 })
	out := make([]string, 0, len(all))
	for _, t := range all {
		s, ok := t.Value.(ast.String)
		if !ok || s == "" {
			return nil, fmt.Errorf("policy: decision approver %v: want a non-empty string", jsonOf(t.Value))
		}
		out = append(out, string(s))
	}
	return out, nil
}

// jsonOf converts a value as the rego package does for results.
func jsonOf(v ast.Value) any {
	x, err := ast.JSON(v)
	if err != nil {
		return fmt.Sprintf("unconvertible %s", v)
	}
	return x
}
