//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestCurlInSandboxThroughProxy runs Debian's curl inside a real sandbox
// made by `sandboxd run`, whose only way out is the gateway running in a
// network namespace with a TLS and an HTTP upstream on egressIP and a
// miekg/dns resolver (issue 6: "the same through curl inside a sandbox").
// Through the proxy (127.0.0.1:3128 inside) curl reaches the allowed host
// over CONNECT with the upstream's real certificate (interception off)
// and over plain http; an unlisted host gets 403 egress_denied; a DoH
// endpoint gets 403 doh_refused; and the upstream's address without the
// proxy cannot be connected to from inside the sandbox, by address or by
// name (the name resolves through the gateway's DNS answerer, which
// answers it: the sandbox's network namespace has only lo). The gateway's audit log has
// the allowed and refused records; only allowed requests reach the upstream.
func TestCurlInSandboxThroughProxy(t *testing.T) {
	e := curlSandboxEnv(t)
	cert, caPEM, _ := gwenv.UpstreamPKI(t, "pkg.test")
	var tlsConns, httpConns, dnsQ atomic.Int64
	var reqs atomic.Int64
	hl, tl := e.NS.Listen(t, egressIP+":80"), e.NS.Listen(t, egressIP+":443")
	hello := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		reqs.Add(1)
		fmt.Fprintf(rw, "hello from %s %s", r.Host, r.URL.Path)
	})
	hs := &http.Server{Handler: hello, ReadHeaderTimeout: 5 * time.Second}
	ts := &http.Server{Handler: hello, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(gwenv.Counting(hl, &httpConns)) }()
	go func() {
		_ = ts.Serve(tls.NewListener(gwenv.Counting(tl, &tlsConns), &tls.Config{Certificates: []tls.Certificate{cert}}))
	}()
	table := map[string]string{"pkg.test": egressIP, "evil.test": egressIP, "dns.google": egressIP}
	e.NS.ServeDNS(t, func(rw mdns.ResponseWriter, q *mdns.Msg) {
		dnsQ.Add(1)
		_ = rw.WriteMsg(gwenv.DNSReply(q, table, 0))
	})
	t.Cleanup(func() { _ = hs.Close(); _ = ts.Close() })

	d := e.CoreConfig("curl")
	// dns.google is listed on purpose: the proxy refuses it anyway.
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{}, "egress": []string{"pkg.test", "dns.google"}}}
	d["egress"] = map[string]any{"max_tunnels_per_caller": 4}
	d["dns"] = map[string]any{"upstreams": []string{gwenv.DNSAddr}}
	g := e.Start(d, e.Write(d))
	caFile := filepath.Join(e.Dir, "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}

	// One sandbox, one script: each step prints "<name> <curl exit> <codes> <body>".
	const proxy = "http://127.0.0.1:3128"
	script := strings.Join([]string{
		curlStep,
		`step allowed-https -w ' %{http_connect} %{http_code}' --cacert /workspace/ca.pem -x ` + proxy + ` https://pkg.test/x`,
		`step allowed-http -w ' %{http_code}' -x ` + proxy + ` http://pkg.test/y`,
		`step denied-https -w ' %{http_connect} %{http_code}' --cacert /workspace/ca.pem -x ` + proxy + ` https://evil.test/`,
		`step denied-http -w ' %{http_code}' -x ` + proxy + ` http://evil.test/`,
		`step doh -w ' %{http_connect} %{http_code}' --cacert /workspace/ca.pem -x ` + proxy + ` https://dns.google/dns-query`,
		`step direct-ip --noproxy '*' --connect-timeout 3 -w ' %{http_code}' --cacert /workspace/ca.pem https://` + egressIP + `/`,
		`step direct-name --noproxy '*' --connect-timeout 3 -w ' %{http_code}' --cacert /workspace/ca.pem https://pkg.test/`,
	}, "\n")
	out := runInSandbox(t, g.Sock, "curl", caFile, script, 120*time.Second)
	t.Logf("inside the sandbox:\n%s", out.String())
	steps := parseSteps(out.String())
	tests := []struct {
		step, prefix, contains string
	}{
		// curl exit 0; body; CONNECT 200, then the upstream's 200.
		{"allowed-https", "0 hello from pkg.test /x 200 200", ""},
		{"allowed-http", "0 hello from pkg.test /y 200", ""},
		// curl 56: the proxy answered CONNECT with 403.
		{"denied-https", "56 ", "403"},
		{"denied-http", "0 ", `"egress_denied"`},
		{"doh", "56 ", "403"},
		// curl 7: could not connect (no route: the sandbox has only lo).
		{"direct-ip", "7 ", ""},
		{"direct-name", "7 ", ""},
	}
	for _, tc := range tests {
		t.Run(tc.step, func(t *testing.T) {
			got, ok := steps[tc.step]
			if !ok {
				t.Fatalf("no output for %s", tc.step)
			}
			if !strings.HasPrefix(got, tc.prefix) || !strings.Contains(got, tc.contains) {
				t.Errorf("%s: %q, want prefix %q containing %q", tc.step, got, tc.prefix, tc.contains)
			}
		})
	}
	if got := steps["denied-http"]; !strings.Contains(got, " 403|") {
		t.Errorf("denied-http: %q, want status 403", got)
	}
	for _, s := range []string{"direct-ip", "direct-name"} {
		if got := steps[s]; !strings.Contains(got, "unreachable") && !strings.Contains(got, "Failed to connect") {
			t.Errorf("%s: %q, want a connect failure", s, got)
		}
	}
	// Only the two allowed requests reached the upstreams.
	if n := reqs.Load(); n != 2 {
		t.Errorf("upstreams served %d requests, want 2 (allowed-https, allowed-http)", n)
	}
	if n := tlsConns.Load(); n != 1 {
		t.Errorf("TLS upstream accepted %d connections, want 1", n)
	}
	// The audit log: the allowed CONNECT and the refusals, for the sandbox's identity.
	want := map[string]bool{"allow pkg.test connect": false, "block evil.test connect": false, "block evil.test http": false, "doh_refused dns.google connect": false}
	for _, r := range g.AuditRecords() {
		f, _ := r["fields"].(map[string]any)
		if r["event"] != "decision" || f == nil || f["agent"] != "agent-a" || f["session"] != "curl" {
			continue
		}
		key := fmt.Sprintf("%v %v %v", f["decision"], f["dest_host"], f["kind"])
		if f["reason"] == "doh_refused" {
			key = fmt.Sprintf("doh_refused %v %v", f["dest_host"], f["kind"])
		}
		if _, ok := want[key]; ok {
			want[key] = true
		}
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("no audit decision record %q", k)
		}
	}
}

// curl is Debian's curl; the host's /usr is bound read-only into every
// sandbox.
const curl = "/usr/bin/curl"

// curlStep defines the shell function `step NAME CURL-ARGS…`: it runs curl
// and prints one line "NAME <curl exit> <output>|<curl's stderr>".
const curlStep = `step() { name=$1; shift; out=$(` + curl + ` -sS --max-time 10 "$@" 2>/tmp/err); rc=$?; out=$(printf '%s' "$out" | tr '\n' ' '); printf '%s %s %s|%s\n' "$name" "$rc" "$out" "$(tr '\n' ' ' </tmp/err)"; }`

// curlSandboxEnv is the env of a test that runs curl in real sandboxes:
// skipped without curl or user namespaces, the sandbox binaries built,
// egressIP on the env's namespace for the test's upstreams.
func curlSandboxEnv(t *testing.T) *gwenv.Env {
	t.Helper()
	if _, err := os.Stat(curl); err != nil {
		t.Skip("curl not installed (Debian package curl; test.sh installs it)")
	}
	e := newEnv(t)
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("kernel lacks user namespaces")
	}
	buildSandboxBins(t)
	e.NS.AddAddr(t, egressIP+"/32")
	return e
}

// parseSteps maps each output line's first word to the rest of it.
func parseSteps(out string) map[string]string {
	steps := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, " ")
		steps[k] = v
	}
	return steps
}

// runInSandbox runs script with /bin/sh in a fresh sandbox made by the real
// `sandboxd run` (agent-a, the given session, the gateway at sock, caFile
// copied to /workspace/ca.pem) and returns its stdout. limit bounds the
// whole run; the sandbox's own timeout is a little shorter.
func runInSandbox(t *testing.T, sock, session, caFile, script string, limit time.Duration) *bytes.Buffer {
	t.Helper()
	state := sandboxState(t, "sluice-e2e-"+session+"-")
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	inner := limit * 5 / 6
	cmd := exec.CommandContext(ctx, sandboxdBin, "run", "--config", execTimeoutConfig(t, inner), "--state-dir", state, "--gateway", sock,
		"--agent", "agent-a", "--session", session, "--copy", caFile+":/workspace/ca.pem", "--timeout", inner.String(),
		"--", "/bin/sh", "-c", script)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxd run: %v\nstdout: %s\nstderr: %s", err, out.String(), errb.String())
	}
	return &out
}

// execTimeoutConfig writes a sandboxd.yaml whose exec_timeout ceiling is d
// (the configured limits are ceilings a run's --timeout cannot pass).
func execTimeoutConfig(t *testing.T, d time.Duration) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sandboxd.yaml")
	if err := os.WriteFile(p, []byte("limits:\n  exec_timeout: "+d.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
