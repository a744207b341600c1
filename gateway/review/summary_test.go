package review

import (
	"strings"
	"testing"
)

func TestArgSummary(t *testing.T) {
	long := strings.Repeat("x", 100)
	for _, c := range []struct {
		name, doc, want string
	}{
		{"amount and ticket: the number first, then the short string", `{"body":{"amount":42,"ticket":"T-1234"}}`, `amount=42 · ticket="T-1234"`},
		{"path parameters first", `{"path":{"id":"inv_9"},"query":{"expand":true},"body":{"amount":5}}`, `id="inv_9" · amount=5 · expand=true`},
		{"long strings last and cut", `{"body":{"note":"` + long + `","amount":1}}`, `amount=1 · note="` + strings.Repeat("x", summaryValue-1) + `…"`},
		{"at most four, the rest counted", `{"body":{"a":1,"b":2,"c":3,"d":4,"e":5}}`, `a=1 · b=2 · c=3 · d=4 +1 more`},
		{"objects and arrays counted, not shown", `{"body":{"items":[1,2],"meta":{"k":"v"},"n":3}}`, `n=3 +2 more`},
		{"headers never shown", `{"headers":{"X-Trace":"abc"},"body":{"n":1}}`, `n=1 +1 more`},
		{"credential-named arguments never shown", `{"body":{"password":"hunter2","api_key":"k-1","amount":3}}`, `amount=3 +2 more`},
		{"a placeholder stays the placeholder", `{"body":{"ref":"sluice:secret:pay:0a1b"}}`, `ref="sluice:secret:pay:0a1b"`},
		{"a scalar body", `{"body":"hello"}`, `body="hello"`},
		{"nothing", `{}`, ``},
		{"not JSON", `{`, ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := argSummary([]byte(c.doc)); got != c.want {
				t.Fatalf("argSummary(%s) = %q, want %q", c.doc, got, c.want)
			}
		})
	}
	// Deterministic: the same document gives the same line every time
	// (Go's map order is random).
	doc := []byte(`{"body":{"z":1,"y":2,"x":3,"w":4,"v":5,"u":"a","t":"b"}}`)
	first := argSummary(doc)
	for range 50 {
		if got := argSummary(doc); got != first {
			t.Fatalf("summary changed: %q then %q", first, got)
		}
	}
}
