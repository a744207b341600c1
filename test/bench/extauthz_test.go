//go:build linux

package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/open-policy-agent/opa/v1/rego"
	"google.golang.org/genproto/googleapis/rpc/code"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-gw/sluice/gateway/extauthz"
)

// The peer of the ext_authz rows: this test binary, re-executed, serving
// envoy.service.auth.v3.Authorization on a Unix socket and deciding each
// Check with the same Rego through OPA's Go API, on the input
// opa-envoy-plugin builds — the core of that plugin, and nothing else.
const (
	authzPeerEnv     = "SLUICE_BENCH_AUTHZ_PEER" // the socket
	authzPeerRegoEnv = "SLUICE_BENCH_AUTHZ_REGO" // the policy file
)

// authzPolicy is written as for opa-envoy-plugin (data.envoy.authz.allow);
// sluice loads it unchanged beside the adapter module.
const authzPolicy = `package envoy.authz

import input.attributes.request.http as http_request

default allow := false

allow if {
	http_request.method == "POST"
	input.parsed_path == ["echo"]
	input.parsed_body.name != "forbidden"
}
`

const authzAdapter = `package sluice.policies.envoy

import data.envoy.authz

allowed if authz.allow with input as input.envoy

decisions contains {"action": "allow", "rule": "envoy.authz"} if {
	input.envoy
	allowed
}

decisions contains {"action": "block", "rule": "envoy.authz"} if {
	input.envoy
	not allowed
}
`

type authzPeer struct {
	authv3.UnimplementedAuthorizationServer
	pq rego.PreparedEvalQuery
}

func (p *authzPeer) Check(ctx context.Context, cr *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	h := cr.GetAttributes().GetRequest().GetHttp()
	u, err := url.ParseRequestURI(h.GetPath())
	if err != nil {
		return deny(), nil
	}
	r := &extauthz.Request{Path: u.EscapedPath(), Query: u.Query(), Body: h.GetRawBody(), Headers: http.Header{"Content-Type": {h.GetHeaders()["content-type"]}}}
	in, err := extauthz.EnvoyInput(cr, r)
	if err != nil {
		return deny(), nil
	}
	rs, err := p.pq.Eval(ctx, rego.EvalInput(in))
	if err != nil || len(rs) != 1 || rs[0].Expressions[0].Value != true {
		return deny(), nil
	}
	return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(code.Code_OK)}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}}, nil
}

func deny() *authv3.CheckResponse {
	return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(code.Code_PERMISSION_DENIED)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_Forbidden}}}}
}

// serveAuthzPeer is the re-executed binary's main.
func serveAuthzPeer() int {
	ctx := context.Background()
	pq, err := rego.New(rego.Query("data.envoy.authz.allow"), rego.Load([]string{os.Getenv(authzPeerRegoEnv)}, nil)).PrepareForEval(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "authz peer:", err)
		return 1
	}
	l, err := net.Listen("unix", os.Getenv(authzPeerEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "authz peer:", err)
		return 1
	}
	g := grpc.NewServer()
	authv3.RegisterAuthorizationServer(g, &authzPeer{pq: pq})
	if err := g.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, "authz peer:", err)
		return 1
	}
	return 0
}

// benchExtAuthz is the ext_authz section: one Check for an allowed POST
// with a JSON body, against the bare peer.
func benchExtAuthz(t *testing.T, w *world) []*section {
	s := &section{Title: "Envoy ext_authz: Check latency", Baseline: "bare ext_authz (OPA Go API)",
		Intro: "One `Check` for an allowed `POST /echo` with a 170-byte JSON body, shaped as Envoy's HTTP filter sends it (pseudo-headers, the body packed as bytes, the listener's identity in context_extensions), sent sequentially by go-control-plane's generated client over a Unix socket; rows take turns in blocks. " +
			"The baseline is a bare ext_authz server (this test binary in a process of its own) that builds opa-envoy-plugin's input and evaluates the same Rego module with OPA's Go API, and does nothing else. " +
			"The sluice row is the real `sluice serve` with that module loaded unchanged beside a five-line adapter: it also resolves the tool, validates, takes the connector's credential from its store, hands it back as a header mutation and writes the decision to the audit log (on /dev/shm, fsynced)."}
	n := iterations(3000)
	dir, err := os.MkdirTemp("", "sluice-bench-authz-")
	if err != nil {
		s.skip("bare ext_authz (OPA Go API)", err.Error())
		return []*section{s}
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	policy := filepath.Join(dir, "envoy_authz.rego")
	if err := os.WriteFile(policy, []byte(authzPolicy), 0o644); err != nil {
		s.skip("bare ext_authz (OPA Go API)", err.Error())
		return []*section{s}
	}
	peerSock := filepath.Join(dir, "peer.sock")
	peer := start(t, nil, "env", authzPeerEnv+"="+peerSock, authzPeerRegoEnv+"="+policy, os.Args[0], "-test.run=^$")
	g, err := w.startGateway(t, gwOpts{Name: "authz", Credential: true, Rego: authzPolicy + "\n", ExtAuthz: true, RegoExtra: authzAdapter})
	if err != nil {
		s.skip("bare ext_authz (OPA Go API)", "gateway: "+err.Error())
		return []*section{s}
	}
	defer g.p.stop()
	client := func(sock string) (authv3.AuthorizationClient, error) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			if time.Now().After(deadline) || !peer.running() {
				return nil, fmt.Errorf("no socket %s: %s", sock, lastLines(peer.out.String(), 3))
			}
			time.Sleep(20 * time.Millisecond)
		}
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { conn.Close() })
		return authv3.NewAuthorizationClient(conn), nil
	}
	host := "127.0.0.1:" + strconv.Itoa(w.apiPort)
	cr := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/echo", Host: host, Scheme: "http", Protocol: "HTTP/1.1", RawBody: []byte(itemBody),
			Headers: map[string]string{":authority": host, ":method": "POST", ":path": "/echo", ":scheme": "http",
				"content-type": "application/json", "content-length": strconv.Itoa(len(itemBody)), "x-request-id": "bench"},
		}},
		ContextExtensions: map[string]string{"sandbox": benchAgent.Sandbox, "agent": benchAgent.Agent, "session": benchAgent.Session, "user": benchAgent.User},
	}}
	checkFn := func(c authv3.AuthorizationClient, wantCred bool) func() error {
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := c.Check(ctx, cr)
			if err != nil {
				return err
			}
			ok := res.GetOkResponse()
			if ok == nil {
				return fmt.Errorf("not allowed: %s", res.GetDeniedResponse().GetBody())
			}
			if wantCred {
				found := false
				for _, h := range ok.Headers {
					found = found || (strings.EqualFold(h.GetHeader().GetKey(), "x-api-key") && h.GetHeader().GetValue() == w.secret)
				}
				if !found {
					return fmt.Errorf("no credential in the answer")
				}
			}
			return nil
		}
	}
	pc, err := client(peerSock)
	if err != nil {
		s.skip("bare ext_authz (OPA Go API)", err.Error())
		return []*section{s}
	}
	gc, err := client(strings.TrimPrefix(g.authz, "unix:"))
	if err != nil {
		s.skip("sluice ext_authz", err.Error())
		return []*section{s}
	}
	ps := []*probe{
		{name: "bare ext_authz (OPA Go API)", note: "decides only", fn: checkFn(pc, false)},
		{name: "sluice ext_authz", note: "decides, attaches the credential, audits", fn: checkFn(gc, true)},
	}
	// BENCH_AGAINST=REV: the sluice row again, from that revision's
	// binary with the same configuration, in turns with this one's.
	if againstRev() != "" {
		bin, short, err := w.againstBin()
		var ag *gw
		if err == nil {
			ag, err = w.startGateway(t, gwOpts{Name: "authz-against", Credential: true, Rego: authzPolicy + "\n", ExtAuthz: true, RegoExtra: authzAdapter, Bin: bin})
		}
		var ac authv3.AuthorizationClient
		if err == nil {
			defer ag.p.stop()
			ac, err = client(strings.TrimPrefix(ag.authz, "unix:"))
		}
		if err != nil {
			ps = append(ps, &probe{name: againstName("sluice ext_authz"), err: err})
		} else {
			ps = append(ps, &probe{name: againstName("sluice ext_authz"), note: "built from " + short + ", the same configuration", fn: checkFn(ac, true)})
		}
	}
	interleave(ps, n, 20)
	s.addProbes(ps)
	if againstRev() != "" {
		s.Notes = append(s.Notes, againstNote(w, "sluice ext_authz"))
		againstVerdicts(s, nil, "sluice ext_authz")
	}
	s.Verdicts = append(s.Verdicts, verdictLat("issue 21: Check p50 with the credential attached and audited ≤ 1.0× a bare ext_authz server on OPA's Go API", s.find("sluice ext_authz"), s.find("bare ext_authz (OPA Go API)"), 1.0))
	return []*section{s}
}
