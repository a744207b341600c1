//go:build linux

package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// credSpec is an API whose operations offer the security alternatives
// given (YAML flow, e.g. "[{basic: []}, {bearer: []}]"), with the four
// kinds of scheme sluice attaches, an oauth2 one it cannot, and GET
// /tickets/{id} (getTicket) that declares security: [].
func credSpec(t *testing.T, dir, name, security string) string {
	t.Helper()
	spec := fmt.Sprintf(`openapi: 3.0.3
info: { title: %s, version: "1" }
servers: [{ url: "https://creds.invalid" }]
security: %s
components:
  securitySchemes:
    basic: { type: http, scheme: basic }
    bearer: { type: http, scheme: bearer }
    hdr: { type: apiKey, in: header, name: X-Api-Key }
    qry: { type: apiKey, in: query, name: api_key }
    oauth: { type: oauth2, flows: { clientCredentials: { tokenUrl: "https://creds.invalid/token", scopes: {} } } }
paths:
  /tickets:
    get:
      operationId: listTickets
      responses: { "200": { description: ok } }
  /tickets/{id}:
    get:
      operationId: getTicket
      security: []
      parameters: [{ name: id, in: path, required: true, schema: { type: string } }]
      responses: { "200": { description: ok } }
`, name, security)
	p := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(p, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCredentialFitsScheme is issue 15 item 6 through the real binary: with
// several security alternatives, the credential arrives where the scheme
// it fits says — a bearer token is not forced into basic auth on a spec
// that lists basic first, user:password goes as basic on one that lists
// bearer first, credential.scheme picks explicitly — and an operation that
// declares security: [] is sent without it. The audit record says where it
// went; the reply never holds it.
func TestCredentialFitsScheme(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const token = "tok-e2e-0123456789abcdef"
	const pair = "AC0123456789:authtoken-e2e-abcdef"
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte(pair))
	d := e.CoreConfig("creds")
	conn := func(slug, security, secret string, extra map[string]any) map[string]any {
		c := map[string]any{"slug": slug, "spec": credSpec(t, e.Dir, slug, security),
			"base_url": fmt.Sprintf("http://127.0.0.1:%d", e.Up.Port), "allow_private": []string{"127.0.0.1/32"},
			"credential": map[string]any{"secret": secret}}
		for k, v := range extra {
			c["credential"].(map[string]any)[k] = v
		}
		return c
	}
	d["connectors"] = []map[string]any{
		conn("basic-first", "[{basic: []}, {bearer: []}]", "token-key", nil),
		conn("bearer-first", "[{bearer: []}, {basic: []}]", "pair-key", nil),
		conn("named", "[{basic: []}, {bearer: []}]", "pair-key", map[string]any{"scheme": "bearer"}),
		conn("oauth-or-key", "[{oauth: []}, {hdr: []}]", "token-key", nil),
	}
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{"basic-first", "bearer-first", "named", "oauth-or-key"}}}
	d["policies"] = []map[string]any{{"match": "*", "action": "allow"}}
	path := e.Write(d)
	e.SetSecret(path, "token-key", token)
	e.SetSecret(path, "pair-key", pair)
	if out, err := e.CLI("", "validate", "--config", path); err != nil || strings.Contains(out, "error:") {
		t.Fatalf("sluice validate: %v\n%s", err, out)
	}
	g := e.Start(d, path)

	cases := []struct {
		tool, args, threat string
		header, want       string // the upstream's header and its value ("" = absent)
		where              string // the audit record's credential field
	}{
		{"basic-first.list_tickets", `{}`, "spec lists basic first; the stored credential is a token (no ':')",
			"Authorization", "Bearer " + token, "bearer"},
		{"bearer-first.list_tickets", `{}`, "spec lists bearer first; the stored credential is user:password",
			"Authorization", basic, "basic"},
		{"named.list_tickets", `{}`, "user:password with credential.scheme: bearer on a basic-first spec",
			"Authorization", "Bearer " + pair, "bearer"},
		{"oauth-or-key.list_tickets", `{}`, "spec offers oauth2 (not attachable) or an API key header",
			"X-Api-Key", token, "header:X-Api-Key"},
		{"basic-first.get_ticket", `{"path":{"id":"t-1"}}`, "operation declares security: [] (explicitly none)",
			"Authorization", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.tool, func(t *testing.T) {
			c := casebook.Expect(t, "D12", tc.threat, fmt.Sprintf("200; upstream %s %s; audit credential %q; reply without the secret", tc.header, redact(tc.want, token, pair), tc.where))
			before := len(e.Up.Requests())
			r := g.For(t).Call(agentA, tc.tool, tc.args)
			expect(t, r, http.StatusOK, "")
			reqs := e.Up.Requests()
			if len(reqs) != before+1 {
				t.Fatalf("upstream saw %d new requests, want 1", len(reqs)-before)
			}
			got := reqs[len(reqs)-1].Header.Get(tc.header)
			var rec map[string]any // the decision record is durable before the dial
			for _, a := range g.AuditRecords() {
				if a["request_id"] == r.RequestID && a["event"] == "decision" {
					rec, _ = a["fields"].(map[string]any)
				}
			}
			where, _ := rec["credential"].(string)
			c.Observef("%d; upstream %s %s; audit credential %q", r.Status, tc.header, redact(got, token, pair), where)
			if got != tc.want {
				t.Errorf("upstream %s = %q, want %q", tc.header, redact(got, token, pair), redact(tc.want, token, pair))
			}
			if h := reqs[len(reqs)-1].Header; tc.want == "" && (h.Get("Authorization") != "" || h.Get("X-Api-Key") != "") {
				t.Errorf("an operation with security: [] carried a credential: %v", h)
			}
			if where != tc.where {
				t.Errorf("audit decision credential = %q, want %q (%v)", where, tc.where, rec)
			}
			for _, s := range []string{token, pair, "authtoken-e2e-abcdef"} {
				if strings.Contains(string(r.Raw), s) {
					t.Error("the reply holds the credential")
				}
			}
		})
	}
}

// redact names a credential value in test output without printing it.
func redact(v, token, pair string) string {
	if v == "" {
		return "(absent)"
	}
	return strings.NewReplacer(token, "<token>", pair, "<user:password>", base64.StdEncoding.EncodeToString([]byte(pair)), "<base64 user:password>").Replace(v)
}

// TestValidateFlagsRuntimeFailures: `sluice validate` through the real
// binary reports, in one run, every configuration that would fail at
// runtime — a credential with nowhere to go, a credential that fits two
// alternatives, a private base_url no allow_private covers, an ask rule
// nobody can approve — each naming its key, and exits non-zero; serve
// refuses the credential problems the same way. Warnings (an allow_private
// wider than needed) print and exit 0.
func TestValidateFlagsRuntimeFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	noSec := filepath.Join(e.Dir, "nosec.yaml")
	if err := os.WriteFile(noSec, []byte(`openapi: 3.0.3
info: { title: nosec, version: "1" }
paths:
  /tickets:
    get:
      operationId: listTickets
      responses: { "200": { description: ok } }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", e.Up.Port)
	doc := func(conns ...map[string]any) gwenv.Doc {
		d := e.CoreConfig("validate")
		d["connectors"] = conns
		var slugs []string
		for _, c := range conns {
			slugs = append(slugs, c["slug"].(string))
		}
		d["agents"] = []map[string]any{{"name": "agent-a", "connectors": slugs}}
		d["policies"] = []map[string]any{{"match": "*", "action": "allow"}}
		return d
	}
	cred := map[string]any{"secret": "tickets-key"}
	nowhere := map[string]any{"slug": "nowhere", "spec": noSec, "base_url": base, "allow_private": []string{"127.0.0.1/32"}, "credential": cred}
	ambiguous := map[string]any{"slug": "ambiguous", "spec": credSpec(t, e.Dir, "ambiguous", "[{hdr: []}, {qry: []}]"),
		"base_url": base, "allow_private": []string{"127.0.0.1/32"}, "credential": cred}
	private := map[string]any{"slug": "private", "spec": credSpec(t, e.Dir, "private", "[{hdr: []}]"), "base_url": "https://10.1.2.3:8443", "credential": cred}
	validate := func(d gwenv.Doc) (string, error) { return e.CLI("", "validate", "--config", e.Write(d)) }

	t.Run("every problem in one run", func(t *testing.T) {
		c := casebook.Expect(t, "D12", "sluice validate on a credential with no securitySchemes and no header/query, one that fits two alternatives, a private base_url and an unapprovable ask rule",
			"exit non-zero; one error per problem, each naming its key; serve refuses the credential problems")
		d := doc(nowhere, ambiguous, private)
		d["policies"] = []map[string]any{{"match": "*", "action": "ask", "approvers": []string{"group:finance"}}}
		out, err := validate(d)
		want := []string{
			"connectors[0].credential: no operation of the spec declares a security requirement, so the credential would go nowhere; set credential.header or credential.query",
			"connectors[1].credential: the credential, a token (it has no ':', so it cannot be user:password), fits more than one security alternative of ambiguous.list_tickets: hdr (apiKey in header X-Api-Key) or qry (apiKey in query api_key); set credential.scheme",
			"connectors[2].base_url: 10.1.2.3 is a private address and no connectors[2].allow_private entry covers it: the guard refuses every call; add 10.1.2.3/32 to allow_private",
			"policies[0]: nobody can approve this ask rule: approvers.users is empty and approvers.oidc is not set",
		}
		missing := 0
		for _, w := range want {
			if !strings.Contains(out, w) {
				missing++
				t.Errorf("validate output does not say %q", w)
			}
		}
		c.Observef("exit %v, %d of %d problems named", err, len(want)-missing, len(want))
		if err == nil {
			t.Errorf("validate exited 0 with errors:\n%s", out)
		}
		if strings.Contains(out, e.Secret) {
			t.Error("validate printed the secret")
		}
		t.Logf("validate:\n%s", out)

		// serve refuses to start on the credential problems, naming them.
		g := e.Launch(d, e.Write(d))
		select {
		case <-g.Exited():
		case <-time.After(30 * time.Second):
			t.Fatal("serve started with a credential that has nowhere to go")
		}
		stderr := string(g.Stderr())
		for _, w := range want[:2] {
			if !strings.Contains(stderr, w) {
				t.Errorf("serve's refusal does not say %q:\n%s", w, stderr)
			}
		}
		if g.ExitErr() == nil {
			t.Error("serve exited 0")
		}
	})

	t.Run("fixed by the keys the errors name", func(t *testing.T) {
		c := casebook.Expect(t, "D12", "control: the same connectors with credential.header, credential.scheme and allow_private set",
			"exit 0; a warning names the narrower allow_private prefix")
		fixedNowhere := map[string]any{"slug": "nowhere", "spec": noSec, "base_url": base, "allow_private": []string{"127.0.0.1/32"},
			"credential": map[string]any{"secret": "tickets-key", "header": "Authorization", "prefix": "Token "}}
		fixedAmbiguous := map[string]any{"slug": "ambiguous", "spec": ambiguous["spec"], "base_url": base, "allow_private": []string{"127.0.0.1/32"},
			"credential": map[string]any{"secret": "tickets-key", "scheme": "hdr"}}
		fixedPrivate := map[string]any{"slug": "private", "spec": private["spec"], "base_url": "https://10.1.2.3:8443", "allow_private": []string{"10.0.0.0/8"}, "credential": cred}
		out, err := validate(doc(fixedNowhere, fixedAmbiguous, fixedPrivate))
		warned := strings.Contains(out, "warning: connectors[2].allow_private[0]: 10.0.0.0/8 admits 16777216 addresses where the base URL needs only 10.1.2.3: narrow it to 10.1.2.3/32")
		c.Observef("exit %v, warning names 10.1.2.3/32: %v", err, warned)
		if err != nil || strings.Contains(out, "error:") || !warned || !strings.Contains(out, "ok: 3 connectors") {
			t.Errorf("validate: %v\n%s", err, out)
		}
	})

	t.Run("allow_private over a metadata range", func(t *testing.T) {
		c := casebook.Expect(t, "C13", "allow_private: [169.254.0.0/16] on a connector, unacknowledged, then acknowledged",
			"exit non-zero naming connectors[0].allow_private[0] and allow_private_covers_metadata; acknowledged: no such error")
		m := map[string]any{"slug": "meta", "spec": private["spec"], "base_url": base, "allow_private": []string{"127.0.0.1/32", "169.254.0.0/16"}, "credential": cred}
		out, err := validate(doc(m))
		named := strings.Contains(out, "connectors[0].allow_private[1]: 169.254.0.0/16 overlaps the cloud metadata range 169.254.0.0/16") &&
			strings.Contains(out, "connectors[0].allow_private_covers_metadata: true")
		m["allow_private_covers_metadata"] = true
		ackOut, ackErr := validate(doc(m))
		c.Observef("exit %v, named %v; acknowledged: exit %v", err, named, ackErr)
		if err == nil || !named {
			t.Errorf("validate: %v\n%s", err, out)
		}
		if ackErr != nil || strings.Contains(ackOut, "metadata") {
			t.Errorf("acknowledged: %v\n%s", ackErr, ackOut)
		}
	})
}
