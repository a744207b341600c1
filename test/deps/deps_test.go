// Package deps enforces the import rules of ARCHITECTURE.md: leaf packages
// import no siblings, sandboxd never links credential or policy code, and
// nothing imports test/. It also requires a doc comment on every package.
package deps

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const mod = "github.com/sluice-gw/sluice"

type pkg struct {
	ImportPath   string
	Name         string
	Dir          string
	Imports      []string
	Deps         []string
	GoFiles      []string
	TestGoFiles  []string
	XTestGoFiles []string
	TestImports  []string
	XTestImports []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps=false", "-json", mod+"/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

// rel turns an import path of this module into its folder ("gateway/audit").
func rel(p string) (string, bool) {
	if p == mod {
		return "", true
	}
	r, ok := strings.CutPrefix(p, mod+"/")
	return r, ok
}

func under(p, folder string) bool { return p == folder || strings.HasPrefix(p, folder+"/") }

// allowed says which in-repo folders a package may import directly, by the
// folder table of ARCHITECTURE.md; the reason is printed on violation.
func allowed(from, to string) (bool, string) {
	if under(to, "test") && !under(from, "test") {
		return false, "nothing imports test/"
	}
	switch {
	case under(from, "cmd/sluice"), under(from, "test"):
		return true, ""
	case under(from, "cmd/sandboxd"):
		return under(to, "sandboxd") || under(to, "dns") || to == "internal/buildinfo", "cmd/sandboxd links only sandboxd, dns and internal/buildinfo: a sandbox host holds no credentials and makes no decisions"
	case under(from, "internal/buildinfo"):
		return false, "internal/buildinfo imports only the standard library"
	case under(from, "gateway") && from != "gateway" && to == "gateway":
		return false, "a gateway/* package never imports the root gateway: the root hands it hooks (gateway/mcp's Deps)"
	case under(from, "gateway"):
		ok := under(to, "gateway") || to == "sandboxd/wire" || under(to, "connectors") || under(to, "policy") ||
			under(to, "vault") || under(to, "dns") || under(to, "rego")
		return ok, "gateway imports the leaves and sandboxd/wire only"
	case under(from, "policy"):
		return under(to, "policy") || to == "rego", "policy is a leaf: it embeds rego/ and imports nothing else of sluice"
	case under(from, "sandboxd"):
		return under(to, "sandboxd") || under(to, "dns"), "sandboxd imports only the dns stub; gateway and sandboxd share only sandboxd/wire"
	case under(from, "connectors"), under(from, "rego"), under(from, "vault"), under(from, "dns"):
		leaf := strings.SplitN(from, "/", 2)[0]
		return under(to, leaf), leaf + " is a leaf: it imports no sibling package"
	}
	return false, "package outside the fixed folders"
}

func TestImportRules(t *testing.T) {
	for _, p := range listPackages(t) {
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		imports := append(append(append([]string{}, p.Imports...), p.TestImports...), p.XTestImports...)
		for _, imp := range imports {
			to, ok := rel(imp)
			if !ok || under(to, from) && !under(to, "test") {
				continue
			}
			if ok, why := allowed(from, to); !ok {
				t.Errorf("%s imports %s: %s", from, to, why)
			}
		}
	}
}

// TestSandboxdLinksNoCredentials checks transitive dependencies: no binary
// or package on the sandbox host may link Vault, OPA or the gateway.
func TestSandboxdLinksNoCredentials(t *testing.T) {
	bad := map[string]string{
		mod + "/vault":                             "the sandbox never holds credentials",
		mod + "/policy":                            "the sandbox host makes no decisions",
		mod + "/gateway":                           "gateway and sandboxd share only sandboxd/wire",
		"github.com/hashicorp/vault/api":           "the sandbox never holds credentials",
		"github.com/open-policy-agent/opa/v1/rego": "the sandbox host makes no decisions",
	}
	for _, root := range []string{mod + "/sandboxd/...", mod + "/cmd/sandboxd/...", mod + "/dns/..."} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", root).CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "matched no packages") || strings.Contains(string(out), "no Go files") || strings.Contains(string(out), "cannot find") {
				continue // the folder has no code yet
			}
			t.Fatalf("go list %s: %v\n%s", root, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for b, why := range bad {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%s links %s: %s", root, dep, why)
				}
			}
		}
	}
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		files := p.GoFiles
		if len(files) == 0 {
			files = append(append(files, p.TestGoFiles...), p.XTestGoFiles...)
		}
		documented := false
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if af.Doc == nil {
				continue
			}
			text := af.Doc.Text()
			want := "Package " + af.Name.Name + " "
			if af.Name.Name == "main" {
				want = "" // commands: "Sluice is …" / "Command sluice …"
			}
			if strings.HasPrefix(text, want) && len(strings.Fields(text)) >= 4 {
				documented = true
				break
			}
			t.Errorf("%s: doc comment in %s should start %q and say what the package is for", p.ImportPath, f, want)
		}
		if !documented {
			t.Errorf("%s has no package doc comment", p.ImportPath)
		}
	}
}

func TestRulesCatchAViolation(t *testing.T) {
	cases := []struct{ from, to string }{
		{"connectors", "policy"},
		{"policy", "vault"},
		{"vault", "gateway/audit"},
		{"sandboxd", "gateway"},
		{"sandboxd", "vault"},
		{"cmd/sandboxd", "policy"},
		{"gateway", "test/e2e"},
		{"gateway", "sandboxd"},
		{"gateway/mcp", "gateway"},
		{"dns", "connectors"},
	}
	for _, c := range cases {
		if ok, _ := allowed(c.from, c.to); ok {
			t.Errorf("allowed(%s → %s) = true; the rule table lets a forbidden import through", c.from, c.to)
		}
	}
	for _, c := range []struct{ from, to string }{{"gateway", "sandboxd/wire"}, {"policy", "rego"}, {"cmd/sluice", "vault"}, {"sandboxd", "dns"}} {
		if ok, why := allowed(c.from, c.to); !ok {
			t.Errorf("allowed(%s → %s) = false (%s); the contract permits it", c.from, c.to, why)
		}
	}
}
