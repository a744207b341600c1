package extauthz

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	dfpclusterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/dynamic_forward_proxy/v3"
	dnscachev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/dynamic_forward_proxy/v3"
	dfpfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/dynamic_forward_proxy/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/log"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-gw/sluice/gateway/config"
)

// Names of the resources every snapshot holds besides the per-sandbox
// listeners and routes.
const (
	AuthzCluster = "sluice_ext_authz"      // the gateway's own gRPC listener
	DFPCluster   = "sluice_dynamic_egress" // dynamic forward proxy: the host header decides
	DNSCacheName = "sluice_dns"
)

// MaxRequestBytes is how much of a request body Envoy buffers and sends
// in the CheckRequest (with_request_body), so that policy and the hold's
// body hash see it.
const MaxRequestBytes = 1 << 20

// XDS serves a sluice-managed Envoy its configuration over ADS, from a
// go-control-plane snapshot cache: one listener per sandbox, each with the
// ext_authz filter pointing back at the gateway and carrying the
// sandbox's identity in context_extensions, a route to the dynamic
// forward proxy cluster, and the clusters. Update builds a new snapshot
// from the configuration; every resource passes ValidateAll and the
// snapshot is Consistent before it is served. A version Envoy NACKed is
// logged, remembered, and not served again.
type XDS struct {
	log   *slog.Logger
	cache cachev3.SnapshotCache
	srv   serverv3.Server

	mu      sync.Mutex
	version string          // the version being served
	nacked  map[string]bool // versions Envoy rejected
	nacks   []NACK
}

// NACK is one rejection Envoy sent.
type NACK struct {
	TypeURL, Version, Message string
}

// NewXDS returns an ADS server whose streams end with ctx.
func NewXDS(ctx context.Context, lg *slog.Logger) *XDS {
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	x := &XDS{log: lg, nacked: map[string]bool{}}
	x.cache = cachev3.NewSnapshotCache(true, cachev3.IDHash{}, log.LoggerFuncs{
		WarnFunc:  func(f string, a ...any) { lg.Warn("xds: " + fmt.Sprintf(f, a...)) },
		ErrorFunc: func(f string, a ...any) { lg.Error("xds: " + fmt.Sprintf(f, a...)) },
	})
	x.srv = serverv3.NewServer(ctx, x.cache, serverv3.CallbackFuncs{StreamRequestFunc: x.onRequest})
	return x
}

// Register adds the ADS service to g.
func (x *XDS) Register(g *grpc.Server) {
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, x.srv)
}

// onRequest logs a NACK (a request carrying error_detail) and remembers
// the rejected version, so it is not served again.
func (x *XDS) onRequest(_ int64, req *discoverygrpc.DiscoveryRequest) error {
	ed := req.GetErrorDetail()
	if ed == nil {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	// The rejected version is the one last sent with that nonce; Envoy
	// reports in version_info the last version it accepted, so the
	// rejected one is the one being served.
	rejected := x.version
	x.nacked[rejected] = true
	x.nacks = append(x.nacks, NACK{TypeURL: req.GetTypeUrl(), Version: rejected, Message: ed.GetMessage()})
	x.log.Error("xds: Envoy rejected the configuration (NACK)", "type_url", req.GetTypeUrl(), "rejected_version", rejected,
		"accepted_version", req.GetVersionInfo(), "node", req.GetNode().GetId(), "reason", ed.GetMessage())
	return nil
}

// NACKs returns the rejections seen so far.
func (x *XDS) NACKs() []NACK {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.nacks)
}

// Version returns the version being served ("" before the first Update).
func (x *XDS) Version() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.version
}

// ErrNACKed is returned by Update for a configuration Envoy rejected
// before: the previous snapshot keeps serving.
var ErrNACKed = errors.New("xds: this configuration was rejected by Envoy before; the previous one keeps serving")

// Update builds the snapshot for c and serves it to c's Envoy node. The
// version is a hash of the resources, so an unchanged configuration pushes
// nothing and a rejected one is recognised.
func (x *XDS) Update(ctx context.Context, c *config.Config) error {
	e := c.Gateway.ExtAuthz
	if e == nil || e.XDS == nil {
		return errors.New("xds: gateway.ext_authz.xds is not configured")
	}
	res, err := Resources(c)
	if err != nil {
		return err
	}
	ver, err := version(res)
	if err != nil {
		return err
	}
	snap, err := cachev3.NewSnapshot(ver, res)
	if err != nil {
		return fmt.Errorf("xds: snapshot: %w", err)
	}
	if err := snap.Consistent(); err != nil {
		return fmt.Errorf("xds: bug(): inconsistent snapshot: %w", err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.nacked[ver] {
		x.log.Warn("xds: not serving a configuration Envoy rejected", "version", ver, "serving", x.version)
		return ErrNACKed
	}
	if ver == x.version {
		return nil
	}
	if err := x.cache.SetSnapshot(ctx, e.XDS.NodeID, snap); err != nil {
		return fmt.Errorf("xds: set snapshot: %w", err)
	}
	x.version = ver
	x.log.Info("xds: serving a new snapshot", "version", ver, "node", e.XDS.NodeID, "listeners", len(res[resource.ListenerType]))
	return nil
}

// version hashes the resources deterministically.
func version(res map[resource.Type][]types.Resource) (string, error) {
	h := sha256.New()
	for _, t := range []resource.Type{resource.ClusterType, resource.ListenerType, resource.RouteType} {
		for _, r := range res[t] {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
			if err != nil {
				return "", fmt.Errorf("xds: version: %w", err)
			}
			h.Write([]byte(t))
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Resources builds every resource for c's sluice-managed Envoy and checks
// each with ValidateAll.
func Resources(c *config.Config) (map[resource.Type][]types.Resource, error) {
	e := c.Gateway.ExtAuthz
	if e == nil || e.XDS == nil {
		return nil, errors.New("xds: gateway.ext_authz.xds is not configured")
	}
	authz, err := authzCluster(e)
	if err != nil {
		return nil, err
	}
	dfp, err := dfpCluster()
	if err != nil {
		return nil, err
	}
	out := map[resource.Type][]types.Resource{
		resource.ClusterType: {authz, dfp},
	}
	for i, l := range e.XDS.Listeners {
		lis, rt, err := sandboxListener(e, l)
		if err != nil {
			return nil, fmt.Errorf("xds: gateway.ext_authz.xds.listeners[%d]: %w", i, err)
		}
		out[resource.ListenerType] = append(out[resource.ListenerType], lis)
		out[resource.RouteType] = append(out[resource.RouteType], rt)
	}
	for _, rs := range out {
		for _, r := range rs {
			if v, ok := r.(interface{ ValidateAll() error }); ok {
				if err := v.ValidateAll(); err != nil {
					return nil, fmt.Errorf("xds: bug(): %s: %w", cachev3.GetResourceName(r), err)
				}
			}
		}
	}
	return out, nil
}

// mustAny packs m deterministically (map entries sorted), so that the
// snapshot's version, a hash of the resources, is stable.
func mustAny(m proto.Message) *anypb.Any {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		panic("bug(): anypb.New: " + err.Error()) // only for well-known generated types
	}
	return a
}

// authzCluster is the gateway's gRPC listener as Envoy reaches it: its
// Unix socket, or TCP with mutual TLS using the client certificate files
// on Envoy's host.
func authzCluster(e *config.ExtAuthz) (*clusterv3.Cluster, error) {
	var addr *corev3.Address
	var ts *corev3.TransportSocket
	if path, ok := e.UnixPath(); ok {
		addr = &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}}
	} else {
		host, port, err := net.SplitHostPort(e.Listen)
		if err != nil {
			return nil, fmt.Errorf("xds: gateway.ext_authz.listen: %w", err)
		}
		p, _ := strconv.ParseUint(port, 10, 16)
		addr = &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)},
		}}}
		x := e.XDS
		tc := &tlsv3.UpstreamTlsContext{
			CommonTlsContext: &tlsv3.CommonTlsContext{
				AlpnProtocols: []string{"h2"},
				TlsCertificates: []*tlsv3.TlsCertificate{{
					CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: x.ClientCertFile}},
					PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: x.ClientKeyFile}},
				}},
				ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
					TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: x.ServerCAFile}},
				}},
			},
		}
		ts = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(tc)}}
	}
	h2 := &upstreamhttpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
		}},
	}
	return &clusterv3.Cluster{
		Name:                          AuthzCluster,
		ClusterDiscoveryType:          &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:                durationpb.New(2 * time.Second),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(h2)},
		TransportSocket:               ts,
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: AuthzCluster,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}},
			}}}},
		},
	}, nil
}

func dnsCache() *dnscachev3.DnsCacheConfig {
	return &dnscachev3.DnsCacheConfig{Name: DNSCacheName, DnsLookupFamily: clusterv3.Cluster_V4_PREFERRED}
}

// dfpCluster sends each request to the host its Host header names; the
// ext_authz filter has decided that host before the router runs.
func dfpCluster() (*clusterv3.Cluster, error) {
	cc := &dfpclusterv3.ClusterConfig{ClusterImplementationSpecifier: &dfpclusterv3.ClusterConfig_DnsCacheConfig{DnsCacheConfig: dnsCache()}}
	return &clusterv3.Cluster{
		Name:           DFPCluster,
		ConnectTimeout: durationpb.New(5 * time.Second),
		LbPolicy:       clusterv3.Cluster_CLUSTER_PROVIDED,
		ClusterDiscoveryType: &clusterv3.Cluster_ClusterType{ClusterType: &clusterv3.Cluster_CustomClusterType{
			Name: "envoy.clusters.dynamic_forward_proxy", TypedConfig: mustAny(cc),
		}},
	}, nil
}

// sandboxListener is one sandbox's listener and its route configuration.
// The identity rides in the virtual host's ext_authz context_extensions:
// Envoy's configuration, which the sandbox cannot write.
func sandboxListener(e *config.ExtAuthz, l config.EnvoyListener) (*listenerv3.Listener, *routev3.RouteConfiguration, error) {
	host, port, err := net.SplitHostPort(l.Address)
	if err != nil {
		return nil, nil, fmt.Errorf("address: %w", err)
	}
	p, _ := strconv.ParseUint(port, 10, 16)
	name := "sluice_" + l.Name
	ctxExt := map[string]string{KeySandbox: l.Sandbox, KeyAgent: l.Agent}
	if l.Session != "" {
		ctxExt[KeySession] = l.Session
	}
	if l.User != "" {
		ctxExt[KeyUser] = l.User
	}
	perRoute := &extauthzv3.ExtAuthzPerRoute{Override: &extauthzv3.ExtAuthzPerRoute_CheckSettings{
		CheckSettings: &extauthzv3.CheckSettings{ContextExtensions: ctxExt},
	}}
	rt := &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:                 name,
			Domains:              []string{"*"},
			TypedPerFilterConfig: map[string]*anypb.Any{"envoy.filters.http.ext_authz": mustAny(perRoute)},
			Routes: []*routev3.Route{
				{
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_ConnectMatcher_{ConnectMatcher: &routev3.RouteMatch_ConnectMatcher{}}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: DFPCluster},
						UpgradeConfigs:   []*routev3.RouteAction_UpgradeConfig{{UpgradeType: "CONNECT", ConnectConfig: &routev3.RouteAction_UpgradeConfig_ConnectConfig{}}},
					}},
				},
				{
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: DFPCluster},
						Timeout:          durationpb.New(60 * time.Second),
					}},
				},
			},
		}},
	}
	authz := &extauthzv3.ExtAuthz{
		Services: &extauthzv3.ExtAuthz_GrpcService{GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: AuthzCluster}},
			Timeout:         durationpb.New(e.XDS.AuthzTimeout.Std()),
		}},
		TransportApiVersion:    corev3.ApiVersion_V3,
		FailureModeAllow:       false, // a gateway that cannot answer closes the door
		WithRequestBody:        &extauthzv3.BufferSettings{MaxRequestBytes: MaxRequestBytes, AllowPartialMessage: true, PackAsBytes: true},
		StatusOnError:          &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
		IncludePeerCertificate: true,
	}
	dfp := &dfpfilterv3.FilterConfig{ImplementationSpecifier: &dfpfilterv3.FilterConfig_DnsCacheConfig{DnsCacheConfig: dnsCache()}}
	mgr := &hcmv3.HttpConnectionManager{
		StatPrefix: name,
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			RouteConfigName: name,
			ConfigSource: &corev3.ConfigSource{
				ResourceApiVersion:    corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			},
		}},
		HttpFilters: []*hcmv3.HttpFilter{
			{Name: "envoy.filters.http.ext_authz", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(authz)}},
			{Name: "envoy.filters.http.dynamic_forward_proxy", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(dfp)}},
			{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}},
		},
		UpgradeConfigs:       []*hcmv3.HttpConnectionManager_UpgradeConfig{{UpgradeType: "CONNECT"}},
		Http2ProtocolOptions: &corev3.Http2ProtocolOptions{AllowConnect: true},
		// The sandbox's Forwarded/X-Forwarded-* claims are not relayed
		// as the gateway's (THREATS F8).
		UseRemoteAddress:             wrapperspb.Bool(true),
		SkipXffAppend:                true,
		PathWithEscapedSlashesAction: hcmv3.HttpConnectionManager_REJECT_REQUEST,
		NormalizePath:                wrapperspb.Bool(false), // ext_authz refuses non-canonical paths rather than deciding a rewrite
	}
	lis := &listenerv3.Listener{
		Name: name,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)},
		}}},
		FilterChains: []*listenerv3.FilterChain{{
			Filters: []*listenerv3.Filter{{
				Name:       "envoy.filters.network.http_connection_manager",
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(mgr)},
			}},
		}},
	}
	return lis, rt, nil
}
