package policy

import (
	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/sluice-gw/sluice/policy/findings"
)

// Finding is a suspected credential in what a call would send (input.findings).
type Finding = findings.Finding

// scanInput finds credentials in what in would send: a tool call's
// arguments (the request is built from them, so it is not scanned twice),
// otherwise the request's line, query, headers and body. Every decision
// path passes here (Decide), so every entrance is scanned alike.
func scanInput(in *Input) []Finding {
	var s findings.Scanner
	if in.Kind == "tool_call" {
		s.Value("/args", in.Args)
	} else {
		s.String("/request/path", in.Request.Path)
		s.Value("/request/query", in.Request.Query)
		s.Value("/request/headers", in.Request.Headers)
		s.String("/request/body", in.Request.Body)
	}
	return s.Findings()
}

// findingsTerm builds input.findings; the fingerprint and reason are present only when set.
func findingsTerm(fs []Finding) *ast.Term {
	terms := make([]*ast.Term, len(fs))
	for i, f := range fs {
		items := [][2]*ast.Term{item("kind", names.term(f.Kind)), item("location", ast.StringTerm(f.Location))}
		if f.Fingerprint != "" {
			items = append(items, item("fingerprint", ast.StringTerm(f.Fingerprint)))
		}
		if f.Reason != "" {
			items = append(items, item("reason", ast.StringTerm(f.Reason)))
		}
		terms[i] = ast.ObjectTerm(items...)
	}
	return ast.ArrayTerm(terms...)
}
