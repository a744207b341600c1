package extauthz_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/sluice-gw/sluice/gateway/extauthz"
	"github.com/sluice-gw/sluice/policy"
)

// TestOPAEnvoyPolicyUnchanged: a policy written for opa-envoy-plugin
// decides the same requests the same way in sluice, through input.envoy
// and a five-line adapter module, as it does evaluated the way the plugin
// evaluates it (OPA's Go API, data.envoy.authz.allow on the plugin's
// input) — field for field of the input, since both are fed EnvoyInput.
func TestOPAEnvoyPolicyUnchanged(t *testing.T) {
	ctx := context.Background()
	eng, err := policy.New(ctx, policy.Config{Paths: []string{"testdata/opa-envoy"}})
	if err != nil {
		t.Fatal(err)
	}
	plugin, err := rego.New(rego.Query("data.envoy.authz.allow"), rego.Load([]string{"testdata/opa-envoy/envoy_authz.rego"}, nil)).PrepareForEval(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		fixture string
		edit    func(*authv3.CheckRequest)
		want    policy.Action
	}{
		{"list within limit", "get_http1.json", path("/v2/pets?limit=10"), policy.Allow},
		{"list over limit", "get_http1.json", path("/v2/pets?limit=100"), policy.Block},
		{"list default limit", "get_http1.json", path("/v2/pets"), policy.Allow},
		{"one pet", "get_http1.json", nil, policy.Allow},
		{"delete", "get_http1.json", func(cr *authv3.CheckRequest) { cr.Attributes.Request.Http.Method = "DELETE" }, policy.Block},
		{"add pet from an agent", "post_http2_body.json", nil, policy.Allow},
		{"add pet with a reserved tag", "post_http2_body.json", body(`{"name":"rex","tag":"admin"}`), policy.Block},
		{"add pet from outside the agents namespace", "post_http2_body.json", func(cr *authv3.CheckRequest) {
			cr.Attributes.Source.Principal = "spiffe://cluster.local/ns/default/sa/web"
		}, policy.Block},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cr := fixture(t, tc.fixture, tc.edit)
			r, err := extauthz.Parse(cr)
			if err != nil {
				t.Fatal(err)
			}
			env, err := extauthz.EnvoyInput(cr, r)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := extauthz.EnvoyJSON(cr, r) // what the gateway decides on; the plugin gets the map
			if err != nil {
				t.Fatal(err)
			}
			d := eng.Decide(ctx, &policy.Input{
				Version: policy.InputVersion, Kind: "http",
				Caller:  policy.Caller{Sandbox: "sb-1", Agent: "support-bot"},
				Request: policy.Request{Method: r.Method, Host: r.Host, Port: r.Port, Path: r.Path, Query: r.Query, Headers: r.Headers},
				Envoy:   raw, Time: time.Now(),
			})
			if d.Action != tc.want || d.Rule != "envoy.authz" {
				t.Fatalf("sluice: %v by %q (%s), want %v by envoy.authz", d.Action, d.Rule, d.Reason, tc.want)
			}
			rs, err := plugin.Eval(ctx, rego.EvalInput(env))
			if err != nil || len(rs) != 1 {
				t.Fatalf("plugin eval: %v %v", rs, err)
			}
			if allowed := rs[0].Expressions[0].Value == true; allowed != (tc.want == policy.Allow) {
				t.Fatalf("the plugin's evaluation says allow=%v; sluice says %v", allowed, d.Action)
			}
		})
	}
}

func path(p string) func(*authv3.CheckRequest) {
	return func(cr *authv3.CheckRequest) {
		cr.Attributes.Request.Http.Path = p
		cr.Attributes.Request.Http.Headers[":path"] = p
	}
}

func body(b string) func(*authv3.CheckRequest) {
	return func(cr *authv3.CheckRequest) {
		h := cr.Attributes.Request.Http
		h.RawBody = []byte(b)
		h.Headers["content-length"] = strconv.Itoa(len(b))
	}
}
