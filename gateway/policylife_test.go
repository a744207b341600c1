package gateway

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/sluice-gw/sluice/gateway/policylife"
	"github.com/sluice-gw/sluice/gateway/receipts"
)

// tinyBundle is an OPA bundle whose module blocks one tool.
func tinyBundle(t testing.TB, revision, frozen string) []byte {
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
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).DisableFormat(true).Write(b); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// bundleHost serves one bundle at a time with an ETag.
type bundleHost struct {
	mu   sync.Mutex
	body []byte
	etag string
}

func (b *bundleHost) set(body []byte, etag string) {
	b.mu.Lock()
	b.body, b.etag = body, etag
	b.mu.Unlock()
}

func (b *bundleHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	body, etag := b.body, b.etag
	b.mu.Unlock()
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("ETag", etag)
	_, _ = w.Write(body)
}

func (g *testGateway) metrics(t testing.TB) string {
	t.Helper()
	resp, err := http.Get("http://" + g.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestBundleServerDecides: a bundle polled from a loopback bundle server
// decides; its revision is on /metrics and on every decision record; a bad
// bundle is refused and counted while the previous revision keeps deciding.
func TestBundleServerDecides(t *testing.T) {
	up := newUpstream(t)
	host := &bundleHost{}
	host.set(tinyBundle(t, "r1", "tickets.get_ticket"), `"r1"`)
	hs := httptest.NewServer(host)
	t.Cleanup(hs.Close)
	g := startGateway(t, up.URL, "policy: { bundle: { url: "+hs.URL+"/b.tar.gz, poll: 100ms } }", nil)
	c := g.client(agentA)

	if r := doCall(t, c, "tickets.get_ticket", `{"path":{"id":"1"}}`); r.code() != "policy_block" || !strings.Contains(r.message(), "frozen by the bundle") {
		t.Fatalf("r1: %d %s, want the bundle's block", r.status, r.raw)
	}
	if m := g.metrics(t); !strings.Contains(m, `sluice_policy_revision_info{revision="r1"} 1`) {
		t.Fatalf("/metrics lacks the revision in force:\n%s", metricLines(m, "sluice_policy"))
	}

	host.set([]byte("not a bundle"), `"bad"`)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(g.metrics(t), `sluice_policy_bundle_loads_total{result="error"} 1`) {
		if time.Now().After(deadline) {
			t.Fatalf("the bad bundle was not counted:\n%s", metricLines(g.metrics(t), "sluice_policy"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := doCall(t, c, "tickets.get_ticket", `{"path":{"id":"1"}}`); r.code() != "policy_block" {
		t.Fatalf("after a bad bundle: %d %s, want r1 still deciding", r.status, r.raw)
	}
	if !strings.Contains(g.logBuf.String(), "policy: bundle rejected; previous policy keeps serving") {
		t.Error("the refused bundle was not logged")
	}

	host.set(tinyBundle(t, "r2", "tickets.list_tickets"), `"r2"`)
	waitStatus(t, c, "tickets.list_tickets", `{}`, 403)
	r := doCall(t, c, "tickets.get_ticket", `{"path":{"id":"1"}}`)
	if r.status != 200 {
		t.Fatalf("r2: get_ticket %d %s, want 200", r.status, r.raw)
	}
	rid, _ := r.body["request_id"].(string)
	found := false
	for _, rec := range auditEvents(t, g) {
		if rec.RequestID == rid && rec.Event == "decision" {
			found = true
			if rec.Fields["policy_revision"] != "r2" {
				t.Fatalf("decision record %v: policy_revision = %v, want r2", rec.Fields, rec.Fields["policy_revision"])
			}
		}
	}
	if !found {
		t.Fatalf("no decision record for %s", rid)
	}
}

func metricLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}

// logCollector is a loopback decision-log collector.
type logCollector struct {
	mu     sync.Mutex
	events []map[string]any
}

func (c *logCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	zr, err := gzip.NewReader(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	var batch []map[string]any
	if err := json.NewDecoder(zr).Decode(&batch); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	c.mu.Lock()
	c.events = append(c.events, batch...)
	c.mu.Unlock()
}

func (c *logCollector) find(rid string) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range c.events {
		if ev["request_id"] == rid {
			return ev
		}
	}
	return nil
}

// TestDecisionLogsReachCollector: every tool call's decision reaches a
// loopback collector in OPA's shape, masked, tied to the call's request ID.
func TestDecisionLogsReachCollector(t *testing.T) {
	g, col := startExporting(t, `  mask: [/input/args/body/reason]
  labels: { env: test }
`)
	c := g.client(agentA)
	r := doCall(t, c, "tickets.create_refund", `{"body":{"amount":7,"reason":"card 4242 4242 4242 4242"}}`)
	if r.status != 202 {
		t.Fatalf("refund: %d %s", r.status, r.raw)
	}
	rid, _ := r.body["request_id"].(string)
	if rid == "" {
		h, _ := r.body["hold"].(map[string]any)
		rid, _ = h["request_id"].(string)
	}
	var ev map[string]any
	deadline := time.Now().Add(10 * time.Second)
	for {
		col.mu.Lock()
		for _, e := range col.events {
			in, _ := e["input"].(map[string]any)
			if in != nil && in["tool"] == "tickets.create_refund" {
				ev = e
			}
		}
		col.mu.Unlock()
		if ev != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ev == nil {
		t.Fatal("no decision event reached the collector")
	}
	raw, _ := json.Marshal(ev)
	if strings.Contains(string(raw), "4242") {
		t.Fatalf("the masked field reached the collector: %s", raw)
	}
	body := ev["input"].(map[string]any)["args"].(map[string]any)["body"].(map[string]any)
	if body["amount"] != float64(7) {
		t.Fatalf("unmasked field lost: %s", raw)
	}
	if e, _ := ev["erased"].([]any); len(e) != 1 || e[0] != "/input/args/body/reason" {
		t.Fatalf("erased = %v", ev["erased"])
	}
	res := ev["result"].(map[string]any)
	if res["action"] != "ask" || ev["path"] != policylife.DecisionLogPath || ev["decision_id"] == "" || ev["labels"].(map[string]any)["env"] != "test" ||
		ev["revision"] == "" || ev["request_id"] == "" {
		t.Fatalf("event lacks OPA's fields: %s", raw)
	}
	if rid != "" && ev["request_id"] != rid {
		t.Errorf("request_id = %v, want the call's %s", ev["request_id"], rid)
	}
}

// TestDecisionLogsCollectorDown: with the collector refusing connections,
// calls are answered as fast as without an export, and the buffer stays
// bounded (the oldest events dropped and counted).
func TestDecisionLogsCollectorDown(t *testing.T) {
	up := newUpstream(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String() + "/logs"
	l.Close() // nothing listens there now: every POST is refused
	base := startGateway(t, up.URL, "", nil)
	g := startGateway(t, up.URL, "decision_logs: { url: "+down+", buffer: 50, batch: 10, flush: 5ms }", nil)
	median := func(g *testGateway) time.Duration {
		c := g.client(agentA)
		var ds []time.Duration
		for range 300 {
			start := time.Now()
			if r := doCall(t, c, "tickets.list_tickets", `{}`); r.status != 200 {
				t.Fatalf("call: %d %s", r.status, r.raw)
			}
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	mb, md := median(base), median(g)
	if md > 3*mb+2*time.Millisecond {
		t.Fatalf("median call with the collector down = %v, without an export = %v", md, mb)
	}
	st := g.life.Stats()
	if st.Queued > 50 || st.Dropped == 0 || st.Sent != 0 {
		t.Fatalf("exporter stats = %+v: want at most 50 queued, some dropped, none sent", st)
	}
	if !strings.Contains(g.metrics(t), "sluice_decision_logs_dropped_total") {
		t.Error("/metrics lacks the dropped counter")
	}
}

// TestReceiptForExecutedHold: an approved hold that executed has a signed
// receipt that verifies offline with the served key; one byte changed and
// it does not.
func TestReceiptForExecutedHold(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", nil)
	c := g.client(agentA)
	r := doCall(t, c, "tickets.create_refund", refund)
	id, _ := holdOf(t, r)
	if rr := g.admin(t, "tok-bob", "GET", "/api/v1/holds/"+id+"/receipt", ""); rr.status != 404 {
		t.Fatalf("receipt before execution: %d %s, want 404", rr.status, rr.raw)
	}
	if ar := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", `{"reason":"ok"}`); ar.status != 200 {
		t.Fatalf("approve: %d %s", ar.status, ar.raw)
	}
	if rr := g.admin(t, "", "GET", "/api/v1/holds/"+id+"/receipt", ""); rr.status != 401 {
		t.Fatalf("receipt without a person: %d", rr.status)
	}
	rr := g.admin(t, "tok-bob", "GET", "/api/v1/holds/"+id+"/receipt", "")
	if rr.status != 200 {
		t.Fatalf("receipt: %d %s", rr.status, rr.raw)
	}
	kr := g.admin(t, "", "GET", "/api/v1/receipts/key", "")
	pub, err := receipts.ParsePublicKey([]byte(kr.body["public_key_pem"].(string)))
	if err != nil {
		t.Fatalf("key: %v (%s)", err, kr.raw)
	}
	file := []byte(rr.raw)
	rc, err := receipts.Verify(file, pub)
	if err != nil {
		t.Fatalf("Verify: %v\n%s", err, file)
	}
	h := g.admin(t, "tok-bob", "GET", "/api/v1/holds/"+id, "")
	hold := h.body["hold"].(map[string]any)
	if rc.HoldID != id || rc.Approver != "bob" || rc.RequestSHA256 != hold["sha256"] || rc.UpstreamStatus != 200 ||
		rc.PolicyRevision == "" || rc.Decision != "ask" || rc.Credential == "" || rc.Caller.User != "alice" || rc.ApprovedAt.IsZero() ||
		rc.LeaseID != "" || strings.Contains(rr.raw, "lease_id") { // a stored credential has no lease: the field is left out
		t.Fatalf("receipt = %+v, hold = %v", rc, hold)
	}
	if strings.Contains(rr.raw, testSecret) {
		t.Fatal("the receipt carries the credential")
	}
	for _, i := range []int{0, len(file) / 3, len(file) / 2, len(file) - 2} {
		bad := append([]byte(nil), file...)
		bad[i] ^= 1
		if _, err := receipts.Verify(bad, pub); err == nil {
			t.Fatalf("receipt with byte %d changed verifies", i)
		}
	}
}
