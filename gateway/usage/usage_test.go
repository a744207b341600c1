package usage

import (
	"encoding/json"
	"math"
	"testing"
)

func TestArgNumber(t *testing.T) {
	body := map[string]any{"amount": json.Number("-250"), "refund": map[string]any{"amount": 12.5}, "name": "x", "big": json.Number("1e400")}
	for _, c := range []struct {
		path string
		want float64
	}{
		{"amount", 250}, // a negative amount counts by its magnitude: it cannot lower a day's sum
		{"refund.amount", 12.5},
		{"name", 0},      // not a number
		{"missing", 0},   // absent: the schema decides whether it is required
		{"name.deep", 0}, // a path through a non-object
		{"big", math.MaxFloat64},
	} {
		if got := argNumber(body, c.path); got != c.want {
			t.Errorf("argNumber(%q) = %v, want %v", c.path, got, c.want)
		}
	}
}
