//go:build linux

package e2e

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// pipPython is Debian's python3 (package python3-pip for pip): the host's
// /usr is bound read-only into the sandbox, so this is what runs inside.
// An explicit path: a pyenv shim on PATH would not exist in the sandbox.
const pipPython = "/usr/bin/python3"

// The tiny pure-Python distribution the index serves.
const (
	pipDist   = "tinypkg"
	pipValue  = "installed-through-sluice"
	pipWheel  = "tinypkg-1.0-py3-none-any.whl"
	evilIndex = "11.0.0.2" // evil.test: an index the agent may not reach
)

// tinyWheel builds a valid wheel (PEP 427): the module, METADATA, WHEEL
// and a RECORD with the sha256 of every file.
func tinyWheel(t *testing.T) []byte {
	t.Helper()
	files := []struct{ name, body string }{
		{pipDist + "/__init__.py", fmt.Sprintf("VALUE = %q\n", pipValue)},
		{pipDist + "-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: " + pipDist + "\nVersion: 1.0\nSummary: sluice e2e test package\n"},
		{pipDist + "-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: sluice-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	add := func(name, body string) {
		w, err := z.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
		add(f.name, f.body)
	}
	recName := pipDist + "-1.0.dist-info/RECORD"
	record.WriteString(recName + ",,\n")
	add(recName, record.String())
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// packageIndex is a PEP 503 simple index serving one wheel; it records
// every request it gets as "host METHOD path".
type packageIndex struct {
	wheel []byte
	mu    sync.Mutex
	seen  []string
}

func (p *packageIndex) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.seen = append(p.seen, r.Host+" "+r.Method+" "+r.URL.Path)
	p.mu.Unlock()
	sum := sha256.Sum256(p.wheel)
	switch r.URL.Path {
	case "/simple/", "/simple":
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"%s/\">%s</a></body></html>\n", pipDist, pipDist)
	case "/simple/" + pipDist + "/":
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"../../packages/%s#sha256=%s\">%s</a></body></html>\n",
			pipWheel, hex.EncodeToString(sum[:]), pipWheel)
	case "/packages/" + pipWheel:
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(p.wheel)
	default:
		http.NotFound(w, r)
	}
}

func (p *packageIndex) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// TestPipInSandboxThroughProxy runs Debian's pip inside a real sandbox
// made by `sandboxd run` (issue 6: "the same through curl and pip inside a
// sandbox ... a local package index on loopback"). The gateway runs in a
// network namespace with a PEP 503 index on egressIP (pkg.test, on the
// agent's egress list, over http and https) and another on evilIndex
// (evil.test, not on it), and a miekg/dns resolver. pip uses the sandbox's
// HTTP_PROXY/HTTPS_PROXY (127.0.0.1:3128, sandboxd's relay to the gateway):
// from pkg.test it installs the package into /workspace over plain http
// and over CONNECT (the upstream's real certificate, interception off),
// and the import works; from evil.test it fails on the gateway's 403, the
// gateway audits egress_denied, evil.test is never resolved and its index
// gets no connection; with the proxy bypassed pip cannot connect at all.
func TestPipInSandboxThroughProxy(t *testing.T) {
	if out, err := exec.Command(pipPython, "-m", "pip", "--version").CombinedOutput(); err != nil {
		t.Skipf("Debian's pip is not installed (%s -m pip: %v: %s; Debian package python3-pip, test.sh installs it)", pipPython, err, out)
	}
	e := newEnv(t)
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("kernel lacks user namespaces")
	}
	buildSandboxBins(t)
	for _, ip := range []string{egressIP, evilIndex} {
		e.NS.AddAddr(t, ip+"/32")
	}
	cert, caPEM, _ := gwenv.UpstreamPKI(t, "pkg.test", "evil.test")
	idx := &packageIndex{wheel: tinyWheel(t)}
	evil := &packageIndex{wheel: idx.wheel}
	var pkgConns, evilConns atomic.Int64
	var dnsMu sync.Mutex
	dnsNames := map[string]int{}
	hl, tl := e.NS.Listen(t, egressIP+":80"), e.NS.Listen(t, egressIP+":443")
	el, etl := e.NS.Listen(t, evilIndex+":80"), e.NS.Listen(t, evilIndex+":443")
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	servers := []*http.Server{
		{Handler: idx, ReadHeaderTimeout: 5 * time.Second}, {Handler: idx, ReadHeaderTimeout: 5 * time.Second},
		{Handler: evil, ReadHeaderTimeout: 5 * time.Second}, {Handler: evil, ReadHeaderTimeout: 5 * time.Second},
	}
	go func() { _ = servers[0].Serve(gwenv.Counting(hl, &pkgConns)) }()
	go func() { _ = servers[1].Serve(tls.NewListener(gwenv.Counting(tl, &pkgConns), tlsCfg)) }()
	go func() { _ = servers[2].Serve(gwenv.Counting(el, &evilConns)) }()
	go func() { _ = servers[3].Serve(tls.NewListener(gwenv.Counting(etl, &evilConns), tlsCfg)) }()
	table := map[string]string{"pkg.test": egressIP, "evil.test": evilIndex}
	e.NS.ServeDNS(t, func(rw mdns.ResponseWriter, q *mdns.Msg) {
		dnsMu.Lock()
		dnsNames[strings.TrimSuffix(q.Question[0].Name, ".")]++
		dnsMu.Unlock()
		_ = rw.WriteMsg(gwenv.DNSReply(q, table, 0))
	})
	t.Cleanup(func() {
		for _, s := range servers {
			_ = s.Close()
		}
	})

	d := e.CoreConfig("pip")
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{}, "egress": []string{"pkg.test"}}}
	d["egress"] = map[string]any{"max_tunnels_per_caller": 4}
	d["dns"] = map[string]any{"upstreams": []string{gwenv.DNSAddr}}
	g := e.Start(d, e.Write(d))
	caFile := filepath.Join(e.Dir, "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}

	// One sandbox, one script. Each step installs into /workspace/<step>
	// and prints "@@ <step> <pip exit> <what import prints>", then pip's
	// output on one line. pip gets only the index and the target; the
	// proxy comes from the sandbox's environment.
	pip := pipPython + ` -m pip install --no-deps --only-binary :all: --timeout 10 --retries 0 tinypkg`
	script := strings.Join([]string{
		`export HOME=/tmp PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1`,
		`echo "@@ env $HTTP_PROXY $HTTPS_PROXY"`,
		`step() { name=$1; shift; "$@" --target /workspace/$name >/tmp/$name.log 2>&1; rc=$?; ` +
			`got=$(PYTHONPATH=/workspace/$name ` + pipPython + ` -c 'import tinypkg; print(tinypkg.VALUE)' 2>/dev/null); ` +
			`echo "@@ $name $rc $got"; tr '\n' ' ' </tmp/$name.log; echo; }`,
		`step http ` + pip + ` --index-url http://pkg.test/simple/ --trusted-host pkg.test`,
		`step https ` + pip + ` --index-url https://pkg.test/simple/ --cert /workspace/ca.pem`,
		// --trusted-host: pip would ignore a plain-http index anyway; the
		// refusal must be the gateway's.
		`step denied-http ` + pip + ` -vv --index-url http://evil.test/simple/ --trusted-host evil.test`,
		`step denied-https ` + pip + ` -vv --index-url https://evil.test/simple/ --cert /workspace/ca.pem`,
		`step direct env NO_PROXY='*' no_proxy='*' ` + pip + ` -vv --index-url http://pkg.test/simple/ --trusted-host pkg.test`,
	}, "\n")
	out := runInSandbox(t, g.Sock, "pip", caFile, script, 240*time.Second)
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "@@ ") {
			t.Logf("inside the sandbox: %s", l)
		}
	}
	type result struct{ rc, imported, log string }
	steps := map[string]result{}
	lines := strings.Split(out.String(), "\n")
	for i, l := range lines {
		rest, ok := strings.CutPrefix(l, "@@ ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		r := result{}
		if len(f) > 1 {
			r.rc = f[1]
		}
		if len(f) > 2 {
			r.imported = f[2]
		}
		if i+1 < len(lines) {
			r.log = lines[i+1]
		}
		steps[f[0]] = r
	}
	t.Run("the sandbox's proxy variables", func(t *testing.T) {
		if r := steps["env"]; r.rc != "http://127.0.0.1:3128" || r.imported != "http://127.0.0.1:3128" {
			t.Fatalf("HTTP_PROXY, HTTPS_PROXY inside: %q %q, want http://127.0.0.1:3128", r.rc, r.imported)
		}
	})

	for _, tc := range []struct {
		step, rc, imported string
		logHas             string // a regular expression
	}{
		{"http", "0", pipValue, `Successfully installed tinypkg-1\.0`},
		{"https", "0", pipValue, `Successfully installed tinypkg-1\.0`},
		// pip exit 1: the proxy's 403 on the index page (http) or on
		// CONNECT (https); nothing installed.
		{"denied-http", "1", "", `403 Client Error: Forbidden for url: http://evil\.test/simple/tinypkg/`},
		{"denied-https", "1", "", `Tunnel connection failed: 403`},
		// No way out but the proxy: Landlock refuses a TCP connect to any
		// port but the relay's (EACCES, errno 13); without Landlock's TCP
		// rules the namespace has no route (ENETUNREACH, errno 101).
		{"direct", "1", "", `Failed to establish a new connection: \[Errno (13|101)\]`},
	} {
		t.Run("pip "+tc.step, func(t *testing.T) {
			r, ok := steps[tc.step]
			if !ok {
				t.Fatalf("no output for %s", tc.step)
			}
			if r.rc != tc.rc || r.imported != tc.imported || !regexp.MustCompile(tc.logHas).MatchString(r.log) {
				t.Fatalf("%s: pip exit %q, import %q, log %q; want exit %s, import %q, log containing %q",
					tc.step, r.rc, r.imported, r.log, tc.rc, tc.imported, tc.logHas)
			}
		})
	}

	// What reached the indexes: pkg.test served the page and the wheel
	// twice (http, then through the tunnel); evil.test nothing at all.
	t.Run("the index saw the installs", func(t *testing.T) {
		got := idx.requests()
		want := []string{
			"pkg.test GET /simple/tinypkg/", "pkg.test GET /packages/" + pipWheel,
			"pkg.test GET /simple/tinypkg/", "pkg.test GET /packages/" + pipWheel,
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("pkg.test index saw %q, want %q (the direct step must not reach it)", got, want)
		}
	})
	t.Run("unlisted index is refused", func(t *testing.T) {
		cb := casebook.Expect(t, "C8", "pip install from http(s)://evil.test/simple/ (not on the agent's egress list) inside a sandbox",
			"pip fails on 403 egress_denied, evil.test never resolved, no connection to its index")
		dnsMu.Lock()
		lookups := dnsNames["evil.test"]
		dnsMu.Unlock()
		var refused []string
		for _, r := range g.For(t).AuditRecords() {
			f, _ := r["fields"].(map[string]any)
			if f == nil || f["dest_host"] != "evil.test" || f["session"] != "pip" {
				continue
			}
			if f["decision"] == "block" || f["code"] == "egress_denied" {
				refused = append(refused, fmt.Sprintf("%v %v %v %v", r["event"], f["kind"], f["decision"], f["code"]))
			}
		}
		cb.Observef("pip exit %s/%s, %d lookups of evil.test, %d connections to its index, audit %v",
			steps["denied-http"].rc, steps["denied-https"].rc, lookups, evilConns.Load(), refused)
		if n := evilConns.Load(); n != 0 || len(evil.requests()) != 0 {
			t.Errorf("evil.test's index got %d connections, requests %q; want none", n, evil.requests())
		}
		if lookups != 0 {
			t.Errorf("evil.test was resolved %d times; policy comes before resolution", lookups)
		}
		for _, kind := range []string{"http", "connect"} {
			found := false
			for _, s := range refused {
				if strings.Contains(s, " "+kind+" ") && strings.Contains(s, "egress_denied") {
					found = true
				}
			}
			if !found {
				t.Errorf("no audit record of evil.test %s refused with egress_denied: %q", kind, refused)
			}
		}
	})
	t.Run("the proxied installs are audited", func(t *testing.T) {
		allowed := map[string]int{}
		for _, r := range g.For(t).AuditRecords() {
			f, _ := r["fields"].(map[string]any)
			if f == nil || f["dest_host"] != "pkg.test" || f["session"] != "pip" || f["agent"] != "agent-a" {
				continue
			}
			if r["event"] == "decision" && f["decision"] == "allow" {
				allowed[fmt.Sprint(f["kind"])]++
			}
			if r["event"] == "result" && f["kind"] == "http" && fmt.Sprint(f["status"]) != "200" {
				t.Errorf("result record with status %v: %v", f["status"], f)
			}
		}
		// Plain http: one decision per request (index page, wheel); https:
		// at least one CONNECT.
		if allowed["http"] < 2 || allowed["connect"] < 1 {
			t.Fatalf("allowed decisions for pkg.test by kind %v, want http >= 2 and connect >= 1", allowed)
		}
	})
}
