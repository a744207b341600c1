//go:build linux

package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/sluice-gw/sluice/gateway/replay"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestPolicyReplay records real traffic with the real binary (every
// decision record carrying its input), stops the gateway, and replays the
// audit log with candidate policies: a tightening shows exactly the calls
// it changes and none else, a loosening fails --fail-on loosened, and an
// edited log is refused naming its line.
func TestPolicyReplay(t *testing.T) {
	requireHost(t)
	e := newEnv(t)
	d := e.BaseConfig("replay")
	d["policies"] = []map[string]any{
		{"match": "tickets.list_tickets", "action": "allow"},
		{"match": "tickets.get_ticket", "action": "allow"},
		{"match": "tickets.create_refund", "action": "ask", "approvers": []string{"group:finance"}},
		{"match": "tickets.delete_ticket", "action": "block"},
		{"match": "*", "action": "block"},
	}
	recorded := d["policies"] // the rules the traffic was decided by
	path := e.Write(d)
	g := e.Start(d, path)
	for _, c := range []struct{ tool, args string }{
		{"tickets.list_tickets", `{}`},
		{"tickets.get_ticket", `{"path":{"id":"1"}}`},
		{"tickets.get_ticket", `{"path":{"id":"2"}}`},
		{"tickets.get_ticket", `{"path":{"id":"2"}}`},
		{"tickets.create_refund", `{"body":{"amount":5,"reason":"dup"}}`},
		{"tickets.create_refund", `{"body":{"amount":5000,"reason":"big"}}`},
		{"tickets.delete_ticket", `{"path":{"id":"3"}}`},
	} {
		if r := g.Call(agentA, c.tool, c.args); r.Status >= 500 {
			t.Fatalf("%s: %d %s", c.tool, r.Status, r.Body)
		}
	}
	// The decision record carries the input: arguments included, the
	// credential never (D9's sweep at cleanup covers every file too).
	var rec map[string]any
	for _, r := range g.AuditEvent("hold_created", "") {
		if in, ok := r["fields"].(map[string]any)["input"].(map[string]any); ok {
			if body, _ := in["args"].(map[string]any)["body"].(map[string]any); body["amount"] == 5000.0 {
				rec = r
			}
		}
	}
	if rec == nil {
		t.Fatalf("no hold_created record carries the refund's input with its amount: %v", g.AuditEvent("hold_created", ""))
	}
	raw, _ := json.Marshal(rec)
	if strings.Contains(string(raw), e.Secret) {
		t.Fatal("the recorded input holds the connector's credential")
	}
	g.Stop()
	audit := filepath.Join(e.Dir, "replay-audit.log")

	// Tightening: a module asks for ticket 2 and blocks refunds over 1000.
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tighten.rego"), `package sluice.policies.tighten

decisions contains {"action": "ask", "reason": "ticket 2 is sensitive", "rule": "ticket2", "approvers": ["group:finance"]} if {
	input.tool == "tickets.get_ticket"
	input.args.path.id == "2"
}

decisions contains {"action": "block", "reason": "refunds over 1000", "rule": "big_refund"} if {
	input.tool == "tickets.create_refund"
	input.args.body.amount > 1000
}
`)
	out, err := e.CLI("", "policy", "replay", "--config", path, "--audit", audit, "--policy", dir, "--json", "--fail-on", "loosened")
	if err != nil {
		t.Fatalf("a tightening must not fail --fail-on loosened: %v\n%s", err, out)
	}
	rep := decodeReport(t, out)
	if rep.Replayed != 7 || rep.Decisions != 7 || len(rep.Skipped) != 0 {
		t.Fatalf("replayed %d of %d decisions, skipped %v; want all 7 and none skipped\n%s", rep.Replayed, rep.Decisions, rep.Skipped, out)
	}
	want := map[string]int{
		"tickets.get_ticket allow→ask policies[1]→ticket2":       2,
		"tickets.create_refund ask→block policies[2]→big_refund": 1,
	}
	got := map[string]int{}
	for _, c := range rep.Changes {
		got[c.Tool+" "+c.From+"→"+c.To+" "+c.FromRule+"→"+c.ToRule] = c.Count
		if c.Loosened || len(c.Examples) == 0 || c.Examples[0].Seq == 0 {
			t.Errorf("change %+v: want not loosened, with examples naming their seq", c)
		}
	}
	if len(got) != len(want) || got["tickets.get_ticket allow→ask policies[1]→ticket2"] != 2 || got["tickets.create_refund ask→block policies[2]→big_refund"] != 1 {
		t.Fatalf("changes %v, want exactly %v", got, want)
	}
	if rep.Changed != 3 || rep.Unchanged != 4 || rep.Loosened != 0 {
		t.Fatalf("changed %d unchanged %d loosened %d; want 3, 4, 0", rep.Changed, rep.Unchanged, rep.Loosened)
	}
	replayMemo(t, e, path, audit, dir)

	// Loosening: refunds allowed. --fail-on loosened exits 1.
	loose := t.TempDir()
	writeFile(t, filepath.Join(loose, "loose.rego"), `package sluice.policies.loose

decisions contains {"action": "allow", "reason": "refunds are fine", "rule": "refunds_ok"} if input.tool == "tickets.create_refund"
`)
	d["policies"] = []map[string]any{
		{"match": "tickets.list_tickets", "action": "allow"},
		{"match": "tickets.get_ticket", "action": "allow"},
		{"match": "tickets.delete_ticket", "action": "block"},
	}
	d.Gateway()["sandbox_socket"] = filepath.Join(e.Dir, "candidate.sock") // Write names the file after it
	candidate := e.Write(d)
	cmd := exec.Command(e.Bin, "policy", "replay", "--config", candidate, "--audit", audit, "--policy", loose, "--fail-on", "loosened")
	text, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("a loosening must exit 1 with --fail-on loosened: %v\n%s", err, text)
	}
	if !strings.Contains(string(text), "ask → allow  LOOSENED") || !strings.Contains(string(text), "2 recorded calls would now be let through further") {
		t.Fatalf("the table must name the loosened refunds:\n%s", text)
	}

	// The candidate as an OPA bundle (written by OPA's own bundle writer):
	// its module reads the refund limit from the bundle's data, so only
	// the 5000 refund changes, ask → block by the bundle's rule.
	limit := `package sluice.policies.limits

decisions contains {"action": "block", "reason": "over the bundle's refund limit", "rule": "refund_limit"} if {
	input.tool == "tickets.create_refund"
	input.args.body.amount > data.limits.refund
}
`
	roots := []string{"sluice/policies/limits", "limits"}
	bun := bundle.Bundle{
		Manifest: bundle.Manifest{Revision: "r-limits-1", Roots: &roots},
		Data:     map[string]any{"limits": map[string]any{"refund": 1000}},
		Modules:  []bundle.ModuleFile{{URL: "/limits/limits.rego", Path: "/limits/limits.rego", Raw: []byte(limit)}},
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).DisableFormat(true).Write(bun); err != nil {
		t.Fatal(err)
	}
	bundlePath := filepath.Join(t.TempDir(), "limits.tar.gz")
	writeFile(t, bundlePath, buf.String())
	out, err = e.CLI("", "policy", "replay", "--config", path, "--audit", audit, "--bundle", bundlePath, "--json")
	if err != nil {
		t.Fatalf("replay --bundle: %v\n%s", err, out)
	}
	rep = decodeReport(t, out)
	if rep.Replayed != 7 || rep.Changed != 1 || rep.Unchanged != 6 || len(rep.Changes) != 1 ||
		rep.Changes[0].Tool != "tickets.create_refund" || rep.Changes[0].From != "ask" || rep.Changes[0].To != "block" ||
		rep.Changes[0].ToRule != "refund_limit" || rep.Changes[0].Count != 1 {
		t.Fatalf("replay --bundle: want exactly the 5000 refund ask → block by refund_limit:\n%s", out)
	}
	// A bundle that does not load: an error, no report.
	broken := filepath.Join(t.TempDir(), "broken.tar.gz")
	writeFile(t, broken, "not a gzip stream")
	out, err = e.CLI("", "policy", "replay", "--config", path, "--audit", audit, "--bundle", broken, "--json")
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, "bundle") || strings.Contains(out, `"changes"`) {
		t.Fatalf("a bundle that does not load must be an error with no report: %v\n%s", err, out)
	}

	// A signed candidate: the config requires a signature
	// (policy.bundle.verification), and --bundle is held to it.
	d["policies"] = recorded
	replaySignedBundle(t, e, d, audit, bun)

	// An edited record breaks the chain: an error naming file and line.
	b, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	for i, l := range lines {
		if strings.Contains(l, `"amount":5000`) {
			lines[i] = strings.Replace(l, `"amount":5000`, `"amount":5`, 1)
			edited := filepath.Join(e.Dir, "edited-audit.log")
			writeFile(t, edited, strings.Join(lines, ""))
			c := casebook.Expect(t, "F15", "sluice policy replay of an audit log with one record's argument edited",
				"exit 1, an error naming the file and the edited line, no report")
			out, err := e.CLI("", "policy", "replay", "--config", path, "--audit", edited, "--policy", dir, "--json")
			c.Observef("%v: %s", err, strings.TrimSpace(out))
			var ee *exec.ExitError
			want := fmt.Sprintf("edited-audit.log line %d: the audit chain is broken", i+1)
			if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, want) || strings.Contains(out, `"changes"`) {
				t.Fatalf("an edited log must be refused naming its line (%q), with no report: %v\n%s", want, err, out)
			}
			return
		}
	}
	t.Fatal("no record of the 5000 refund to edit")
}

// replaySignedBundle replays the limits bundle signed as `opa sign` signs
// (OPA's own signer, RS256) with a config whose policy.bundle.verification
// names the public key: the good signature replays; a byte changed after
// signing, another key's signature or none at all exits 1 naming the
// signature failure, with no report (F19).
func replaySignedBundle(t *testing.T, e *gwenv.Env, d gwenv.Doc, audit string, bun bundle.Bundle) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pub := filepath.Join(dir, "bundle.pub")
	writeFile(t, pub, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})))
	write := func(name string, k *rsa.PrivateKey, tamper bool) string {
		b := bun
		b.Signatures = bundle.SignaturesConfig{}
		b.Modules = append([]bundle.ModuleFile(nil), bun.Modules...)
		if k != nil {
			der, err := x509.MarshalPKCS8PrivateKey(k)
			if err != nil {
				t.Fatal(err)
			}
			priv := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
			if err := b.GenerateSignature(bundle.NewSigningConfig(priv, "RS256", ""), "default", false); err != nil {
				t.Fatal(err)
			}
		}
		if tamper { // one byte of the signed module (in the reason text)
			raw := bytes.Clone(b.Modules[0].Raw)
			raw[bytes.Index(raw, []byte("over the"))] = 'O'
			b.Modules[0].Raw = raw
		}
		var buf bytes.Buffer
		if err := bundle.NewWriter(&buf).DisableFormat(true).Write(b); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name+".tar.gz")
		writeFile(t, p, buf.String())
		return p
	}
	good := write("signed", key, false)
	d["policy"] = map[string]any{"bundle": map[string]any{"file": good, "verification": map[string]any{"key_file": pub}}}
	d.Gateway()["sandbox_socket"] = filepath.Join(e.Dir, "signed.sock") // Write names the file after it
	cfg := e.Write(d)

	out, err := e.CLI("", "policy", "replay", "--config", cfg, "--audit", audit, "--bundle", good, "--json")
	if err != nil {
		t.Fatalf("replay --bundle with a good signature: %v\n%s", err, out)
	}
	rep := decodeReport(t, out)
	if rep.Replayed != 7 || rep.Changed != 1 || len(rep.Changes) != 1 || rep.Changes[0].ToRule != "refund_limit" {
		t.Fatalf("replay of the signed bundle: want the 5000 refund ask → block by refund_limit:\n%s", out)
	}

	c := casebook.Expect(t, "F19", "a candidate OPA bundle whose signature does not verify given to `sluice policy replay --bundle` under policy.bundle.verification",
		"exit 1 naming the signature failure (digest mismatch, verification error, missing .signatures.json); nothing replayed, no report")
	var seen []string
	for _, tc := range []struct{ name, file, want string }{
		{"a byte changed after signing", write("tampered", key, true), "digest mismatch"},
		{"signed by another key", write("other", other, false), "verification"},
		{"unsigned", write("unsigned", nil, false), "missing .signatures.json"},
	} {
		out, err := e.CLI("", "policy", "replay", "--config", cfg, "--audit", audit, "--bundle", tc.file, "--json")
		seen = append(seen, fmt.Sprintf("%s: %v: %s", tc.name, err, strings.TrimSpace(out)))
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(strings.ToLower(out), tc.want) || strings.Contains(out, `"changes"`) {
			t.Errorf("%s: want exit 1 naming %q and no report: %v\n%s", tc.name, tc.want, err, out)
		}
	}
	c.Observef("%s", strings.Join(seen, " | "))
}

func decodeReport(t *testing.T, out string) replay.Report {
	t.Helper()
	var rep replay.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("replay --json: %v\n%s", err, out)
	}
	return rep
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replayMemo: the memo answers only what it may. With the tightening on
// one worker, the two identical reads of ticket 2 are evaluated once and
// the report is --no-memo's; a candidate calling time.now_ns turns the
// memo off, saying why, and every record is evaluated.
func replayMemo(t *testing.T, e *gwenv.Env, path, audit, tighten string) {
	c := casebook.Expect(t, "F20", "sluice policy replay of candidates the memo can and cannot answer for (a tightening reading tool and arguments; a rule calling time.now_ns)",
		"the tightening: memo on, fewer evaluations than records, the same report as --no-memo; the clock rule: memo off naming time.now_ns, every record evaluated")
	run := func(args ...string) replay.Report {
		t.Helper()
		out, err := e.CLI("", append([]string{"policy", "replay", "--config", path, "--audit", audit, "--json"}, args...)...)
		if err != nil {
			t.Fatalf("replay %v: %v\n%s", args, err, out)
		}
		return decodeReport(t, out)
	}
	memo := run("--policy", tighten, "--workers", "1")
	plain := run("--policy", tighten, "--no-memo")
	clock := t.TempDir()
	writeFile(t, filepath.Join(clock, "clock.rego"), `package sluice.policies.clock

decisions contains {"action": "ask", "reason": "now", "rule": "clock"} if time.now_ns() > 0
`)
	off := run("--policy", clock)
	c.Observef("tightening: memo %q, %d evaluations for %d records, --no-memo %d; clock rule: memo %q, %d evaluations for %d records",
		memo.Memo, memo.Evaluated, memo.Replayed, plain.Evaluated, off.Memo, off.Evaluated, off.Replayed)
	if memo.Memo != "on" || memo.Evaluated != memo.Replayed-1 || plain.Evaluated != plain.Replayed || !reflect.DeepEqual(memo.Changes, plain.Changes) ||
		memo.Unchanged != plain.Unchanged || memo.Replayed != 7 {
		t.Fatalf("tightening with the memo %+v\nwithout %+v", memo, plain)
	}
	if !strings.HasPrefix(off.Memo, "off: the policy calls time.now_ns") || off.Evaluated != off.Replayed || off.Replayed != 7 {
		t.Fatalf("clock rule: %+v", off)
	}
}
