//go:build linux

package deploy

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/dynamic_forward_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/dynamic_forward_proxy/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/extauthz"
)

var envoyDir = filepath.Join(root, "deploy", "envoy")

// docs reads a multi-document YAML file as generic maps.
func docs(t *testing.T, name string) []map[string]any {
	t.Helper()
	f, err := os.Open(filepath.Join(envoyDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	dec := yaml.NewDecoder(f)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if err.Error() == "EOF" {
				return out
			}
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, m)
	}
}

// dig walks a path of map keys and list indexes.
func dig(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %v: not a map", path)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at %v: not a list of %d", path, k+1)
			}
			v = l[k]
		}
	}
	return v
}

func kindOf(t *testing.T, ds []map[string]any, kind string) map[string]any {
	t.Helper()
	for _, d := range ds {
		if d["kind"] == kind {
			return d
		}
	}
	t.Fatalf("no %s", kind)
	return nil
}

// meshConfig loads sluice-mesh.yaml with the gateway's own config package
// and returns the ext_authz listener's port.
func meshConfig(t *testing.T) (*config.Config, int) {
	t.Helper()
	c, err := config.Load(filepath.Join(envoyDir, "sluice-mesh.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	e := c.Gateway.ExtAuthz
	if e == nil {
		t.Fatal("sluice-mesh.yaml has no gateway.ext_authz")
	}
	if _, unix := e.UnixPath(); unix || e.ClientCAFile == "" {
		t.Fatal("the mesh listener must be TCP with mutual TLS")
	}
	_, p, err := net.SplitHostPort(e.Listen)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(p)
	return c, port
}

// TestIstioExtAuthz: the extension provider names sluice's Service and the
// ext_authz listener's port, fails closed, sends the body as sluice's xDS
// would; the AuthorizationPolicy is CUSTOM with that provider; the
// Service's target port is the listener's; the DestinationRule makes the
// connection mutual TLS, which the listener requires.
func TestIstioExtAuthz(t *testing.T) {
	c, port := meshConfig(t)
	ds := docs(t, "istio.yaml")
	op := kindOf(t, ds, "IstioOperator")
	prov := dig(t, op, "spec", "meshConfig", "extensionProviders", 0).(map[string]any)
	g := dig(t, prov, "envoyExtAuthzGrpc").(map[string]any)
	svc := kindOf(t, ds, "Service")
	md := svc["metadata"].(map[string]any)
	fqdn := md["name"].(string) + "." + md["namespace"].(string) + ".svc.cluster.local"
	if g["service"] != fqdn {
		t.Errorf("provider service %v, want the Service %s", g["service"], fqdn)
	}
	if g["port"] != port || dig(t, svc, "spec", "ports", 0, "port") != port || dig(t, svc, "spec", "ports", 0, "targetPort") != port {
		t.Errorf("provider port %v, service port %v → %v; want gateway.ext_authz.listen's %d", g["port"], dig(t, svc, "spec", "ports", 0, "port"), dig(t, svc, "spec", "ports", 0, "targetPort"), port)
	}
	if g["failOpen"] != false {
		t.Error("failOpen must be false: sluice's silence must not open the door")
	}
	if dig(t, g, "includeRequestBodyInCheck", "maxRequestBytes") != extauthz.MaxRequestBytes || dig(t, g, "includeRequestBodyInCheck", "packAsBytes") != true {
		t.Errorf("includeRequestBodyInCheck = %v", g["includeRequestBodyInCheck"])
	}
	if to := g["timeout"].(string); to != "15s" || c.Gateway.ExtAuthz.HoldWait.Std().Seconds() >= 15 {
		t.Errorf("provider timeout %s must exceed gateway.ext_authz.hold_wait %s", to, c.Gateway.ExtAuthz.HoldWait.Std())
	}
	ap := kindOf(t, ds, "AuthorizationPolicy")
	if dig(t, ap, "spec", "action") != "CUSTOM" || dig(t, ap, "spec", "provider", "name") != prov["name"] {
		t.Errorf("AuthorizationPolicy = %v", ap["spec"])
	}
	dr := kindOf(t, ds, "DestinationRule")
	if dig(t, dr, "spec", "host") != fqdn || dig(t, dr, "spec", "trafficPolicy", "tls", "mode") != "MUTUAL" {
		t.Errorf("DestinationRule = %v", dr["spec"])
	}
	// The principals sluice maps are SPIFFE IDs of this mesh's trust domain.
	for _, p := range c.Gateway.ExtAuthz.Principals {
		if !strings.HasPrefix(p.Principal, "spiffe://cluster.local/") {
			t.Errorf("principal %s is not in the mesh's trust domain", p.Principal)
		}
	}
}

// TestEnvoyGatewayExtAuth: the SecurityPolicy's gRPC backend is sluice's
// Service and port, failOpen false, the body sent; the BackendTLSPolicy
// targets that Service's port and the EnvoyProxy presents a client
// certificate (mutual TLS, as the listener requires).
func TestEnvoyGatewayExtAuth(t *testing.T) {
	_, port := meshConfig(t)
	ds := docs(t, "envoy-gateway.yaml")
	svc := kindOf(t, docs(t, "istio.yaml"), "Service")
	sp := kindOf(t, ds, "SecurityPolicy")
	ref := dig(t, sp, "spec", "extAuth", "grpc", "backendRefs", 0).(map[string]any)
	if ref["name"] != dig(t, svc, "metadata", "name") || ref["namespace"] != dig(t, svc, "metadata", "namespace") || ref["port"] != port {
		t.Errorf("backendRef %v, want Service %v/%v port %d", ref, dig(t, svc, "metadata", "namespace"), dig(t, svc, "metadata", "name"), port)
	}
	if dig(t, sp, "spec", "extAuth", "failOpen") != false {
		t.Error("failOpen must be false")
	}
	if dig(t, sp, "spec", "extAuth", "bodyToExtAuth", "maxRequestBytes") != extauthz.MaxRequestBytes {
		t.Error("the body must reach sluice (policy and the hold's body hash)")
	}
	bt := kindOf(t, ds, "BackendTLSPolicy")
	if dig(t, bt, "spec", "targetRefs", 0, "name") != ref["name"] || dig(t, bt, "spec", "targetRefs", 0, "sectionName") != dig(t, svc, "spec", "ports", 0, "name") {
		t.Errorf("BackendTLSPolicy targets %v", dig(t, bt, "spec", "targetRefs", 0))
	}
	if dig(t, kindOf(t, ds, "EnvoyProxy"), "spec", "backendTLS", "clientCertificateRef", "name") == nil {
		t.Error("EnvoyProxy presents no client certificate")
	}
	rg := kindOf(t, ds, "ReferenceGrant")
	if dig(t, rg, "metadata", "namespace") != ref["namespace"] || dig(t, rg, "spec", "to", 0, "name") != ref["name"] {
		t.Errorf("ReferenceGrant = %v", rg)
	}
}

// bootstrap parses an Envoy bootstrap file with Envoy's own protos
// (go-control-plane's generated code: unknown fields and bad enum names are
// errors) and checks it with ValidateAll.
func bootstrap(t *testing.T, name string) *bootstrapv3.Bootstrap {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(envoyDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var m any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, bs); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return bs
}

// TestPlainEnvoyBootstrap: envoy.yaml parses as an Envoy bootstrap, its
// ext_authz cluster is sluice-envoy.yaml's socket, and its listener is the
// one sluice's xDS serves for the same sandbox: the same ext_authz filter
// and the same identity in context_extensions.
func TestPlainEnvoyBootstrap(t *testing.T) {
	c, err := config.Load(filepath.Join(envoyDir, "sluice-envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sock, ok := c.Gateway.ExtAuthz.UnixPath()
	if !ok {
		t.Fatal("sluice-envoy.yaml: want a Unix socket")
	}
	bs := bootstrap(t, "envoy.yaml")
	if bs.GetNode().GetId() != c.Gateway.ExtAuthz.XDS.NodeID {
		t.Errorf("node id %q", bs.GetNode().GetId())
	}
	var pipe string
	for _, cl := range bs.GetStaticResources().GetClusters() {
		if cl.Name == extauthz.AuthzCluster {
			pipe = cl.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath()
		}
	}
	if pipe != sock {
		t.Errorf("ext_authz cluster dials %q, want gateway.ext_authz.listen %q", pipe, sock)
	}

	res, err := extauthz.Resources(c)
	if err != nil {
		t.Fatal(err)
	}
	served := res[resource.ListenerType][0].(*listenerv3.Listener)
	static := bs.GetStaticResources().GetListeners()[0]
	if served.Name != static.Name || !proto.Equal(served.Address, static.Address) {
		t.Errorf("listener %s %v, xDS serves %s %v", static.Name, static.Address, served.Name, served.Address)
	}
	hcm := func(l *listenerv3.Listener) *hcmv3.HttpConnectionManager {
		m := &hcmv3.HttpConnectionManager{}
		if err := l.FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(m); err != nil {
			t.Fatal(err)
		}
		if err := m.ValidateAll(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	sm, xm := hcm(static), hcm(served)
	authz := func(m *hcmv3.HttpConnectionManager) *extauthzv3.ExtAuthz {
		a := &extauthzv3.ExtAuthz{}
		if err := m.HttpFilters[0].GetTypedConfig().UnmarshalTo(a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	if sa, xa := authz(sm), authz(xm); !proto.Equal(sa, xa) || sa.FailureModeAllow {
		t.Errorf("envoy.yaml's ext_authz filter differs from the one sluice serves:\n%v\n%v", sa, xa)
	}
	perRoute := func(vh *routev3.VirtualHost) map[string]string {
		p := &extauthzv3.ExtAuthzPerRoute{}
		if err := vh.TypedPerFilterConfig["envoy.filters.http.ext_authz"].UnmarshalTo(p); err != nil {
			t.Fatal(err)
		}
		return p.GetCheckSettings().GetContextExtensions()
	}
	rt := res[resource.RouteType][0].(*routev3.RouteConfiguration)
	se, xe := perRoute(sm.GetRouteConfig().VirtualHosts[0]), perRoute(rt.VirtualHosts[0])
	l := c.Gateway.ExtAuthz.XDS.Listeners[0]
	for k, want := range map[string]string{"sandbox": l.Sandbox, "agent": l.Agent, "session": l.Session, "user": l.User} {
		if se[k] != want || xe[k] != want {
			t.Errorf("context_extensions[%s]: envoy.yaml %q, xDS %q, want %q", k, se[k], xe[k], want)
		}
	}
}

// TestEnvoyADSBootstrap: envoy-ads.yaml asks sluice's socket for
// everything over ADS, as the node sluice serves.
func TestEnvoyADSBootstrap(t *testing.T) {
	c, err := config.Load(filepath.Join(envoyDir, "sluice-envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sock, _ := c.Gateway.ExtAuthz.UnixPath()
	bs := bootstrap(t, "envoy-ads.yaml")
	if bs.GetNode().GetId() != c.Gateway.ExtAuthz.XDS.NodeID {
		t.Errorf("node id %q, want gateway.ext_authz.xds.node_id %q", bs.GetNode().GetId(), c.Gateway.ExtAuthz.XDS.NodeID)
	}
	ads := bs.GetDynamicResources().GetAdsConfig()
	cl := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	if bs.GetDynamicResources().GetLdsConfig().GetAds() == nil || bs.GetDynamicResources().GetCdsConfig().GetAds() == nil {
		t.Error("LDS and CDS must come over ADS")
	}
	for _, x := range bs.GetStaticResources().GetClusters() {
		if x.Name == cl {
			if p := x.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath(); p != sock {
				t.Errorf("ADS cluster dials %q, want %q", p, sock)
			}
			return
		}
	}
	t.Errorf("no static cluster %q for ADS", cl)
}
