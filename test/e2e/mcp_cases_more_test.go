//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestMCPThreatCasesMore replays more of the THREATS classes that have a
// meaning for a tools/call over MCP (beside TestMCPThreatCases): argument
// injection into a path parameter (F7), a credential reflected in encoded
// forms (D11) and then looked for in the audit log and the gateway's log
// (D9), a double approval of an MCP-held call (E3), and an "always allow"
// grant with max_uses raced by concurrent MCP calls on one session, which
// the door's fast path serves concurrently (E11). Each case asserts the
// tool result (isError and its code, or what reached the upstream) and the
// audit record, with transport mcp.
func TestMCPThreatCasesMore(t *testing.T) {
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	withApprovers(d, gwenv.CarolToken)
	d.Gateway()["hold_wait"] = "200ms"
	g := e.Start(d, e.Write(d))
	cs := mcpConnect(t, g, agentA, nil)
	call := func(t *testing.T, tool string, args map[string]any) *sdk.CallToolResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("tools/call %s: %v (want a tool result)", tool, err)
		}
		e.Keep([]byte(toolText(r)))
		return r
	}
	// ridOf is a result's request id: every text the door writes names
	// it (a refusal's "(request_id …)", a result document's field), and
	// structuredContent, when there is one, may be the upstream's body.
	ridOf := func(r *sdk.CallToolResult) string {
		if m := ridRe.FindStringSubmatch(toolText(r)); m != nil {
			return m[1]
		}
		return ""
	}
	for _, tc := range []struct{ name, id string }{
		{"dot-dot slash to another operation (CVE-2021-41773)", "../echo"},
		{"percent-encoded dot-dot slash (CVE-2021-41773)", "%2e%2e%2fecho"},
		{"double-encoded (CVE-2021-42013)", "%252e%252e%252fecho"},
		{"slash inside id", "a/b"},
		{"query smuggle", "1?limit=1000"},
	} {
		t.Run("F7 path parameter "+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "F7", "over MCP: tools/call tickets.get_ticket with path id "+fmt.Sprintf("%q", tc.id),
				"isError schema_violation and nothing upstream, or the id as one escaped segment under /tickets/; decision audited with transport mcp")
			before := len(e.Up.Requests())
			r := call(t, "tickets.get_ticket", map[string]any{"path": map[string]any{"id": tc.id}})
			reqs := e.Up.Requests()[before:]
			rid := ridOf(r)
			f := auditFields(t, g, "decision", rid)
			c.Observef("isError %v %.80q; %d upstream requests %v; decision transport %v", r.IsError, toolText(r), len(reqs), uris(reqs), f["transport"])
			if f["transport"] != "mcp" {
				t.Errorf("decision record transport %v, want mcp", f["transport"])
			}
			switch {
			case r.IsError:
				if !strings.HasPrefix(toolText(r), "schema_violation: ") || len(reqs) != 0 {
					t.Errorf("refused as %q with %d upstream requests; want schema_violation and none", toolText(r), len(reqs))
				}
			case len(reqs) != 1:
				t.Errorf("sent: %d upstream requests, want 1", len(reqs))
			default:
				esc := reqs[0].EscapedPath
				seg, ok := strings.CutPrefix(esc, "/tickets/")
				if !ok || seg == "" || strings.Contains(seg, "/") || path.Clean(esc) != esc || strings.Contains(reqs[0].RequestURI, "?") {
					t.Errorf("upstream got %q: not one segment under /tickets/", reqs[0].RequestURI)
				}
			}
		})
	}

	// D11: the upstream reflects the key in forms a plain match misses.
	for _, tc := range []struct{ name, head, body string }{
		{"JSON \\u escapes in the body", "", `{"echo":"` + jsonEscapeAll(e.Secret) + `"}`},
		{"percent-encoded in a header and upper-cased in the body", "X-Echo: " + pctAll(e.Secret) + "\r\n", `{"echo":"` + strings.ToUpper(e.Secret) + `"}`},
	} {
		t.Run("D11 "+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "D11", "over MCP: tools/call tickets.list_tickets, the upstream reflects the injected X-Api-Key as "+tc.name,
				"the tool result carries no form of the key (decoded JSON, percent-decoded, case-folded); audit secret_reflected with transport mcp, or the reply refused upstream_error and audited")
			e.Up.SetRaw(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s", tc.head, len(tc.body), tc.body))
			defer e.Up.SetMode(gwenv.ModeOK)
			before := len(e.Up.Requests())
			r := call(t, "tickets.list_tickets", map[string]any{})
			reqs := e.Up.Requests()[before:]
			if len(reqs) != 1 || reqs[0].Header.Get("X-Api-Key") != e.Secret {
				t.Fatalf("the upstream did not get the key once (%d requests): the case proves nothing", len(reqs))
			}
			leak := recoverable(e.Secret, toolText(r))
			rid := ridOf(r)
			var audited any
			if r.IsError {
				audited = auditFields(t, g, "result", rid)["upstream_error"]
			} else {
				audited = auditFields(t, g, "secret_reflected", rid)["transport"]
			}
			c.Observef("isError %v %.60q; the sandbox recovers the key: %v; audit %v", r.IsError, toolText(r), leak, audited)
			if leak {
				t.Errorf("the tool result gives the key back: %s", toolText(r))
			}
			if r.IsError && (!strings.HasPrefix(toolText(r), "upstream_error: ") || audited == nil) || !r.IsError && audited != "mcp" {
				t.Errorf("outcome %v %q, audit %v", r.IsError, toolText(r), audited)
			}
		})
	}

	t.Run("D9 the key in no audit record or log line", func(t *testing.T) {
		c := casebook.Expect(t, "D9", "over MCP: after the reflections above, grep the audit log and the gateway's log for every form of the key",
			"0 hits")
		recs, _ := json.Marshal(g.AuditRecords())
		hits := []string{}
		for name, f := range e.SecretForms() {
			if strings.Contains(string(recs), f) || strings.Contains(string(g.Stderr()), f) {
				hits = append(hits, name)
			}
		}
		c.Observef("%d audit records, forms found: %v", len(g.AuditRecords()), hits)
		if len(hits) != 0 {
			t.Errorf("the key is in the audit log or the gateway's log: %v", hits)
		}
	})

	t.Run("E3 double approval of an MCP-held call", func(t *testing.T) {
		c := casebook.Expect(t, "E3", "over MCP: a refund held (approval_pending), approved twice concurrently through the admin API; the agent waits with sluice.await_hold",
			"exactly one approval 200, the other 409; one upstream request; await_hold returns the result (isError false)")
		r := call(t, "tickets.create_refund", map[string]any{"body": map[string]any{"amount": 31, "reason": "e3"}})
		hold, _ := structured(t, r)["hold"].(map[string]any)
		hid, _ := hold["id"].(string)
		if hid == "" {
			t.Fatalf("refund not held: %s", toolText(r))
		}
		before := len(e.Up.Requests())
		var wg sync.WaitGroup
		sts := make([]int, 2)
		for i := range sts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sts[i], _, _ = g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"ok"}`)
			}()
		}
		wg.Wait()
		w := call(t, "sluice.await_hold", map[string]any{"hold_id": hid})
		sent := 0
		for _, q := range e.Up.Requests()[before:] {
			if q.Path == "/refunds" {
				sent++
			}
		}
		c.Observef("approvals %v; await_hold isError %v %.60q; upstream /refunds requests %d", sts, w.IsError, toolText(w), sent)
		ok := (sts[0] == 200 && sts[1] == 409) || (sts[0] == 409 && sts[1] == 200)
		if !ok || w.IsError || sent != 1 {
			t.Errorf("double approval: %v, await_hold %v %q, %d sent; want one 200, one 409, one send", sts, w.IsError, toolText(w), sent)
		}
	})

	t.Run("E11 max_uses grant raced over one MCP session", func(t *testing.T) {
		c := casebook.Expect(t, "E11", "over MCP: a grant with max_uses 2 raced by 8 identical concurrent tools/calls on one session",
			"exactly 2 sent under it (2 grant_used records, isError false), 6 isError approval_pending")
		args := map[string]any{"body": map[string]any{"amount": 77, "reason": "e11"}}
		r := call(t, "tickets.create_refund", args)
		hold, _ := structured(t, r)["hold"].(map[string]any)
		hid, _ := hold["id"].(string)
		if hid == "" {
			t.Fatalf("refund not held: %s", toolText(r))
		}
		st, _, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+hid+"/approve", gwenv.CarolToken, `{"reason":"ok","always":true,"max_uses":2}`)
		grant, _ := body["grant"].(map[string]any)
		if st != http.StatusOK || grant == nil {
			t.Fatalf("approve always max_uses 2: %d %v", st, body)
		}
		if w := call(t, "sluice.await_hold", map[string]any{"hold_id": hid}); w.IsError {
			t.Fatalf("the approved call: %s", toolText(w))
		}
		var mu sync.Mutex
		outcome := map[string]int{}
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := call(t, "tickets.create_refund", args)
				k := "sent"
				if r.IsError {
					k, _, _ = strings.Cut(toolText(r), ":")
				}
				mu.Lock()
				outcome[k]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		used := 0
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			used = 0
			for _, rec := range g.AuditEvent("grant_used", "") {
				if f, _ := rec["fields"].(map[string]any); f["grant"] == grant["id"] {
					used++
				}
			}
			if used >= 2 {
				break
			}
		}
		c.Observef("outcomes %v, %d grant_used records", outcome, used)
		if outcome["sent"] != 2 || outcome["approval_pending"] != 6 || used != 2 {
			t.Errorf("8 racing MCP calls under a max_uses 2 grant: %v, %d grant_used; want 2 sent, 6 held, 2 grant_used", outcome, used)
		}
	})
}

// TestMCPCredentialInArguments is THREATS D14 over MCP: a credential-shaped
// string in a tool argument is found before the decision and the shipped
// example rule blocks it — an isError policy_block naming its kind and
// location, never the value; nothing sent; the value in no audit record
// (beside the recorded input) or log line.
func TestMCPCredentialInArguments(t *testing.T) {
	e := newEnv(t)
	examples, err := filepath.Abs("../../rego/examples")
	if err != nil {
		t.Fatal(err)
	}
	d := mainConfig(e, "sluice")
	d["rego"] = []string{examples}
	g := e.Start(d, e.Write(d))
	cs := mcpConnect(t, g, agentA, nil)
	const key = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
	c := casebook.Expect(t, "D14", "over MCP: tools/call tickets.create_refund (an ask tool) with a Stripe live key in the body's reason",
		"isError policy_block by findings.credential naming stripe_key at /args/body/reason; no hold, nothing upstream; the key in no finding, reason, audit field (beside the recorded input) or log line")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := len(e.Up.Requests())
	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "tickets.create_refund", Arguments: map[string]any{"body": map[string]any{"amount": 5, "reason": "use " + key}}})
	if err != nil {
		t.Fatalf("tools/call: %v", err)
	}
	sent := len(e.Up.Requests()) - before
	rec := g.AwaitAuditFields("decision", map[string]any{"rule": "findings.credential", "code": "policy_block"})
	f, _ := rec["fields"].(map[string]any)
	recs := g.AuditRecords()
	for _, r := range recs {
		if rf, ok := r["fields"].(map[string]any); ok {
			delete(rf, "input")
		}
	}
	audit, _ := json.Marshal(recs)
	leaked := strings.Contains(string(audit), key) || strings.Contains(string(g.Stderr()), key) || strings.Contains(toolText(r), key)
	c.Observef("isError %v %.90q; upstream requests %d; audit decision %v rule %v code %v transport %v; key in result, audit or log %v",
		r.IsError, toolText(r), sent, f["decision"], f["rule"], f["code"], f["transport"], leaked)
	if !r.IsError || !strings.HasPrefix(toolText(r), "policy_block: ") || !strings.Contains(toolText(r), "stripe_key") ||
		!strings.Contains(toolText(r), "/args/body/reason") || sent != 0 || leaked || f["transport"] != "mcp" || f["tool"] != "tickets.create_refund" {
		t.Errorf("credential in an argument over MCP: %v %q", r.IsError, toolText(r))
	}
}

var ridRe = regexp.MustCompile(`request_id"?[ :]+"?([0-9a-f]{8,})`)

func uris(reqs []gwenv.Seen) []string {
	out := make([]string, len(reqs))
	for i, q := range reqs {
		out[i] = q.RequestURI
	}
	return out
}

// jsonEscapeAll writes every character of s as a JSON \u escape.
func jsonEscapeAll(s string) string {
	var b strings.Builder
	for _, c := range s {
		fmt.Fprintf(&b, `\u%04x`, c)
	}
	return b.String()
}

// pctAll percent-encodes every byte of s.
func pctAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

// recoverable reports whether the secret can be read back from text (a
// tool result): as is, after JSON-decoding the document (and the strings
// in it), after percent-decoding, or case-folded.
func recoverable(secret, text string) bool {
	cands := []string{text}
	var doc any
	if json.Unmarshal([]byte(text), &doc) == nil {
		b, _ := json.Marshal(doc)
		cands = append(cands, string(b))
		var walk func(v any)
		walk = func(v any) {
			switch x := v.(type) {
			case string:
				cands = append(cands, x)
			case []any:
				for _, y := range x {
					walk(y)
				}
			case map[string]any:
				for _, y := range x {
					walk(y)
				}
			}
		}
		walk(doc)
	}
	for _, s := range cands {
		if u, err := url.PathUnescape(s); err == nil {
			cands = append(cands, u)
		}
	}
	for _, s := range cands {
		if strings.Contains(strings.ToLower(s), strings.ToLower(secret)) {
			return true
		}
	}
	return false
}
