//go:build linux

package e2e

import (
	"context"
	"crypto/sha256"
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
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// seenReq is what the intercepting world's TLS upstream received.
type seenReq struct {
	host, path, auth, body, proto string
}

// interceptWorld: a TLS upstream on egressIP serving api.test (a secret is
// bound to it), other.test (intercepted, nothing bound) and plain.test
// (not intercepted; also in plain HTTP on port 80), and a gateway that
// intercepts the first two.
type interceptWorld struct {
	e           *gwenv.Env
	g           *gwenv.Gateway
	upstreamCA  *x509.CertPool // the upstream's own CA
	gatewayCA   *x509.CertPool // from GET /ca.pem
	placeholder string
	release     chan struct{} // lets /stream send its second event

	mu   sync.Mutex
	seen []seenReq
}

// icptSessionToken is the machine token (sandboxd's) the interception
// suite reads the placeholders with.
const icptSessionToken = "e2e-sandboxd-session-token"

func (w *interceptWorld) requests() []seenReq {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]seenReq(nil), w.seen...)
}

func newInterceptWorld(t testing.TB) *interceptWorld {
	t.Helper()
	e := newEnv(t)
	w := &interceptWorld{e: e, release: make(chan struct{}, 16)}
	e.NS.AddAddr(t, egressIP+"/32")
	cert, caPEM, pool := gwenv.UpstreamPKI(t, "api.test", "other.test", "plain.test")
	w.upstreamCA = pool
	caFile := filepath.Join(e.Dir, "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	tl := e.NS.Listen(t, egressIP+":443")
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		w.seen = append(w.seen, seenReq{host: r.Host, path: r.URL.RequestURI(), auth: r.Header.Get("Authorization"), body: string(b), proto: r.Proto})
		w.mu.Unlock()
		if r.URL.Path == "/trailers" {
			// gRPC's shape: a status in a trailer, sent only if asked
			// with TE: trailers; an echo of the credential in another.
			if r.Header.Get("Te") != "trailers" {
				rw.WriteHeader(http.StatusBadRequest)
				return
			}
			rw.Header().Set("Content-Type", "application/grpc")
			rw.WriteHeader(200)
			fmt.Fprint(rw, "body")
			rw.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
			rw.Header().Set(http.TrailerPrefix+"X-Echo", r.Header.Get("Authorization"))
			return
		}
		if r.URL.Path == "/stream" {
			serveStream(rw, w.release)
			return
		}
		if r.URL.Path == "/unauthorized" { // an upstream that refuses the key
			rw.WriteHeader(http.StatusUnauthorized)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/ws") {
			wsUpstream.ServeHTTP(rw, r)
			return
		}
		if r.URL.Path == "/echo" {
			rw.Header().Set("X-Echo", r.Header.Get("Authorization"))
			fmt.Fprintf(rw, "you sent %s", r.Header.Get("Authorization"))
			return
		}
		fmt.Fprintf(rw, "hello from %s %s", r.Host, r.URL.Path)
	})
	ts := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		_ = ts.Serve(tls.NewListener(tl, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}))
	}()
	// The same handler in plain HTTP, for the forward proxy (plain.test).
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(e.NS.Listen(t, egressIP+":80")) }()
	t.Cleanup(func() { _ = hs.Close() })
	table := map[string]string{"api.test": egressIP, "other.test": egressIP, "plain.test": egressIP}
	e.NS.ServeDNS(t, func(rw mdns.ResponseWriter, q *mdns.Msg) { _ = rw.WriteMsg(gwenv.DNSReply(q, table, 60)) })
	t.Cleanup(func() { _ = ts.Close() })

	if err := os.MkdirAll(filepath.Join(e.Dir, "policies"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.Dir, "policies", "admin.rego"), []byte(`package sluice.policies.team

decisions contains {"action": "block", "rule": "team.no_admin", "reason": "admin paths are off limits"} if {
	input.kind == "http"
	startswith(input.request.path, "/admin")
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	d := e.CoreConfig("icpt")
	// sandboxd's token: GET /api/v1/placeholders needs it.
	d.Gateway()["session_tokens_sha256"] = []string{fmt.Sprintf("%x", sha256.Sum256([]byte(icptSessionToken)))}
	d["rego"] = []string{filepath.Join(e.Dir, "policies")}
	d.Gateway()["request_body_timeout"] = "2s" // TestInterceptedStalledBody
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{}, "egress": []string{"api.test", "other.test", "plain.test"}}}
	d["egress"] = map[string]any{
		"intercept": map[string]any{"hosts": []string{"api.test", "*.other.test", "other.test"},
			"ca_dir": filepath.Join(e.Dir, "ca"), "upstream_ca_file": caFile},
		"placeholders": []map[string]any{{"secret": "gh-token", "hosts": []string{"api.test"}, "header": "Authorization", "prefix": "Bearer "}},
	}
	d["dns"] = map[string]any{"upstreams": []string{gwenv.DNSAddr}}
	path := e.Write(d)
	e.SetSecret(path, "gh-token", e.Secret)
	w.g = e.Start(d, path)

	code, body, err := w.g.AdminGet("/ca.pem")
	if err != nil || code != 200 {
		t.Fatalf("GET /ca.pem: %d %v %s", code, err, body)
	}
	w.gatewayCA = x509.NewCertPool()
	if !w.gatewayCA.AppendCertsFromPEM(body) {
		t.Fatalf("GET /ca.pem is not a PEM certificate: %q", body)
	}
	if code, body, _ := w.g.AdminGet("/api/v1/placeholders"); code != 401 {
		t.Fatalf("GET /api/v1/placeholders without a token: %d %s, want 401", code, body)
	}
	code, _, m := w.g.AdminDo(http.MethodGet, "/api/v1/placeholders", icptSessionToken, "")
	body, _ = json.Marshal(m)
	if code != 200 {
		t.Fatalf("GET /api/v1/placeholders: %d %s", code, body)
	}
	var ph struct {
		Placeholders []struct{ Secret, Placeholder string } `json:"placeholders"`
	}
	if err := json.Unmarshal(body, &ph); err != nil || len(ph.Placeholders) != 1 || ph.Placeholders[0].Secret != "gh-token" {
		t.Fatalf("placeholders: %v %s", err, body)
	}
	w.placeholder = ph.Placeholders[0].Placeholder
	if !strings.HasPrefix(w.placeholder, "sluice:secret:gh-token:") || strings.Contains(w.placeholder, e.Secret) {
		t.Fatalf("placeholder %q", w.placeholder)
	}
	return w
}

// client is a sandbox client through the gateway's proxy trusting roots.
func (w *interceptWorld) client(t testing.TB, roots *x509.CertPool) *http.Client {
	proxyURL, _ := url.Parse("http://sluice-proxy")
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(proxyURL),
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return wire.Dial(ctx, w.g.Sock, agentA)
		},
	}}
}

// do sends one request and returns the response with its body read (and
// kept for the D9 check).
func (w *interceptWorld) do(t testing.TB, c *http.Client, method, u, body string, hdr http.Header, host string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if host != "" {
		req.Host = host
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", method, u, err, w.g.Stderr())
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	w.e.Keep(b)
	for _, vs := range resp.Header {
		for _, v := range vs {
			w.e.Keep([]byte(v))
		}
	}
	return resp, string(b)
}

func countEvent(recs []map[string]any, event, host string) int {
	n := 0
	for _, r := range recs {
		f, _ := r["fields"].(map[string]any)
		if r["event"] == event && f["dest_host"] == host {
			n++
		}
	}
	return n
}

// TestInterception: TLS interception with host-bound placeholders.
func TestInterception(t *testing.T) {
	requireHost(t)
	w := newInterceptWorld(t)
	c := w.client(t, w.gatewayCA)
	bearer := http.Header{"Authorization": {"Bearer " + w.placeholder}}

	t.Run("CA key is 0600", func(t *testing.T) {
		st, err := os.Stat(filepath.Join(w.e.Dir, "ca", "ca.key"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("ca.key mode %04o", st.Mode().Perm())
		}
	})
	t.Run("bound host and header get the real secret", func(t *testing.T) {
		resp, body := w.do(t, c, "GET", "https://api.test/user", "", bearer, "")
		if resp.StatusCode != 200 || body != "hello from api.test /user" {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if resp.TLS == nil || resp.TLS.PeerCertificates[0].Issuer.CommonName != "sluice egress interception CA" {
			t.Fatalf("the client did not see the gateway's leaf")
		}
		reqs := w.requests()
		if last := reqs[len(reqs)-1]; last.auth != "Bearer "+w.e.Secret || last.path != "/user" {
			t.Fatalf("upstream saw path %q, Authorization with the secret: %v", last.path, last.auth == "Bearer "+w.e.Secret)
		}
	})
	t.Run("another host gets the placeholder unchanged", func(t *testing.T) {
		resp, _ := w.do(t, c, "GET", "https://other.test/x", "", bearer, "")
		if resp.StatusCode != 200 {
			t.Fatalf("got %d", resp.StatusCode)
		}
		reqs := w.requests()
		if last := reqs[len(reqs)-1]; last.host != "other.test" || last.auth != "Bearer "+w.placeholder {
			t.Fatalf("other.test saw host %q auth %q", last.host, last.auth)
		}
		w.g.For(t).AwaitAuditFields("placeholder_host_mismatch", map[string]any{"dest_host": "other.test", "kind": "http"})
	})
	t.Run("placeholder in the body goes out unchanged", func(t *testing.T) {
		payload := `{"token":"` + w.placeholder + `"}`
		resp, _ := w.do(t, c, "POST", "https://api.test/upload", payload, nil, "")
		if resp.StatusCode != 200 {
			t.Fatalf("got %d", resp.StatusCode)
		}
		reqs := w.requests()
		if last := reqs[len(reqs)-1]; last.body != payload {
			t.Fatalf("upstream body %q", last.body)
		}
		w.g.For(t).AwaitAuditFields("placeholder_not_substituted", map[string]any{"dest_host": "api.test"})
	})
	t.Run("placeholder in the query goes out unchanged", func(t *testing.T) {
		resp, _ := w.do(t, c, "GET", "https://api.test/q?t="+url.QueryEscape(w.placeholder), "", nil, "")
		if resp.StatusCode != 200 {
			t.Fatalf("got %d", resp.StatusCode)
		}
		reqs := w.requests()
		if last := reqs[len(reqs)-1]; !strings.Contains(last.path, "gh-token") || strings.Contains(last.path, w.e.Secret) {
			t.Fatalf("upstream path %q", last.path)
		}
	})
	t.Run("D6 CR/LF next to a placeholder is 400 and never sent", func(t *testing.T) {
		before := len(w.requests())
		resp, body := w.do(t, c, "GET", "https://api.test/q?t="+url.QueryEscape(w.placeholder)+"%0d%0aX-Evil:%201", "", nil, "")
		if resp.StatusCode != 400 || !strings.Contains(body, `"schema_violation"`) {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		if n := len(w.requests()) - before; n != 0 {
			t.Fatalf("%d requests reached the upstream", n)
		}
	})
	t.Run("keep-alive: several requests in one intercepted tunnel", func(t *testing.T) {
		kc := w.client(t, w.gatewayCA)
		kc.Transport.(*http.Transport).DisableKeepAlives = false
		defer kc.CloseIdleConnections()
		before := countEvent(w.g.For(t).AuditRecords(), "decision", "api.test")
		for i := range 3 {
			resp, body := w.do(t, kc, "GET", fmt.Sprintf("https://api.test/k%d", i), "", bearer, "")
			if resp.StatusCode != 200 || body != fmt.Sprintf("hello from api.test /k%d", i) {
				t.Fatalf("request %d: %d %q\n%s", i, resp.StatusCode, body, w.g.Stderr())
			}
		}
		// One decision for the CONNECT and one per request.
		if n := countEvent(w.g.For(t).AuditRecords(), "decision", "api.test") - before; n != 4 {
			t.Fatalf("%d decision records, want 4 (1 tunnel + 3 requests)", n)
		}
	})
	t.Run("G11 an upstream's 401 is recorded as upstream_status", func(t *testing.T) {
		resp, body := w.do(t, c, "GET", "https://api.test/unauthorized", "", bearer, "")
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("got %d %q, want the upstream's 401 relayed", resp.StatusCode, body)
		}
		g := w.g.For(t)
		rec := g.AwaitAuditFields("result", map[string]any{"dest_host": "api.test", "kind": "http", "status": 401, "upstream_status": 401})
		line := g.AwaitLog("egress 401", func(m map[string]any) bool {
			return m["msg"] == "egress" && m["request_id"] == rec["request_id"]
		})
		if line["upstream_status"] != float64(401) {
			t.Errorf("egress line %v: want upstream_status 401", line)
		}
		_, metrics, err := g.AdminGet("/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if want := `sluice_upstream_responses_total{class="4xx",connector="",path="intercept"} 1`; !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	})
	t.Run("blocked path in the tunnel is 403 and never sent", func(t *testing.T) {
		before := len(w.requests())
		resp, body := w.do(t, c, "GET", "https://api.test/admin/users", "", bearer, "")
		if resp.StatusCode != 403 || !strings.Contains(body, `"egress_denied"`) {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		if n := len(w.requests()) - before; n != 0 {
			t.Fatalf("%d requests reached the upstream", n)
		}
		w.g.For(t).AwaitAuditFields("decision", map[string]any{"dest_host": "api.test", "kind": "http", "decision": "block", "rule": "team.no_admin"})
	})
	t.Run("Host header other than the CONNECT host is 403", func(t *testing.T) {
		cb := casebook.Expect(t, "C5", "CONNECT api.test:443 (intercepted), then a request inside with Host: other.test",
			"403 inside the tunnel, nothing sent upstream")
		before := len(w.requests())
		resp, _ := w.do(t, c, "GET", "https://api.test/user", "", bearer, "other.test")
		cb.Observef("%d, upstream requests +%d", resp.StatusCode, len(w.requests())-before)
		if resp.StatusCode != 403 {
			t.Fatalf("got %d", resp.StatusCode)
		}
		if n := len(w.requests()) - before; n != 0 {
			t.Fatalf("%d requests reached the upstream", n)
		}
	})
	t.Run("echoed secret is scrubbed and audited", func(t *testing.T) {
		resp, body := w.do(t, c, "GET", "https://api.test/echo", "", bearer, "")
		if resp.StatusCode != 200 || strings.Contains(body, w.e.Secret) || strings.Contains(resp.Header.Get("X-Echo"), w.e.Secret) {
			t.Fatalf("got %d; secret in the reply: %v", resp.StatusCode, strings.Contains(body, w.e.Secret))
		}
		if !strings.HasPrefix(body, "you sent Bearer ") {
			t.Fatalf("body %q", body)
		}
		w.g.For(t).AwaitAuditFields("secret_reflected", map[string]any{"dest_host": "api.test"})
	})
	t.Run("a streamed reply reaches the client as it is sent", func(t *testing.T) {
		expectStreamed(t, c, "https://other.test/stream", w.release)
	})
	t.Run("D5 plain http to a credentialed host is 403", func(t *testing.T) {
		before := len(w.requests())
		resp, body := w.do(t, c, "GET", "http://api.test/user", "", bearer, "")
		if resp.StatusCode != 403 || !strings.Contains(body, `"egress_denied"`) {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		if n := len(w.requests()) - before; n != 0 {
			t.Fatalf("%d requests reached the upstream", n)
		}
	})
	t.Run("interception off: the client sees the upstream's certificate", func(t *testing.T) {
		resp, body := w.do(t, w.client(t, w.upstreamCA), "GET", "https://plain.test/p", "", nil, "")
		if resp.StatusCode != 200 || body != "hello from plain.test /p" {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "upstream test CA" {
			t.Fatalf("issuer %q", iss)
		}
	})
	t.Run("the secret was sent only to api.test", func(t *testing.T) {
		for _, r := range w.requests() {
			if strings.Contains(r.auth+r.body+r.path, w.e.Secret) && r.host != "api.test" {
				t.Errorf("the secret reached %s", r.host)
			}
		}
		if n := countEvent(w.g.For(t).AuditRecords(), "placeholder_host_mismatch", "api.test"); n != 0 {
			t.Errorf("%d host mismatches audited for the bound host", n)
		}
	})
}

// BenchmarkIntercept measures keep-alive HTTPS requests through one
// tunnel of the real gateway in its namespace: passed through (the
// baseline), intercepted, and intercepted with a placeholder substituted
// (reply buffered and scrubbed). Compare the sub-benchmarks' ns/op.
func BenchmarkIntercept(b *testing.B) {
	requireHost(b)
	w := newInterceptWorld(b)
	for _, bc := range []struct {
		name  string
		roots *x509.CertPool
		url   string
		hdr   http.Header
	}{
		{"pass-through", w.upstreamCA, "https://plain.test/x", http.Header{}},
		{"intercepted", w.gatewayCA, "https://other.test/x", http.Header{}},
		{"intercepted-placeholder", w.gatewayCA, "https://api.test/x", http.Header{"Authorization": {"Bearer " + w.placeholder}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := w.client(b, bc.roots)
			c.Transport.(*http.Transport).DisableKeepAlives = false
			defer c.CloseIdleConnections()
			for b.Loop() {
				req, _ := http.NewRequest("GET", bc.url, nil)
				req.Header = bc.hdr.Clone()
				resp, err := c.Do(req)
				if err != nil || resp.StatusCode != 200 {
					b.Fatalf("%s: %v", bc.url, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
