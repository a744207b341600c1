package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestAuditWritesThroughAppend holds every audit write of the root to
// auditLog.append, the one place that detaches it from the caller's
// context (THREATS G10): a direct Append or AppendWritten with a
// request's context loses the record when the caller hangs up. (Package
// egress holds its own files to its Deps.Append the same way.)
func TestAuditWritesThroughAppend(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "auditlog.go" {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(af, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Append" || sel.Sel.Name == "AppendWritten") {
				if x, ok := sel.X.(*ast.SelectorExpr); ok && x.Sel.Name == "audit" {
					t.Errorf("%s: an audit write not through auditLog.append", fset.Position(sel.Pos()))
				}
			}
			return true
		})
	}
	if checked < 10 {
		t.Fatalf("checked %d files: the glob missed the package", checked)
	}
}
