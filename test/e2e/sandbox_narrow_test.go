//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestSandboxEgressNarrowing: `sandboxd run --egress pkg.test` for an
// agent whose allowlist is pkg.test and other.test. Inside the real
// sandbox, pkg.test (in both lists) answers through the proxy and
// resolves; other.test (the agent's, not the sandbox's) is refused on
// every way out — plain http (403 egress_denied), CONNECT (403) and DNS
// (REFUSED) — by the narrowing's rule before policy, and only the allowed
// request reaches the upstream. Every audit record of the sandbox carries
// its narrowing. A run whose --egress names a host outside the agent's
// list (evil.test) is refused at create with the gateway's
// egress_not_granted, audited there and in sandboxd's events, and runs
// nothing.
func TestSandboxEgressNarrowing(t *testing.T) {
	e := curlSandboxEnv(t)
	var reqs atomic.Int64
	var hosts hostList
	hl := e.NS.Listen(t, egressIP+":80")
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		reqs.Add(1)
		hosts.add(r.Host)
		fmt.Fprintf(rw, "hello from %s", r.Host)
	})}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() { _ = hs.Close() })
	table := map[string]string{"pkg.test": egressIP, "other.test": egressIP, "evil.test": egressIP}
	e.NS.ServeDNS(t, func(rw mdns.ResponseWriter, q *mdns.Msg) { _ = rw.WriteMsg(gwenv.DNSReply(q, table, 0)) })

	d := e.CoreConfig("narrow")
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{}, "egress": []string{"pkg.test", "other.test"}}}
	d["dns"] = map[string]any{"upstreams": []string{gwenv.DNSAddr}}
	g := e.Start(d, e.Write(d))

	const proxy = "http://127.0.0.1:3128"
	script := strings.Join([]string{
		curlStep,
		`step both -w ' %{http_code}' -x ` + proxy + ` http://pkg.test/x`,
		`step narrowed-http -w ' %{http_code}' -x ` + proxy + ` http://other.test/y`,
		`step narrowed-connect -w ' %{http_connect}' -x ` + proxy + ` https://other.test/`,
		`getent hosts pkg.test >/dev/null; echo "dns-both $?"`,
		`getent hosts other.test >/dev/null; echo "dns-narrowed $?"`,
	}, "\n")
	state := sandboxState(t, "sluice-e2e-narrow-")
	out, stderr, code := runBin(t, state, sandboxdBin, "run", "--state-dir", state, "--gateway", g.Sock,
		"--agent", "agent-a", "--session", "narrow", "--egress", "pkg.test", "--timeout", "60s", "--", "/bin/sh", "-c", script)
	if code != 0 {
		t.Fatalf("sandboxd run --egress pkg.test: exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	t.Logf("inside the sandbox:\n%s", out)
	steps := parseSteps(out)
	for _, tc := range []struct{ step, prefix, contains string }{
		{"both", "0 hello from pkg.test 200", ""},
		{"narrowed-http", "0 ", `"code":"egress_denied"`},
		{"narrowed-connect", "56 ", "403"},
		{"dns-both", "0", ""},
		{"dns-narrowed", "2", ""}, // getent: not found (the answerer said REFUSED)
	} {
		if got := steps[tc.step]; !strings.HasPrefix(got, tc.prefix) || !strings.Contains(got, tc.contains) {
			t.Errorf("%s: %q, want prefix %q containing %q", tc.step, got, tc.prefix, tc.contains)
		}
	}
	if got := steps["narrowed-http"]; !strings.Contains(got, " 403|") || !strings.Contains(got, `not on sandbox`) {
		t.Errorf("narrowed-http: %q, want 403 naming the sandbox's egress list", got)
	}
	if n, hs := reqs.Load(), hosts.list(); n != 1 || len(hs) != 1 || hs[0] != "pkg.test" {
		t.Errorf("the upstream served %d requests for %v, want exactly one for pkg.test", n, hs)
	}

	// The audit log: the refusals decided by the narrowing's rule, the
	// allowed request by the agent's allowlist, all carrying egress.
	want := map[string]bool{
		"decision allow pkg.test http egress":              false,
		"decision block other.test http sandbox_egress":    false,
		"decision block other.test connect sandbox_egress": false,
		"dns_refused block other.test dns sandbox_egress":  false,
	}
	var sandbox string
	for _, r := range g.AuditRecords() {
		f, _ := r["fields"].(map[string]any)
		if f == nil || f["session"] != "narrow" {
			continue
		}
		sandbox, _ = f["sandbox"].(string)
		if f["egress"] != "pkg.test" {
			t.Errorf("audit record %v %v of the narrowed sandbox without its egress: %v", r["event"], f["dest_host"], f)
		}
		key := fmt.Sprintf("%v %v %v %v %v", r["event"], f["decision"], f["dest_host"], f["kind"], f["rule"])
		if _, ok := want[key]; ok {
			want[key] = true
		}
		if f["rule"] == "sandbox_egress" && f["code"] != "egress_denied" {
			t.Errorf("narrowed refusal %s without code egress_denied: %v", key, f)
		}
	}
	var missing []string
	for k, seen := range want {
		if !seen {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("no audit records %q", missing)
	}
	cb := casebook.Expect(t, "C19", "agent code in a sandbox made with --egress pkg.test reaches other.test, which its agent's allowlist has but the narrowing does not, over plain http, CONNECT and DNS",
		"403 egress_denied / REFUSED, rule sandbox_egress, audit records carrying egress=pkg.test; nothing reaches other.test; control: pkg.test answers 200 and resolves")
	cb.Observef("http %.60q; connect %.30q; dns rc %s; control %.40q; upstream saw %v; audit missing %v (sandbox %s)",
		steps["narrowed-http"], steps["narrowed-connect"], steps["dns-narrowed"], steps["both"], hosts.list(), missing, sandbox)

	// Wider than the agent's list: refused at create, nothing runs.
	state = sandboxState(t, "sluice-e2e-narrow-wide-")
	out, stderr, code = runBin(t, state, sandboxdBin, "run", "--state-dir", state, "--gateway", g.Sock,
		"--agent", "agent-a", "--session", "wide", "--egress", "pkg.test,evil.test", "--", "/bin/sh", "-c", "echo ran")
	if code != 1 || strings.Contains(out, "ran") || !strings.Contains(stderr, "egress_not_granted") || !strings.Contains(stderr, "evil.test") {
		t.Errorf("--egress wider than the agent's list: exit %d, stdout %q, stderr %q; want exit 1 with egress_not_granted naming evil.test", code, out, stderr)
	}
	recs := g.AuditEvent("egress_not_granted", `"session":"wide"`)
	if len(recs) != 1 {
		t.Errorf("gateway audit records egress_not_granted for session wide: %d, want 1", len(recs))
	} else if f, _ := recs[0]["fields"].(map[string]any); f["egress"] != "evil.test,pkg.test" || fmt.Sprint(f["not_granted"]) != "[evil.test]" {
		t.Errorf("egress_not_granted record: %v", f)
	}
	ev := readEvents(t, state)
	var refused, created int
	for _, m := range ev {
		switch m["event"] {
		case "egress_refused":
			if m["egress"] == "evil.test,pkg.test" && strings.Contains(fmt.Sprint(m["error"]), "egress_not_granted") {
				refused++
			}
		case "create", "created", "exec":
			created++
		}
	}
	if refused != 1 || created != 0 {
		t.Errorf("sandboxd events: %d egress_refused, %d create/exec; want 1 and 0: %v", refused, created, ev)
	}
	// Unconfirmed: no gateway to ask. Refused, not run unnarrowed.
	state = sandboxState(t, "sluice-e2e-narrow-none-")
	nout, nerr, ncode := runBin(t, state, sandboxdBin, "run", "--state-dir", state, "--no-gateway",
		"--agent", "agent-a", "--egress", "pkg.test", "--", "/bin/sh", "-c", "echo ran")
	if ncode != 1 || strings.Contains(nout, "ran") || !strings.Contains(nerr, "egress not granted: the gateway cannot confirm egress pkg.test") {
		t.Errorf("--egress with no gateway: exit %d, stdout %q, stderr %q; want exit 1, unconfirmed", ncode, nout, nerr)
	}
	cb2 := casebook.Expect(t, "A14", "sandboxd run --egress names a host (evil.test) outside the agent's egress allowlist, to widen what the sandbox may reach",
		"refused at create (exit 1, the gateway's 403 egress_not_granted naming evil.test), audited by the gateway and in sandboxd's events; no sandbox runs")
	cb2.Observef("exit %d, stderr %.120q; gateway records %d; sandboxd egress_refused %d, create/exec events %d; unconfirmed: exit %d, %.80q", code, stderr, len(recs), refused, created, ncode, nerr)
}

// readEvents reads sandboxd's events.jsonl under state.
func readEvents(t *testing.T, state string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "events.jsonl"))
	if err != nil {
		t.Fatalf("read events: %v", err)
	}
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var m map[string]any
		if len(l) > 0 && json.Unmarshal(l, &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// hostList collects strings from handler goroutines.
type hostList struct {
	mu sync.Mutex
	s  []string
}

func (h *hostList) add(v string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.s = append(h.s, v)
}

func (h *hostList) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.s...)
}
