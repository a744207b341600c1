package extauthz_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/extauthz"
)

func xdsConfig(t *testing.T, sock string, listeners string) *config.Config {
	t.Helper()
	src := `
gateway:
  sandbox_socket: /run/sluice/relay.sock
  ext_authz:
    listen: unix:` + sock + `
    trusted_uids: [` + strconv.Itoa(os.Getuid()) + `]
    xds:
      node_id: envoy-1
      listeners:
` + listeners + `
store: sqlite:/tmp/x.db
audit: { path: /tmp/audit.log }
agents:
  - name: support-bot
  - name: builder
`
	c, err := config.Parse([]byte(src), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const oneListener = `        - { name: sb-1, address: "127.0.0.1:10001", sandbox: sb-1, agent: support-bot, session: s-1, user: bob }
`

// TestResourcesValidate: every resource passes go-control-plane's
// ValidateAll (Resources checks it) and the ext_authz filter fails
// closed, buffers the body, points back at the gateway, and carries the
// listener's identity in context_extensions.
func TestResourcesValidate(t *testing.T) {
	c := xdsConfig(t, "/run/sluice/authz.sock", oneListener+`        - { name: sb-2, address: "127.0.0.1:10002", sandbox: sb-2, agent: builder }
`)
	res, err := extauthz.Resources(c)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res[resource.ListenerType]); n != 2 {
		t.Fatalf("%d listeners, want 2", n)
	}
	lis := res[resource.ListenerType][0].(*listenerv3.Listener)
	mgr := &hcmv3.HttpConnectionManager{}
	if err := lis.FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(mgr); err != nil {
		t.Fatal(err)
	}
	authz := &extauthzv3.ExtAuthz{}
	if err := mgr.HttpFilters[0].GetTypedConfig().UnmarshalTo(authz); err != nil {
		t.Fatal(err)
	}
	if authz.FailureModeAllow || authz.GetGrpcService().GetEnvoyGrpc().GetClusterName() != extauthz.AuthzCluster ||
		authz.GetWithRequestBody().GetMaxRequestBytes() != extauthz.MaxRequestBytes || authz.TransportApiVersion != corev3.ApiVersion_V3 {
		t.Errorf("ext_authz filter = %v", authz)
	}
	rt := res[resource.RouteType][0].(*routev3.RouteConfiguration)
	per := &extauthzv3.ExtAuthzPerRoute{}
	if err := rt.VirtualHosts[0].TypedPerFilterConfig["envoy.filters.http.ext_authz"].UnmarshalTo(per); err != nil {
		t.Fatal(err)
	}
	if ce := per.GetCheckSettings().GetContextExtensions(); ce["sandbox"] != "sb-1" || ce["agent"] != "support-bot" || ce["user"] != "bob" {
		t.Errorf("context_extensions = %v", ce)
	}
}

// TestADS drives the ADS server with go-control-plane's generated client
// as Envoy would: subscribe, receive, ACK; a configuration change pushes a
// new version; a NACK is logged and the rejected version is not served
// again.
func TestADS(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs bytes.Buffer
	x := extauthz.NewXDS(ctx, slog.New(slog.NewTextHandler(&logs, nil)))
	sock := filepath.Join(t.TempDir(), "authz.sock")
	c1 := xdsConfig(t, sock, oneListener)
	if err := x.Update(ctx, c1); err != nil {
		t.Fatal(err)
	}
	v1 := x.Version()
	l, opts, err := extauthz.Listen(c1.Gateway.ExtAuthz, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := extauthz.NewGRPC(opts, extauthz.NewAuthz(extauthz.Deps{}), x)
	go g.Serve(l)
	defer g.Stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "envoy-1", Cluster: "egress"}
	send := func(req *discoverygrpc.DiscoveryRequest) {
		t.Helper()
		req.Node, req.TypeUrl = node, resource.ListenerType
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() *discoverygrpc.DiscoveryResponse {
		t.Helper()
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// Subscribe: the first answer is the current version.
	send(&discoverygrpc.DiscoveryRequest{})
	r1 := recv()
	if r1.VersionInfo != v1 || len(r1.Resources) != 1 {
		t.Fatalf("first response: version %q (want %q), %d listeners", r1.VersionInfo, v1, len(r1.Resources))
	}
	// ACK it.
	send(&discoverygrpc.DiscoveryRequest{VersionInfo: r1.VersionInfo, ResponseNonce: r1.Nonce})

	// A configuration change (a second sandbox) pushes a new version.
	c2 := xdsConfig(t, sock, oneListener+`        - { name: sb-2, address: "127.0.0.1:10002", sandbox: sb-2, agent: builder }
`)
	if err := x.Update(ctx, c2); err != nil {
		t.Fatal(err)
	}
	r2 := recv()
	if r2.VersionInfo == v1 || r2.VersionInfo != x.Version() || len(r2.Resources) != 2 {
		t.Fatalf("after the change: version %q (was %q), %d listeners", r2.VersionInfo, v1, len(r2.Resources))
	}

	// NACK it: Envoy keeps v1 and says why.
	send(&discoverygrpc.DiscoveryRequest{VersionInfo: r1.VersionInfo, ResponseNonce: r2.Nonce, ErrorDetail: &status.Status{Code: 3, Message: "listener sluice_sb-2: address already in use"}})
	deadline := time.Now().Add(5 * time.Second)
	for len(x.NACKs()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	n := x.NACKs()
	if len(n) != 1 || n[0].Version != r2.VersionInfo || !strings.Contains(n[0].Message, "address already in use") {
		t.Fatalf("NACKs = %+v", n)
	}
	if !strings.Contains(logs.String(), "NACK") || !strings.Contains(logs.String(), "address already in use") {
		t.Errorf("the NACK is not in the log: %s", logs.String())
	}
	// The rejected configuration is not pushed again; another one is.
	if err := x.Update(ctx, c1); err != nil {
		t.Fatal(err)
	}
	if err := x.Update(ctx, c2); err != extauthz.ErrNACKed {
		t.Fatalf("re-pushing the rejected configuration: err = %v, want ErrNACKed", err)
	}
	if x.Version() != v1 {
		t.Fatalf("serving %q, want %q", x.Version(), v1)
	}
}
