package policy

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestFindingsBlockWithTheShippedExample: a credential-shaped string in a
// tool argument or in a proxied request's header reaches policy as a
// finding (kind and location, never the value) before the decision, and
// the example rule in rego/examples blocks it even to an allowed host.
func TestFindingsBlockWithTheShippedExample(t *testing.T) {
	e := newEngine(t, Config{Rules: gatewayRules, Paths: []string{"../rego/examples"},
		Egress: map[string][]string{"support-bot": {"pypi.org"}}})
	ctx := context.Background()
	const stripe = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"

	clean := toolCall("billing-api.get_invoice")
	if d := e.Decide(ctx, clean); d.Action != Allow {
		t.Fatalf("clean call: %+v, want allow", d)
	}
	if len(clean.Findings) != 0 {
		t.Fatalf("clean call findings: %+v", clean.Findings)
	}

	leak := toolCall("billing-api.get_invoice")
	leak.Args = map[string]any{"query": map[string]any{"note": "use " + stripe}}
	d := e.Decide(ctx, leak)
	if d.Action != Block || d.Rule != "findings.credential" || !strings.Contains(d.Reason, "/args/query/note") {
		t.Fatalf("credential in an argument: %+v, want block by findings.credential naming /args/query/note", d)
	}
	raw, _ := json.Marshal(leak)
	if strings.Contains(string(raw), stripe) == false || strings.Contains(d.Reason, stripe) {
		t.Fatal("bug in the test, or the reason carries the value")
	}
	if len(leak.Findings) != 1 || leak.Findings[0].Kind != "stripe_key" || strings.Contains(leak.Findings[0].Fingerprint, stripe[8:]) {
		t.Fatalf("findings = %+v", leak.Findings)
	}

	allowed := &Input{Kind: "http", Caller: Caller{Agent: "support-bot"}, Request: Request{Method: "GET", Host: "pypi.org", Port: 443, Path: "/simple/"}}
	if d := e.Decide(ctx, allowed); d.Action != Allow {
		t.Fatalf("proxied request to an allowed host: %+v, want allow", d)
	}
	proxied := &Input{Kind: "http", Caller: Caller{Agent: "support-bot"}, Request: Request{Method: "GET", Host: "pypi.org", Port: 443, Path: "/simple/",
		Headers: map[string][]string{"Authorization": {"token ghp_" + strings.Repeat("aB3", 12)}}}}
	if d := e.Decide(ctx, proxied); d.Action != Block || !strings.Contains(d.Reason, "github_token") || !strings.Contains(d.Reason, "/request/headers/Authorization") {
		t.Fatalf("credential in a proxied header to an allowed host: %+v, want block", d)
	}
	body := &Input{Kind: "http", Caller: Caller{Agent: "support-bot"}, Request: Request{Method: "POST", Host: "pypi.org", Port: 443, Path: "/upload",
		Body: `{"key":"-----BEGIN PRIVATE KEY-----\nMIIEv..."}`}}
	if d := e.Decide(ctx, body); d.Action != Block || !strings.Contains(d.Reason, "private_key") {
		t.Fatalf("private key in a proxied body: %+v, want block", d)
	}
}
