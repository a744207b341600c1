package gateway

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/extauthz"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

var updateEnvoy = flag.Bool("update-envoy", false, "rewrite testdata/envoy/*.golden")

// envoyGateway is a gateway with gateway.ext_authz on a Unix socket that
// trusts this process, and a client from go-control-plane's generated
// code standing in for Envoy.
type envoyGateway struct {
	*testGateway
	up    *upstreamServer
	authz authv3.AuthorizationClient
	host  string // the tickets connector's authority, as Envoy's :authority
}

func startEnvoyGateway(t testing.TB, edit func(*config.Config)) *envoyGateway {
	t.Helper()
	up := newUpstream(t)
	g := startHolds(t, up, "", func(c *config.Config) {
		c.Gateway.ExtAuthz = &config.ExtAuthz{
			Listen:      "unix:" + filepath.Join(c.Dir, "authz.sock"),
			TrustedUIDs: []uint32{uint32(os.Getuid())},
			HoldWait:    config.Duration(100 * time.Millisecond),
		}
		// One connector per base URL: the unguarded twin moves to a path
		// of its own.
		c.Connectors[1].BaseURL = up.URL + "/unguarded"
		c.Agents[0].Egress = []string{"pypi.org"}
		if edit != nil {
			edit(c)
		}
	})
	conn, err := grpc.NewClient("unix://"+strings.TrimPrefix(g.ExtAuthzAddr(), "unix:"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	u, _ := url.Parse(up.URL)
	return &envoyGateway{testGateway: g, up: up, authz: authv3.NewAuthorizationClient(conn), host: u.Host}
}

// checkRequest is a CheckRequest as Envoy's HTTP ext_authz filter sends
// it: pseudo-headers in the header map, the listener's identity in
// context_extensions, the body packed as bytes.
func (g *envoyGateway) checkRequest(protocol, method, path string, body []byte, headers map[string]string) *authv3.CheckRequest {
	h := map[string]string{":authority": g.host, ":method": method, ":path": path, ":scheme": "http", "x-request-id": "3f8e1c2a-envoy", "user-agent": "python-httpx/0.27"}
	if body != nil {
		h["content-type"] = "application/json"
		h["content-length"] = strconv.Itoa(len(body))
	}
	for k, v := range headers {
		h[k] = v
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: nil},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "1234", Method: method, Headers: h, Path: path, Host: g.host, Scheme: "http",
			Protocol: protocol, Size: int64(len(body)), RawBody: body,
		}},
		ContextExtensions: map[string]string{"sandbox": agentA.Sandbox, "agent": agentA.Agent, "session": agentA.Session, "user": agentA.User},
	}}
}

func (g *envoyGateway) check(t *testing.T, cr *authv3.CheckRequest) *authv3.CheckResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := g.authz.Check(ctx, cr)
	if err != nil {
		t.Fatalf("Check: gRPC error %v: a policy outcome is never a gRPC error", err)
	}
	return res
}

var (
	ridRE  = regexp.MustCompile(`\b[0-9a-f]{24}\b`)
	holdRE = regexp.MustCompile(`\b[0-9a-f]{32}\b`)
)

// envoyGolden compares a CheckResponse with testdata/envoy/NAME.golden,
// request and hold ids replaced by placeholders.
func envoyGolden(t *testing.T, name string, res *authv3.CheckResponse) {
	t.Helper()
	raw, err := protojson.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	out, _ := json.MarshalIndent(v, "", "  ")
	got := holdRE.ReplaceAllString(ridRE.ReplaceAllString(string(out), "REQUEST_ID"), "HOLD_ID") + "\n"
	path := filepath.Join("testdata", "envoy", name+".golden")
	if *updateEnvoy {
		os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-envoy)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs:\n got %s\nwant %s", path, got, want)
	}
}

// envoyRecords are the audit records of the envoy transport.
func envoyRecords(t *testing.T, g *testGateway) []audit.Record {
	var out []audit.Record
	for _, r := range auditEvents(t, g) {
		if f := fieldsOf(r); f["transport"] == "envoy" {
			out = append(out, r)
		}
	}
	return out
}

func fieldsOf(r audit.Record) map[string]any {
	b, _ := json.Marshal(r)
	var m map[string]any
	json.Unmarshal(b, &m)
	if f, ok := m["fields"].(map[string]any); ok {
		return f
	}
	return m
}

// send applies an OkHttpResponse's mutations to the request as Envoy
// would and sends it to the upstream: what the upstream receives is what
// the allow answer makes of the client's request.
func (g *envoyGateway) send(t *testing.T, method, path string, client http.Header, ok *authv3.OkHttpResponse) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, g.up.URL+path, nil)
	req.Header = client.Clone()
	for _, h := range ok.HeadersToRemove {
		req.Header.Del(h)
	}
	for _, h := range ok.Headers {
		if h.GetAppendAction().String() != "OVERWRITE_IF_EXISTS_OR_ADD" {
			t.Fatalf("header %s is not overwritten", h.GetHeader().GetKey())
		}
		req.Header.Set(h.GetHeader().GetKey(), h.GetHeader().GetValue())
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestEnvoyAllowAttachesCredential: an allowed tool call (HTTP/1.1, no
// body) is an OkHttpResponse that overwrites the connector's credential
// header (the client's own value never reaches the upstream), removes
// Proxy-Authorization and x-sluice-*, and is audited with transport envoy;
// the gateway itself sends nothing.
func TestEnvoyAllowAttachesCredential(t *testing.T) {
	g := startEnvoyGateway(t, nil)
	hdr := map[string]string{"x-api-key": "attacker-chosen", "proxy-authorization": "Basic c2I6dG9rZW4=", "x-sluice-hold": "forged"}
	res := g.check(t, g.checkRequest("HTTP/1.1", "GET", "/tickets?limit=5", nil, hdr))
	envoyGolden(t, "allow_credential", res)
	ok := res.GetOkResponse()
	if ok == nil {
		t.Fatalf("want OK, got %v", res)
	}
	if n := g.up.requests.Load(); n != 0 {
		t.Fatalf("the gateway sent %d requests itself; Envoy sends", n)
	}
	client := http.Header{"X-Api-Key": {"attacker-chosen"}, "Proxy-Authorization": {"Basic c2I6dG9rZW4="}, "X-Sluice-Hold": {"forged"}}
	if resp := g.send(t, "GET", "/tickets?limit=5", client, ok); resp.StatusCode != 200 {
		t.Fatalf("upstream: %d", resp.StatusCode)
	}
	g.up.mu.Lock()
	key := g.up.lastKey
	g.up.mu.Unlock()
	if key != testSecret {
		t.Fatalf("the upstream got X-Api-Key %q, want the connector's credential", key)
	}
	recs := envoyRecords(t, g.testGateway)
	if len(recs) != 1 {
		t.Fatalf("%d envoy records, want 1", len(recs))
	}
	f := fieldsOf(recs[0])
	if f["decision"] != "allow" || f["tool"] != "tickets.list_tickets" || f["credential"] == nil || f["agent"] != "agent-a" {
		t.Errorf("audit record %v", f)
	}
	if !strings.Contains(g.logBuf.String(), `"transport":"envoy"`) {
		t.Error("no tool_call line with transport envoy")
	}
}

// TestEnvoyBlock: a blocked tool call is a 403 with sluice's JSON body,
// audited; nothing is sent.
func TestEnvoyBlock(t *testing.T) {
	g := startEnvoyGateway(t, nil)
	res := g.check(t, g.checkRequest("HTTP/2", "DELETE", "/tickets/T-1", nil, nil))
	envoyGolden(t, "block", res)
	d := res.GetDeniedResponse()
	if d == nil || d.GetStatus().GetCode() != 403 || !strings.Contains(d.Body, `"code":"policy_block"`) || strings.Contains(d.Body, testSecret) {
		t.Fatalf("want 403 policy_block, got %v", res)
	}
	if f := fieldsOf(envoyRecords(t, g.testGateway)[0]); f["decision"] != "block" || f["code"] != "policy_block" {
		t.Errorf("audit record %v", f)
	}
}

// TestEnvoyAskApproveRetryOnce: an ask (HTTP/2 with a body) is held and
// answered 202 with the hold id and Retry-After; after a person approves,
// the same request sent again passes once, with the credential; a third
// send is held again, and a request with another body is never released
// by that approval (THREATS E4, E3).
func TestEnvoyAskApproveRetryOnce(t *testing.T) {
	g := startEnvoyGateway(t, nil)
	body := []byte(`{"amount":5,"reason":"dup"}`)
	cr := g.check(t, g.checkRequest("HTTP/2", "POST", "/refunds", body, nil))
	envoyGolden(t, "ask_pending", cr)
	d := cr.GetDeniedResponse()
	if d == nil || d.GetStatus().GetCode() != 202 {
		t.Fatalf("want 202, got %v", cr)
	}
	var b struct {
		Hold struct{ ID, Status string }
	}
	json.Unmarshal([]byte(d.Body), &b)
	if b.Hold.ID == "" || b.Hold.Status != "pending" || headerOf(d.Headers, "retry-after") == "" || headerOf(d.Headers, "x-sluice-hold") != b.Hold.ID {
		t.Fatalf("hold answer %s %v", d.Body, d.Headers)
	}
	// Sent again while pending: the same hold.
	if again := g.check(t, g.checkRequest("HTTP/2", "POST", "/refunds", body, nil)); !strings.Contains(again.GetDeniedResponse().GetBody(), b.Hold.ID) {
		t.Fatalf("re-send while pending: %v", again)
	}
	if ar := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+b.Hold.ID+"/approve", `{"reason":"ok"}`); ar.status != 200 {
		t.Fatalf("approve: %d %s", ar.status, ar.raw)
	}
	if n := g.up.requests.Load(); n != 0 {
		t.Fatalf("approval sent %d requests: a decided-only hold is never sent by the gateway", n)
	}
	other := g.check(t, g.checkRequest("HTTP/2", "POST", "/refunds", []byte(`{"amount":500,"reason":"dup"}`), nil))
	if other.GetOkResponse() != nil {
		t.Fatal("a request with another body was let through by the approval")
	}
	ok := g.check(t, g.checkRequest("HTTP/2", "POST", "/refunds", body, nil))
	envoyGolden(t, "ask_approved_retry", ok)
	if ok.GetOkResponse() == nil || headerOf(ok.GetOkResponse().Headers, "x-api-key") != testSecret {
		t.Fatalf("the approved retry: %v", ok)
	}
	third := g.check(t, g.checkRequest("HTTP/2", "POST", "/refunds", body, nil))
	if third.GetOkResponse() != nil || third.GetDeniedResponse().GetStatus().GetCode() != 202 || strings.Contains(third.GetDeniedResponse().GetBody(), b.Hold.ID) {
		t.Fatalf("a second retry after one approval: %v; want a new hold", third)
	}
	var released int
	for _, r := range auditEvents(t, g.testGateway) {
		if r.Event == "hold_released" {
			released++
		}
	}
	if released != 1 {
		t.Fatalf("%d hold_released records, want 1", released)
	}
}

// TestEnvoyAskExpired: a hold nobody decides before it expires answers
// 403 approval_expired; nothing was let through.
func TestEnvoyAskExpired(t *testing.T) {
	g := startEnvoyGateway(t, func(c *config.Config) {
		c.Gateway.HoldTTL = config.Duration(300 * time.Millisecond)
		c.Gateway.ExtAuthz.HoldWait = config.Duration(5 * time.Second)
	})
	res := g.check(t, g.checkRequest("HTTP/1.1", "POST", "/refunds", []byte(`{"amount":5}`), nil))
	envoyGolden(t, "ask_expired", res)
	if d := res.GetDeniedResponse(); d == nil || d.GetStatus().GetCode() != 403 || !strings.Contains(d.Body, `"code":"approval_expired"`) {
		t.Fatalf("want 403 approval_expired, got %v", res)
	}
}

// TestEnvoyForgedIdentityIgnored: without context_extensions, identity
// headers are no identity: 403, audited, the pipeline never ran.
func TestEnvoyForgedIdentityIgnored(t *testing.T) {
	g := startEnvoyGateway(t, nil)
	cr := g.checkRequest("HTTP/1.1", "GET", "/tickets", nil, map[string]string{"x-sluice-agent": "agent-a", "x-sluice-sandbox": "sb-1", "sluice-identity": `{"agent":"agent-a"}`})
	cr.Attributes.ContextExtensions = nil
	res := g.check(t, cr)
	envoyGolden(t, "forged_identity", res)
	if d := res.GetDeniedResponse(); d == nil || d.GetStatus().GetCode() != 403 || !strings.Contains(d.Body, `"code":"identity_required"`) {
		t.Fatalf("want 403 identity_required, got %v", res)
	}
	recs := envoyRecords(t, g.testGateway)
	if len(recs) != 1 || fieldsOf(recs[0])["code"] != "identity_required" || fieldsOf(recs[0])["decision"] != nil {
		t.Fatalf("records %v", recs)
	}
}

// TestEnvoyRawEgress: a host that is no connector's is raw egress: CONNECT
// to a host on the agent's egress allowlist is allowed, another is
// refused egress_denied, a loopback address is refused before policy; a
// connector's host with a path that is none of its operations is 404,
// never raw egress.
func TestEnvoyRawEgress(t *testing.T) {
	g := startEnvoyGateway(t, nil)
	connect := func(authority string) *authv3.CheckResponse {
		cr := g.checkRequest("HTTP/1.1", "CONNECT", "", nil, map[string]string{":authority": authority})
		delete(cr.Attributes.Request.Http.Headers, ":path")
		cr.Attributes.Request.Http.Host = authority
		return g.check(t, cr)
	}
	allowed := connect("pypi.org:443")
	envoyGolden(t, "connect_allowed", allowed)
	if allowed.GetOkResponse() == nil {
		t.Fatalf("CONNECT pypi.org:443: %v", allowed)
	}
	for _, a := range []string{"example.org:443", g.host} {
		if d := connect(a).GetDeniedResponse(); d == nil || d.GetStatus().GetCode() != 403 || !strings.Contains(d.Body, `"code":"egress_denied"`) {
			t.Errorf("CONNECT %s: want 403 egress_denied, got %v", a, d)
		}
	}
	if d := g.check(t, g.checkRequest("HTTP/1.1", "GET", "/admin", nil, nil)).GetDeniedResponse(); d == nil || d.GetStatus().GetCode() != 404 || !strings.Contains(d.Body, `"code":"unknown_tool"`) {
		t.Errorf("connector host, no operation: %v", d)
	}
	kinds := map[string]int{}
	for _, r := range envoyRecords(t, g.testGateway) {
		k, _ := fieldsOf(r)["kind"].(string)
		kinds[k]++
	}
	if kinds["connect"] != 3 {
		t.Errorf("records by kind %v, want 3 connect", kinds)
	}
}

func headerOf(hs []*corev3.HeaderValueOption, name string) string {
	for _, h := range hs {
		if h.GetHeader().GetKey() == name {
			return h.GetHeader().GetValue()
		}
	}
	return ""
}

// TestEnvoyApprovalLapses: an approved hold whose request is not sent
// again before the hold expires lets nothing through afterwards; the
// identical request is held anew (not refused forever).
func TestEnvoyApprovalLapses(t *testing.T) {
	g := startEnvoyGateway(t, func(c *config.Config) { c.Gateway.HoldTTL = config.Duration(700 * time.Millisecond) })
	body := []byte(`{"amount":9}`)
	first := g.check(t, g.checkRequest("HTTP/1.1", "POST", "/refunds", body, nil)).GetDeniedResponse()
	id := headerOf(first.GetHeaders(), "x-sluice-hold")
	if first.GetStatus().GetCode() != 202 || id == "" {
		t.Fatalf("ask: %v", first)
	}
	if ar := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", `{"reason":"ok"}`); ar.status != 200 {
		t.Fatalf("approve: %d %s", ar.status, ar.raw)
	}
	time.Sleep(time.Second)
	res := g.check(t, g.checkRequest("HTTP/1.1", "POST", "/refunds", body, nil))
	d := res.GetDeniedResponse()
	if res.GetOkResponse() != nil || d.GetStatus().GetCode() != 202 || headerOf(d.GetHeaders(), "x-sluice-hold") == id {
		t.Fatalf("after the approval lapsed: %v; want a new hold", res)
	}
	lapsed := false
	for _, r := range auditEvents(t, g.testGateway) {
		if r.Event == "hold_expired" && strings.Contains(fmt.Sprint(fieldsOf(r)), "approved_unused") {
			lapsed = true
		}
	}
	if !lapsed {
		t.Error("no hold_expired record for the lapsed approval")
	}
}

// TestEnvoyRawEgressNarrowed: raw egress decided for the Envoy door keeps
// a sandbox's egress narrowing (sandboxd --egress), as the forward proxy
// does: a host the agent may reach but the narrowing leaves out is 403
// egress_denied by rule sandbox_egress before policy, audited with the
// narrowing; a host in both passes. Envoy's identity sources carry no
// narrowing, so the door's raw-egress decision is called directly.
func TestEnvoyRawEgressNarrowed(t *testing.T) {
	g := startEnvoyGateway(t, func(c *config.Config) {
		c.Agents[0].Egress = []string{"pypi.org", "files.pythonhosted.org"}
	})
	id := agentA
	narrow, err := wire.FormatEgress([]string{"files.pythonhosted.org"})
	if err != nil {
		t.Fatal(err)
	}
	id.Egress = narrow
	connect := func(host string) extauthz.Verdict {
		return g.envoy.envoyEgress(context.Background(), &extauthz.Request{Identity: id, IdentitySource: "context_extensions",
			Protocol: "HTTP/1.1", Scheme: "http", Method: http.MethodConnect, Host: host, Port: 443, ExplicitPort: true}, 0)
	}
	if v := connect("pypi.org"); v.Allow || v.Status != http.StatusForbidden || v.Code != "egress_denied" {
		t.Errorf("CONNECT pypi.org:443 outside the narrowing: %+v, want 403 egress_denied", v)
	}
	if v := connect("files.pythonhosted.org"); !v.Allow {
		t.Errorf("CONNECT files.pythonhosted.org:443 inside the narrowing: %+v, want allowed", v)
	}
	byHost := map[string]map[string]any{}
	for _, r := range envoyRecords(t, g.testGateway) {
		f := fieldsOf(r)
		h, _ := f["dest_host"].(string)
		byHost[h] = f
	}
	if f := byHost["pypi.org"]; f["rule"] != "sandbox_egress" || f["code"] != "egress_denied" || f["egress"] != narrow || f["decision"] != "block" {
		t.Errorf("pypi.org record %v: want rule sandbox_egress, code egress_denied, decision block, egress %q", f, narrow)
	}
	if f := byHost["files.pythonhosted.org"]; f["decision"] != "allow" || f["egress"] != narrow {
		t.Errorf("files.pythonhosted.org record %v: want decision allow with egress %q", f, narrow)
	}
}

// TestEnvoyMemoStillAudits (THREATS F23, through the door): a Check that
// differs from an earlier one only in what the policy never reads (the
// request id) is answered from the engine's memo and is still audited
// with its own input and handed the credential; one that differs in a
// header the policy reads is evaluated afresh and blocked.
func TestEnvoyMemoStillAudits(t *testing.T) {
	dir := t.TempDir()
	adapter, err := os.ReadFile("extauthz/testdata/opa-envoy/adapter.rego")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "adapter.rego"), adapter, 0o644)
	os.WriteFile(filepath.Join(dir, "envoy.rego"), []byte(`package envoy.authz

import input.attributes.request.http as http_request

default allow := false

allow if {
	http_request.method == "GET"
	input.parsed_path[0] == "tickets"
	http_request.headers["x-team"] == "blue"
}
`), 0o644)
	g := startEnvoyGateway(t, func(c *config.Config) { c.Rego = []string{dir} })
	e := g.engine.Load()
	var hits []int64
	for _, h := range []map[string]string{{"x-request-id": "req-1", "x-team": "blue"}, {"x-request-id": "req-2", "x-team": "blue"}, {"x-request-id": "req-3", "x-team": "red"}} {
		res := g.check(t, g.checkRequest("HTTP/1.1", "GET", "/tickets?limit=5", nil, h))
		ok, key := res.GetOkResponse(), ""
		for _, m := range ok.GetHeaders() {
			if strings.EqualFold(m.GetHeader().GetKey(), "x-api-key") {
				key = m.GetHeader().GetValue()
			}
		}
		if (h["x-team"] == "blue") != (ok != nil && key == testSecret) {
			t.Fatalf("x-team %s: %v (credential %t)", h["x-team"], res, key == testSecret)
		}
		_, n := e.MemoStats()
		hits = append(hits, n)
	}
	if hits[1] != hits[0]+1 || hits[2] != hits[1] {
		t.Errorf("answers from memory after each Check %v: want the second only", hits)
	}
	recs := envoyRecords(t, g.testGateway)
	if len(recs) != 3 {
		t.Fatalf("%d envoy records, want one per Check", len(recs))
	}
	for i, want := range []string{"allow", "allow", "block"} {
		f := fieldsOf(recs[i])
		in, _ := json.Marshal(f["input"])
		if f["decision"] != want || f["rule"] != "envoy.authz" || !strings.Contains(string(in), fmt.Sprintf(`"req-%d"`, i+1)) || (want == "allow") != (f["credential"] != nil) {
			t.Errorf("record %d: %v", i, f)
		}
	}
}
