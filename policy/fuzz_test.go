package policy

import (
	"context"
	"testing"
)

// FuzzEval feeds arbitrary input documents to Eval: it must never panic,
// never allow on bad input, and only allow what the rules allow.
func FuzzEval(f *testing.F) {
	f.Add(`{"version":1,"kind":"tool_call","tool":"billing-api.get_invoice"}`)                        // allowed by a prefix rule
	f.Add(`{"kind":"tool_call","tool":"billing-api.create_refund","args":{"a":[1,2.5,null,true]}}`)   // ask, nested args
	f.Add(`{"kind":"http","request":{"host":"pypi.org","query":{"q":["x"]},"headers":{"A":["b"]}}}`)  // raw egress
	f.Add(`{"kind":"tool_call","tool":"x","time":"2025-03-01T12:00:00Z","operation":{"tags":["a"]}}`) // no rule matched
	f.Add(`{"kind":"tool_call","extra":1}`)                                                           // unknown field
	f.Add(`{"kind":"dns"}{"kind":"dns"}`)                                                             // trailing data
	f.Add(`{"version":2,"kind":"dns"}`)                                                               // wrong version
	f.Add(`{"kind":"tool_call","args":1e400}`)                                                        // huge number
	e, err := New(context.Background(), Config{Rules: gatewayRules})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		d, err := e.Eval(context.Background(), []byte(raw))
		if err != nil {
			if d.Action != Block {
				t.Fatalf("bad input %q decided %v", raw, d.Action)
			}
			return
		}
		if d.Action == Allow && d.Rule != "policies[0]" && d.Rule != "policies[5]" {
			t.Fatalf("allow by %s for %q", d.Rule, raw)
		}
	})
}
