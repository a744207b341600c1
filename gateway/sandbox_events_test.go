package gateway

import (
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/admin"
	"github.com/sluice-gw/sluice/gateway/config"
)

// TestSandboxEvents: sandboxd reports a command killed by a limit with its
// session token; the report becomes the audit record sandbox_<event> with
// who reported it. Anyone without a session token, approvers included, is
// 401; a malformed report is 400 naming what was wrong; neither writes a
// record.
func TestSandboxEvents(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", func(c *config.Config) {
		c.Gateway.SessionTokensSHA256 = []string{tokenHash("tok-other"), tokenHash("tok-sandboxd")}
	})
	const good = `{"event":"oom","sandbox":"sb-1","agent":"agent-a","session":"s-1","user":"alice","host":"node-a","limit":67108864}`

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			name, token, body string
			status            int
			code, says        string
		}{
			{"no token", "", good, 401, "unauthenticated", "session token"},
			{"wrong token", "wrong", good, 401, "unauthenticated", "session token"},
			{"an approver", "tok-bob", good, 401, "unauthenticated", "session token"},
			{"unknown event", "tok-sandboxd", `{"event":"reboot","sandbox":"sb-1"}`, 400, "bad_request", `event "reboot"`},
			{"no sandbox", "tok-sandboxd", `{"event":"oom"}`, 400, "bad_request", "sandbox must be"},
			{"space in a field", "tok-sandboxd", `{"event":"oom","sandbox":"sb-1","agent":"a b"}`, 400, "bad_request", "agent must be"},
			{"unknown key", "tok-sandboxd", `{"event":"oom","sandbox":"sb-1","argv":["sh"]}`, 400, "bad_request", `unknown field "argv"`},
			{"two objects", "tok-sandboxd", good + good, 400, "bad_request", "one JSON object"},
			{"negative limit", "tok-sandboxd", `{"event":"timeout","sandbox":"sb-1","limit":-1}`, 400, "bad_request", "limit must not be negative"},
			{"egress not canonical", "tok-sandboxd", `{"event":"oom","sandbox":"sb-1","egress":"b.org,a.org"}`, 400, "bad_request", "egress"},
			{"too big", "tok-sandboxd", `{"event":"oom","sandbox":"` + strings.Repeat("x", admin.MaxSandboxEventBytes) + `"}`, 400, "bad_request", "at most 4096 bytes"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := g.admin(t, tc.token, "POST", "/api/v1/sandbox-events", tc.body)
				e, _ := r.body["error"].(map[string]any)
				if msg, _ := e["message"].(string); r.status != tc.status || r.code() != tc.code || !strings.Contains(msg, tc.says) {
					t.Fatalf("%d %s, want %d %s saying %q", r.status, r.raw, tc.status, tc.code, tc.says)
				}
			})
		}
		for _, rec := range auditEvents(t, g) {
			if strings.HasPrefix(rec.Event, "sandbox_") {
				t.Fatalf("a refused report was audited: %+v", rec)
			}
		}
	})
	t.Run("audited with who reported", func(t *testing.T) {
		r := g.admin(t, "tok-sandboxd", "POST", "/api/v1/sandbox-events", good)
		rid, _ := r.body["request_id"].(string)
		if r.status != 200 || rid == "" {
			t.Fatalf("%d %s, want 200 with a request_id", r.status, r.raw)
		}
		r = g.admin(t, "tok-sandboxd", "POST", "/api/v1/sandbox-events", `{"event":"pids_limit","sandbox":"sb-2","limit":64,"egress":"pypi.org"}`)
		if r.status != 200 {
			t.Fatalf("pids_limit: %d %s", r.status, r.raw)
		}
		// A13: an init that died leaves its sandbox failed; no limit.
		r = g.admin(t, "tok-sandboxd", "POST", "/api/v1/sandbox-events", `{"event":"init_died","sandbox":"sb-3","agent":"agent-a"}`)
		if r.status != 200 {
			t.Fatalf("init_died: %d %s", r.status, r.raw)
		}
		var oom, pids, died int
		for _, rec := range auditEvents(t, g) {
			switch rec.Event {
			case "sandbox_oom":
				oom++
				f := rec.Fields
				if rec.RequestID != rid || f["sandbox"] != "sb-1" || f["agent"] != "agent-a" || f["session"] != "s-1" || f["user"] != "alice" ||
					f["host"] != "node-a" || f["limit"] != float64(64<<20) || f["reported_by"] != "session_token[1]" {
					t.Errorf("sandbox_oom record %+v", rec)
				}
			case "sandbox_init_died":
				died++
				if _, ok := rec.Fields["limit"]; rec.Fields["sandbox"] != "sb-3" || rec.Fields["agent"] != "agent-a" || ok {
					t.Errorf("sandbox_init_died record %+v", rec)
				}
			case "sandbox_pids_limit":
				pids++
				if rec.Fields["sandbox"] != "sb-2" || rec.Fields["limit"] != float64(64) || rec.Fields["egress"] != "pypi.org" {
					t.Errorf("sandbox_pids_limit record %+v", rec)
				}
			}
		}
		if oom != 1 || pids != 1 || died != 1 {
			t.Fatalf("%d sandbox_oom, %d sandbox_pids_limit and %d sandbox_init_died records, want 1 each", oom, pids, died)
		}
	})
}
