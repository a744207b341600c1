//go:build linux

package attack

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// signedBundle is an OPA bundle that blocks tool frozen, signed (as `opa
// sign` does) with key when key is set.
func signedBundle(t *testing.T, revision, frozen string, key *rsa.PrivateKey) []byte {
	t.Helper()
	roots := []string{"sluice/policies/bundled", "bundled"}
	b := bundle.Bundle{
		Manifest: bundle.Manifest{Revision: revision, Roots: &roots},
		Data:     map[string]any{"bundled": map[string]any{"frozen": []any{frozen}}},
		Modules: []bundle.ModuleFile{{URL: "/bundled.rego", Path: "/bundled.rego", Raw: []byte(`package sluice.policies.bundled

decisions contains {"action": "block", "reason": "frozen by the bundle", "rule": "bundled.frozen"} if {
	input.tool in data.bundled.frozen
}
`)}},
	}
	if key != nil {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.GenerateSignature(bundle.NewSigningConfig(string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})), "RS256", ""), "default", false); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).DisableFormat(true).Write(b); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestBadlySignedBundleRefused is THREATS C20 (reserved as C16; renumbered: main's mcp19 took C16) through the real binary: a
// bundle server (inside the test's namespace) that starts serving a bundle
// signed by another key, or an unsigned one, does not change what decides.
func TestBadlySignedBundleRefused(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pub := filepath.Join(e.Dir, "bundle.pub")
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	body := signedBundle(t, "r1", "tickets.list_tickets", key)
	etag := `"r1"`
	ln := e.NS.Listen(t, "127.0.0.1:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		b, tag := body, etag
		mu.Unlock()
		if r.Header.Get("If-None-Match") == tag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", tag)
		_, _ = w.Write(b)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	d := e.BaseConfig("bundle")
	d["policy"] = map[string]any{"bundle": map[string]any{
		"url": "http://" + ln.Addr().String() + "/sluice.tar.gz", "poll": "100ms",
		"verification": map[string]any{"key_file": pub},
	}}
	g := e.Start(d, e.Write(d)).For(t)
	if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Code != "policy_block" || !strings.Contains(r.Message, "frozen by the bundle") {
		t.Fatalf("r1 (signed by the configured key): %d %s, want the bundle's block", r.Status, r.Body)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"signed by another key", signedBundle(t, "r-other", "tickets.create_refund", other)},
		{"unsigned", signedBundle(t, "r-unsigned", "tickets.create_refund", nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "C20", "the bundle server starts serving a bundle "+tc.name+" (revision that unfreezes tickets.list_tickets)",
				"refused: logged 'bundle rejected', counted in sluice_policy_bundle_loads_total{result=\"error\"}; revision r1 keeps deciding (list_tickets still 403 policy_block)")
			before := bundleErrors(t, g)
			mu.Lock()
			body, etag = tc.b, `"`+tc.name+`"`
			mu.Unlock()
			deadline := time.Now().Add(10 * time.Second)
			for bundleErrors(t, g) == before && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			after := bundleErrors(t, g)
			r := g.Call(agentA, "tickets.list_tickets", `{}`)
			logged := g.AwaitLog("bundle rejected", func(l map[string]any) bool {
				return strings.Contains(l["msg"].(string), "bundle rejected")
			}) != nil
			_, m, _ := g.AdminGet("/metrics")
			c.Observef("bundle errors %s -> %s; list_tickets %d %s; logged %v; revision r1 on /metrics %v", before, after, r.Status, r.Code, logged,
				strings.Contains(string(m), `sluice_policy_revision_info{revision="r1"} 1`))
			if after == before || r.Code != "policy_block" || !logged || !strings.Contains(string(m), `revision="r1"`) {
				t.Errorf("bundle %s was not refused as designed", tc.name)
			}
		})
	}
}

func bundleErrors(t *testing.T, g *gwenv.Gateway) string {
	_, m, err := g.AdminGet("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(m)) {
		if strings.HasPrefix(l, `sluice_policy_bundle_loads_total{result="error"}`) {
			return strings.TrimSpace(strings.Fields(l)[1])
		}
	}
	return "absent"
}

// TestCredentialInArgumentsBlocked is THREATS D14 through the real
// binary: an agent puts a credential-shaped string (a Stripe live key) in
// a tool argument of a tool it may call; the gateway's scanner puts it in
// input.findings (kind and location, never the value) and the shipped
// example rule (rego/examples/findings.rego) blocks it before anything is
// sent.
func TestCredentialInArgumentsBlocked(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	examples, err := filepath.Abs("../../rego/examples")
	if err != nil {
		t.Fatal(err)
	}
	d := e.BaseConfig("findings")
	d["rego"] = []string{examples}
	g := e.Start(d, e.Write(d)).For(t)
	const key = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
	c := casebook.Expect(t, "D14", "agent-a calls tickets.create_refund (held for finance otherwise) with a Stripe live key in the body's reason",
		"403 policy_block by findings.credential naming /args/body/reason; no hold, nothing reaches the upstream; the key in no finding, reason, audit field (beside the recorded input) or log line")
	n := len(e.Up.Requests())
	r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":5,"reason":"use `+key+`"}}`)
	sent := len(e.Up.Requests()) - n
	rec := g.AwaitAuditFields("decision", map[string]any{"rule": "findings.credential", "code": "policy_block"})
	f, _ := rec["fields"].(map[string]any)
	// The decision record's recorded input (audit.record_inputs) holds
	// the agent's own arguments, as sent; everything the gateway derived
	// — findings, reason, log lines — must not carry the value.
	recs := g.AuditRecords()
	for _, r := range recs {
		if rf, ok := r["fields"].(map[string]any); ok {
			delete(rf, "input")
		}
	}
	audit, _ := json.Marshal(recs)
	leaked := bytes.Contains(audit, []byte(key)) || bytes.Contains(g.Stderr(), []byte(key))
	c.Observef("%d %s %q; upstream requests %d; audit decision record: decision %v rule %v code %v tool %v; key in audit or log %v",
		r.Status, r.Code, r.Message, sent, f["decision"], f["rule"], f["code"], f["tool"], leaked)
	if r.Status != http.StatusForbidden || r.Code != "policy_block" || !strings.Contains(r.Message, "stripe_key") ||
		!strings.Contains(r.Message, "/args/body/reason") || sent != 0 || leaked || f["decision"] != "block" || f["tool"] != "tickets.create_refund" {
		t.Errorf("credential in an argument: %d %s %s", r.Status, r.Code, r.Body)
	}
	ok := casebook.Expect(t, "D14", "control: the same refund with an ordinary reason", "202: held for finance as the simple rule says")
	r = g.Call(agentA, "tickets.create_refund", `{"body":{"amount":5,"reason":"charged twice"}}`)
	ok.Observef("%d", r.Status)
	if r.Status != http.StatusAccepted {
		t.Errorf("control: %d %s", r.Status, r.Body)
	}
}

// TestReceiptTampered is THREATS E13 through the real binary: the signed
// receipt of an executed hold verifies offline with `sluice receipts
// verify`, and with one byte changed (the approver, the upstream status,
// the signature) it does not.
func TestReceiptTampered(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	d := e.BaseConfig("receipts")
	g := e.Start(d, e.Write(d)).For(t)
	r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":5}}`)
	var held struct {
		Hold struct{ ID string } `json:"hold"`
	}
	if err := json.Unmarshal(r.Body, &held); err != nil || held.Hold.ID == "" {
		t.Fatalf("refund: %d %s", r.Status, r.Body)
	}
	id := held.Hold.ID
	if st, code, _ := g.AdminDo("POST", "/api/v1/holds/"+id+"/approve", gwenv.CarolToken, `{}`); st != 200 {
		t.Fatalf("approve: %d %s", st, code)
	}
	get := func(path, token string) []byte {
		req, _ := http.NewRequest("GET", "http://"+g.Admin+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := g.AdminClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return b
	}
	receipt := get("/api/v1/holds/"+id+"/receipt", gwenv.CarolToken)
	var key struct {
		PEM string `json:"public_key_pem"`
	}
	if err := json.Unmarshal(get("/api/v1/receipts/key", ""), &key); err != nil {
		t.Fatal(err)
	}
	pub := filepath.Join(e.Dir, "receipts.pub")
	file := filepath.Join(e.Dir, "receipt.json")
	if err := os.WriteFile(pub, []byte(key.PEM), 0o644); err != nil {
		t.Fatal(err)
	}
	verify := func(b []byte) (string, error) {
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return e.CLI("", "receipts", "verify", file, "--key", pub)
	}
	ok := casebook.Expect(t, "E13", "control: the receipt of hold approved by carol, as served, verified offline",
		"sluice receipts verify exits 0 naming carol and the upstream's status")
	out, err := verify(receipt)
	ok.Observef("exit %v: %s", err, headLine(out))
	if err != nil || !strings.Contains(out, "by carol") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	for _, tc := range []struct{ name, from, to string }{
		{"the approver (carol -> darol)", `"approver":"carol"`, `"approver":"darol"`},
		{"the upstream status (200 -> 201)", `"upstream_status":200`, `"upstream_status":201`},
		{"one character of the signature", `"signature":"`, `"signature":"A`},
	} {
		c := casebook.Expect(t, "E13", "the receipt with one byte changed: "+tc.name, "sluice receipts verify exits non-zero")
		i := bytes.Index(receipt, []byte(tc.from))
		if i < 0 {
			t.Fatalf("receipt lacks %s: %s", tc.from, receipt)
		}
		bad := append([]byte(nil), receipt...)
		to := []byte(tc.to)
		if len(to) == len(tc.from) {
			copy(bad[i:], to)
		} else { // change the signature's first character in place
			j := i + len(tc.from)
			if bad[j] == 'A' {
				bad[j] = 'B'
			} else {
				bad[j] = 'A'
			}
		}
		out, err := verify(bad)
		c.Observef("exit %v: %s", err, headLine(out))
		if err == nil {
			t.Errorf("a receipt with %s verifies", tc.name)
		}
	}
}

func headLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

// TestBadDataDocumentRefused is THREATS F16 through the real binary: a
// data document beside the Rego is rewritten, while the gateway runs, into
// something that does not parse; the reload is refused naming the file and
// its line, and the previous data keeps deciding.
func TestBadDataDocumentRefused(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	dir := filepath.Join(e.Dir, "policies", "limits")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, src string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("limits.rego", `package sluice.policies.limits

decisions contains {"action": "block", "reason": "over the refund limit", "rule": "limits.refund"} if {
	input.tool == "tickets.create_refund"
	input.args.body.amount > data.limits.max_refund
}
`)
	write("data.json", `{"max_refund": 100}`)
	d := e.BaseConfig("data")
	d["rego"] = []string{filepath.Join(e.Dir, "policies")}
	g := e.Start(d, e.Write(d)).For(t)
	if r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":500}}`); r.Code != "policy_block" {
		t.Fatalf("refund of 500 with max_refund 100: %d %s", r.Status, r.Body)
	}
	c := casebook.Expect(t, "F16", "limits/data.json rewritten while serving to `{\"max_refund\": 1000,\\n \"oops\" 1}` (a missing colon on line 2)",
		"reload refused, logged naming limits/data.json:2 and sluice_data_error; max_refund 100 keeps deciding (a refund of 500 still 403)")
	write("data.json", "{\"max_refund\": 1000,\n \"oops\" 1}")
	line := g.AwaitLog("reload rejected", func(l map[string]any) bool {
		m, _ := l["msg"].(string)
		return strings.Contains(m, "reload rejected")
	})
	msg := fmt.Sprint(line["error"])
	r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":500}}`)
	named := strings.Contains(msg, filepath.Join("limits", "data.json")+":2:") && strings.Contains(msg, "sluice_data_error")
	c.Observef("log: %s; refund of 500: %d %s", msg, r.Status, r.Code)
	if !named || r.Code != "policy_block" {
		t.Errorf("bad data document: named %v; refund %d %s", named, r.Status, r.Body)
	}
	ok := casebook.Expect(t, "F16", "control: limits/data.json fixed to max_refund 1000", "a refund of 500 is held for finance (202) again")
	write("data.json", `{"max_refund": 1000}`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = g.Call(agentA, "tickets.create_refund", `{"body":{"amount":500}}`)
		if r.Status == http.StatusAccepted || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	ok.Observef("%d %s", r.Status, r.Code)
	if r.Status != http.StatusAccepted {
		t.Errorf("after the fix: %d %s", r.Status, r.Body)
	}
}
