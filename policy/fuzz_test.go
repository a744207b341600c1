package policy

import (
	"context"
	"reflect"
	"testing"
)

// FuzzEval feeds arbitrary input documents to Eval: it must never panic,
// never allow on bad input, only allow what the rules allow, and decide
// exactly as data.sluice.main.decision does in Rego (see regoDecider), with
// and without modules.
func FuzzEval(f *testing.F) {
	f.Add(`{"version":1,"kind":"tool_call","tool":"billing-api.get_invoice"}`)                        // allowed by a prefix rule
	f.Add(`{"kind":"tool_call","tool":"billing-api.create_refund","args":{"a":[1,2.5,null,true]}}`)   // ask, nested args
	f.Add(`{"kind":"http","request":{"host":"pypi.org","query":{"q":["x"]},"headers":{"A":["b"]}}}`)  // raw egress
	f.Add(`{"kind":"tool_call","tool":"x","time":"2025-03-01T12:00:00Z","operation":{"tags":["a"]}}`) // no rule matched
	f.Add(`{"kind":"tool_call","extra":1}`)                                                           // unknown field
	f.Add(`{"kind":"dns"}{"kind":"dns"}`)                                                             // trailing data
	f.Add(`{"version":2,"kind":"dns"}`)                                                               // wrong version
	f.Add(`{"kind":"tool_call","args":1e400}`)                                                        // huge number
	f.Add(`{"kind":"tool_call","tool":"w.tie"}`)                                                      // module tie on key (odd module)
	f.Add(`{"kind":"tool_call","tool":"w.numappr"}`)                                                  // malformed module decision
	f.Add(`{"kind":"tool_call","tool":"\u00e9.x_admin"}`)                                             // non-ASCII slug
	f.Add(`{"kind":"tool_call","tool":"crm.list_contacts","args":{"body":{"amount":5000}}}`)          // block beats two asks
	ctx := context.Background()
	e, err := New(ctx, Config{Rules: gatewayRules})
	if err != nil {
		f.Fatal(err)
	}
	ref := newRegoDecider(f, Config{Rules: gatewayRules})
	dir := f.TempDir()
	writeFile(f, dir, "odd.rego", oddModule)
	writeFile(f, dir, "team.rego", teamModule)
	withMods := Config{Rules: append(append([]Rule(nil), gatewayRules...), Rule{Match: "w.*", Action: "ask"}), Paths: []string{dir}}
	em, err := New(ctx, withMods)
	if err != nil {
		f.Fatal(err)
	}
	refm := newRegoDecider(f, withMods)
	f.Fuzz(func(t *testing.T, raw string) {
		d, err := e.Eval(ctx, []byte(raw))
		if err != nil {
			if d.Action != Block {
				t.Fatalf("bad input %q decided %v", raw, d.Action)
			}
			return
		}
		if d.Action == Allow && d.Rule != "policies[0]" && d.Rule != "policies[5]" {
			t.Fatalf("allow by %s for %q", d.Rule, raw)
		}
		in, err := DecodeInput([]byte(raw))
		if err != nil {
			t.Fatalf("Eval accepted %q, DecodeInput did not: %v", raw, err)
		}
		if want := ref.Decide(ctx, in); !reflect.DeepEqual(d, want) {
			t.Fatalf("input %q: engine decided %+v, decision rule %+v", raw, d, want)
		}
		if got, want := em.Decide(ctx, in), refm.Decide(ctx, in); !reflect.DeepEqual(got, want) {
			t.Fatalf("input %q with modules: engine decided %+v, decision rule %+v", raw, got, want)
		}
	})
}
