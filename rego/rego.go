// Package rego embeds sluice's shipped Rego library: the decision query
// data.sluice.main.decision, the evaluation of the simple rules from
// sluice.yaml and the collection of the security team's modules under
// sluice.policies.*. README.md in this folder is the reference for the input
// document, the decision and the conventions; the _test.rego files next to
// each module run under `opa test rego/` and from `go test`.
//
// Import it under an alias (policylib), since OPA's package is also named rego.
package rego

import (
	"embed"
	"io/fs"
	"strings"
)

// FS holds the library's .rego files, tests included, at the root.
//
//go:embed *.rego
var FS embed.FS

// Files returns the names of the embedded .rego files in lexical order;
// tests (files ending in _test.rego) only if withTests.
func Files(withTests bool) []string {
	names, err := fs.Glob(FS, "*.rego")
	if err != nil {
		panic("bug(): rego: glob embedded library: " + err.Error())
	}
	out := names[:0]
	for _, n := range names {
		if !withTests && strings.HasSuffix(n, "_test.rego") {
			continue
		}
		out = append(out, n)
	}
	return out
}
