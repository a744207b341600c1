//go:build linux

package attack

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// TestProxiedBodyCredentialBlocked is THREATS E18 through the real binary:
// an agent sends a credential-shaped string (a Stripe live key) in the
// body of a plain-http request through the forward proxy to a host on
// its egress allowlist, as is or gzip-compressed, or under a content
// coding the gateway cannot read. The body is read, decoded and scanned
// before the decision, so the shipped example rule
// (rego/examples/findings.rego, hot-loaded into the security team's
// rego directory) blocks it; what cannot be scanned is refused; nothing
// reaches the upstream. A clean body still goes through.
func TestProxiedBodyCredentialBlocked(t *testing.T) {
	w := newWorld(t)
	g := w.g.For(t)
	revision := regexp.MustCompile(`sluice_policy_revision_info\{revision="([^"]+)"\}`)
	rev := func() string {
		_, b, _ := g.AdminGet("/metrics")
		if m := revision.FindSubmatch(b); m != nil {
			return string(m[1])
		}
		return ""
	}
	before := rev()
	src, err := os.ReadFile("../../rego/examples/findings.rego")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.rego, "findings.rego"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(20 * time.Second); rev() == before; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the policy did not reload with findings.rego (revision still %q)", before)
		}
	}
	const key = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
	gz := func(s string) string {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write([]byte(s))
		_ = zw.Close()
		return b.String()
	}
	secret := `{"note":"use ` + key + `"}`
	for _, tc := range []struct {
		name, what, expected, body, coding string
		status                             int
		code                               string
	}{
		{"plain", "POST http://pkg.test/upload through the forward proxy with a Stripe live key in the JSON body",
			"403 egress_denied by findings.credential naming /request/body; no result record, nothing sent; the key in no reason, audit field (beside the recorded input) or log line",
			secret, "", http.StatusForbidden, "egress_denied"},
		{"gzip", "the same body gzip-compressed (Content-Encoding: gzip)",
			"403 egress_denied by findings.credential naming /request/body (decoded, then scanned); nothing sent",
			gz(secret), "gzip", http.StatusForbidden, "egress_denied"},
		{"br", "the same body under Content-Encoding: br, which the gateway does not decode",
			"415 schema_violation naming the coding; nothing sent",
			secret, "br", http.StatusUnsupportedMediaType, "schema_violation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "E18", tc.what, tc.expected)
			hdr := http.Header{"Content-Type": {"application/json"}}
			if tc.coding != "" {
				hdr.Set("Content-Encoding", tc.coding)
			}
			st, body, _ := w.fetch(t, w.proxyClient(agentA, nil), http.MethodPost, "http://pkg.test/upload", tc.body, hdr)
			var ref struct {
				Error struct {
					Code      string `json:"code"`
					Message   string `json:"message"`
					RequestID string `json:"request_id"`
				} `json:"error"`
			}
			_ = json.Unmarshal([]byte(body), &ref)
			rid := ref.Error.RequestID
			sent := rid == "" || len(g.AuditEvent("result", rid)) != 0
			recs := g.AuditRecords()
			rule := ""
			for _, r := range recs {
				f, ok := r["fields"].(map[string]any)
				if !ok {
					continue
				}
				if r["request_id"] == rid {
					rule, _ = f["rule"].(string)
				}
				delete(f, "input") // the agent's own requests, as recorded; everything derived must not carry the key
			}
			audit, _ := json.Marshal(recs)
			leaked := bytes.Contains(audit, []byte(key)) || bytes.Contains(g.Stderr(), []byte(key)) || strings.Contains(ref.Error.Message, key)
			c.Observef("%d %s %q; rule %q; sent %v; key in audit or log %v", st, ref.Error.Code, ref.Error.Message, rule, sent, leaked)
			if st != tc.status || ref.Error.Code != tc.code || sent || leaked {
				t.Fatalf("%d %s; sent %v, key in audit or log %v", st, body, sent, leaked)
			}
			if tc.status == http.StatusForbidden && (rule != "findings.credential" || !strings.Contains(ref.Error.Message, "/request/body")) {
				t.Fatalf("blocked by %q, message %q; want findings.credential naming /request/body", rule, ref.Error.Message)
			}
		})
	}
	t.Run("control", func(t *testing.T) {
		c := casebook.Expect(t, "E18", "control: the same POST with an ordinary note", "200, sent, its result audited")
		n := len(g.AuditEvent("result", `"dest_host":"pkg.test"`))
		st, _, _ := w.fetch(t, w.proxyClient(agentA, nil), http.MethodPost, "http://pkg.test/upload", `{"note":"charged twice"}`, http.Header{"Content-Type": {"application/json"}})
		audited := w.awaitAuditCount(t, "result", `"dest_host":"pkg.test"`, n+1)
		c.Observef("%d, result audited %v", st, audited)
		if st != http.StatusOK || !audited {
			t.Fatalf("control: %d, audited %v", st, audited)
		}
	})
}
