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

	"github.com/sluice-gw/sluice/gateway/oauth/oauthtest"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

const svcSpec = `openapi: 3.0.3
info: { title: svc, version: "1" }
paths:
  /status:
    get:
      operationId: getStatus
      responses: { "200": { description: ok } }
`

// TestOAuthPlaceholderBoundToHosts (THREATS D19): an egress placeholder
// bound to an OAuth connection (the svc connector's client-credentials
// token from zitadel's authorization server, in the test's namespace)
// through the real binary with TLS interception:
//   - to its bound host and header the gateway substitutes the access
//     token (one token request), and the reply that echoes it is scrubbed;
//   - in a request to another intercepted host (its header, or its URL)
//     the request is refused 403 egress_denied, audited
//     placeholder_connection_elsewhere, and nothing reaches that host.
func TestOAuthPlaceholderBoundToHosts(t *testing.T) {
	requireHost(t)
	e := newEnv(t)
	e.NS.AddAddr(t, egressIP+"/32")
	cert, caPEM, _ := gwenv.UpstreamPKI(t, "api.test", "other.test")
	caFile := filepath.Join(e.Dir, "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []seenReq
	tl := e.NS.Listen(t, egressIP+":443")
	ts := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, seenReq{host: r.Host, path: r.URL.RequestURI(), auth: r.Header.Get("Authorization"), body: string(b)})
		mu.Unlock()
		rw.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(rw, "you sent %s", r.Header.Get("Authorization"))
	})}
	go func() {
		_ = ts.Serve(tls.NewListener(tl, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}))
	}()
	t.Cleanup(func() { _ = ts.Close() })
	table := map[string]string{"api.test": egressIP, "other.test": egressIP}
	e.NS.ServeDNS(t, func(rw mdns.ResponseWriter, q *mdns.Msg) { _ = rw.WriteMsg(gwenv.DNSReply(q, table, 60)) })
	as := oauthtest.StartOn(t, e.NS.Listen(t, "127.0.0.1:0"), "http://sluice.test/connections/callback")

	spec := filepath.Join(e.Dir, "svc.yaml")
	if err := os.WriteFile(spec, []byte(svcSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	d := e.CoreConfig("ophs")
	d.Gateway()["session_tokens_sha256"] = []string{fmt.Sprintf("%x", sha256.Sum256([]byte(icptSessionToken)))}
	d["connectors"] = []map[string]any{{
		"slug": "svc", "spec": spec, "base_url": as.URL, "allow_private": []string{"127.0.0.0/8"},
		"credential": map[string]any{"oauth2": map[string]any{"flow": "client_credentials", "client_id": oauthtest.ServiceID,
			"client_secret": "svc-client-secret", "token_url": as.TokenURL(), "scopes": []string{"openid"}}},
	}}
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{}, "egress": []string{"api.test", "other.test"}}}
	d["policies"] = []map[string]any{{"match": "*", "action": "allow"}}
	d["egress"] = map[string]any{
		"intercept":    map[string]any{"hosts": []string{"api.test", "other.test"}, "ca_dir": filepath.Join(e.Dir, "ca"), "upstream_ca_file": caFile},
		"placeholders": []map[string]any{{"connection": "svc", "hosts": []string{"api.test"}, "header": "Authorization", "prefix": "Bearer "}},
	}
	d["dns"] = map[string]any{"upstreams": []string{gwenv.DNSAddr}}
	path := e.Write(d)
	e.SetSecret(path, "svc-client-secret", oauthtest.ServiceSecret)
	g := e.Start(d, path)

	code, body, err := g.AdminGet("/ca.pem")
	if err != nil || code != 200 {
		t.Fatalf("GET /ca.pem: %d %v", code, err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(body)
	code, _, m := g.AdminDo(http.MethodGet, "/api/v1/placeholders", icptSessionToken, "")
	raw, _ := json.Marshal(m)
	var ph struct {
		Placeholders []struct{ Secret, Placeholder string } `json:"placeholders"`
	}
	if err := json.Unmarshal(raw, &ph); code != 200 || err != nil || len(ph.Placeholders) != 1 || ph.Placeholders[0].Secret != "oauth2.svc" {
		t.Fatalf("placeholders: %d %v %s", code, err, raw)
	}
	placeholder := ph.Placeholders[0].Placeholder

	proxyURL, _ := url.Parse("http://sluice-proxy")
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return wire.Dial(ctx, g.Sock, agentA) },
	}}
	do := func(u string, hdr http.Header, body ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		if len(body) > 0 {
			req, _ = http.NewRequest(http.MethodPost, u, strings.NewReader(body[0]))
		}
		for k, vs := range hdr {
			req.Header[k] = vs
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v\n%s", u, err, g.Stderr())
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		e.Keep(b)
		var hb strings.Builder
		_ = resp.Header.Write(&hb)
		e.Keep([]byte(hb.String()))
		return resp.StatusCode, hb.String() + string(b)
	}
	seenOn := func(host string) []seenReq {
		mu.Lock()
		defer mu.Unlock()
		var out []seenReq
		for _, s := range seen {
			if s.host == host {
				out = append(out, s)
			}
		}
		return out
	}
	bearer := http.Header{"Authorization": {"Bearer " + placeholder}}

	st, reply := do("https://api.test/user", bearer)
	api := seenOn("api.test")
	if st != 200 || len(api) != 1 || !strings.HasPrefix(api[0].auth, "Bearer ") || api[0].auth == "Bearer "+placeholder {
		t.Fatalf("bound host: %d, upstream saw %d requests", st, len(api))
	}
	token := strings.TrimPrefix(api[0].auth, "Bearer ")
	if strings.Contains(reply, token) || as.Grants("client_credentials") != 1 {
		t.Fatalf("the echoed token reached the sandbox (%v) or %d token requests", strings.Contains(reply, token), as.Grants("client_credentials"))
	}

	for _, tc := range []struct {
		name string
		u    string
		hdr  http.Header
	}{
		{"in its header", "https://other.test/x", bearer},
		{"in the URL", "https://other.test/q?t=" + url.QueryEscape(placeholder), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := casebook.Expect(t, "D19", "an egress placeholder bound to an OAuth connection, sent "+tc.name+" to a host it is not bound to (TLS intercepted)",
				"403 egress_denied, nothing reaches the host, audited placeholder_connection_elsewhere; the token in no reply or record")
			st, reply := do(tc.u, tc.hdr)
			rec := g.For(t).AwaitAuditFields("placeholder_connection_elsewhere", map[string]any{"dest_host": "other.test"})
			recRaw, _ := json.Marshal(rec)
			n := len(seenOn("other.test"))
			cb.Observef("%d %s, other.test reached %d times, audited %v", st, codeOf(reply), n, rec != nil)
			if st != http.StatusForbidden || codeOf(reply) != "egress_denied" || n != 0 || strings.Contains(string(recRaw), token) {
				t.Fatalf("%d %q, other.test reached %d times", st, reply, n)
			}
		})
	}

	// In a body the placeholder is never substituted and the request is
	// not refused: it streams upstream (a body is not read before it is
	// sent), so other.test gets the placeholder, never the token, and the
	// record says so once the body has gone by.
	t.Run("in the body", func(t *testing.T) {
		cb := casebook.Expect(t, "D4", "an egress placeholder bound to an OAuth connection, sent in the request body to a host it is not bound to (TLS intercepted)",
			"sent unchanged: the host gets the placeholder, never the token; audited placeholder_host_mismatch")
		payload := `{"note":"` + placeholder + `"}`
		st, _ := do("https://other.test/upload", nil, payload)
		rec := g.For(t).AwaitAuditFields("placeholder_host_mismatch", map[string]any{"dest_host": "other.test"})
		got := seenOn("other.test")
		cb.Observef("%d, other.test got the body unchanged %v (the token %v), audited %v", st, len(got) == 1 && got[0].body == payload,
			len(got) == 1 && strings.Contains(got[0].body, token), rec != nil)
		if st != http.StatusOK || len(got) != 1 || got[0].body != payload || strings.Contains(got[0].body, token) {
			t.Fatalf("%d; other.test got %d requests", st, len(got))
		}
	})
}

func codeOf(reply string) string {
	i := strings.Index(reply, "{")
	if i < 0 {
		return ""
	}
	var b struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(reply[i:]), &b)
	return b.Error.Code
}
