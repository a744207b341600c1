package egress

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
)

// TestProxyAuditSyncModes: with either audit.sync mode a proxied request's
// decision and result records are in the log file when its answer arrives
// (and fsynced with always), and when the log cannot be written the request
// is refused with 503 audit_unavailable before anything reaches the
// upstream.
func TestProxyAuditSyncModes(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full on this system")
	}
	modes := []struct {
		name string
		edit func(*config.Config)
	}{
		{"always", nil},
		{"interval", func(c *config.Config) {
			c.Audit.Sync, c.Audit.SyncInterval = config.AuditSyncInterval, config.Duration(time.Second)
		}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			be := startBenchEgress(t, "", m.edit)
			c := be.viaProxy(t)
			defer c.CloseIdleConnections()

			syncs := be.g.audit.Stats().Syncs
			resp, body := proxyGet(t, c)
			if resp.StatusCode != http.StatusOK || body != "hello /x" || be.requests.Load() != 1 {
				t.Fatalf("allowed request: %d %q, upstream saw %d", resp.StatusCode, body, be.requests.Load())
			}
			var events []string
			for _, r := range auditEvents(t, be.g) {
				if r.Fields["kind"] == "http" {
					events = append(events, r.Event)
				}
			}
			if strings.Join(events, ",") != "decision,result" {
				t.Fatalf("audit events when the answer arrived = %v, want decision,result", events)
			}
			got := be.g.audit.Stats().Syncs - syncs
			if m.edit == nil && got == 0 {
				t.Fatal("audit.sync always: the answer arrived before the result record was fsynced")
			}
			if m.edit != nil && got != 0 {
				t.Fatalf("audit.sync interval: %d fsyncs on the request's path, want none within the 1s interval", got)
			}

			// The log's file becomes a full disk: every write fails.
			must(t, os.Remove(be.g.cfg.Audit.Path))
			must(t, os.Symlink("/dev/full", be.g.cfg.Audit.Path))
			for i := range 2 {
				resp, body := proxyGet(t, c)
				var eb refusal.Body
				_ = json.Unmarshal([]byte(body), &eb)
				if resp.StatusCode != http.StatusServiceUnavailable || eb.Error.Code != refusal.AuditUnavailable {
					t.Fatalf("request %d with a failing audit log: %d %s", i, resp.StatusCode, body)
				}
				if ps := resp.Header.Get("Proxy-Status"); ps != "sluice; error="+psDenied {
					t.Errorf("Proxy-Status = %q", ps)
				}
			}
			if n := be.requests.Load(); n != 1 {
				t.Fatalf("%d requests reached the upstream while the audit log was failing, want none", n-1)
			}
		})
		t.Run(m.name+"/result record fails", func(t *testing.T) {
			// The log file is deleted while the upstream answers: the
			// decision was written, the result cannot be, so the answer
			// is never released; the connection is dropped instead.
			be := startBenchEgress(t, "", m.edit)
			remove := func() { _ = os.Remove(be.g.cfg.Audit.Path) }
			be.onRequest.Store(&remove)
			c := be.viaProxy(t)
			defer c.CloseIdleConnections()
			resp, err := c.Get("http://pkg.example/x")
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("the answer was released without its result record: %d %q", resp.StatusCode, body)
			}
			if be.requests.Load() != 1 {
				t.Fatalf("upstream saw %d requests, want 1", be.requests.Load())
			}
			if !errors.Is(be.g.audit.Err(), audit.ErrUnlinked) {
				t.Fatalf("audit Err() = %v, want ErrUnlinked", be.g.audit.Err())
			}
		})
		t.Run(m.name+"/disk full", func(t *testing.T) {
			// Every write of the log fails with ENOSPC from the start.
			dir := t.TempDir()
			must(t, os.Symlink("/dev/full", filepath.Join(dir, "audit.log")))
			be := startBenchEgress(t, dir, m.edit)
			c := be.viaProxy(t)
			defer c.CloseIdleConnections()
			resp, body := proxyGet(t, c)
			var eb refusal.Body
			_ = json.Unmarshal([]byte(body), &eb)
			if resp.StatusCode != http.StatusServiceUnavailable || eb.Error.Code != refusal.AuditUnavailable {
				t.Fatalf("request with a full disk: %d %s", resp.StatusCode, body)
			}
			if !errors.Is(be.g.audit.Err(), syscall.ENOSPC) {
				t.Fatalf("audit Err() = %v, want ENOSPC", be.g.audit.Err())
			}
			if n := be.requests.Load(); n != 0 {
				t.Fatalf("%d requests reached the upstream with a full disk, want none", n)
			}
		})
	}
}

func proxyGet(t *testing.T, c *http.Client) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get("http://pkg.example/x")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestEgressAuditFieldsSorted: the fields of every kind of egress record
// are in strictly increasing key order, as audit.Record.Sorted requires
// (out of order, the log would fold them into a map: the same line, at the
// cost the pairs exist to avoid).
func TestEgressAuditFieldsSorted(t *testing.T) {
	full := newEgressCall("r1", time.Now(), call.KindHTTP)
	full.setCaller(policy.Caller{Sandbox: "sb", Agent: "a", Session: "s", User: "u"})
	full.decide(policy.Decision{Action: policy.Allow, Rule: "policies[0]", Reason: "ok"})
	full.DestHost, full.Port, full.Status, full.UpstreamStatus, full.UpstreamErr, full.Event = "pkg.example", 80, 200, 401, "broken_body", "x"
	full.SetResolvedIP("192.0.2.1")
	bare := newEgressCall("r2", time.Now(), call.KindDNS)
	bare.DestHost, bare.Event = "pkg.example", "doh_refused"
	for _, tc := range []struct {
		name  string
		c     *egressCall
		event string
		ref   *refusal.Error
		want  int
	}{
		{"every field of a result", full, "result", &refusal.Error{Code: refusal.UpstreamError}, 18},
		{"a decision", full, "decision", nil, 14},
		{"a ref before policy", bare, "decision", &refusal.Error{Code: refusal.EgressDenied}, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var code refusal.Code
			if tc.ref != nil {
				code = tc.ref.Code
			}
			f := call.AppendFields([]audit.Field(nil), &tc.c.Record, tc.event, code)
			for i := 1; i < len(f); i++ {
				if f[i-1].Key >= f[i].Key {
					t.Fatalf("%q before %q", f[i-1].Key, f[i].Key)
				}
			}
			if len(f) != tc.want {
				t.Fatalf("%d fields %v, want %d", len(f), f, tc.want)
			}
		})
	}
}

// TestAuditWritesDetached holds every audit write in the gateway to
// appendAudit, the one place that detaches it from the caller's context
// (THREATS G10): a direct s.audit.Append with a request's context loses the
// record when the caller hangs up.
func TestAuditWritesDetached(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "egress_audit.go" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, ".audit.Append") {
				t.Errorf("%s:%d: an audit write not through appendAudit: %s", f, i+1, strings.TrimSpace(l))
			}
		}
	}
}
