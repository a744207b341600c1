//go:build linux

package attack

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// The suites here send bytes through the sandbox socket of the real
// `sluice serve` binary, running in a network namespace made for the test,
// as an agent inside a sandbox would (sandboxd relays the socket
// byte-for-byte after writing the identity preamble).

var (
	sluiceOnce sync.Once
	sluiceBin  string
	sluiceErr  error
)

// gatewayBin builds cmd/sluice once into the package's build directory.
func gatewayBin(t *testing.T) string {
	t.Helper()
	if why := gwenv.SkipReason(); why != "" {
		t.Skip(why)
	}
	need(t)
	sluiceOnce.Do(func() { sluiceBin, sluiceErr = gwenv.Build(buildDir) })
	if sluiceErr != nil {
		t.Fatal(sluiceErr)
	}
	return sluiceBin
}

// egressIP is the "public" address of the world's upstreams, on the
// namespace's lo (which has no other interface, so nothing leaves it).
const egressIP = "11.0.0.1"

// Identities besides gwenv's agent-a: agent-c only opens tunnels (its own
// tunnel budget), agent-d only makes holds (its own pending budget).
var (
	agentA = gwenv.AgentA
	agentC = wire.Identity{Sandbox: "sb-3", Agent: "agent-c", Session: "s3", User: "chris"}
	agentD = wire.Identity{Sandbox: "sb-4", Agent: "agent-d", Session: "s4", User: "dave"}
)

// tlsSeen is one request the TLS upstream received.
type tlsSeen struct {
	host, uri, auth, body string
	hdr                   http.Header
}

// world is a namespace with an HTTP and a TLS upstream on egressIP, a DNS
// server on the namespace loopback, the connector upstream of gwenv and a
// gateway that intercepts api.test and other.test (a placeholder is bound
// to api.test's Authorization header).
type world struct {
	e           *gwenv.Env
	g           *gwenv.Gateway
	doc         gwenv.Doc
	cfg         string
	rego        string
	upstreamCA  *x509.CertPool
	gatewayCA   *x509.CertPool
	placeholder string
	ghSecret    string

	httpConn, tlsConn, dnsQ atomic.Int64
	mu                      sync.Mutex
	tlsReqs                 []tlsSeen
}

const harmlessRego = `package sluice.policies.team

decisions contains {"action": "block", "rule": "team.nothing", "reason": "never matches"} if {
	input.tool == "tickets.none"
}
`

func newWorld(t *testing.T) *world { t.Helper(); return newWorldWith(t, nil) }

// newWorldWith is newWorld whose configuration edit changes before the
// gateway starts (hosted_test.go adds its listener).
func newWorldWith(t *testing.T, edit func(e *gwenv.Env, d gwenv.Doc)) *world {
	t.Helper()
	e := gwenv.New(t, gatewayBin(t))
	w := &world{e: e, ghSecret: "ghp_" + strings.Repeat("s3cr3t", 6)}
	e.NS.AddAddr(t, egressIP+"/32")
	cert, caPEM, pool := gwenv.UpstreamPKI(t, "pkg.test", "api.test", "other.test")
	w.upstreamCA = pool
	caFile := filepath.Join(e.Dir, "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	hl := e.NS.Listen(t, egressIP+":80")
	tl := e.NS.Listen(t, egressIP+":443")
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.TLS != nil {
			w.mu.Lock()
			w.tlsReqs = append(w.tlsReqs, tlsSeen{host: r.Host, uri: r.URL.RequestURI(), auth: r.Header.Get("Authorization"), body: string(b), hdr: r.Header.Clone()})
			w.mu.Unlock()
		}
		if strings.HasPrefix(r.URL.Path, "/reflect/") {
			reflectReply(rw, r) // scrub_test.go: a hostile upstream
			return
		}
		if r.URL.Path == "/headers" {
			echoHeaders(rw, r)
			return
		}
		if r.URL.Path == "/redirect" {
			rw.Header().Set("Location", "http://169.254.169.254/latest/meta-data/")
			rw.WriteHeader(http.StatusFound)
			return
		}
		fmt.Fprintf(rw, "hello from %s %s", r.Host, r.URL.Path)
	})
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	ts := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(gwenv.Counting(hl, &w.httpConn)) }()
	go func() {
		_ = ts.Serve(tls.NewListener(gwenv.Counting(tl, &w.tlsConn), &tls.Config{Certificates: []tls.Certificate{cert}}))
	}()
	table := map[string]string{"pkg.test": egressIP, "api.test": egressIP, "other.test": egressIP,
		"rebind.test": "127.0.0.1", "meta.test": "169.254.169.254", "metadata.google.internal": "169.254.169.254",
		"meta6.test": "fd00:ec2::254"} // AWS's IPv6 metadata address, AAAA only
	e.NS.ServeDNS(t, func(rw mdns.ResponseWriter, q *mdns.Msg) {
		w.dnsQ.Add(1)
		m := gwenv.DNSReply(q, table, 0)
		if q.Question[0].Name == "servfail.test." {
			m.Rcode = mdns.RcodeServerFailure
		}
		_ = rw.WriteMsg(m)
	})
	t.Cleanup(func() { _ = hs.Close(); _ = ts.Close() })

	w.rego = filepath.Join(e.Dir, "rego")
	if err := os.Mkdir(w.rego, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.rego, "team.rego"), []byte(harmlessRego), 0o644); err != nil {
		t.Fatal(err)
	}
	d := e.BaseConfig("atk")
	d["rego"] = []string{w.rego}
	d.Gateway()["max_pending_holds"] = 2
	d.Gateway()["max_pending_holds_per_sandbox"] = 2 // B7 is the agent's cap; B9 (holds_cap_test.go) the sandbox's
	egress := []string{"pkg.test", "api.test", "other.test", "rebind.test", "meta.test", "meta6.test", "servfail.test", "nx.test", "metadata.google.internal"}
	d["agents"] = []map[string]any{
		{"name": "agent-a", "connectors": []string{"tickets"}, "egress": egress},
		{"name": "agent-b", "connectors": []string{}},
		{"name": "agent-c", "connectors": []string{}, "egress": []string{"pkg.test"}},
		{"name": "agent-d", "connectors": []string{"tickets"}},
	}
	d["egress"] = map[string]any{
		"max_tunnels_per_caller": 2,
		"handshake_timeout":      "8s",
		"intercept": map[string]any{"hosts": []string{"api.test", "other.test"},
			"ca_dir": filepath.Join(e.Dir, "ca"), "upstream_ca_file": caFile},
		"placeholders": []map[string]any{{"secret": "gh-token", "hosts": []string{"api.test"}, "header": "Authorization", "prefix": "Bearer "}},
	}
	d["dns"] = map[string]any{"upstreams": []string{gwenv.DNSAddr}, "subdomain_threshold": 5}
	if edit != nil {
		edit(e, d)
	}
	w.doc, w.cfg = d, e.Write(d)
	e.SetSecret(w.cfg, "gh-token", w.ghSecret)
	w.g = e.Start(d, w.cfg)

	code, body, err := w.g.AdminGet("/ca.pem")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /ca.pem: %d %v %s", code, err, body)
	}
	w.gatewayCA = x509.NewCertPool()
	if !w.gatewayCA.AppendCertsFromPEM(body) {
		t.Fatalf("GET /ca.pem is not PEM: %q", body)
	}
	// With approvers configured, the placeholder list needs a person.
	st, _, m := w.g.AdminDo(http.MethodGet, "/api/v1/placeholders", gwenv.CarolToken, "")
	phs, _ := m["placeholders"].([]any)
	if st != http.StatusOK || len(phs) != 1 {
		t.Fatalf("GET /api/v1/placeholders: %d %v", st, m)
	}
	w.placeholder, _ = phs[0].(map[string]any)["placeholder"].(string)
	if !strings.HasPrefix(w.placeholder, "sluice:secret:gh-token:") || strings.Contains(w.placeholder, w.ghSecret) {
		t.Fatalf("placeholder %q", w.placeholder)
	}
	return w
}

func (w *world) tlsRequests() []tlsSeen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]tlsSeen(nil), w.tlsReqs...)
}

// proxyClient uses the gateway as its HTTP proxy over the sandbox socket,
// trusting roots for TLS, and does not follow redirects.
func (w *world) proxyClient(id wire.Identity, roots *x509.CertPool) *http.Client {
	proxyURL, _ := url.Parse("http://sluice-proxy")
	return &http.Client{
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{
			Proxy:             http.ProxyURL(proxyURL),
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			DialContext: func(context.Context, string, string) (net.Conn, error) {
				return w.g.Dial(id)
			},
		},
	}
}

// fetch sends one request through the proxy and reads the whole reply.
func (w *world) fetch(t *testing.T, c *http.Client, method, u, body string, hdr http.Header) (int, string, http.Header) {
	t.Helper()
	// The world caps a sandbox at 2 tunnels (max_tunnels_per_caller, B6)
	// and proxyClient opens one per request: a tunnel the client has
	// closed holds its slot until the gateway has finished it (its result
	// record written), so a request made right after two others can find
	// both slots still held. Only that refusal (the CONNECT answered 429)
	// is tried again, for at most 5s; nothing was sent upstream for it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		req, err := http.NewRequest(method, u, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := c.Do(req)
		if err != nil && req.URL.Scheme == "https" && strings.HasSuffix(err.Error(), http.StatusText(http.StatusTooManyRequests)) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("%s %s: %v", method, u, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
}

// exchange writes raw on a fresh connection as id and reads one response
// (a CONNECT's 200 has no body: the connection is then the tunnel).
func (w *world) exchange(t *testing.T, id wire.Identity, raw string) (*http.Response, string, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := w.g.Dial(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("write: %v", err)
	}
	br := bufio.NewReader(c)
	method := strings.SplitN(raw, " ", 2)[0]
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("read response to %q: %v", firstLine(raw), err)
	}
	if method == http.MethodConnect && resp.StatusCode == http.StatusOK {
		return resp, "", c, br // the tunnel: no body to read
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), c, br
}

func firstLine(s string) string { return strings.SplitN(s, "\r\n", 2)[0] }

// errCode is the JSON error code of a body ("" if none).
func errCode(body string) string {
	code, _ := errFields(body)
	return code
}

// errFields are the code and request_id of a JSON error body.
func errFields(body string) (code, requestID string) {
	var eb struct {
		Error struct {
			Code      string `json:"code"`
			RequestID string `json:"request_id"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &eb)
	return eb.Error.Code, eb.Error.RequestID
}

// awaitAudit waits for an audit record of event whose JSON contains every
// one of subs.
func (w *world) awaitAudit(t *testing.T, event string, subs ...string) bool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, r := range w.g.For(t).AuditEvent(event, "") {
			b, _ := json.Marshal(r)
			all := true
			for _, s := range subs {
				all = all && strings.Contains(string(b), s)
			}
			if all {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// awaitAuditCount waits until at least n audit records of event contain sub.
func (w *world) awaitAuditCount(t *testing.T, event, sub string, n int) bool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(w.g.For(t).AuditEvent(event, sub)) < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// clientHello returns the first TLS record a real crypto/tls client sends
// for serverName ("" sends no SNI).
func clientHello(t *testing.T, serverName string) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		_ = tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""}).Handshake()
		a.Close()
	}()
	defer b.Close()
	_ = b.SetReadDeadline(time.Now().Add(10 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}
