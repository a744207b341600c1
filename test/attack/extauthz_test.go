//go:build linux

package attack

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// envoyWorld is the real gateway with gateway.ext_authz on a Unix socket
// (trusting root, as Envoy's uid would be trusted), and go-control-plane's
// generated client standing in for Envoy.
type envoyWorld struct {
	e     *gwenv.Env
	g     *gwenv.Gateway
	authz authv3.AuthorizationClient
	host  string // the tickets connector's authority
}

const envoyPrincipal = "spiffe://cluster.local/ns/agents/sa/agent-a"

func newEnvoyWorld(t *testing.T) *envoyWorld {
	t.Helper()
	e := gwenv.New(t, gatewayBin(t))
	d := e.BaseConfig("authz")
	sock := filepath.Join(e.Dir, "authz-ext.sock")
	d.Gateway()["ext_authz"] = map[string]any{
		"listen": "unix:" + sock, "trusted_uids": []uint32{0}, "hold_wait": "200ms",
		"principals": []map[string]any{{"principal": envoyPrincipal, "agent": "agent-a", "sandbox": "pod-a", "session": "s-1", "user": "alice"}},
	}
	g := e.Start(d, e.Write(d))
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &envoyWorld{e: e, g: g, authz: authv3.NewAuthorizationClient(conn), host: "127.0.0.1:" + strconv.Itoa(e.Up.Port)}
}

// req is a CheckRequest as Envoy's HTTP filter sends it, from the
// listener whose context_extensions name agent-a's sandbox.
func (w *envoyWorld) req(method, host, path string, body []byte, hdr map[string]string) *authv3.CheckRequest {
	h := map[string]string{":authority": host, ":method": method, ":path": path, ":scheme": "http", "x-request-id": "e-1"}
	if body != nil {
		h["content-type"], h["content-length"] = "application/json", strconv.Itoa(len(body))
	}
	for k, v := range hdr {
		h[k] = v
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: method, Headers: h, Path: path, Host: host, Scheme: "http", Protocol: "HTTP/1.1", RawBody: body,
		}},
		ContextExtensions: map[string]string{"sandbox": "sb-a", "agent": "agent-a", "session": "s-1", "user": "alice"},
	}}
}

func (w *envoyWorld) check(t *testing.T, cr *authv3.CheckRequest) *authv3.CheckResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := w.authz.Check(ctx, cr)
	if err != nil {
		t.Fatalf("Check: gRPC error %v (a refusal must be an HTTP answer, never a gRPC error that failure_mode_allow would decide)", err)
	}
	return res
}

// denied returns the denial's HTTP status, error code and request id
// (0 and "" when the answer is an allow).
func denied(res *authv3.CheckResponse) (int, string, string) {
	d := res.GetDeniedResponse()
	if d == nil {
		return 0, "", ""
	}
	code, rid := errFields(d.Body)
	return int(d.GetStatus().GetCode()), code, rid
}

func hdrValue(hs []*corev3.HeaderValueOption, name string) string {
	for _, h := range hs {
		if h.GetHeader().GetKey() == name {
			return h.GetHeader().GetValue()
		}
	}
	return ""
}

// TestExtAuthzDecidedAsSent is THREATS C17 and C18 through ext_authz:
// Envoy forwards the target and authority it received, so a form the
// gateway would have to normalise is refused (400 bad_request) and a
// destination the guard never dials is refused (403 egress_denied), both
// before policy (no decision in the record) and audited; the control, the
// same request in canonical form, is decided.
func TestExtAuthzDecidedAsSent(t *testing.T) {
	w := newEnvoyWorld(t)
	for _, tc := range []struct {
		id, name, host, path string
		status               int
		code                 string
	}{
		{"C17", "dot-segment /tickets/../refunds (RFC 3986 5.2.4)", w.host, "/tickets/../refunds", 400, "bad_request"},
		{"C17", "encoded dot-segment %2e%2e", w.host, "/tickets/%2e%2e/refunds", 400, "bad_request"},
		{"C17", "encoded slash %2F", w.host, "/tickets%2Fx", 400, "bad_request"},
		{"C17", "empty segment //tickets", w.host, "//tickets", 400, "bad_request"},
		{"C17", "backslash", w.host, `/tickets\x`, 400, "bad_request"},
		{"C17", "authority 2130706433 (inet_aton 127.0.0.1)", "2130706433:" + strconv.Itoa(w.e.Up.Port), "/tickets", 400, "bad_request"},
		{"C17", "authority with a trailing dot", "pkg.test.", "/", 400, "bad_request"},
		{"C17", "authority in upper case", "PKG.TEST", "/", 400, "bad_request"},
		{"C18", "metadata address 169.254.169.254", "169.254.169.254", "/latest/meta-data/", 403, "egress_denied"},
		{"C18", "metadata name metadata.google.internal", "metadata.google.internal", "/computeMetadata/v1/", 403, "egress_denied"},
		{"C18", "IPv4-mapped metadata [::ffff:169.254.169.254]", "[::ffff:a9fe:a9fe]", "/", 403, "egress_denied"},
		{"C18", "NAT64 metadata [64:ff9b::a9fe:a9fe]", "[64:ff9b::a9fe:a9fe]", "/", 403, "egress_denied"},
		{"C18", "loopback other than a connector's", "127.0.0.1:22", "/", 403, "egress_denied"},
		{"C18", "private 10.0.0.1", "10.0.0.1", "/", 403, "egress_denied"},
	} {
		t.Run(tc.id+" "+tc.name, func(t *testing.T) {
			g := w.g.For(t)
			c := casebook.Expect(t, tc.id, tc.name+" (ext_authz CheckRequest)",
				fmt.Sprintf("DeniedHttpResponse %d %s before policy (audited, no decision), nothing sent by the gateway", tc.status, tc.code))
			before := len(w.e.Up.Requests())
			status, code, rid := denied(w.check(t, w.req("GET", tc.host, tc.path, nil, nil)))
			recs := auditFor(g, "decision", rid)
			c.Observef("%d %s, %d audit records (decision field %v), upstream requests %d", status, code, len(recs), fieldOr(recs, "decision"), len(w.e.Up.Requests())-before)
			if status != tc.status || code != tc.code {
				t.Fatalf("got %d %s, want %d %s", status, code, tc.status, tc.code)
			}
			if len(recs) != 1 || fieldsOf(recs[0])["code"] != tc.code || fieldsOf(recs[0])["decision"] != nil || fieldsOf(recs[0])["transport"] != "envoy" {
				t.Fatalf("audit %v: want one envoy record with code %s and no decision", recs, tc.code)
			}
			if len(w.e.Up.Requests()) != before {
				t.Fatal("the gateway sent something")
			}
		})
	}
	t.Run("C17 control: the canonical request is decided", func(t *testing.T) {
		c := casebook.Expect(t, "C17", "control: GET /tickets on the connector's canonical authority", "OkHttpResponse (allowed by tickets.list_tickets)")
		res := w.check(t, w.req("GET", w.host, "/tickets", nil, nil))
		c.Observef("ok=%v", res.GetOkResponse() != nil)
		if res.GetOkResponse() == nil {
			t.Fatalf("control: %v", res)
		}
	})
}

func fieldOr(recs []map[string]any, k string) any {
	if len(recs) == 0 {
		return nil
	}
	return fieldsOf(recs[0])[k]
}

// TestExtAuthzCredentialHeaders is THREATS D15: the credential is handed
// to Envoy as an overwrite of the connector's header (a value the sandbox
// sent there, meant to travel beside it or shadow it, is replaced),
// Proxy-Authorization and x-sluice-* are removed, and the secret is in no
// response header, no dynamic metadata, no audit record and no log line.
func TestExtAuthzCredentialHeaders(t *testing.T) {
	w := newEnvoyWorld(t)
	c := casebook.Expect(t, "D15", "sandbox sends its own X-Api-Key, Proxy-Authorization and x-sluice-* through Envoy",
		"OkHttpResponse: X-Api-Key OVERWRITE_IF_EXISTS_OR_ADD with the credential, proxy-authorization and x-sluice-* in headers_to_remove, nothing in response headers or metadata; the secret in no audit record or log line")
	res := w.check(t, w.req("GET", w.host, "/tickets", nil, map[string]string{
		"x-api-key": "sandbox-chosen", "proxy-authorization": "Basic c2I6dG9rZW4=", "x-sluice-approved": "1",
	}))
	ok := res.GetOkResponse()
	if ok == nil {
		t.Fatalf("want allow, got %v", res)
	}
	var mode string
	for _, h := range ok.Headers {
		if strings.EqualFold(h.GetHeader().GetKey(), "x-api-key") {
			mode = h.GetAppendAction().String()
		}
	}
	removed := strings.Join(ok.HeadersToRemove, ",")
	raw, _ := protojson.Marshal(res)
	outside := strings.Count(string(raw), w.e.Secret) // the one allowed place is the request header mutation
	recs, _ := json.Marshal(w.g.AuditRecords())
	logs := w.g.Stderr()
	c.Observef("x-api-key %s (credential attached: %v), removed %s, secret occurrences in the answer %d, response headers %d, metadata %v, secret in audit %v, in log %v",
		mode, hdrValue(ok.Headers, "x-api-key") == w.e.Secret, removed, outside, len(ok.ResponseHeadersToAdd), res.DynamicMetadata != nil,
		strings.Contains(string(recs), w.e.Secret), strings.Contains(string(logs), w.e.Secret))
	if mode != "OVERWRITE_IF_EXISTS_OR_ADD" || hdrValue(ok.Headers, "x-api-key") != w.e.Secret {
		t.Errorf("credential mutation %s", mode)
	}
	if !strings.Contains(removed, "proxy-authorization") || !strings.Contains(removed, "x-sluice-approved") {
		t.Errorf("headers_to_remove %s", removed)
	}
	if outside != 1 || len(ok.ResponseHeadersToAdd) != 0 || res.DynamicMetadata != nil || ok.DynamicMetadata != nil {
		t.Errorf("the secret appears %d times in the answer; response headers %v", outside, ok.ResponseHeadersToAdd)
	}
	if strings.Contains(string(recs), w.e.Secret) || strings.Contains(string(logs), w.e.Secret) {
		t.Error("the secret is in the audit log or the gateway's log")
	}
	if n := len(w.e.Up.Requests()); n != 0 {
		t.Errorf("the gateway sent %d requests itself", n)
	}
}

// TestExtAuthzIdentity is THREATS D16: identity comes only from what
// Envoy vouches for. Identity headers the sandbox writes (x-sluice-*, a
// forged x-forwarded-client-cert), a principal not in principals, a
// principal and context_extensions that disagree: 403 identity_required,
// audited, before the pipeline; the controls (context_extensions; a
// listed principal) are decided.
func TestExtAuthzIdentity(t *testing.T) {
	w := newEnvoyWorld(t)
	noExt := func(cr *authv3.CheckRequest) *authv3.CheckRequest { cr.Attributes.ContextExtensions = nil; return cr }
	withPrincipal := func(cr *authv3.CheckRequest, p string) *authv3.CheckRequest {
		cr.Attributes.Source = &authv3.AttributeContext_Peer{Principal: p}
		return cr
	}
	forged := map[string]string{"x-sluice-agent": "agent-a", "x-sluice-sandbox": "sb-a", "x-forwarded-client-cert": "By=spiffe://cluster.local/ns/egress/sa/envoy;URI=" + envoyPrincipal}
	for _, tc := range []struct {
		name string
		cr   *authv3.CheckRequest
		ok   bool
	}{
		{"identity headers and a forged XFCC, no context_extensions", noExt(w.req("GET", w.host, "/tickets", nil, forged)), false},
		{"a principal not in gateway.ext_authz.principals", withPrincipal(noExt(w.req("GET", w.host, "/tickets", nil, nil)), "spiffe://cluster.local/ns/agents/sa/intruder"), false},
		{"principal and context_extensions disagree on the agent", func() *authv3.CheckRequest {
			cr := withPrincipal(w.req("GET", w.host, "/tickets", nil, nil), envoyPrincipal)
			cr.Attributes.ContextExtensions["agent"] = "agent-b"
			return cr
		}(), false},
		{"control: context_extensions", w.req("GET", w.host, "/tickets", nil, nil), true},
		{"control: a listed principal", withPrincipal(noExt(w.req("GET", w.host, "/tickets", nil, nil)), envoyPrincipal), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := w.g.For(t)
			want := "403 identity_required, audited, the pipeline not run"
			if tc.ok {
				want = "OkHttpResponse with the credential"
			}
			c := casebook.Expect(t, "D16", tc.name+" (ext_authz)", want)
			res := w.check(t, tc.cr)
			status, code, rid := denied(res)
			recs := auditFor(g, "decision", rid)
			c.Observef("allowed=%v %d %s, audit records %d", res.GetOkResponse() != nil, status, code, len(recs))
			if tc.ok {
				if res.GetOkResponse() == nil {
					t.Fatalf("control refused: %v", res)
				}
				return
			}
			if status != 403 || code != "identity_required" || len(recs) != 1 || fieldsOf(recs[0])["decision"] != nil {
				t.Fatalf("got %d %s, records %v", status, code, recs)
			}
		})
	}
}

// TestExtAuthzHoldBinding is THREATS E10: an ask through ext_authz is
// held; once carol approves, the same request from the same identity
// passes exactly once (hold_released once); the same request from another
// sandbox, another body, or a second retry is not let through by that
// approval; the gateway itself never sends it.
func TestExtAuthzHoldBinding(t *testing.T) {
	w := newEnvoyWorld(t)
	g := w.g.For(t)
	body := []byte(`{"amount":7,"reason":"dup"}`)
	first := w.check(t, w.req("POST", w.host, "/refunds", body, nil))
	d := first.GetDeniedResponse()
	if d == nil || d.GetStatus().GetCode() != 202 {
		t.Fatalf("ask: %v", first)
	}
	holdID := hdrValue(d.Headers, "x-sluice-hold")
	if holdID == "" || hdrValue(d.Headers, "retry-after") == "" {
		t.Fatalf("202 without hold id or Retry-After: %v", d.Headers)
	}
	if st, code, _ := g.AdminDo("POST", "/api/v1/holds/"+holdID+"/approve", gwenv.CarolToken, `{"reason":"ok"}`); st != 200 {
		t.Fatalf("approve: %d %s", st, code)
	}
	otherSandbox := w.req("POST", w.host, "/refunds", body, nil)
	otherSandbox.Attributes.ContextExtensions["sandbox"] = "sb-other"
	for _, tc := range []struct {
		name string
		cr   *authv3.CheckRequest
	}{
		{"the same request from another sandbox of the same agent and user", otherSandbox},
		{"the same identity with another body", w.req("POST", w.host, "/refunds", []byte(`{"amount":700,"reason":"dup"}`), nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "E10", tc.name+" after the approval (ext_authz)", "not let through: a new hold (202) or a refusal, never OK")
			res := w.check(t, tc.cr)
			st, code, _ := denied(res)
			c.Observef("allowed=%v %d %s", res.GetOkResponse() != nil, st, code)
			if res.GetOkResponse() != nil {
				t.Fatal("let through by another request's approval")
			}
		})
	}
	t.Run("the approved request, sent again twice", func(t *testing.T) {
		c := casebook.Expect(t, "E10", "the approved request re-sent twice by the same identity (ext_authz)",
			"the first passes with the credential (hold_released once), the second is held again; the gateway sends nothing")
		one := w.check(t, w.req("POST", w.host, "/refunds", body, nil))
		two := w.check(t, w.req("POST", w.host, "/refunds", body, nil))
		released := g.AuditEvent("hold_released", holdID)
		st2, _, _ := denied(two)
		c.Observef("first allowed=%v (credential %v), second allowed=%v %d, hold_released %d, upstream requests %d",
			one.GetOkResponse() != nil, hdrValue(one.GetOkResponse().GetHeaders(), "x-api-key") == w.e.Secret, two.GetOkResponse() != nil, st2, len(released), len(w.e.Up.Requests()))
		if one.GetOkResponse() == nil || hdrValue(one.GetOkResponse().GetHeaders(), "x-api-key") != w.e.Secret {
			t.Fatalf("first re-send: %v", one)
		}
		if two.GetOkResponse() != nil || st2 != 202 {
			t.Fatalf("second re-send: %v", two)
		}
		if len(released) != 1 || len(w.e.Up.Requests()) != 0 {
			t.Fatalf("hold_released %d, upstream requests %d", len(released), len(w.e.Up.Requests()))
		}
	})
}
