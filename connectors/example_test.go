package connectors

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// TestToolExample: Tool.Example makes arguments from the argument schema
// — the spec's example, const, default or first enum value first, then a
// value of the type (a date-time, an integer's minimum, a string its
// pattern matches), local $refs resolved, and an empty path, query or
// headers object left out; a schema that is not an object is a bug().
func TestToolExample(t *testing.T) {
	schema := `{"type":"object","properties":{
		"path":{"type":"object","properties":{}},
		"query":{"type":"object","properties":{"limit":{"type":"integer","minimum":5}}},
		"body":{"type":"object","properties":{
			"currency":{"type":"string","enum":["eur","usd"]},
			"memo":{"type":"string","example":"refund"},
			"when":{"type":"string","format":"date-time"},
			"code":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{2}$"},
			"items":{"type":"array","items":{"$ref":"#/$defs/item"}},
			"urgent":{"type":["boolean","null"]}}}},
		"$defs":{"item":{"type":"object","properties":{"sku":{"type":"string","default":"sku-1"}}}}}`
	got, err := (&Tool{Name: "shop.refund", Schema: json.RawMessage(schema)}).Example()
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Path  *map[string]any `json:"path"`
		Query map[string]any  `json:"query"`
		Body  struct {
			Currency, Memo, When, Code string
			Items                      []map[string]any
			Urgent                     bool
		} `json:"body"`
	}
	if err := json.Unmarshal(got, &v); err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	b := v.Body
	switch {
	case v.Path != nil:
		t.Errorf("an empty path object is kept: %s", got)
	case v.Query["limit"] != 5.0:
		t.Errorf("query.limit %v, want the minimum 5", v.Query["limit"])
	case b.Currency != "eur" || b.Memo != "refund" || b.When != "2026-01-01T00:00:00Z" || !b.Urgent:
		t.Errorf("body %+v: want the first enum value, the example, a date-time and true", b)
	case !regexp.MustCompile(`^[A-Z]{3}-[0-9]{2}$`).MatchString(b.Code):
		t.Errorf("body.code %q does not match its pattern", b.Code)
	case len(b.Items) != 1 || b.Items[0]["sku"] != "sku-1":
		t.Errorf("body.items %v: want one item from the $ref, with its default", b.Items)
	}
	_, err = (&Tool{Name: "shop.bad", Schema: json.RawMessage(`[1]`)}).Example()
	if err == nil || !strings.HasPrefix(err.Error(), "bug(): tool shop.bad:") {
		t.Errorf("a schema that is not an object: %v, want a bug() naming the tool", err)
	}
}
