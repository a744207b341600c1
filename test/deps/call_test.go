package deps

import (
	"slices"
	"strings"
	"testing"
)

// TestCallFloor: gateway/call, the shape of a tool call every front door
// hands the pipeline, is a floor: it imports the standard library,
// gateway/refusal and sandboxd/wire, and nothing that decides, holds,
// stores or attaches (so a door that imports it links none of that, and
// the floor cannot grow a second pipeline).
func TestCallFloor(t *testing.T) {
	allowed := []string{"gateway/refusal", "sandboxd/wire"}
	found := false
	for _, p := range listPackages(t) {
		if p.ImportPath != mod+"/gateway/call" {
			continue
		}
		found = true
		for _, imp := range p.Imports {
			r, ok := rel(imp)
			if ok && !slices.Contains(allowed, r) {
				t.Errorf("gateway/call imports %s; it may import only the standard library and %s", r, strings.Join(allowed, ", "))
			}
			if !ok && strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") {
				t.Errorf("gateway/call imports %s; it may import only the standard library and %s", imp, strings.Join(allowed, ", "))
			}
		}
	}
	if !found {
		t.Fatal("go list did not find gateway/call")
	}
}
