package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/audit"
)

// TestAuditSession: one session's records in order across two files
// (oldest first), none of another session's, agent-chosen control and
// bidi characters escaped for the terminal, --json as the log has them,
// and a non-zero exit for a session with no records or a record past a
// break in the chain.
func TestAuditSession(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	l, err := audit.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []audit.Record{
		{RequestID: "r1", Event: "decision", Fields: map[string]any{"session": "s-1", "tool": "t.a", "decision": "allow"}},
		{RequestID: "r2", Event: "decision", Fields: map[string]any{"session": "s-2", "tool": "t.b", "decision": "allow"}},
		{RequestID: "r3", Event: "decision", Fields: map[string]any{"session": "s-1", "kind": "connect", "dest_host": "evil\u202egpj.example\x1b[31m", "port": 443, "decision": "block", "code": "egress_denied"}},
		{RequestID: "r4", Event: "result", Fields: map[string]any{"session": "s-1", "tool": "t.a", "status": 200, "upstream_status": 401}},
		{RequestID: "r5", Event: "dns_answered", Fields: map[string]any{"session": "s-1", "kind": "dns", "dest_host": "pypi.org", "decision": "allow", "qtype": "A", "rcode": "NOERROR", "answers": 1}},
	} {
		if _, err := l.Append(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	out, _, err := cli(t, "", "audit", "session", "s-1", "--file", path)
	if err != nil {
		t.Fatalf("audit session: %v\n%s", err, out)
	}
	var reqs []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[len(f)-1], "r") && len(f[len(f)-1]) == 2 {
			reqs = append(reqs, f[len(f)-1])
		}
	}
	if strings.Join(reqs, ",") != "r1,r3,r4,r5" {
		t.Errorf("records %v, want r1, r3, r4, r5 in order:\n%s", reqs, out)
	}
	for _, want := range []string{"tunnel (decision)", `evil\u{202e}gpj.example\u{001b}[31m:443`, "refused egress_denied", "status 200 · upstream 401",
		"DNS question", "pypi.org", "A NOERROR · 1 answers", "4 records of session s-1", "chain: " + path + ": 5 records verify"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.ContainsAny(out, "\u202e\x1b") {
		t.Error("a raw control or bidi character reached the terminal")
	}

	jout, _, err := cli(t, "", "audit", "session", "s-1", "--file", path, "--json")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(jout), "\n")
	if len(lines) != 4 {
		t.Fatalf("--json: %d lines:\n%s", len(lines), jout)
	}
	for _, l := range lines {
		var rec audit.Record
		if json.Unmarshal([]byte(l), &rec) != nil || rec.Field("session") != "s-1" {
			t.Errorf("--json line %q", l)
		}
	}

	if out, _, err := cli(t, "", "audit", "session", "nobody", "--file", path); err == nil || !strings.Contains(err.Error(), "no records") {
		t.Errorf("an unknown session: %v\n%s", err, out)
	}

	// Break the chain at line 3: s-1's records from there are marked.
	data, _ := os.ReadFile(path)
	ls := strings.SplitAfter(string(data), "\n")
	ls[2] = strings.Replace(ls[2], `"decision":"block"`, `"decision":"allow"`, 1)
	if err := os.WriteFile(path, []byte(strings.Join(ls, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err = cli(t, "", "audit", "session", "s-1", "--file", path)
	if err == nil || !strings.Contains(out, "BROKEN at line 3") || !strings.Contains(out, "FAIL: 3 of these records") || !strings.Contains(out, "\n!3 ") {
		t.Errorf("a broken chain: %v\n%s", err, out)
	}
}
