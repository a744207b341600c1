//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/scrub"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// mainGateway starts the main configuration with its secret set.
func mainGateway(t *testing.T) (*gwenv.Env, *gwenv.Gateway) {
	t.Helper()
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	return e, e.Start(d, e.Write(d))
}

// awaitDecision waits for the one canonical decision line of rid (a 200 is
// logged just after the reply is written) and fails on zero or several.
func awaitDecision(t *testing.T, g *gwenv.Gateway, rid string) map[string]any {
	t.Helper()
	if rid == "" {
		t.Fatal("reply has no request_id")
	}
	g.For(t).AwaitLog("tool_call request_id="+rid, func(m map[string]any) bool { return m["msg"] == "tool_call" && m["request_id"] == rid })
	lines := decisionLines(g, rid)
	if len(lines) != 1 {
		t.Fatalf("want exactly one decision line for %s, got %d: %v", rid, len(lines), lines)
	}
	return lines[0]
}

func wantFields(t *testing.T, line map[string]any, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, _ := line[k].(string); got != v {
			t.Errorf("decision line %s = %q, want %q (line %v)", k, got, v, line)
		}
	}
}

// TestAllowedCall: an allowed call reaches the upstream with the credential
// attached by the gateway, the sandbox never sees it, and one canonical
// decision line describes the call.
func TestAllowedCall(t *testing.T) {
	t.Parallel()
	e, g := mainGateway(t)

	r := g.For(t).Call(agentA, "tickets.list_tickets", `{"query":{"limit":5,"tag":["red","blue"]}}`)
	expect(t, r, http.StatusOK, "")
	if r.Result.Status != http.StatusOK || !bytes.Contains(r.Result.Body, []byte("printer on fire")) {
		t.Fatalf("reply is not the upstream's JSON: %s", r.Body)
	}
	reqs := e.Up.Requests()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(reqs))
	}
	if got := reqs[0].Header.Get("X-Api-Key"); got != e.Secret {
		t.Errorf("upstream X-Api-Key is not the stored secret (len %d)", len(got))
	}
	u, _ := url.ParseRequestURI(reqs[0].RequestURI)
	if u.Path != "/tickets" || u.Query().Get("limit") != "5" || !slices.Equal(u.Query()["tag"], []string{"red", "blue"}) {
		t.Errorf("upstream request URI %q, want /tickets?limit=5&tag=red&tag=blue", reqs[0].RequestURI)
	}
	for name, f := range e.SecretForms() {
		if bytes.Contains(r.Raw, []byte(f)) {
			t.Errorf("reply contains the secret (%s form)", name)
		}
	}
	line := awaitDecision(t, g, r.RequestID)
	wantFields(t, line, map[string]string{
		"decision": "allow", "tool": "tickets.list_tickets", "agent": "agent-a",
		"dest_host": "127.0.0.1", "resolved_ip": "127.0.0.1",
	})
	if rule, _ := line["rule"].(string); rule == "" {
		t.Errorf("decision line has no rule: %v", line)
	}

	// The audit log holds the decision (made durable before the dial) and
	// the result, with where the credential went but never its value.
	events := map[string]map[string]any{}
	for _, rec := range g.AuditRecords() {
		if rec["request_id"] == r.RequestID {
			events[rec["event"].(string)], _ = rec["fields"].(map[string]any)
		}
	}
	if d := events["decision"]; d == nil || d["decision"] != "allow" || d["credential"] != "header:X-Api-Key" {
		t.Errorf("audit decision record for %s: %v", r.RequestID, d)
	}
	if res := events["result"]; res == nil || res["secret_reflected"] != false {
		t.Errorf("audit result record for %s: %v", r.RequestID, res)
	}

	// The same configuration passes `sluice validate` (a dry run) but for
	// its ask rule, which names no approver on purpose (TestRefusals: 503
	// approval_unavailable).
	if out, err := e.CLI("", "validate", "--config", g.Config); err != nil {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "error:") && !strings.Contains(l, "policies[3].approvers: the ask rule names no approver") {
				t.Errorf("sluice validate: %v\n%s", err, out)
			}
		}
	}
}

// TestRefusals: block, unknown tool, not granted and ask each refuse with
// their code, and nothing reaches the upstream.
func TestRefusals(t *testing.T) {
	t.Parallel()
	e, g := mainGateway(t)

	cases := []struct {
		name     string
		id       wire.Identity
		tool     string
		args     string
		status   int
		code     string
		decision string // expected decision field of the log line; "" when no decision was made
	}{
		{"blocked by policy", agentA, "tickets.delete_ticket", `{"path":{"id":"t-1"}}`, 403, "policy_block", "block"},
		{"control: allowed tool", agentA, "tickets.list_tickets", `{}`, 200, "", "allow"},
		{"unknown tool", agentA, "tickets.nope", `{}`, 404, "unknown_tool", ""},
		{"not granted", agentB, "tickets.list_tickets", `{}`, 403, "not_granted", ""},
		{"ask without approvals", agentA, "tickets.create_refund", `{"body":{"amount":5,"reason":"dup"}}`, 503, "approval_unavailable", "ask"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, beforeAcc := len(e.Up.Requests()), e.Up.Accepts.Load()
			r := g.For(t).Call(tc.id, tc.tool, tc.args)
			if tc.code == "approval_unavailable" {
				c := casebook.Expect(t, "G8", "Ask call ("+tc.tool+") with no approval service configured",
					"503 approval_unavailable, decision ask, nothing upstream")
				defer func() {
					c.Observef("%d %s, upstream requests +%d, connections +%d", r.Status, r.Code,
						len(e.Up.Requests())-before, e.Up.Accepts.Load()-beforeAcc)
				}()
			}
			expect(t, r, tc.status, tc.code)
			wantReqs := before
			if tc.status == 200 {
				wantReqs++
			}
			if got := len(e.Up.Requests()); got != wantReqs {
				t.Errorf("upstream requests %d -> %d, want %d", before, got, wantReqs)
			}
			if tc.status != 200 && e.Up.Accepts.Load() != beforeAcc {
				t.Errorf("upstream accepted a connection for a refused call")
			}
			line := awaitDecision(t, g, r.RequestID)
			wantFields(t, line, map[string]string{"decision": tc.decision, "agent": tc.id.Agent, "tool": tc.tool})
			if tc.code != "" {
				if reason, _ := line["reason"].(string); !strings.HasPrefix(reason, tc.code) {
					t.Errorf("decision line reason %q, want prefix %q", reason, tc.code)
				}
			}
		})
	}

	t.Run("tool list", func(t *testing.T) {
		a := toolNames(t, g, agentA)
		for _, want := range []string{"tickets.list_tickets", "tickets.get_ticket", "tickets.echo_auth", "tickets.create_refund"} {
			if !slices.Contains(a, want) {
				t.Errorf("agent-a does not see %s: %v", want, a)
			}
		}
		if slices.Contains(a, "tickets.delete_ticket") {
			t.Errorf("agent-a sees tickets.delete_ticket, which policy blocks outright: %v", a)
		}
		if b := toolNames(t, g, agentB); len(b) != 0 {
			t.Errorf("agent-b (granted nothing) sees tools: %v", b)
		}
	})
}

// TestSchemaViolations is THREATS F7: bad arguments are refused with 400
// schema_violation naming the field, before policy and before any dial.
// Path parameters that try to climb out of /tickets/ (CVE-2021-41773 is the
// Apache path-traversal that %2e%2e spellings exploited) are either refused
// or reach the upstream as one escaped segment under /tickets/.
func TestSchemaViolations(t *testing.T) {
	t.Parallel()
	e, g := mainGateway(t)

	refused := []struct {
		name, tool, args, field string
	}{
		{"wrong type query.limit", "tickets.list_tickets", `{"query":{"limit":"ten"}}`, "query.limit"},
		{"unknown query parameter", "tickets.list_tickets", `{"query":{"bogus":"1"}}`, "bogus"},
		{"array item wrong type", "tickets.list_tickets", `{"query":{"tag":[1,2]}}`, "query.tag"},
		{"missing required body.amount", "tickets.create_refund", `{"body":{"reason":"dup"}}`, "amount"},
		{"wrong type body.amount", "tickets.create_refund", `{"body":{"amount":"5"}}`, "body.amount"},
		{"extra body property", "tickets.create_refund", `{"body":{"amount":5,"evil":true}}`, "evil"},
		{"extra top-level key", "tickets.list_tickets", `{"query":{},"evil":1}`, "evil"},
		{"duplicate key", "tickets.list_tickets", `{"query":{"limit":1,"limit":2}}`, "limit"},
		{"not an object", "tickets.list_tickets", `[1,2]`, ""},
		{"missing path id", "tickets.get_ticket", `{}`, "id"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "F7", tc.name+": "+tc.tool+" "+tc.args,
				"400 schema_violation naming "+strconv.Quote(tc.field)+", no policy decision, nothing upstream")
			before, acc := len(e.Up.Requests()), e.Up.Accepts.Load()
			r := g.For(t).Call(agentA, tc.tool, tc.args)
			defer func() {
				c.Observef("%d %s %q, upstream requests +%d, connections +%d", r.Status, r.Code, r.Message,
					len(e.Up.Requests())-before, e.Up.Accepts.Load()-acc)
			}()
			expect(t, r, http.StatusBadRequest, "schema_violation")
			if tc.field != "" && !strings.Contains(r.Message, tc.field) {
				t.Errorf("message %q does not name %q", r.Message, tc.field)
			}
			if len(e.Up.Requests()) != before || e.Up.Accepts.Load() != acc {
				t.Errorf("upstream was reached for a schema violation")
			}
			line := awaitDecision(t, g, r.RequestID)
			wantFields(t, line, map[string]string{"decision": ""}) // refused before any policy ran
			if reason, _ := line["reason"].(string); !strings.HasPrefix(reason, "schema_violation") {
				t.Errorf("decision line reason %q, want schema_violation", reason)
			}
		})
	}

	t.Run("oversized arguments", func(t *testing.T) {
		// Valid JSON one byte over the 1 MiB bound: only its size is wrong.
		pad := 1<<20 + 1 - len(`{"query":{"q":""}}`)
		args := `{"query":{"q":"` + strings.Repeat("a", pad) + `"}}`
		c := casebook.Expect(t, "F7", fmt.Sprintf("oversized arguments: tickets.list_tickets with %d bytes of JSON (1 MiB + 1)", len(args)),
			"400 schema_violation naming the bound, no policy decision, nothing upstream")
		before, acc := len(e.Up.Requests()), e.Up.Accepts.Load()
		r := g.For(t).Call(agentA, "tickets.list_tickets", args)
		defer func() {
			c.Observef("%d %s %q, upstream requests +%d, connections +%d", r.Status, r.Code, r.Message,
				len(e.Up.Requests())-before, e.Up.Accepts.Load()-acc)
		}()
		expect(t, r, http.StatusBadRequest, "schema_violation")
		if !strings.Contains(r.Message, "larger than 1048576 bytes") {
			t.Errorf("message %q does not name the bound", r.Message)
		}
		if len(e.Up.Requests()) != before || e.Up.Accepts.Load() != acc {
			t.Errorf("upstream was reached for oversized arguments")
		}
		line := awaitDecision(t, g, r.RequestID)
		wantFields(t, line, map[string]string{"decision": ""})
	})

	// Traversal: CVE-2021-41773 (Apache 2.4.49, "%2e%2e/" escaped the doc root).
	traversal := []struct{ name, id string }{
		{"dot-dot slash (CVE-2021-41773)", "../admin"},
		{"percent-encoded dot-dot slash (CVE-2021-41773)", "%2e%2e%2fadmin"},
		{"upper-case percent-encoded (CVE-2021-41773)", "%2E%2E%2Fadmin"},
		{"double-encoded (CVE-2021-42013)", "%252e%252e%252fadmin"},
		{"bare dot-dot", ".."},
		{"bare dot", "."},
		{"slash inside id", "a/b"},
		{"backslash traversal", `..\admin`},
		{"query smuggle", "1?admin=true"},
		{"fragment smuggle", "1#frag"},
	}
	for _, tc := range traversal {
		t.Run("path "+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "F7", "path parameter "+tc.name+": id "+strconv.Quote(tc.id),
				"400 schema_violation and nothing upstream, or 200 with the id as one escaped segment under /tickets/")
			before := len(e.Up.Requests())
			args, _ := json.Marshal(map[string]any{"path": map[string]string{"id": tc.id}})
			r := g.For(t).Call(agentA, "tickets.get_ticket", string(args))
			reqs := e.Up.Requests()[before:]
			if len(reqs) == 1 {
				c.Observef("%d %s, upstream got %q", r.Status, r.Code, reqs[0].RequestURI)
			} else {
				c.Observef("%d %s, %d upstream requests", r.Status, r.Code, len(reqs))
			}
			t.Logf("id %q: %d %s", tc.id, r.Status, r.Code)
			switch r.Status {
			case http.StatusBadRequest:
				expect(t, r, http.StatusBadRequest, "schema_violation")
				if len(reqs) != 0 {
					t.Fatalf("upstream reached on a 400")
				}
			case http.StatusOK:
				if len(reqs) != 1 {
					t.Fatalf("want 1 upstream request, got %d", len(reqs))
				}
				esc := reqs[0].EscapedPath
				t.Logf("reached upstream as %q", reqs[0].RequestURI)
				seg, ok := strings.CutPrefix(esc, "/tickets/")
				if !ok || seg == "" || strings.Contains(seg, "/") || path.Clean(esc) != esc {
					t.Errorf("upstream path %q (RequestURI %q) escapes /tickets/ or is not one segment", esc, reqs[0].RequestURI)
				}
				// RFC 3986 §2.3/§6.2.2.2: %2E is the unreserved ".", and a
				// normalising server decodes it before removing dot segments
				// (exactly the CVE-2021-41773 ".%2e/" trick), so the decoded
				// segment must not be a dot segment either.
				if dec, err := url.PathUnescape(seg); err == nil && (dec == "." || dec == "..") {
					t.Errorf("upstream path %q is the dot segment %q once percent-decoded: it climbs out of /tickets/ at any normalising server; want 400 schema_violation", esc, dec)
				}
				if u, _ := url.ParseRequestURI(reqs[0].RequestURI); u == nil || u.RawQuery != "" || u.Fragment != "" {
					t.Errorf("upstream RequestURI %q carries a smuggled query or fragment", reqs[0].RequestURI)
				}
				if dec, err := url.PathUnescape(seg); err != nil || dec != tc.id {
					t.Errorf("segment %q decodes to %q, want the id %q verbatim", seg, dec, tc.id)
				}
			default:
				t.Fatalf("got %d %q, want 400 schema_violation or 200 with one segment; body %s", r.Status, r.Code, r.Body)
			}
		})
	}
}

// TestEgressGuard is THREATS C1–C3: connectors pointed at metadata, loopback
// spellings, embedded IPv4 and names resolving inside are refused with 403
// egress_denied before any connection; a control connector that
// allow_private admits succeeds, so the refusals are provably the guard's.
func TestEgressGuard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := itoa(e.Up.Port)
	cases := []struct{ slug, baseURL, cite string }{
		{"c1-aws-metadata", "http://169.254.169.254", "C1: AWS IMDS"},
		{"c1-aws-metadata-v6", "http://[fd00:ec2::254]", "C1: AWS IMDS IPv6"},
		{"c1-gcp-metadata-name", "http://metadata.google.internal", "C1: GCP metadata name"},
		{"c2-decimal", "http://2130706433:" + p, "C2: inet_aton decimal (127.0.0.1)"},
		{"c2-hex", "http://0x7f000001:" + p, "C2: inet_aton hex"},
		{"c2-octal", "http://0177.0.0.1:" + p, "C2: inet_aton octal"},
		{"c2-short", "http://127.1:" + p, "C2: inet_aton short form"},
		{"c2-zero", "http://0:" + p, "C2: 0 means this host"},
		{"c2-unspecified-v4", "http://0.0.0.0:" + p, "C2: RFC 1122 unspecified"},
		{"c2-unspecified-v6", "http://[::]:" + p, "C2: RFC 4291 unspecified"},
		{"c2-v4-mapped", "http://[::ffff:169.254.169.254]", "C2: RFC 4291 IPv4-mapped"},
		{"c2-nat64", "http://[64:ff9b::a9fe:a9fe]", "C2: RFC 6052 NAT64"},
		{"c2-6to4", "http://[2002:a9fe:a9fe::1]", "C2: RFC 3056 6to4"},
		{"c2-cgnat", "http://100.64.0.1", "C2: RFC 6598 CGNAT"},
		{"c2-loopback-no-allow", "http://127.0.0.1:" + p, "C2: loopback without allow_private"},
		{"c3-name-loopback", "http://internal.test:" + p, "C3: name -> 127.0.0.1"},
		{"c3-name-rfc1918", "http://rfc1918.test", "C3: name -> RFC 1918"},
		{"c3-name-ula", "http://ula.test", "C3: name -> RFC 4193 ULA"},
		{"c3-name-metadata", "http://meta.test", "C3: name -> 169.254.169.254"},
	}
	specDir := filepath.Join(e.Dir, "specs")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(e.Spec)
	if err != nil {
		t.Fatal(err)
	}
	specFor := func(slug string) string {
		p := filepath.Join(specDir, slug+".yaml")
		if err := os.WriteFile(p, spec, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	all := func(skip map[int]bool) gwenv.Doc {
		d := e.CoreConfig("egress")
		d["policies"] = []map[string]any{{"match": "*", "action": "allow"}}
		var conns []map[string]any
		var slugs []string
		for i, tc := range cases {
			if skip[i] {
				continue
			}
			conns = append(conns, map[string]any{"slug": tc.slug, "spec": specFor(tc.slug), "base_url": tc.baseURL})
			slugs = append(slugs, tc.slug)
		}
		d["connectors"] = append(conns, map[string]any{"slug": "control", "spec": specFor("control"),
			"base_url": "http://127.0.0.1:" + p, "allow_private": []string{"127.0.0.0/8"}})
		d["agents"] = []map[string]any{{"name": "agent-a", "connectors": append(slugs, "control")}}
		return d
	}

	// A spelling the configuration refuses never gets as far as a dial;
	// record it and run the rest.
	refusedAtConfig := map[int]string{}
	cfg := e.Write(all(nil))
	// validate also names every base_url here as one "the guard refuses
	// every call" to: serve runs with those, and this test proves it per
	// call. Only what serve itself refuses is taken out.
	if out, err := e.CLI("", "validate", "--config", cfg); err != nil {
		for i := range cases {
			key := fmt.Sprintf("connectors[%d].base_url", i)
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, key) && !strings.Contains(l, "the guard refuses every call") {
					refusedAtConfig[i] = out
				}
			}
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "error:") && !strings.Contains(l, "the guard refuses every call") && len(refusedAtConfig) == 0 {
				t.Fatalf("sluice validate failed without naming a base_url: %v\n%s", err, out)
			}
		}
	}
	d := all(mapKeys(refusedAtConfig))
	g := e.Start(d, e.Write(d))

	for i, tc := range cases {
		t.Run(tc.slug, func(t *testing.T) {
			c := casebook.Expect(t, strings.ToUpper(tc.slug[:2]), tc.cite+": connector base_url "+tc.baseURL,
				"403 egress_denied before any dial (0 upstream connections), or refused by validate naming the base_url")
			if out, ok := refusedAtConfig[i]; ok {
				c.Observef("refused at config: %s", firstLine(out, fmt.Sprintf("connectors[%d].base_url", i)))
				t.Logf("%s (%s): refused at config: %s", tc.baseURL, tc.cite, out)
				if !strings.Contains(out, fmt.Sprintf("connectors[%d].base_url", i)) {
					t.Errorf("config error does not name connectors[%d].base_url", i)
				}
				return
			}
			r := g.For(t).Call(agentA, tc.slug+".list_tickets", `{}`)
			c.Observef("%d %s, upstream connections %d", r.Status, r.Code, e.Up.Accepts.Load())
			if r.Status != http.StatusForbidden || r.Code != "egress_denied" {
				t.Fatalf("%s (%s): got %d %q, want 403 egress_denied; body %s", tc.baseURL, tc.cite, r.Status, r.Code, r.Body)
			}
			line := awaitDecision(t, g, r.RequestID)
			if reason, _ := line["reason"].(string); !strings.HasPrefix(reason, "egress_denied") {
				t.Errorf("decision line reason %q, want egress_denied", reason)
			}
			if n := e.Up.Accepts.Load(); n != 0 {
				t.Fatalf("upstream accepted %d connections: the guard let %s through", n, tc.baseURL)
			}
		})
	}
	if n, reqs := e.Up.Accepts.Load(), len(e.Up.Requests()); n != 0 || reqs != 0 {
		t.Fatalf("after the refusal table the upstream saw %d connections, %d requests; want 0", n, reqs)
	}

	t.Run("control with allow_private", func(t *testing.T) {
		c := casebook.Expect(t, "C2", "control: connector at http://127.0.0.1 admitted by allow_private 127.0.0.0/8",
			"200, exactly 1 upstream connection (the refusals above are the guard's)")
		r := g.For(t).Call(agentA, "control.list_tickets", `{}`)
		c.Observef("%d, upstream connections %d", r.Status, e.Up.Accepts.Load())
		expect(t, r, http.StatusOK, "")
		if n := e.Up.Accepts.Load(); n != 1 {
			t.Errorf("upstream accepted %d connections, want 1", n)
		}
	})
}

// firstLine is the first line of out that contains sub (else out's first
// line), for the report.
func firstLine(out, sub string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return lines[0]
}

func mapKeys(m map[int]string) map[int]bool {
	out := map[int]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

// TestCredentialEcho is THREATS D3 and D9: an upstream that reflects the
// injected key gets its reply scrubbed, the audit log records
// secret_reflected, and the secret appears in no reply, log or audit record.
func TestCredentialEcho(t *testing.T) {
	t.Parallel()
	e, g := mainGateway(t)
	d3 := casebook.Expect(t, "D3", "upstream reflects the injected X-Api-Key in its body and headers (plain and base64)",
		"reply scrubbed to "+scrub.Replacement+", no form of the secret in the reply, audit secret_reflected")
	d9 := casebook.Expect(t, "D9", "grep the audit log and the gateway log for every form of the secret after an echo",
		"0 hits")

	r := g.For(t).Call(agentA, "tickets.echo_auth", `{}`)
	defer func() {
		hits := func(b []byte) int {
			n := 0
			for _, f := range e.SecretForms() {
				if bytes.Contains(b, []byte(f)) {
					n++
				}
			}
			return n
		}
		var reflected bool
		for _, rec := range g.AuditRecords() {
			reflected = reflected || (rec["event"] == "secret_reflected" && rec["request_id"] == r.RequestID)
		}
		d3.Observef("%d, reply carries %s: %v, secret forms in reply: %d, audit secret_reflected: %v",
			r.Status, scrub.Replacement, bytes.Contains(r.Raw, []byte(scrub.Replacement)), hits(r.Raw), reflected)
		audit, _ := os.ReadFile(g.Audit)
		d9.Observef("secret forms in audit log: %d, in gateway log: %d", hits(audit), hits(g.Stderr()))
	}()
	expect(t, r, http.StatusOK, "")
	reqs := e.Up.Requests()
	if len(reqs) != 1 || reqs[0].Header.Get("X-Api-Key") != e.Secret {
		t.Fatalf("control: the upstream did not receive the secret to reflect (%d requests)", len(reqs))
	}
	if !bytes.Contains(r.Raw, []byte(scrub.Replacement)) {
		t.Errorf("reply does not carry %q: %s", scrub.Replacement, r.Body)
	}
	for name, f := range e.SecretForms() {
		if bytes.Contains(r.Raw, []byte(f)) {
			t.Errorf("reply contains the secret (%s form): %s", name, r.Body)
		}
	}
	for _, h := range []string{"X-Echo-Key", "X-Echo-Key-B64"} {
		if v := r.Result.Headers[h]; len(v) != 1 || !strings.Contains(v[0], scrub.Replacement) {
			t.Errorf("reflected header %s = %q, want it scrubbed to %q", h, v, scrub.Replacement)
		}
	}
	line := awaitDecision(t, g, r.RequestID)
	wantFields(t, line, map[string]string{"decision": "allow", "reason": "secret_reflected"})

	var found bool
	for _, rec := range g.AuditRecords() {
		if rec["event"] == "secret_reflected" && rec["request_id"] == r.RequestID {
			found = true
		}
	}
	if !found {
		t.Errorf("audit log has no secret_reflected record for %s", r.RequestID)
	}
	// D9 here too (the env's cleanup repeats it over every file and reply).
	audit, _ := os.ReadFile(g.Audit)
	for name, f := range e.SecretForms() {
		if bytes.Contains(audit, []byte(f)) {
			t.Errorf("audit log contains the secret (%s form)", name)
		}
		if bytes.Contains(g.Stderr(), []byte(f)) {
			t.Errorf("gateway log contains the secret (%s form)", name)
		}
	}
}

// TestAuditTamper is THREATS D10: `sluice audit verify` accepts the log the
// gateway wrote and names the line of an edit, a deletion and a swap.
func TestAuditTamper(t *testing.T) {
	t.Parallel()
	e, g := mainGateway(t)
	cfg := g.Config
	expect(t, g.For(t).Call(agentA, "tickets.list_tickets", `{}`), http.StatusOK, "")
	expect(t, g.For(t).Call(agentA, "tickets.delete_ticket", `{"path":{"id":"1"}}`), http.StatusForbidden, "policy_block")
	expect(t, g.For(t).Call(agentA, "tickets.get_ticket", `{"path":{"id":"7"}}`), http.StatusOK, "")
	expect(t, g.For(t).Call(agentB, "tickets.get_ticket", `{"path":{"id":"7"}}`), http.StatusForbidden, "not_granted")
	g.Stop()

	out, err := e.CLI("", "audit", "verify", "--config", cfg)
	if err != nil {
		t.Fatalf("audit verify on the gateway's log: %v\n%s", err, out)
	}
	data, err := os.ReadFile(g.Audit)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	if len(lines) < 5 {
		t.Fatalf("want at least 5 audit records, got %d", len(lines))
	}
	mid := len(lines) / 2

	edit := func() [][]byte {
		ls := cloneLines(lines)
		i := bytes.Index(ls[mid], []byte(`"agent-`))
		if i < 0 {
			i = bytes.Index(ls[mid], []byte(`"event":"`)) + 9
		} else {
			i += len(`"agent-`)
		}
		ls[mid][i] ^= 0x01 // one byte: agent-a -> agent-`, or the event's first letter
		return ls
	}
	del := func() [][]byte { ls := cloneLines(lines); return append(ls[:mid], ls[mid+1:]...) }
	swap := func() [][]byte { ls := cloneLines(lines); ls[mid], ls[mid+1] = ls[mid+1], ls[mid]; return ls }
	cases := []struct {
		name     string
		tamper   func() [][]byte
		wantLine int
	}{
		{"edit one byte", edit, mid + 1},
		{"delete a line", del, mid + 1},
		{"swap two lines", swap, mid + 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "D10", "tamper with the exported audit log: "+tc.name,
				fmt.Sprintf("sluice audit verify exits non-zero naming line %d", tc.wantLine))
			p := filepath.Join(e.Dir, "tampered-"+strings.ReplaceAll(tc.name, " ", "-")+".log")
			if err := os.WriteFile(p, bytes.Join(tc.tamper(), nil), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := e.CLI("", "audit", "verify", "--config", cfg, "--file", p)
			c.Observef("%v: %s", err, firstLine(out, "line "))
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("audit verify accepted a tampered log: %v\n%s", err, out)
			}
			if want := fmt.Sprintf("line %d", tc.wantLine); !strings.Contains(out, want) {
				t.Errorf("verify output does not name %q:\n%s", want, out)
			}
		})
	}
}

func cloneLines(ls [][]byte) [][]byte {
	out := make([][]byte, len(ls))
	for i, l := range ls {
		out[i] = bytes.Clone(l)
	}
	return out
}

// TestPolicyReload is THREATS G6: a module with a syntax error is rejected on
// SIGHUP with OPA's error and location, the previous policy keeps serving and
// the reload error is counted; a valid module then takes effect.
func TestPolicyReload(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := filepath.Join(e.Dir, "policies")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mod := filepath.Join(dir, "team.rego")
	write := func(src string) {
		if err := os.WriteFile(mod, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`package sluice.policies.team

# Ticket "forbidden" is off limits.
decisions contains d if {
	input.tool == "tickets.get_ticket"
	input.args.path.id == "forbidden"
	d := {"action": "block", "rule": "team.forbidden", "reason": "off limits"}
}
`)
	d := mainConfig(e, "sluice")
	d["rego"] = []string{"policies/"}
	g := e.Start(d, e.Write(d))

	expect(t, g.For(t).Call(agentA, "tickets.list_tickets", `{}`), http.StatusOK, "")
	expect(t, g.For(t).Call(agentA, "tickets.get_ticket", `{"path":{"id":"forbidden"}}`), http.StatusForbidden, "policy_block")

	countMsg := func(sub string) int {
		n := 0
		for _, m := range g.LogLines() {
			if msg, _ := m["msg"].(string); strings.Contains(msg, sub) {
				n++
			}
		}
		return n
	}
	rejected := countMsg("reload rejected") + countMsg("reload failed")
	g6 := casebook.Expect(t, "G6", "SIGHUP with a Rego module that has a syntax error, then a valid one",
		"reload rejected with rego_parse_error and the file:line, old policy keeps serving (200), error counted; the valid module then blocks")

	write("package sluice.policies.team\n\ndecisions contains d if {\n\tinput.tool ==\n")
	g.Signal(syscall.SIGHUP)
	line := g.AwaitLog("reload rejected", func(m map[string]any) bool {
		msg, _ := m["msg"].(string)
		return (strings.Contains(msg, "reload rejected") || strings.Contains(msg, "reload failed")) && countMsg("reload rejected")+countMsg("reload failed") > rejected
	})
	errText, _ := line["err"].(string)
	if errText == "" {
		errText, _ = line["error"].(string)
	}
	if !strings.Contains(errText, "rego_parse_error") || !strings.Contains(errText, "team.rego:") {
		t.Errorf("reload rejection does not carry OPA's code and location: %v", line)
	}
	r := g.For(t).Call(agentA, "tickets.list_tickets", `{}`)
	rejection := fmt.Sprintf("rejected: %v; next call %d", strings.Contains(errText, "rego_parse_error") && strings.Contains(errText, "team.rego:"), r.Status)
	g6.Observe(rejection)
	expect(t, r, http.StatusOK, "")
	_, metrics, err := g.AdminGet("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var counted bool
	for _, l := range strings.Split(string(metrics), "\n") {
		// Non-zero: the series exists, at 0, from the start.
		if strings.HasPrefix(l, "sluice_policy_reloads") && strings.Contains(l, `result="error"`) && !strings.HasSuffix(l, " 0") {
			counted = true
		}
	}
	if !counted {
		t.Errorf("/metrics has no non-zero sluice_policy_reloads{result=\"error\"} line")
	}
	rejection += fmt.Sprintf("; error counted: %v", counted)
	g6.Observe(rejection)

	reloaded := countMsg("policy: reloaded")
	write(`package sluice.policies.team

decisions contains {"action": "block", "rule": "team.no_listing", "reason": "listing is paused"} if {
	input.tool == "tickets.list_tickets"
}
`)
	g.Signal(syscall.SIGHUP)
	g.AwaitLog("policy: reloaded", func(map[string]any) bool { return countMsg("policy: reloaded") > reloaded })
	before := len(e.Up.Requests())
	r = g.For(t).Call(agentA, "tickets.list_tickets", `{}`)
	g6.Observef("%s; after the valid reload: %d %s", rejection, r.Status, r.Code)
	expect(t, r, http.StatusForbidden, "policy_block")
	if len(e.Up.Requests()) != before {
		t.Errorf("upstream reached for a blocked call")
	}
	wantFields(t, awaitDecision(t, g, r.RequestID), map[string]string{"decision": "block", "rule": "team.no_listing"})
}

// TestIdentity is THREATS A10 and the identity contract: no preamble, an
// untrusted peer, spoofed identity headers and admin routes over the
// sandbox socket are all refused.
func TestIdentity(t *testing.T) {
	t.Parallel()
	e, g := mainGateway(t)

	t.Run("no preamble", func(t *testing.T) {
		c := casebook.Expect(t, "A10", "request on the gateway socket with no identity preamble", "400 identity_required, connection closed")
		out, closed := g.For(t).RawNoPreamble([]byte("GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n"), 5*time.Second)
		c.Observef("%s, closed %v", statusLine(out), closed)
		if !strings.HasPrefix(out, "HTTP/1.1 400 ") || !strings.Contains(out, `"identity_required"`) {
			t.Errorf("got %q, want 400 identity_required", out)
		}
		if !closed {
			t.Errorf("connection not closed after the refusal")
		}
	})

	t.Run("malformed preamble", func(t *testing.T) {
		c := casebook.Expect(t, "A10", "identity preamble with a duplicate agent key (agent-a, then agent-b)", "400 identity_required, connection closed")
		out, closed := g.For(t).RawNoPreamble([]byte("SLUICE-IDENTITY {\"sandbox\":\"sb-1\",\"agent\":\"agent-a\",\"agent\":\"agent-b\"}\nGET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n"), 5*time.Second)
		c.Observef("%s, closed %v", statusLine(out), closed)
		if !strings.HasPrefix(out, "HTTP/1.1 400 ") || !strings.Contains(out, `"identity_required"`) || !closed {
			t.Errorf("duplicate-key preamble: got %q (closed %v), want 400 identity_required and close", out, closed)
		}
	})

	t.Run("untrusted peer", func(t *testing.T) {
		d := mainConfig(e, "untrusted")
		d.Gateway()["trusted_relay_uids"] = []uint32{4242} // root, the test, is then untrusted
		ug := e.Start(d, e.Write(d)).For(t)
		cb := casebook.Expect(t, "A10", "a well-formed preamble from a peer uid the gateway does not trust", "403 untrusted_peer and close; a tool call reaches nothing upstream")
		line, _ := wire.Encode(agentA)
		out, closed := ug.RawNoPreamble(append(line, "GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n"...), 5*time.Second)
		first := fmt.Sprintf("%s, closed %v", statusLine(out), closed)
		cb.Observe(first)
		if !strings.HasPrefix(out, "HTTP/1.1 403 ") || !strings.Contains(out, `"untrusted_peer"`) || !closed {
			t.Errorf("got %q (closed %v), want 403 untrusted_peer and close", out, closed)
		}
		before := len(e.Up.Requests())
		call := "POST /v1/tools/tickets.list_tickets HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
		out, _ = ug.RawNoPreamble(append(line, call...), 5*time.Second)
		cb.Observef("%s; tool call %s, upstream requests +%d", first, statusLine(out), len(e.Up.Requests())-before)
		if !strings.HasPrefix(out, "HTTP/1.1 403 ") || !strings.Contains(out, `"untrusted_peer"`) {
			t.Errorf("tool call from an untrusted peer: got %q, want 403 untrusted_peer", out)
		}
		if len(e.Up.Requests()) != before {
			t.Errorf("upstream reached from an untrusted peer")
		}
	})

	t.Run("spoofed identity headers", func(t *testing.T) {
		spoof, _ := json.Marshal(agentA)
		hdr := http.Header{
			"X-Sluice-Identity": {string(spoof)},
			"X-Sluice-Agent":    {"agent-a"},
			"Sluice-Identity":   {wire.Prefix + string(spoof)},
		}
		c := casebook.Expect(t, "A10", "agent-b sends X-Sluice-Identity, X-Sluice-Agent and Sluice-Identity headers claiming agent-a",
			"headers ignored: 403 not_granted as agent-b, nothing upstream")
		before := len(e.Up.Requests())
		r := g.For(t).Do(agentB, http.MethodPost, "/v1/tools/tickets.list_tickets",
			`{"headers":{"X-Sluice-Agent":"agent-a"}}`, hdr)
		c.Observef("%d %s, upstream requests +%d", r.Status, r.Code, len(e.Up.Requests())-before)
		expect(t, r, http.StatusForbidden, "not_granted")
		if len(e.Up.Requests()) != before {
			t.Errorf("upstream reached with a spoofed identity")
		}
		wantFields(t, awaitDecision(t, g, r.RequestID), map[string]string{"agent": "agent-b"})
	})

	t.Run("admin routes not on sandbox socket", func(t *testing.T) {
		c := casebook.Expect(t, "A10", "approval, audit, metrics and health routes requested over the sandbox socket",
			"404 not_found for all 9 routes; control: /healthz answers 200 on the admin listener")
		var got []string
		defer func() { c.Observe(strings.Join(got, ", ")) }()
		for _, rt := range []struct{ method, path string }{
			{"GET", "/api/v1/holds"}, {"GET", "/api/v1/holds/x"}, {"POST", "/api/v1/holds/x/approve"},
			{"POST", "/api/v1/holds/x/deny"}, {"GET", "/api/v1/audit"}, {"GET", "/metrics"},
			{"GET", "/healthz"}, {"GET", "/readyz"}, {"GET", "/"},
		} {
			r := g.For(t).Do(agentA, rt.method, rt.path, "", nil)
			got = append(got, fmt.Sprintf("%s %s %d %s", rt.method, rt.path, r.Status, r.Code))
			if r.Status != http.StatusNotFound || r.Code != "not_found" {
				t.Errorf("%s %s over the sandbox socket: %d %q, want 404 not_found", rt.method, rt.path, r.Status, r.Code)
			}
		}
		// Control: the routes exist, on the admin listener.
		st, _, err := g.AdminGet("/healthz")
		got = append(got, fmt.Sprintf("admin /healthz %d", st))
		if err != nil || st != http.StatusOK {
			t.Errorf("admin /healthz: %d %v", st, err)
		}
	})
}

// statusLine is the first line of a raw HTTP answer, for the report.
func statusLine(out string) string {
	l, _, _ := strings.Cut(out, "\r\n")
	if b := strings.Index(out, `"code":"`); b >= 0 {
		code, _, _ := strings.Cut(out[b+len(`"code":"`):], `"`)
		l += " " + code
	}
	return l
}
