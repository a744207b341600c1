//go:build linux

package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestIdentitiesCanonical is THREATS E8: identities are compared in one
// canonical form (case folded, NFKC). A hold requested for "Carol",
// "CAROL" or full-width "ｃａｒｏｌ" cannot be approved by the approver
// carol (403 self_approval_forbidden, audited, nothing sent); an identity
// whose user mixes scripts ("cаrol" with a Cyrillic а) is refused at the
// socket; ending session "S-CASE" ends the session sandboxes call "s-case".
func TestIdentitiesCanonical(t *testing.T) {
	requireHost(t)
	e := newEnv(t)
	d := mainConfig(e, "sluice")
	withApprovers(d, gwenv.CarolToken)
	d.Gateway()["session_tokens_sha256"] = []string{fmt.Sprintf("%x", sha256.Sum256([]byte(icptSessionToken)))}
	g := e.Start(d, e.Write(d))

	t.Run("self-approval under another spelling", func(t *testing.T) {
		cb := casebook.Expect(t, "E8", "the approver carol approves holds requested by users Carol, CAROL and ｃａｒｏｌ (full width)",
			"403 self_approval_forbidden for each, audited hold_self_approval_refused; the hold's user is carol; nothing sent upstream")
		for i, user := range []string{"Carol", "CAROL", "ｃａｒｏｌ"} {
			id := wire.Identity{Sandbox: "sb-e8", Agent: "agent-a", Session: "s-e8", User: user}
			r := g.For(t).Call(id, "tickets.create_refund", `{"body":{"amount":5,"reason":"dup"}}`)
			var held struct {
				Hold struct{ ID, Status string } `json:"hold"`
			}
			if err := json.Unmarshal(r.Body, &held); err != nil || r.Status != http.StatusAccepted {
				t.Fatalf("%q: ask %d %s, want 202", user, r.Status, r.Body)
			}
			st, _, m := g.AdminDo(http.MethodPost, "/api/v1/holds/"+held.Hold.ID+"/approve", gwenv.CarolToken, `{"reason":"mine"}`)
			errm, _ := m["error"].(map[string]any)
			if st != http.StatusForbidden || errm["code"] != "self_approval_forbidden" {
				t.Fatalf("%q: carol's approve: %d %v, want 403 self_approval_forbidden", user, st, m)
			}
			g.For(t).AwaitAuditFields("hold_created", map[string]any{"hold": held.Hold.ID, "user": "carol"})
			g.For(t).AwaitAuditFields("hold_self_approval_refused", map[string]any{"hold": held.Hold.ID, "by": "carol"})
			if n := len(e.Up.Requests()); n != 0 {
				t.Fatalf("after %d refused approvals the upstream saw %d requests", i+1, n)
			}
		}
		cb.Observe("3 spellings: 403 self_approval_forbidden each, hold_created user carol, hold_self_approval_refused by carol, 0 upstream requests")
	})
	t.Run("mixed-script user refused at the socket", func(t *testing.T) {
		cb := casebook.Expect(t, "E8", "a sandbox identity whose user is c\u0430rol (Cyrillic а) or carol\u0441 (Cyrillic с)",
			"400 identity_required naming the ambiguity; nothing decided")
		for _, id := range []wire.Identity{
			{Sandbox: "sb-e8", Agent: "agent-a", Session: "s-e8", User: "c\u0430rol"},
			{Sandbox: "sb-e8", Agent: "agent-a", Session: "s-e8", User: "carol\u0441"},
		} {
			// The answer comes as soon as the preamble is read.
			out, closed := g.For(t).Raw(id, []byte("GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n"), 5*time.Second)
			if !closed || !strings.HasPrefix(out, "HTTP/1.1 400 ") || !strings.Contains(out, `"identity_required"`) || !strings.Contains(out, "mixes Latin and Cyrillic") {
				t.Fatalf("user %q: %q (closed %v), want 400 identity_required naming the mixed scripts", id.User, out, closed)
			}
			if strings.Contains(out, `"tools"`) {
				t.Fatalf("user %q was served", id.User)
			}
		}
		cb.Observe("400 identity_required (\"the identity's user is ambiguous: ident: name mixes Latin and Cyrillic letters\") for both")
	})
	t.Run("session ids compared canonically", func(t *testing.T) {
		cb := casebook.Expect(t, "E8", "end session S-CASE while sandboxes call as s-case and S-Case",
			"the end answers session s-case; later calls from either spelling 403 session_ended")
		low := wire.Identity{Sandbox: "sb-e8", Agent: "agent-a", Session: "s-case", User: "alice"}
		expect(t, g.For(t).Call(low, "tickets.list_tickets", `{}`), http.StatusOK, "")
		st, _, m := g.AdminDo(http.MethodPost, "/api/v1/sessions/S-CASE/end", icptSessionToken, "")
		sess, _ := m["session"].(map[string]any)
		if st != http.StatusOK || sess["session"] != "s-case" {
			t.Fatalf("end S-CASE: %d %v", st, m)
		}
		mixed := low
		mixed.Session = "S-Case"
		expect(t, g.For(t).Call(low, "tickets.list_tickets", `{}`), http.StatusForbidden, "session_ended")
		expect(t, g.For(t).Call(mixed, "tickets.list_tickets", `{}`), http.StatusForbidden, "session_ended")
		cb.Observe("end of S-CASE recorded as s-case; s-case and S-Case both 403 session_ended")
	})
}
