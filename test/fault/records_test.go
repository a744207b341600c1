//go:build linux

package fault

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// upstreamCount reads sluice_upstream_responses_total for connector,
// path and class from the gateway's /metrics (0 when the series is absent).
func upstreamCount(t *testing.T, g *gwenv.Gateway, connector, path, class string) int {
	t.Helper()
	st, body, err := g.AdminGet("/metrics")
	if err != nil || st != http.StatusOK {
		t.Fatalf("/metrics: %d %v", st, err)
	}
	re := regexp.MustCompile(`^sluice_upstream_responses_total\{(.*)\} (\d+)$`)
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		labels := m[1]
		if bytes.Contains([]byte(labels), []byte(`class="`+class+`"`)) &&
			bytes.Contains([]byte(labels), []byte(`connector="`+connector+`"`)) &&
			bytes.Contains([]byte(labels), []byte(`path="`+path+`"`)) {
			n, _ := strconv.Atoi(m[2])
			return n
		}
	}
	return 0
}

// TestUpstreamStatusRecorded (G11): the upstream refuses the call with
// 401 (a wrong key). The gateway relays that answer, so its own status is
// 200; the audit result record, the canonical tool_call line and the
// metric must each carry the upstream's 401 beside it, or a security
// team reads "200" for a call that did nothing.
func TestUpstreamStatusRecorded(t *testing.T) {
	e := newEnv(t)
	d := e.BaseConfig("upstatus")
	path := e.Write(d)
	g := e.Start(d, path)
	c := casebook.Expect(t, "G11", "the upstream answers 401 (wrong key) to an allowed tool call (real gateway, recording upstream)",
		"reply 200 carrying status 401; audit result status 200 upstream_status 401; tool_call line the same; sluice_upstream_responses_total{connector=tickets,path=tool_call,class=4xx} +1")

	before := upstreamCount(t, g, "tickets", "tool_call", "4xx")
	e.Up.SetMode(gwenv.ModeRaw)
	e.Up.SetRaw("HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: 25\r\nConnection: close\r\n\r\n{\"error\":\"bad api key\"}\r\n")
	r := g.Call(agentA, "tickets.list_tickets", `{}`)
	e.Up.SetMode(gwenv.ModeOK)
	if r.Status != http.StatusOK || r.Result.Status != http.StatusUnauthorized {
		t.Fatalf("call: %d %s, want 200 carrying the upstream's 401", r.Status, r.Body)
	}
	if n := len(e.Up.Requests()); n != 1 {
		t.Fatalf("upstream saw %d requests, want 1", n)
	}
	rec, _ := g.AwaitAudit("result", r.RequestID)["fields"].(map[string]any)
	line := g.AwaitLog("tool_call "+r.RequestID, func(m map[string]any) bool {
		return m["msg"] == "tool_call" && m["request_id"] == r.RequestID
	})
	after := upstreamCount(t, g, "tickets", "tool_call", "4xx")
	c.Observef("reply %d carrying %d; audit status %v upstream_status %v; log status %v upstream_status %v; metric 4xx %d -> %d",
		r.Status, r.Result.Status, rec["status"], rec["upstream_status"], line["status"], line["upstream_status"], before, after)
	if rec["status"] != float64(200) || rec["upstream_status"] != float64(401) {
		t.Errorf("audit result: status %v upstream_status %v, want 200 and 401: %v", rec["status"], rec["upstream_status"], rec)
	}
	if line["status"] != float64(200) || line["upstream_status"] != float64(401) {
		t.Errorf("tool_call line: status %v upstream_status %v, want 200 and 401: %v", line["status"], line["upstream_status"], line)
	}
	if after != before+1 {
		t.Errorf("sluice_upstream_responses_total{connector=tickets,path=tool_call,class=4xx}: %d -> %d, want +1", before, after)
	}

	// An approved hold is sent through the same path: its result too.
	held := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":1}}`)
	if held.Status != http.StatusAccepted || held.HoldID == "" {
		t.Fatalf("ask: %d %s, want 202 pending", held.Status, held.Body)
	}
	e.Up.SetMode(gwenv.ModeRaw)
	e.Up.SetRaw("HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	st, _, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+held.HoldID+"/approve", gwenv.CarolToken, `{"reason":"ok"}`)
	e.Up.SetMode(gwenv.ModeOK)
	if st != http.StatusOK {
		t.Fatalf("approve: %d", st)
	}
	hr, _ := g.AwaitAuditFields("result", map[string]any{"tool": "tickets.create_refund", "upstream_status": 401})["fields"].(map[string]any)
	c.Observef("reply %d carrying %d; audit status %v upstream_status %v; log status %v upstream_status %v; metric 4xx %d -> %d; approved hold's result status %v upstream_status %v",
		r.Status, r.Result.Status, rec["status"], rec["upstream_status"], line["status"], line["upstream_status"], before, after, hr["status"], hr["upstream_status"])
	if hr["status"] != float64(200) {
		t.Errorf("approved hold's result record %v: want status 200 beside upstream_status 401", hr)
	}

	// Control: a refusal before the upstream has no upstream_status at all.
	ctl := g.Call(agentA, "tickets.no_such_tool", `{}`)
	if ctl.Status != http.StatusNotFound {
		t.Fatalf("control: %d %s, want 404", ctl.Status, ctl.Body)
	}
	cl := g.AwaitLog("tool_call "+ctl.RequestID, func(m map[string]any) bool {
		return m["msg"] == "tool_call" && m["request_id"] == ctl.RequestID
	})
	if cl["upstream_status"] != float64(0) || cl["status"] != float64(404) {
		t.Errorf("control tool_call line: status %v upstream_status %v, want 404 and 0", cl["status"], cl["upstream_status"])
	}
}

// TestAuditFullDiskRecords (G12): the audit log is on a full tmpfs. Each
// refused call logs one line, not two, and identical lines are logged once
// and then counted (log_repeated): every refusal is accounted for, in a
// bounded number of lines. The gateway is stopped while the disk is still
// full; the record it was writing is left cut short, and `sluice audit
// verify` names it an unfinished write, not tampering, exits non-zero and
// says the next start removes it. The next start does so (and logs it),
// and the log verifies.
func TestAuditFullDiskRecords(t *testing.T) {
	e := newEnv(t)
	fs := gwenv.Tmpfs(t, e.Dir, "auditfs", "64k")
	d := e.BaseConfig("fullrec")
	logPath := filepath.Join(fs, "audit.log")
	d["audit"] = map[string]any{"path": logPath}
	path := e.Write(d)
	g := e.Start(d, path)
	c := casebook.Expect(t, "G12", "audit log on a full 64k tmpfs: 100 refused calls, then the gateway is stopped while the disk is full, then restarted with space",
		"one log line per refused call at most, identical ones counted in log_repeated (sum = refusals); verify: UNFINISHED ... unfinished write, non-zero, 'not tampering', 'next start removes'; restart logs the removal and verify is ok")
	var obs []string // one observation of every step, recorded even when a step fails
	observe := func(format string, args ...any) { obs = append(obs, fmt.Sprintf(format, args...)) }
	defer func() { c.Observe(strings.Join(obs, "; ")) }()

	if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
		t.Fatalf("control: %d %s", r.Status, r.Body)
	}
	filler := gwenv.Fill(t, fs)
	refused := 0
	for i := 0; i < 40 && refused == 0; i++ {
		if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status == http.StatusServiceUnavailable && r.Code == "audit_unavailable" {
			refused++
		}
	}
	if refused == 0 {
		t.Fatalf("no call was refused audit_unavailable with the disk full")
	}
	start := time.Now()
	for range 100 {
		r := g.Call(agentA, "tickets.list_tickets", `{}`)
		if r.Status != http.StatusServiceUnavailable || r.Code != "audit_unavailable" {
			t.Fatalf("disk full: %d %s, want 503 audit_unavailable", r.Status, r.Body)
		}
		refused++
	}
	took := time.Since(start)

	// Every refusal is a tool_call line or counted in a log_repeated line
	// (logged at the end of each 5s interval in which it repeated).
	var lines, counted, notDurable int
	deadline := time.Now().Add(30 * time.Second)
	for {
		lines, counted, notDurable = 0, 0, 0
		for _, m := range g.LogLines() {
			reason, _ := m["reason"].(string)
			switch {
			case m["msg"] == "tool_call" && strings.HasPrefix(reason, "audit_unavailable"):
				lines++
			case m["msg"] == "log_repeated" && m["line"] == "tool_call" && strings.HasPrefix(reason, "audit_unavailable"):
				n, _ := m["count"].(float64)
				counted += int(n)
			case strings.Contains(fmt.Sprint(m["msg"]), "not durable"):
				notDurable++
			}
		}
		if lines+counted >= refused || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// One line per distinct reason and interval: the 100 calls took
	// `took`; allow the first line, one per interval and one per reason
	// (the first refusal's record may have failed another way).
	bound := 3 + int(took/(5*time.Second))
	observe("%d calls refused audit_unavailable in %v: %d tool_call lines, %d counted in log_repeated, %d separate 'not durable' lines",
		refused, took.Round(time.Millisecond), lines, counted, notDurable)
	if lines+counted != refused {
		t.Errorf("%d tool_call lines + %d counted = %d, want every one of the %d refusals accounted for\nstderr:\n%s", lines, counted, lines+counted, refused, g.Stderr())
	}
	if lines > bound {
		t.Errorf("%d tool_call lines for %d identical refusals in %v, want at most %d", lines, refused, took, bound)
	}
	if notDurable != 0 {
		t.Errorf("%d separate audit error lines: a refused call must log one line, not two", notDurable)
	}

	// Stopped while the disk is full.
	g.Stop()
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	partial := len(data) - (bytes.LastIndexByte(data, '\n') + 1)
	if partial == 0 {
		// The last failed write had no room for even one byte (the log
		// ended exactly on a page): cut its last record as such a write
		// would have, so that verify still meets the case.
		last := bytes.LastIndexByte(data[:len(data)-1], '\n') + 1
		partial = (len(data) - last) / 2
		data = data[:last+partial]
		if err := os.WriteFile(logPath, data, 0o600); err != nil {
			t.Fatal(err)
		}
		observe("the log ended on a newline at stop; its last record was cut to half by the test")
	}
	out, verr := exec.Command(e.Bin, "audit", "verify", "--file", logPath).CombinedOutput()
	observe("stopped with %d bytes of a partial last line; verify exit %v: %s", partial, verr, bytes.TrimSpace(out))
	if verr == nil {
		t.Errorf("verify passed a log with a partial last line: %s", out)
	}
	for _, want := range []string{"UNFINISHED: " + logPath, "unfinished write", "not tampering",
		"next start of the gateway on this log removes these " + strconv.Itoa(partial) + " bytes"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("verify output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "FAIL") || strings.Contains(string(out), "chain broken") {
		t.Errorf("verify calls an unfinished write a broken chain:\n%s", out)
	}

	// Space back, started again: the line is removed (and logged), and
	// the log verifies.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	g = e.Start(d, path)
	rm := g.AwaitLog("audit: removed an unfinished last line", func(m map[string]any) bool {
		return m["msg"] == "audit: removed an unfinished last line"
	})
	if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
		t.Errorf("after restart with space: %d %s", r.Status, r.Body)
	}
	g.Stop()
	out2, verr2 := exec.Command(e.Bin, "audit", "verify", "--file", logPath).CombinedOutput()
	observe("restart logged removal of %v bytes; verify then: %v %s", rm["bytes"], verr2, bytes.TrimSpace(out2))
	if rm["bytes"] != float64(partial) {
		t.Errorf("start removed %v bytes, want %d", rm["bytes"], partial)
	}
	if verr2 != nil || !strings.HasPrefix(string(out2), "ok: ") {
		t.Errorf("verify after the restart: %v %s", verr2, out2)
	}
}

// metricValue is the value of the /metrics sample line that starts with
// series, and whether there is one.
func metricValue(t *testing.T, g *gwenv.Gateway, series string) (string, bool) {
	t.Helper()
	st, body, err := g.AdminGet("/metrics")
	if err != nil || st != http.StatusOK {
		t.Fatalf("/metrics: %d %v", st, err)
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v, true
		}
	}
	return "", false
}

// TestMetricsRecordsFromTheStart (G13): a monitoring system that alerts on
// absent or increasing series sees every sluice family, zero-valued, on
// the first scrape of a fresh `sluice serve`, with the Go and process
// families; the pending-holds gauge goes 0 → 1 → 0 around a hold and its
// approval, and approval latency counts it; a call is counted under the
// same rule label when the config's policies are reordered.
func TestMetricsRecordsFromTheStart(t *testing.T) {
	eachStore(t, func(t *testing.T, sk storeKind) {
		e := newEnv(t)
		c := casebook.Expect(t, "G13", sk.threat("first scrape of a fresh gateway, then a hold approved, then the same call under reordered policies (real binary)"),
			"every sluice family at 0 and go_/process_ families present; sluice_holds_pending 0 -> 1 -> 0; sluice_approval_latency_seconds_count{approved} 1; same rule label under both orders")
		d := e.BaseConfig("metrics")
		sk.apply(d)
		g := e.Start(d, e.Write(d))
		var missing []string
		for _, series := range []string{
			`sluice_decisions_total{action="ask",rule="default"}`,
			`sluice_policy_reloads_total{result="error"}`,
			`sluice_connections_refused_total{code="untrusted_peer"}`,
			`sluice_audit_failures_total`,
			`sluice_secret_reflected_total`,
			`sluice_upstream_responses_total{class="4xx",connector="tickets",path="tool_call"}`,
			`sluice_egress_active`,
			`sluice_dns_answers_total{rcode="NOERROR"}`,
			`sluice_dns_exfiltration_signals_total`,
			`sluice_request_duration_seconds_count{decision="block"}`,
			`sluice_approval_latency_seconds_count{decision="approved"}`,
			`sluice_holds_pending`,
		} {
			if v, ok := metricValue(t, g, series); !ok || v != "0" {
				missing = append(missing, series+"="+v)
			}
		}
		fds, okFD := metricValue(t, g, "process_open_fds")
		_, okGo := metricValue(t, g, "go_goroutines")
		if len(missing) > 0 || !okFD || !okGo {
			t.Errorf("first scrape: not at 0 or absent: %v; process_open_fds %q %v; go_goroutines %v", missing, fds, okFD, okGo)
		}

		held := g.Call(agentA, "tickets.create_refund", `{"body":{"amount":1}}`)
		if held.Status != http.StatusAccepted || held.HoldID == "" {
			t.Fatalf("ask: %d %s, want 202 pending", held.Status, held.Body)
		}
		during, _ := metricValue(t, g, "sluice_holds_pending")
		if st, _, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+held.HoldID+"/approve", gwenv.CarolToken, `{"reason":"ok"}`); st != http.StatusOK {
			t.Fatalf("approve: %d", st)
		}
		g.AwaitAudit("hold_approved", held.HoldID)
		after, _ := metricValue(t, g, "sluice_holds_pending")
		lat, _ := metricValue(t, g, `sluice_approval_latency_seconds_count{decision="approved"}`)
		if during != "1" || after != "0" || lat != "1" {
			t.Errorf("sluice_holds_pending %q while held, %q after approval (want 1, 0); approval latency count %q (want 1)", during, after, lat)
		}

		// The same allowed call under the policies in the other order.
		labelOf := func(g *gwenv.Gateway) string {
			if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
				t.Fatalf("list: %d %s", r.Status, r.Body)
			}
			_, body, _ := g.AdminGet("/metrics")
			m := regexp.MustCompile(`(?m)^sluice_decisions_total\{action="allow",rule="([^"]*)"\} 1$`).FindSubmatch(body)
			if m == nil {
				t.Fatalf("no allow decision counted once in /metrics")
			}
			return string(m[1])
		}
		first := labelOf(g)
		r := e.BaseConfig("metrics-reordered")
		p := r["policies"].([]map[string]any)
		p[0], p[1] = p[1], p[0] // the refund rule first, list second; the catch-all stays last
		second := labelOf(e.Start(r, e.Write(r)))
		c.Observef("first scrape: %d series not at 0 %v; process_open_fds %s; go_goroutines %v; pending %s -> %s; approval latency count %s; rule label %q / reordered %q",
			len(missing), missing, fds, okGo, during, after, lat, first, second)
		if first != second || first != "policy:tickets.list_tickets:allow" {
			t.Errorf("rule label %q, reordered %q; want both policy:tickets.list_tickets:allow", first, second)
		}
	})
}
