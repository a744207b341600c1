package gateway

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/open-policy-agent/opa/v1/rego"
	"google.golang.org/genproto/googleapis/rpc/code"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/extauthz"
	"github.com/sluice-gw/sluice/gateway/toolinput"
	"github.com/sluice-gw/sluice/policy"
)

// envoyBenchPolicy is the benchmarks' opa-envoy-plugin policy
// (data.envoy.authz.allow), loaded unchanged by sluice beside the adapter
// and evaluated alone by the bare peer.
const envoyBenchPolicy = "package envoy.authz\n\nimport input.attributes.request.http as http_request\n\ndefault allow := false\n\nallow if {\n\thttp_request.method == \"GET\"\n\tinput.parsed_path[0] == \"tickets\"\n}\n"

// envoyBench is the in-process gateway of the Envoy benchmarks (audit log
// on /dev/shm, as test/bench's extauthz section), the Check they send, and
// the policy file the peer loads.
func envoyBench(b *testing.B) (*envoyGateway, *authv3.CheckRequest, string) {
	shm := b.TempDir()
	if d, err := os.MkdirTemp("/dev/shm", "sluice-bench-"); err == nil {
		shm = d
		b.Cleanup(func() { os.RemoveAll(d) })
	}
	dir := b.TempDir()
	adapter, err := os.ReadFile("extauthz/testdata/opa-envoy/adapter.rego")
	if err != nil {
		b.Fatal(err)
	}
	pol := filepath.Join(dir, "envoy.rego")
	if err := os.WriteFile(filepath.Join(dir, "adapter.rego"), adapter, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(pol, []byte(envoyBenchPolicy), 0o644); err != nil {
		b.Fatal(err)
	}
	g := startEnvoyGateway(b, func(c *config.Config) {
		c.Audit.Path = filepath.Join(shm, "audit.log")
		c.Rego = []string{dir}
	})
	return g, g.checkRequest("HTTP/1.1", "GET", "/tickets?limit=5", nil, nil), pol
}

// BenchmarkEnvoyCheck is one allowed Check with the credential attached,
// through the real gateway in this process ("sluice"), beside the bare
// peer of test/bench's extauthz section ("peer": opa-envoy-plugin's input
// and the same Rego through OPA's Go API, nothing else) served over the
// same kind of socket by the same gRPC, so that the two differ only in
// what the server does. cpu-µs/op is the whole process's CPU per Check
// (client and GC included): on a shared machine it moves far less than
// latency. "sluice-evaluated" is the gateway with its policy compiled
// to evaluate every decision (no live memo). Run with -count to repeat
// the rows.
func BenchmarkEnvoyCheck(b *testing.B) {
	g, cr, pol := envoyBench(b)
	peer := startEnvoyPeer(b, pol)
	ctx := context.Background()
	memo, evaluated := g.engine.Load(), noMemoEngine(b, g)
	for _, row := range []struct {
		name string
		c    authv3.AuthorizationClient
		e    *policy.Engine
	}{{"peer", peer, memo}, {"sluice", g.authz, memo}, {"sluice-evaluated", g.authz, evaluated}} {
		b.Run(row.name, func(b *testing.B) {
			g.engine.Store(row.e)
			defer g.engine.Store(memo)
			cpu0 := processCPU()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				res, err := row.c.Check(ctx, cr)
				if err != nil || res.GetOkResponse() == nil {
					b.Fatalf("%v %v\n%s", res, err, lastN(g.logBuf.String(), 1500))
				}
			}
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// noMemoEngine is g's policy compiled again to evaluate every decision
// (policy.Config.NoMemo): the "-evaluated" rows, the engine before its
// live memo.
func noMemoEngine(b *testing.B, g *envoyGateway) *policy.Engine {
	pc := PolicyConfig(g.cfg, nil)
	pc.NoMemo = true
	e, err := policy.New(context.Background(), pc)
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkEnvoyDecide is the floor under BenchmarkEnvoyCheck: the policy
// work of a Check alone, no gRPC, audit, credential or log line. "peer" is
// the bare peer's (opa-envoy-plugin's input, the team's module through
// OPA's Go API); "sluice" is the pipeline's (input.envoy's JSON, the tool
// call's input, the shipped library with the adapter and the module,
// through the engine's live memo), "sluice-evaluated" the same with every
// decision evaluated.
func BenchmarkEnvoyDecide(b *testing.B) {
	g, cr, pol := envoyBench(b)
	ctx := context.Background()
	pq, err := rego.New(rego.Query("data.envoy.authz.allow"), rego.Load([]string{pol}, nil)).PrepareForEval(ctx)
	if err != nil {
		b.Fatal(err)
	}
	route := g.envoy.envoyRoutes()
	evaluated := noMemoEngine(b, g)
	sluice := func(e *policy.Engine) func() bool {
		return func() bool {
			r, err := extauthz.Parse(cr)
			if err != nil {
				b.Fatal(err)
			}
			if r.Envoy, err = extauthz.EnvoyJSON(cr, r); err != nil {
				b.Fatal(err)
			}
			m, found := route(r.Host, r.Port, r.Method, r.Path, r.RawQuery)
			if found != extauthz.Matched {
				b.Fatalf("no tool for the Check: %v", found)
			}
			tool, _ := g.catalog.Tool(m.Tool)
			up := g.catalog.Upstream(m.Connector)
			hr, err := http.NewRequestWithContext(ctx, r.Method, up.Conn.BaseURL.Scheme+"://"+up.Conn.BaseURL.Host+r.Path+"?"+r.RawQuery, http.NoBody)
			if err != nil {
				b.Fatal(err)
			}
			hr.Header = r.Headers.Clone()
			req, err := toolinput.Formed(ctx, hr, tool, up.Conn.BaseURL)
			if err != nil {
				b.Fatal(err)
			}
			id := agentA
			in := toolinput.Input(id.Sandbox, id.Agent, id.Session, id.User, tool, nil, req, time.Now().UTC())
			in.Envoy = r.Envoy
			return e.Decide(ctx, in).Rule == "envoy.authz"
		}
	}
	rows := []struct {
		name string
		fn   func() bool
	}{{"peer", func() bool {
		r, err := extauthz.Parse(cr)
		if err != nil {
			b.Fatal(err)
		}
		in, err := extauthz.EnvoyInput(cr, r)
		if err != nil {
			b.Fatal(err)
		}
		rs, err := pq.Eval(ctx, rego.EvalInput(in))
		return err == nil && len(rs) == 1 && rs[0].Expressions[0].Value == true
	}}, {"sluice", sluice(g.engine.Load())}, {"sluice-evaluated", sluice(evaluated)}}
	for _, row := range rows {
		b.Run(row.name, func(b *testing.B) {
			cpu0 := processCPU()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if !row.fn() {
					b.Fatal("not allowed by envoy.authz")
				}
			}
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// envoyPeer is test/bench's bare ext_authz peer, in this process.
type envoyPeer struct {
	authv3.UnimplementedAuthorizationServer
	pq rego.PreparedEvalQuery
}

func (p *envoyPeer) Check(ctx context.Context, cr *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	h := cr.GetAttributes().GetRequest().GetHttp()
	u, err := url.ParseRequestURI(h.GetPath())
	if err != nil {
		return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(code.Code_PERMISSION_DENIED)}}, nil
	}
	r := &extauthz.Request{Path: u.EscapedPath(), Query: u.Query(), Body: h.GetRawBody(), Headers: http.Header{"Content-Type": {h.GetHeaders()["content-type"]}}}
	in, err := extauthz.EnvoyInput(cr, r)
	if err != nil {
		return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(code.Code_PERMISSION_DENIED)}}, nil
	}
	rs, err := p.pq.Eval(ctx, rego.EvalInput(in))
	if err != nil || len(rs) != 1 || rs[0].Expressions[0].Value != true {
		return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(code.Code_PERMISSION_DENIED)}}, nil
	}
	return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(code.Code_OK)}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}}, nil
}

// startEnvoyPeer serves the peer on a Unix socket and returns its client.
func startEnvoyPeer(b *testing.B, policyFile string) authv3.AuthorizationClient {
	pq, err := rego.New(rego.Query("data.envoy.authz.allow"), rego.Load([]string{policyFile}, nil)).PrepareForEval(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(b.TempDir(), "peer.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	s := grpc.NewServer()
	authv3.RegisterAuthorizationServer(s, &envoyPeer{pq: pq})
	go s.Serve(l)
	b.Cleanup(s.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return authv3.NewAuthorizationClient(conn)
}

func lastN(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
