//go:build linux

package fault

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

var agentA = gwenv.AgentA

// poll asks for a hold's state as the agent.
func poll(g *gwenv.Gateway, id string) gwenv.Reply {
	return g.Do(agentA, http.MethodGet, "/v1/holds/"+id, "", nil)
}

// TestKill9WithHeldCalls (G1, G2): the gateway is killed with one hold
// pending and another approved and mid-send (its upstream hangs). After a
// restart the pending hold is still pending and can be approved once; the
// one that was executing becomes outcome_unknown, is audited, and is
// never re-sent. On SQLite and on PostgreSQL (eachStore).
func TestKill9WithHeldCalls(t *testing.T) {
	eachStore(t, func(t *testing.T, sk storeKind) {
		e := newEnv(t)
		d := e.BaseConfig("kill")
		sk.apply(d)
		path := e.Write(d)
		g := e.Start(d, path)
		g1 := casebook.Expect(t, "G1", sk.threat("kill -9 of the gateway (sluice serve) with a pending Ask hold, then restart"),
			"after restart the poll is still 202 pending, nothing upstream; approving it runs it exactly once")
		g2 := casebook.Expect(t, "G2", sk.threat("kill -9 while an approved hold is being sent (upstream hangs), then restart"),
			"hold becomes outcome_unknown (audited hold_outcome_unknown), poll 502 upstream_error, second approve 409, exactly 1 upstream request (never re-sent)")

		pending := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":1}}`)
		running := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":2}}`)
		for _, r := range []gwenv.Reply{pending, running} {
			if r.Status != http.StatusAccepted || r.HoldState != "pending" || r.HoldID == "" {
				t.Fatalf("ask: %d %s, want 202 pending", r.Status, r.Body)
			}
		}
		e.Up.SetMode(gwenv.ModeHang)
		go func() {
			// The approve blocks while the upstream hangs; the gateway dies under it.
			req, _ := http.NewRequest(http.MethodPost, "http://"+g.Admin+"/api/v1/holds/"+running.HoldID+"/approve", strings.NewReader(`{"reason":"ok"}`))
			req.Header.Set("Authorization", "Bearer "+gwenv.CarolToken)
			if resp, err := g.AdminClient().Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		e.Up.AwaitRequest(t, 30*time.Second)
		g.Kill9()
		// During the outage the socket refuses connections (sandboxd's relay
		// turns that into its own error); nothing is held or sent.
		_, outage := net.DialTimeout("unix", g.Sock, 5*time.Second)

		e.Up.SetMode(gwenv.ModeOK)
		g = e.Start(d, path)
		p1 := poll(g, pending.HoldID)
		// SQLite: at the start; PostgreSQL: once the dead process's lease passed.
		rec := g.AwaitAudit("hold_outcome_unknown", running.HoldID)
		p2 := poll(g, running.HoldID)
		early := len(e.Up.Requests()) // the hung amount 2 only
		g1.Observef("after restart: pending hold poll %d %s, upstream requests %d", p1.Status, p1.HoldState, len(e.Up.Requests()))
		g2.Observef("after restart: running hold poll %d %s, audit %v", p2.Status, p2.Code, rec["event"])
		if p1.Status != http.StatusAccepted || p1.HoldState != "pending" {
			t.Errorf("pending hold after restart: %d %s, want 202 pending", p1.Status, p1.Body)
		}
		if p2.Status != http.StatusBadGateway || p2.Code != "upstream_error" || !strings.Contains(string(p2.Body), "not re-sent") {
			t.Errorf("executing hold after restart: %d %s, want 502 upstream_error (outcome unknown, not re-sent)", p2.Status, p2.Body)
		}
		st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+running.HoldID+"/approve", gwenv.CarolToken, `{"reason":"again"}`)
		if st != http.StatusConflict {
			t.Errorf("approve the outcome_unknown hold again: %d %s, want 409", st, code)
		}
		// Control: the pending one is approved once and runs.
		st, _, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+pending.HoldID+"/approve", gwenv.CarolToken, `{"reason":"ok"}`)
		hold, _ := body["hold"].(map[string]any)
		if st != http.StatusOK || hold["status"] != "executed" {
			t.Fatalf("approve the pending hold after restart: %d %v, want 200 executed", st, body)
		}
		done := g.Do(agentA, http.MethodGet, "/v1/holds/"+pending.HoldID+"?wait=5s", "", nil)
		if done.Status != http.StatusOK || !strings.Contains(string(done.Body), "refund") {
			t.Errorf("poll the approved hold: %d %s", done.Status, done.Body)
		}
		reqs := e.Up.Requests()
		var amounts []string
		for _, r := range reqs {
			amounts = append(amounts, r.Body)
			if r.Header.Get("X-Api-Key") != e.Secret {
				t.Errorf("upstream request without the credential: %+v", r)
			}
		}
		g1.Observef("during the outage dial: %v; after restart: pending hold poll %d %s with %d upstream requests (the hung one); approved: %d %v, poll %d", outage, p1.Status, p1.HoldState, early, st, hold["status"], done.Status)
		if !errors.Is(outage, syscall.ECONNREFUSED) && !errors.Is(outage, syscall.ENOENT) {
			t.Errorf("dial during the outage: %v, want ECONNREFUSED or ENOENT", outage)
		}
		if early != 1 {
			t.Errorf("%d upstream requests after the restart, before any new approval; want only the hung one", early)
		}
		g2.Observef("after restart: running hold poll %d %s, audit %v, second approve 409; upstream request bodies %v", p2.Status, p2.Code, rec["event"], amounts)
		if len(reqs) != 2 || !strings.Contains(reqs[0].Body, `"amount":2`) || !strings.Contains(reqs[1].Body, `"amount":1`) {
			t.Errorf("upstream saw %v; want the hung amount 2 once (never re-sent) and the approved amount 1 once", amounts)
		}
	})
}

// TestAuditFullDisk (G5): the audit file lives on a tiny tmpfs; once the
// filesystem is full, allowed calls are refused 503 audit_unavailable with
// nothing upstream, /readyz is 503; when space returns calls resume and
// the chain verifies.
func TestAuditFullDisk(t *testing.T) {
	e := newEnv(t)
	fs := gwenv.Tmpfs(t, e.Dir, "auditfs", "64k")
	d := e.BaseConfig("full")
	d["audit"] = map[string]any{"path": filepath.Join(fs, "audit.log")}
	path := e.Write(d)
	g := e.Start(d, path)
	c := casebook.Expect(t, "G5", "audit log on a full 64k tmpfs (allowed call), then the filler is removed",
		"503 audit_unavailable with no upstream connection, /readyz 503; after space returns 200 and `sluice audit verify` passes")

	if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
		t.Fatalf("control: %d %s", r.Status, r.Body)
	}
	filler := gwenv.Fill(t, fs)
	// tmpfs allocates pages: the log's last page may still hold a record
	// or two. Calls succeed until it does not; each refused one must have
	// reached nothing.
	// The first refused call may be one whose decision record still fit
	// (so it was sent) and whose result record did not; the reply is then
	// withheld. From the next call on the decision itself cannot be
	// written, and nothing may be sent.
	var first, refused gwenv.Reply
	ok, reached := 0, false
	for i := 0; i < 40 && first.Status == 0; i++ {
		if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status == http.StatusOK {
			ok++
		} else {
			first = r
		}
	}
	acc, n := e.Up.Accepts.Load(), len(e.Up.Requests())
	refused = g.Call(agentA, "tickets.list_tickets", `{}`)
	reached = e.Up.Accepts.Load() != acc || len(e.Up.Requests()) != n
	if first.Status != http.StatusServiceUnavailable || first.Code != "audit_unavailable" {
		t.Errorf("first refusal with the disk full: %d %s, want 503 audit_unavailable", first.Status, first.Body)
	}
	if reached {
		t.Errorf("a call whose decision could not be audited reached the upstream")
	}
	st, ready, _ := g.AdminGet("/readyz")
	c.Observef("disk full: %d %s after %d calls used the page slack, then %d %s with upstream reached %v; /readyz %d", first.Status, first.Code, ok, refused.Status, refused.Code, reached, st)
	if refused.Status != http.StatusServiceUnavailable || refused.Code != "audit_unavailable" {
		t.Fatalf("disk full: %d %s, want 503 audit_unavailable", refused.Status, refused.Body)
	}
	if st != http.StatusServiceUnavailable || !strings.Contains(string(ready), "audit") {
		t.Errorf("/readyz with the audit disk full: %d %s, want 503 naming audit", st, ready)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	r := g.Call(agentA, "tickets.list_tickets", `{}`)
	out, err := exec.Command(e.Bin, "audit", "verify", "--file", filepath.Join(fs, "audit.log")).CombinedOutput()
	c.Observef("disk full: %d %s after %d calls used the page slack, then %d %s with upstream reached %v; /readyz %d; space back: %d, verify err=%v", first.Status, first.Code, ok, refused.Status, refused.Code, reached, st, r.Status, err)
	if r.Status != http.StatusOK {
		t.Errorf("after space returned: %d %s, want 200", r.Status, r.Body)
	}
	if err != nil {
		t.Errorf("sluice audit verify: %v: %s", err, out)
	}
}

// TestAuditFileUnlinked (G5): the audit file is deleted under the running
// gateway. Designed (gateway/audit): the batch that notices the link count
// of zero fails — the call is refused 503 audit_unavailable and nothing is
// sent — and the next append re-creates the file starting with an
// audit_log_recreated record that continues the chain; the gateway never
// keeps writing into the unlinked inode.
func TestAuditFileUnlinked(t *testing.T) {
	e := newEnv(t)
	d := e.BaseConfig("unlink")
	path := e.Write(d)
	g := e.Start(d, path)
	c := casebook.Expect(t, "G5", "audit log file unlinked while the gateway runs",
		"next call 503 audit_unavailable, nothing upstream; then a new file starting with audit_log_recreated (seq continues) and calls resume")

	if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
		t.Fatalf("control: %d %s", r.Status, r.Body)
	}
	old := g.AuditRecords()
	lastSeq := old[len(old)-1]["seq"].(float64)
	if err := os.Remove(g.Audit); err != nil {
		t.Fatal(err)
	}
	acc, n := e.Up.Accepts.Load(), len(e.Up.Requests())
	r1 := g.Call(agentA, "tickets.list_tickets", `{}`)
	reached := e.Up.Accepts.Load() != acc || len(e.Up.Requests()) != n
	r2 := g.Call(agentA, "tickets.list_tickets", `{}`)
	recs := g.AuditRecords()
	first := map[string]any{}
	if len(recs) > 0 {
		first = recs[0]
	}
	c.Observef("after unlink: %d %s (upstream reached %v); next call %d; new file starts with %v seq %v (old file ended at seq %v)",
		r1.Status, r1.Code, reached, r2.Status, first["event"], first["seq"], lastSeq)
	if r1.Status != http.StatusServiceUnavailable || r1.Code != "audit_unavailable" || reached {
		t.Errorf("first call after unlink: %d %s, upstream reached %v; want 503 audit_unavailable and nothing sent", r1.Status, r1.Body, reached)
	}
	if r2.Status != http.StatusOK {
		t.Errorf("second call after unlink: %d %s, want 200 (the log is re-created)", r2.Status, r2.Body)
	}
	if first["event"] != "audit_log_recreated" || first["seq"].(float64) <= lastSeq {
		t.Errorf("re-created log starts with %v, want audit_log_recreated continuing after seq %v", first, lastSeq)
	}
}

const goodRego = `package sluice.policies.team

decisions contains {"action": "block", "rule": "team.no_refunds", "reason": "refunds paused"} if {
	input.tool == "tickets.create_refund"
}
`

const badRego = "package sluice.policies.team\n\ndecisions contains d if {\n\tinput.tool ==\n"

// TestPolicyReloadSyntaxError (G6): a SIGHUP with a Rego syntax error is
// rejected, the old policy keeps serving, /readyz names the failure and the
// error is counted.
func TestPolicyReloadSyntaxError(t *testing.T) {
	e := newEnv(t)
	rego, mod := writeRego(t, e.Dir, goodRego)
	d := e.BaseConfig("reload")
	d["rego"] = []string{rego}
	path := e.Write(d)
	g := e.Start(d, path)
	c := casebook.Expect(t, "G6", "SIGHUP reload with a Rego syntax error",
		"reload rejected (rego_parse_error), policy version unchanged, list still 200 and refund still blocked by the old module, /readyz lists the failure, sluice_policy_reloads{result=\"error\"} counted")

	_, ready0, _ := g.AdminGet("/readyz")
	var before struct {
		Version  float64  `json:"policy_version"`
		Problems []string `json:"problems"`
	}
	_ = json.Unmarshal(ready0, &before)
	if r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":1}}`); r.Status != http.StatusForbidden || r.Code != "policy_block" {
		t.Fatalf("control: the good module blocks refunds: %d %s", r.Status, r.Body)
	}
	if err := os.WriteFile(mod, []byte(badRego), 0o644); err != nil {
		t.Fatal(err)
	}
	g.Signal(syscall.SIGHUP)
	line := g.AwaitLog("reload rejected", func(m map[string]any) bool {
		msg, _ := m["msg"].(string)
		return strings.Contains(msg, "reload rejected") || strings.Contains(msg, "reload failed")
	})
	errText := fmt.Sprint(line["err"], line["error"])
	list := g.Call(agentA, "tickets.list_tickets", `{}`)
	refund := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":1}}`)
	st, ready, _ := g.AdminGet("/readyz")
	var after struct {
		Version  float64  `json:"policy_version"`
		Problems []string `json:"problems"`
	}
	_ = json.Unmarshal(ready, &after)
	_, metrics, _ := g.AdminGet("/metrics")
	counted := false
	for _, l := range strings.Split(string(metrics), "\n") {
		if strings.HasPrefix(l, "sluice_policy_reloads") && strings.Contains(l, `result="error"`) && !strings.HasSuffix(l, " 0") {
			counted = true
		}
	}
	c.Observef("rejected with rego_parse_error %v; version %v -> %v; list %d, refund %d %s; /readyz %d problems %q; error counted %v",
		strings.Contains(errText, "rego_parse_error"), before.Version, after.Version, list.Status, refund.Status, refund.Code, st, after.Problems, counted)
	if !strings.Contains(errText, "rego_parse_error") {
		t.Errorf("reload rejection does not carry rego_parse_error: %v", line)
	}
	if after.Version != before.Version || before.Version == 0 {
		t.Errorf("policy version %v -> %v, want unchanged and non-zero", before.Version, after.Version)
	}
	if list.Status != http.StatusOK || refund.Status != http.StatusForbidden || refund.Code != "policy_block" {
		t.Errorf("after the bad reload: list %d, refund %d %s; want the old policy (200, 403 policy_block)", list.Status, refund.Status, refund.Code)
	}
	if len(after.Problems) == 0 || !strings.Contains(strings.Join(after.Problems, " "), "reload failed") {
		t.Errorf("/readyz does not report the failed reload: %d %s", st, ready)
	}
	if !counted {
		t.Errorf("/metrics has no non-zero sluice_policy_reloads{result=\"error\"}")
	}
}

// TestBrokenPolicyAtColdStart (G6): a gateway started with a Rego module
// that does not parse serves nothing: every call is 403 policy_block with
// nothing upstream, and /readyz is 503. The control is the same gateway
// with the module fixed.
func TestBrokenPolicyAtColdStart(t *testing.T) {
	e := newEnv(t)
	rego, mod := writeRego(t, e.Dir, badRego)
	d := e.BaseConfig("cold")
	d["rego"] = []string{rego}
	path := e.Write(d)
	g := e.Launch(d, path)
	g.AwaitSocket()
	c := casebook.Expect(t, "G6", "cold start of sluice serve with a Rego module that does not parse",
		"fails closed: allowed tool 403 policy_block, nothing upstream, /readyz 503 'policy: not loaded'; control: fixed module, SIGHUP, 200")

	st, ready, _ := g.AdminGet("/readyz")
	r := g.Call(agentA, "tickets.list_tickets", `{}`)
	reached := len(e.Up.Requests())
	c.Observef("list %d %s, upstream requests %d, /readyz %d %s", r.Status, r.Code, reached, st, strings.TrimSpace(string(ready)))
	if r.Status != http.StatusForbidden || r.Code != "policy_block" || reached != 0 {
		t.Errorf("with no policy loaded: %d %s, %d upstream requests; want 403 policy_block and none", r.Status, r.Body, reached)
	}
	if st != http.StatusServiceUnavailable || !strings.Contains(string(ready), "not loaded") {
		t.Errorf("/readyz: %d %s, want 503 naming the missing policy", st, ready)
	}
	if err := os.WriteFile(mod, []byte(goodRego), 0o644); err != nil {
		t.Fatal(err)
	}
	g.Signal(syscall.SIGHUP)
	g.AwaitReady()
	ctl := g.Call(agentA, "tickets.list_tickets", `{}`)
	c.Observef("list %d %s, upstream requests %d, /readyz %d %s; control after fixing the module: %d", r.Status, r.Code, reached, st, strings.TrimSpace(string(ready)), ctl.Status)
	if ctl.Status != http.StatusOK {
		t.Errorf("control: %d %s, want 200", ctl.Status, ctl.Body)
	}
}

// TestStoreUnavailable (G8): the SQLite store lives on a tiny tmpfs that is
// then filled: Ask calls are refused 503 approval_unavailable, never
// allowed and never sent; allowed calls are unaffected; with space back the
// Ask is held again.
func TestStoreUnavailable(t *testing.T) {
	e := newEnv(t)
	fs := gwenv.Tmpfs(t, e.Dir, "storefs", "1m")
	d := e.BaseConfig("store")
	d["store"] = "sqlite:" + filepath.Join(fs, "sluice.db")
	d.Gateway()["max_pending_holds"] = 100
	d.Gateway()["max_pending_holds_per_sandbox"] = 100
	path := e.Write(d)
	g := e.Start(d, path)
	c := casebook.Expect(t, "G8", "approval store (SQLite) on a full tmpfs, Ask call",
		"503 approval_unavailable, nothing upstream, never auto-allowed; allowed calls still 200; space back: 202 held")

	if r := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":1}}`); r.Status != http.StatusAccepted {
		t.Fatalf("control: %d %s, want 202 held", r.Status, r.Body)
	}
	filler := gwenv.Fill(t, fs)
	var refused gwenv.Reply
	held := 0
	for i := 0; i < 40; i++ {
		r := g.Call(agentA, "tickets.create_refund", fmt.Sprintf(`{"body":{"amount":%d}}`, i+2))
		if r.Status == http.StatusAccepted {
			held++ // the WAL's last page still had room
			continue
		}
		refused = r
		break
	}
	allowed := g.Call(agentA, "tickets.list_tickets", `{}`)
	refunds := 0
	for _, r := range e.Up.Requests() {
		if r.Path == "/refunds" {
			refunds++
		}
	}
	c.Observef("store full: ask %d %s (after %d held in the slack), refunds upstream %d; allowed call %d", refused.Status, refused.Code, held, refunds, allowed.Status)
	if refused.Status != http.StatusServiceUnavailable || refused.Code != "approval_unavailable" {
		t.Fatalf("ask with the store full: %d %s, want 503 approval_unavailable", refused.Status, refused.Body)
	}
	if refunds != 0 {
		t.Errorf("%d refunds reached the upstream", refunds)
	}
	if allowed.Status != http.StatusOK {
		t.Errorf("allowed call with the store full: %d %s, want 200", allowed.Status, allowed.Body)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	back := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":99}}`)
	c.Observef("store full: ask %d %s (after %d held in the slack), refunds upstream %d; allowed call %d; space back: %d", refused.Status, refused.Code, held, refunds, allowed.Status, back.Status)
	if back.Status != http.StatusAccepted {
		t.Errorf("space back: %d %s, want 202", back.Status, back.Body)
	}
}

// TestUpstreamFaults (F6 and the upstream faults of issue 7): the upstream
// hangs past upstream_timeout, resets the connection, answers bytes that
// are not HTTP, a status of 099 or a header with a control byte. Each is
// 502 upstream_error with the credential never shown, audited as a result
// with the refusal; a control call between them answers 200.
func TestUpstreamFaults(t *testing.T) {
	e := newEnv(t)
	d := e.BaseConfig("upstream")
	path := e.Write(d)
	g := e.Start(d, path)
	cases := []struct {
		name string
		mode gwenv.Mode
	}{
		{"upstream hangs past upstream_timeout (5s)", gwenv.ModeHang},
		{"upstream resets the connection (RST)", gwenv.ModeReset},
		{"upstream answers bytes that are not HTTP", gwenv.ModeGarbage},
		{"upstream answers status 099", gwenv.ModeBadStatus},
		{"upstream answers a header value with a control byte", gwenv.ModeCtlHeader},
		{"upstream answers status 000", gwenv.ModeRaw},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := g.For(t)
			c := casebook.Expect(t, "F6", tc.name+" (real gateway, real upstream)",
				"502 upstream_error, audited, no secret in the reply; control before it 200")
			e.Up.SetMode(gwenv.ModeOK)
			ctl := g.Call(agentA, "tickets.list_tickets", `{}`)
			e.Up.SetMode(tc.mode)
			if tc.mode == gwenv.ModeRaw {
				e.Up.SetRaw("HTTP/1.1 000 Zero\r\nContent-Length: 0\r\n\r\n")
			}
			start := time.Now()
			r := g.Call(agentA, "tickets.list_tickets", `{}`)
			took := time.Since(start).Round(100 * time.Millisecond)
			e.Up.SetMode(gwenv.ModeOK)
			var audited bool
			if r.RequestID != "" {
				for _, rec := range g.AuditEvent("result", r.RequestID) {
					b, _ := json.Marshal(rec)
					audited = audited || strings.Contains(string(b), "upstream_error")
				}
			}
			c.Observef("control %d; fault %d %s after %v, audited %v", ctl.Status, r.Status, r.Code, took, audited)
			if ctl.Status != http.StatusOK {
				t.Fatalf("control: %d %s", ctl.Status, ctl.Body)
			}
			if r.Status != http.StatusBadGateway || r.Code != "upstream_error" {
				t.Errorf("got %d %s, want 502 upstream_error", r.Status, r.Body)
			}
			if strings.Contains(string(r.Body), e.Secret) {
				t.Errorf("the reply carries the secret")
			}
			if !audited {
				t.Errorf("no result audit record naming upstream_error for request %q", r.RequestID)
			}
		})
	}
}

// TestPolicyEvalFailures (G7): a Rego module whose evaluation fails for the
// list tool — a runtime error, a conflicting complete rule, an endless
// loop past the 1s eval timeout, or a malformed decision (a non-string
// approver or rule id, an unknown action) — turns the simple rules' allow
// into 403 policy_block (rule policy_error, or for an unknown action the
// module's own rule, naming it) with nothing upstream; the audited reason
// names what failed. The control is
// the same module for another tool: the refund is still held (202).
func TestPolicyEvalFailures(t *testing.T) {
	e := newEnv(t)
	rego, mod := writeRego(t, e.Dir, goodRego)
	d := e.BaseConfig("eval")
	d["rego"] = []string{rego}
	path := e.Write(d)
	g := e.Start(d, path)
	// rule is the decision's rule: policy_error, except for an unknown
	// action, which blocks in the name of the module's own rule.
	cases := []struct{ name, body, reason, rule string }{
		{"divide by zero (strict builtin errors)", `decisions contains {"action": "allow", "rule": "x", "reason": sprintf("%v", [10 / (count(input.tool) - count(input.tool))])} if {
	input.tool == "tickets.list_tickets"
}
`, "policy", "policy_error"},
		{"conflicting complete rule", `level := 1 if input.tool == "tickets.list_tickets"
level := 2 if startswith(input.tool, "tickets.list")
decisions contains {"action": "allow", "rule": "x", "reason": "r"} if level > 0
`, "conflict", "policy_error"},
		{"endless loop past the eval timeout", `decisions contains {"action": "allow", "rule": "slow", "reason": "r"} if {
	input.tool == "tickets.list_tickets"
	count([x | some x in numbers.range(1, 100000000); x < 0]) == 0
}
`, "timed out", "policy_error"},
		{"a non-string approver in an ask", `decisions contains {"action": "ask", "rule": "x", "reason": "r", "approvers": [1]} if input.tool == "tickets.list_tickets"
`, "approver 1", "policy_error"},
		{"a non-string rule id", `decisions contains {"action": "allow", "rule": 7, "reason": "r"} if input.tool == "tickets.list_tickets"
`, "rule 7", "policy_error"},
		{"an action that is not allow, ask or block", `decisions contains {"action": "maybe", "rule": "x", "reason": "r"} if input.tool == "tickets.list_tickets"
`, "invalid action maybe", "x"},
	}
	version := func() float64 {
		_, b, _ := g.AdminGet("/readyz")
		var r struct {
			V float64 `json:"policy_version"`
		}
		_ = json.Unmarshal(b, &r)
		return r.V
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := g.For(t)
			c := casebook.Expect(t, "G7", "policy evaluation fails for an allowed tool: "+tc.name,
				"403 policy_block by rule "+tc.rule+" naming "+tc.reason+", nothing upstream; control: another tool under the same module is still held 202")
			v := version()
			body := "package sluice.policies.team\n\nimport rego.v1\n\n" + tc.body
			if err := os.WriteFile(mod, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			g.Signal(syscall.SIGHUP)
			deadline := time.Now().Add(30 * time.Second)
			for version() == v {
				if time.Now().After(deadline) {
					t.Fatalf("the module was not loaded within 30s\n%s", g.Stderr())
				}
				time.Sleep(100 * time.Millisecond)
			}
			n := len(e.Up.Requests())
			r := g.Call(agentA, "tickets.list_tickets", `{}`)
			reached := len(e.Up.Requests()) - n
			var rule, reason string
			for _, rec := range g.AuditEvent("decision", r.RequestID) {
				f, _ := rec["fields"].(map[string]any)
				rule, _ = f["rule"].(string)
				reason, _ = f["reason"].(string)
			}
			ctl := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":1}}`)
			c.Observef("%d %s, audited rule %q reason %.80q, upstream requests %d; control refund %d %s", r.Status, r.Code, rule, reason, reached, ctl.Status, ctl.HoldState)
			if r.Status != http.StatusForbidden || r.Code != "policy_block" || reached != 0 {
				t.Errorf("got %d %s with %d upstream requests, want 403 policy_block and none", r.Status, r.Body, reached)
			}
			if rule != tc.rule || !strings.Contains(reason, tc.reason) {
				t.Errorf("decision record rule %q reason %q, want %s naming %q", rule, reason, tc.rule, tc.reason)
			}
			if ctl.Status != http.StatusAccepted {
				t.Errorf("control: refund %d %s, want 202 held", ctl.Status, ctl.Body)
			}
		})
	}
}

// writeRego puts src into DIR/rego/team.rego, the policy directory the
// configs list, and returns the directory and the module's path.
func writeRego(t *testing.T, dir, src string) (rego, mod string) {
	t.Helper()
	rego = filepath.Join(dir, "rego")
	if err := os.Mkdir(rego, 0o755); err != nil {
		t.Fatal(err)
	}
	mod = filepath.Join(rego, "team.rego")
	if err := os.WriteFile(mod, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return rego, mod
}

// TestAuditFileReplaced: a file the gateway did not create is renamed over
// the audit log's path (someone swapping in a forged log). The gateway
// must refuse every call rather than write into or after that file, leave
// it untouched, and resume with a new log of its own once the path is free.
func TestAuditFileReplaced(t *testing.T) {
	e := newEnv(t)
	d := e.BaseConfig("replaced")
	path := e.Write(d)
	g := e.Start(d, path)
	c := casebook.Expect(t, "G5", "a foreign file renamed over the audit log while the gateway runs (a forged log swapped in)",
		"calls 503 audit_unavailable with nothing upstream, the foreign file untouched; once it is removed, a new log starting with audit_log_recreated and calls resume")

	if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
		t.Fatalf("control: %d %s", r.Status, r.Body)
	}
	forged := []byte(`{"seq":1,"event":"forged"}` + "\n")
	tmp := g.Audit + ".forged"
	if err := os.WriteFile(tmp, forged, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, g.Audit); err != nil {
		t.Fatal(err)
	}
	acc, n := e.Up.Accepts.Load(), len(e.Up.Requests())
	r1 := g.Call(agentA, "tickets.list_tickets", `{}`)
	r2 := g.Call(agentA, "tickets.list_tickets", `{}`)
	reached := e.Up.Accepts.Load() != acc || len(e.Up.Requests()) != n
	after, _ := os.ReadFile(g.Audit)
	untouched := string(after) == string(forged)
	if err := os.Remove(g.Audit); err != nil {
		t.Fatal(err)
	}
	var r3 gwenv.Reply
	for i := 0; i < 3 && r3.Status != http.StatusOK; i++ { // the first call after removal may find the path free mid-check
		r3 = g.Call(agentA, "tickets.list_tickets", `{}`)
	}
	recs := g.AuditRecords()
	first := map[string]any{}
	if len(recs) > 0 {
		first = recs[0]
	}
	c.Observef("replaced: %d %s then %d %s, upstream reached %v, foreign file untouched %v; removed: %d, new log starts with %v",
		r1.Status, r1.Code, r2.Status, r2.Code, reached, untouched, r3.Status, first["event"])
	for i, r := range []gwenv.Reply{r1, r2} {
		if r.Status != http.StatusServiceUnavailable || r.Code != "audit_unavailable" {
			t.Errorf("call %d with a foreign file at the path: %d %s, want 503 audit_unavailable", i+1, r.Status, r.Body)
		}
	}
	if reached {
		t.Error("a call reached the upstream while the audit path held a foreign file")
	}
	if !untouched {
		t.Errorf("the gateway wrote into the foreign file: %q", after)
	}
	if r3.Status != http.StatusOK || first["event"] != "audit_log_recreated" {
		t.Errorf("after the foreign file was removed: %d, new log starts with %v; want 200 and audit_log_recreated", r3.Status, first["event"])
	}
}
