package gateway

import (
	"net/http"
	"testing"

	"github.com/sluice-gw/sluice/gateway/call"
)

// An allowed Check's verdict sets its credential headers sorted by name,
// each one's values joined, and is built with one allocation for the
// list (five with the map's sorted keys).
func TestVerdictSetsSorted(t *testing.T) {
	o := call.Outcome{Status: http.StatusOK, Attach: http.Header{"X-Api-Key": {"k"}, "Authorization": {"Bearer a", "b"}}}
	v := verdict(o)
	if !v.Allow || len(v.Set) != 2 || v.Set[0].Name != "Authorization" || v.Set[0].Value != "Bearer a, b" || v.Set[1].Name != "X-Api-Key" {
		t.Fatalf("verdict sets %+v", v.Set)
	}
	one := call.Outcome{Status: http.StatusOK, Attach: http.Header{"Authorization": {"Bearer a"}}}
	if n := testing.AllocsPerRun(100, func() { verdict(one) }); n > 1 {
		t.Fatalf("%v allocations per allowed verdict, want 1", n)
	}
}
