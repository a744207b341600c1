package review

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/audit"
)

var lineRE = regexp.MustCompile(`<tr class="row[^"]*" data-line="(\d+)"`)

// lines lists the data-line of each table row, in page order.
func lines(body string) []string {
	var out []string
	for _, m := range lineRE.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestAuditTable: newest first, each filter narrows to exact matches,
// paging by line keeps its filters, and the badge says whether the chain
// verifies through the newest record shown — broken on a page past an
// edited record, verified on a page before it (THREATS F12).
func TestAuditTable(t *testing.T) {
	var recs []audit.Record
	for i := 1; i <= 12; i++ {
		user, tool, dec := "bob", "payments.get_invoice", "allow"
		if i%3 == 0 {
			user, tool, dec = "carol", "payments.create_refund", "ask"
		}
		recs = append(recs, audit.Record{RequestID: fmt.Sprintf("r%d", i), Event: "decision",
			Fields: map[string]any{"tool": tool, "user": user, "decision": dec, "session": "s-" + user}})
	}
	recs = append(recs, audit.Record{Event: "hold_created", Fields: map[string]any{"hold": "h-1", "tool": "payments.create_refund",
		"user": "carol", "session": "s-carol", "decision": "ask"}})
	path := auditFile(t, recs...)
	e := newEnv(t, func(o *Options) { o.AuditFile = path })
	b := e.browser()
	b.login("alice", "alice-pw")

	_, body := b.get("/audit?n=5")
	if got := lines(body); fmt.Sprint(got) != "[13 12 11 10 9]" {
		t.Fatalf("first page lines %v, want the 5 newest, newest first", got)
	}
	if !strings.Contains(body, `id="chain-badge"`) || !strings.Contains(body, "Chain verifies up to the last record shown (line 13)") {
		t.Fatalf("no verified badge:\n%s", body)
	}
	older := regexp.MustCompile(`id="older" href="([^"]+)"|href="([^"]+)" id="older"`).FindStringSubmatch(body)
	if older == nil {
		t.Fatal("no link to older records")
	}
	_, body2 := b.get(strings.ReplaceAll(older[1]+older[2], "&amp;", "&"))
	if got := lines(body2); fmt.Sprint(got) != "[8 7 6 5 4]" {
		t.Fatalf("second page lines %v", got)
	}
	if !strings.Contains(body2, `id="newer"`) {
		t.Fatal("no link back to newer records")
	}

	for _, c := range []struct{ q, want string }{
		{"user=carol", "[13 12 9 6 3]"},
		{"tool=payments.create_refund&decision=ask", "[13 12 9 6 3]"},
		{"event=hold_created", "[13]"},
		{"hold=h-1", "[13]"},
		{"session=s-bob&n=3", "[11 10 8]"},
		{"user=nobody", "[]"},
	} {
		if _, body := b.get("/audit?" + c.q); fmt.Sprint(lines(body)) != c.want {
			t.Errorf("/audit?%s: lines %v, want %s", c.q, lines(body), c.want)
		}
	}

	// Edit line 10 (its user) and add a line that is not a record.
	data, _ := os.ReadFile(path)
	ls := strings.SplitAfter(string(data), "\n")
	ls[9] = strings.Replace(ls[9], `"user":"bob"`, `"user":"eve"`, 1)
	ls = append(ls, "garbage\n")
	if err := os.WriteFile(path, []byte(strings.Join(ls, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, body = b.get("/audit?n=5")
	if !strings.Contains(body, "Chain broken at line 10") || !strings.Contains(body, "hash mismatch") || !strings.Contains(body, `class="chain broken"`) {
		t.Fatalf("tampered: no broken badge:\n%s", body)
	}
	if !strings.Contains(body, "line 14: not a record") {
		t.Error("the garbage line is not reported")
	}
	if got := lines(body); fmt.Sprint(got) != "[14 13 12 11 10]" {
		t.Fatalf("tampered first page %v", got)
	}
	_, body = b.get("/audit?n=5&before=10")
	if !strings.Contains(body, "Chain verifies up to the last record shown (line 9)") {
		t.Fatalf("the page before the edit should verify:\n%s", body)
	}
	_, body = b.get("/audit?user=eve")
	if fmt.Sprint(lines(body)) != "[10]" || !strings.Contains(body, "not verified") {
		t.Fatalf("the edited record is listed, marked unverified: %v", lines(body))
	}
}

// TestTimeline: one session's records, oldest first, and none of another's.
func TestTimeline(t *testing.T) {
	path := auditFile(t,
		audit.Record{Event: "decision", Fields: map[string]any{"tool": "payments.create_refund", "session": "s-1", "decision": "ask"}},
		audit.Record{Event: "decision", Fields: map[string]any{"kind": "connect", "dest_host": "pypi.org", "port": 443, "session": "s-2"}},
		audit.Record{Event: "hold_created", Fields: map[string]any{"hold": "h-1", "tool": "payments.create_refund", "session": "s-1"}},
		audit.Record{Event: "dns_refused", Fields: map[string]any{"kind": "dns", "dest_host": "evil.example", "session": "s-1", "code": "egress_denied"}},
		audit.Record{Event: "decision", Fields: map[string]any{"kind": "http", "dest_host": "files.example", "port": 80, "session": "s-1", "decision": "allow"}},
		audit.Record{Event: "decision", Fields: map[string]any{"tool": "t.slash", "session": "team/s 9"}},
		// As the gateway writes a session's first question of a name (dnsAnswered).
		audit.Record{Event: "dns_answered", Fields: map[string]any{"kind": "dns", "dest_host": "pkg.example", "session": "s-1", "decision": "allow",
			"qtype": "AAAA", "rcode": "NOERROR", "answers": 2}},
	)
	e := newEnv(t, func(o *Options) { o.AuditFile = path })
	b := e.browser()
	b.login("alice", "alice-pw")
	_, body := b.get("/sessions/s-1")
	if got := lines(body); fmt.Sprint(got) != "[1 3 4 5 7]" {
		t.Fatalf("timeline lines %v, want s-1's in order", got)
	}
	for _, want := range []string{"tool call", "hold", "DNS question", "evil.example", "refused egress_denied", "proxied request", "files.example:80", "Chain verifies",
		"pkg.example", "AAAA NOERROR · 2 answers"} {
		if !strings.Contains(body, want) {
			t.Errorf("timeline lacks %q", want)
		}
	}
	if strings.Contains(body, "pypi.org") {
		t.Error("another session's record is on the timeline")
	}
	// A session name with a slash and a space is one path segment, escaped.
	_, body = b.get("/audit?tool=t.slash")
	if !strings.Contains(body, `href="/sessions/team%2Fs%209"`) {
		t.Fatalf("the session link is not escaped:\n%s", body)
	}
	if _, body = b.get("/sessions/team%2Fs%209"); fmt.Sprint(lines(body)) != "[6]" {
		t.Fatalf("timeline of %q: %v", "team/s 9", lines(body))
	}
}
