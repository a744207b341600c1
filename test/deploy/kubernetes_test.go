//go:build linux

package deploy

import (
	"context"
	"net"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/sandboxd"
)

// The names the manifests give the objects these tests follow.
const (
	namespace       = "sluice"
	gatewayName     = "sluice-gateway" // Deployment, Service
	gatewayCM       = "sluice-config"
	sandboxdName    = "sandboxd" // DaemonSet
	sandboxdCM      = "sluice-sandboxd-config"
	nodePlaceholder = "@NODE_NAME@"
	exampleNode     = "node-a"
)

// TestManifestsParse checks every document of every file: it decodes, and
// it has apiVersion, kind and metadata.name; namespaced objects are in the
// sluice namespace; no kind/name pair is defined twice.
func TestManifestsParse(t *testing.T) {
	m := loadManifests(t)
	seen := map[string]string{}
	for _, o := range m.objs {
		t.Run(o.file+"#"+o.Kind+"/"+o.Metadata.Name, func(t *testing.T) {
			for _, f := range []struct{ field, v string }{
				{"apiVersion", o.APIVersion}, {"kind", o.Kind}, {"metadata.name", o.Metadata.Name},
			} {
				if f.v == "" {
					t.Errorf("%s document %d: %s is empty", o.file, o.doc, f.field)
				}
			}
			if o.Kind != "Namespace" && o.Metadata.Namespace != namespace {
				t.Errorf("%s: metadata.namespace = %q, want %q", o.where(), o.Metadata.Namespace, namespace)
			}
			id := o.Kind + "/" + o.Metadata.Name
			if prev, ok := seen[id]; ok && !strings.HasPrefix(o.file, "optional-") && !strings.HasPrefix(prev, "optional-") {
				t.Errorf("%s: %s is also defined in %s", o.file, id, prev)
			}
			seen[id] = o.file
		})
	}
	if m.find("Namespace", namespace) == nil {
		t.Errorf("deploy/kubernetes: no Namespace %q", namespace)
	}
}

// gatewayConfig loads the sluice.yaml of the gateway's ConfigMap with the
// gateway's own config package, as the pod would (relative paths against
// the config's mount).
func gatewayConfig(t *testing.T, m *manifests) (*config.Config, *object) {
	t.Helper()
	cm := m.get(t, "ConfigMap", gatewayCM)
	data, ok := cm.Data["sluice.yaml"]
	if !ok {
		t.Fatalf("%s: data has no sluice.yaml", cm.where())
	}
	cfg, err := config.Parse([]byte(data), "/etc/sluice")
	if err != nil {
		t.Fatalf("%s: data.sluice.yaml: %v", cm.where(), err)
	}
	return cfg, cm
}

// sandboxdConfig parses the DaemonSet's sandboxd.yaml with sandboxd's own
// parser, after the init container's substitution of the node name.
func sandboxdConfig(t *testing.T, m *manifests) (sandboxd.Config, *object) {
	t.Helper()
	cm := m.get(t, "ConfigMap", sandboxdCM)
	data, ok := cm.Data["sandboxd.yaml"]
	if !ok {
		t.Fatalf("%s: data has no sandboxd.yaml", cm.where())
	}
	cfg, err := sandboxd.ParseConfig([]byte(strings.ReplaceAll(data, nodePlaceholder, exampleNode)))
	if err != nil {
		t.Fatalf("%s: data.sandboxd.yaml: %v", cm.where(), err)
	}
	return cfg, cm
}

// TestGatewayConfigLoads checks the ConfigMap's sluice.yaml with
// config.Parse (strict keys, Validate), that relay_tls is on (sandbox
// hosts are other nodes), and that every connector's spec is mounted from
// a ConfigMap and builds tools.
func TestGatewayConfigLoads(t *testing.T) {
	m := loadManifests(t)
	cfg, cm := gatewayConfig(t, m)
	if cfg.Gateway.RelayTLS.Listen == "" {
		t.Errorf("%s: data.sluice.yaml: gateway.relay_tls.listen is empty; nodes cannot reach a Unix socket", cm.where())
	}
	if h, _, err := net.SplitHostPort(cfg.Gateway.AdminListen); err != nil || h == "127.0.0.1" || h == "::1" || h == "localhost" {
		t.Errorf("%s: data.sluice.yaml: gateway.admin_listen = %q; the probes and the Service need the pod's address", cm.where(), cfg.Gateway.AdminListen)
	}
	dep, w := m.workload(t, "Deployment", gatewayName)
	c := w.Template.Spec.containerNamed(t, dep.where(), "gateway")
	if len(cfg.Connectors) == 0 {
		t.Logf("%s: no connectors", cm.where())
	}
	for i, cn := range cfg.Connectors {
		t.Run(cn.Slug, func(t *testing.T) {
			spec, kind, err := m.fileContent(&w.Template.Spec, c, cn.Spec)
			if err != nil || kind != "configMap" {
				t.Fatalf("%s: container gateway: connectors[%d].spec %s: want a ConfigMap key mounted there, got %s source: %v", dep.where(), i, cn.Spec, kind, err)
			}
			tools, err := connectors.LoadData(context.Background(), cn.Slug, []byte(spec), cn.BaseURL)
			if err != nil {
				t.Fatalf("%s: connectors[%d].spec %s: %v", cm.where(), i, cn.Spec, err)
			}
			if tools == nil {
				t.Fatalf("%s: connectors[%d].spec %s: no connector", cm.where(), i, cn.Spec)
			}
		})
	}
}

// TestSandboxdConfigsParse parses every sandboxd.yaml shipped: the
// example, the example with its commented gateway_tls block turned on,
// and the DaemonSet's, with sandboxd.ParseConfig (strict keys, Validate).
func TestSandboxdConfigsParse(t *testing.T) {
	example := readFile(t, filepath.Join(root, "deploy", "sandboxd.yaml"))
	m := loadManifests(t)
	cm := m.get(t, "ConfigMap", sandboxdCM)
	cases := []struct {
		name, where, data string
		check             func(t *testing.T, c sandboxd.Config)
	}{
		{"example", "deploy/sandboxd.yaml", example, func(t *testing.T, c sandboxd.Config) {
			if c.GatewayTLS.Address != "" {
				t.Errorf("deploy/sandboxd.yaml: gateway_tls.address = %q; the example's default is the local socket", c.GatewayTLS.Address)
			}
		}},
		{"example with gateway_tls", "deploy/sandboxd.yaml (gateway_tls uncommented)", uncommentBlock(t, example, "gateway_tls:"), func(t *testing.T, c sandboxd.Config) {
			if c.GatewayTLS.Address == "" || c.GatewayTLS.CertFile == "" {
				t.Errorf("deploy/sandboxd.yaml: the commented gateway_tls block did not set gateway_tls: %+v", c.GatewayTLS)
			}
		}},
		{"daemonset", cm.where() + ": data.sandboxd.yaml", strings.ReplaceAll(cm.Data["sandboxd.yaml"], nodePlaceholder, exampleNode), func(t *testing.T, c sandboxd.Config) {
			if c.Host != exampleNode {
				t.Errorf("%s: data.sandboxd.yaml: host = %q after substituting %s, want the node name", cm.where(), c.Host, nodePlaceholder)
			}
			if c.GatewayTLS.Address == "" {
				t.Errorf("%s: data.sandboxd.yaml: gateway_tls.address is empty; a node cannot reach the gateway's Unix socket", cm.where())
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if strings.TrimSpace(tc.data) == "" {
				t.Fatalf("%s: empty", tc.where)
			}
			c, err := sandboxd.ParseConfig([]byte(tc.data))
			if err != nil {
				t.Fatalf("%s: %v", tc.where, err)
			}
			tc.check(t, c)
		})
	}
}

// uncommentBlock turns "# key:" and the "#   " lines right after it into
// YAML, as an operator enabling the block would.
func uncommentBlock(t *testing.T, s, key string) string {
	t.Helper()
	lines := strings.Split(s, "\n")
	in := false
	found := false
	for i, l := range lines {
		switch {
		case l == "# "+key:
			lines[i], in, found = key, true, true
		case in && strings.HasPrefix(l, "#   "):
			lines[i] = strings.TrimPrefix(l, "# ")
		default:
			in = false
		}
	}
	if !found {
		t.Fatalf("no commented %q block", key)
	}
	return strings.Join(lines, "\n")
}

// TestInitContainerRendersHost checks that the DaemonSet's init container
// substitutes the node's name into sandboxd.yaml, from the downward API,
// and writes it where sandboxd reads its --config.
func TestInitContainerRendersHost(t *testing.T) {
	m := loadManifests(t)
	ds, w := m.workload(t, "DaemonSet", sandboxdName)
	p := &w.Template.Spec
	cm := m.get(t, "ConfigMap", sandboxdCM)
	if !strings.Contains(cm.Data["sandboxd.yaml"], "host: \""+nodePlaceholder+"\"") {
		t.Errorf("%s: data.sandboxd.yaml: host is not %q", cm.where(), nodePlaceholder)
	}
	// Two init containers: config (checked here) and install-cni
	// (sluice-cni onto the node, cmd/sluice-cni's install).
	var ic *container
	for i := range p.InitContainers {
		if p.InitContainers[i].Name == "config" {
			ic = &p.InitContainers[i]
		}
	}
	if ic == nil || len(p.InitContainers) != 2 {
		t.Fatalf("%s: want init containers config and install-cni, got %d", ds.where(), len(p.InitContainers))
	}
	script := strings.Join(ic.Command, " ")
	if !strings.Contains(script, nodePlaceholder) || !strings.Contains(script, "${NODE_NAME}") {
		t.Errorf("%s: initContainers[%s].command does not replace %s with ${NODE_NAME}: %q", ds.where(), ic.Name, nodePlaceholder, script)
	}
	fromNode := false
	for _, e := range ic.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			fromNode = true
		}
	}
	if !fromNode {
		t.Errorf("%s: initContainers[%s].env: NODE_NAME is not from fieldRef spec.nodeName", ds.where(), ic.Name)
	}
	// The script reads the ConfigMap and writes sandboxd's --config.
	sd := p.containerNamed(t, ds.where(), "sandboxd")
	cfgPath := flagValue(sd.Command, "--config")
	in, out := redirect(script)
	if _, kind, err := m.fileContent(p, ic, in); err != nil || kind != "configMap" {
		t.Errorf("%s: initContainers[%s] reads %s: want the ConfigMap's sandboxd.yaml: %v", ds.where(), ic.Name, in, err)
	}
	if out != cfgPath {
		t.Errorf("%s: initContainers[%s] writes %q but containers[sandboxd] reads --config %q", ds.where(), ic.Name, out, cfgPath)
	}
	_, vin, _, ok1 := p.mountFor(ic, out)
	_, vout, _, ok2 := p.mountFor(sd, cfgPath)
	if !ok1 || !ok2 || vin != vout || vin.EmptyDir == nil {
		t.Errorf("%s: %s is not one emptyDir shared by the init container and sandboxd", ds.where(), cfgPath)
	}
}

// redirect finds "sed … IN > OUT" in a shell line.
func redirect(script string) (in, out string) {
	before, after, ok := strings.Cut(script, ">")
	if !ok {
		return "", ""
	}
	f := strings.Fields(before)
	if len(f) == 0 {
		return "", strings.TrimSpace(after)
	}
	return f[len(f)-1], strings.TrimSpace(after)
}

// flagValue returns the value after flag in argv ("--flag v" or "--flag=v").
func flagValue(argv []string, flag string) string {
	for i, a := range argv {
		if a == flag && i+1 < len(argv) {
			return argv[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// TestPortsAgree follows each port from the config that opens it to the
// client that dials it: relay_tls.listen = the gateway container's port =
// the Service's targetPort, whose port sandboxd's gateway_tls.address
// dials; admin_listen = the probes' port = the Service's admin targetPort,
// whose port gateway_admin names; the NetworkPolicy admits both.
func TestPortsAgree(t *testing.T) {
	m := loadManifests(t)
	gw, gcm := gatewayConfig(t, m)
	sd, scm := sandboxdConfig(t, m)
	dep, w := m.workload(t, "Deployment", gatewayName)
	c := w.Template.Spec.containerNamed(t, dep.where(), "gateway")
	svcObj := m.get(t, "Service", gatewayName)
	var svc serviceSpec
	if err := svcObj.Spec.Decode(&svc); err != nil {
		t.Fatalf("%s: spec: %v", svcObj.where(), err)
	}
	if svc.Type != "" && svc.Type != "ClusterIP" {
		t.Errorf("%s: spec.type = %q, want ClusterIP", svcObj.where(), svc.Type)
	}
	for k, v := range svc.Selector {
		if w.Template.Metadata.Labels[k] != v {
			t.Errorf("%s: spec.selector %s=%s does not select %s's pods", svcObj.where(), k, v, dep.where())
		}
	}
	_, relayPort, _ := net.SplitHostPort(gw.Gateway.RelayTLS.Listen)
	_, adminPort, _ := net.SplitHostPort(gw.Gateway.AdminListen)
	// servicePortTo returns the Service port whose targetPort reaches want.
	servicePortTo := func(want string) (string, bool) {
		for _, p := range svc.Ports {
			if cp, ok := containerPort(c, p.TargetPort); ok && cp == want {
				return strconv.Itoa(p.Port), true
			}
		}
		return "", false
	}
	sdHost, sdPort, err := net.SplitHostPort(sd.GatewayTLS.Address)
	if err != nil {
		t.Fatalf("%s: gateway_tls.address: %v", scm.where(), err)
	}
	adminURL, err := url.Parse(sd.GatewayAdmin)
	if err != nil || adminURL.Port() == "" {
		t.Fatalf("%s: gateway_admin %q: want a URL with a port (%v)", scm.where(), sd.GatewayAdmin, err)
	}
	svcDNS := gatewayName + "." + namespace + ".svc"
	cases := []struct {
		name   string
		listen string // the gateway's port, from its config
		dialed string // the port a client dials
		dialer string // who dials it, for messages
		host   string // the host the client dials
		named  string // the container port's name
	}{
		{name: "relay_tls", listen: relayPort, dialed: sdPort, dialer: scm.where() + ": gateway_tls.address", host: sdHost, named: "relay-tls"},
		{name: "admin", listen: adminPort, dialed: adminURL.Port(), dialer: scm.where() + ": gateway_admin", host: adminURL.Hostname(), named: "admin"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.listen == "" {
				t.Fatalf("%s: data.sluice.yaml: no %s port", gcm.where(), tc.name)
			}
			if cp, ok := containerPort(c, intOrString(tc.named)); !ok || cp != tc.listen {
				t.Errorf("%s: containers[gateway].ports[%s] = %q, but data.sluice.yaml listens on %s", dep.where(), tc.named, cp, tc.listen)
			}
			sp, ok := servicePortTo(tc.listen)
			if !ok {
				t.Fatalf("%s: no port's targetPort reaches the gateway's %s port %s", svcObj.where(), tc.name, tc.listen)
			}
			if sp != tc.dialed {
				t.Errorf("%s dials port %s, but %s serves %s on port %s", tc.dialer, tc.dialed, svcObj.where(), tc.name, sp)
			}
			if tc.host != svcDNS && tc.host != svcDNS+".cluster.local" {
				t.Errorf("%s dials host %q, want the Service's name %s", tc.dialer, tc.host, svcDNS)
			}
		})
	}
	t.Run("probes", func(t *testing.T) {
		for _, p := range []struct {
			field string
			pr    *probe
			path  string
		}{
			{"livenessProbe", c.LivenessProbe, "/healthz"},
			{"readinessProbe", c.ReadinessProbe, "/readyz"},
			{"startupProbe", c.StartupProbe, ""},
		} {
			if p.pr == nil {
				if p.path != "" {
					t.Errorf("%s: containers[gateway].%s is missing", dep.where(), p.field)
				}
				continue
			}
			if p.pr.HTTPGet == nil {
				t.Errorf("%s: containers[gateway].%s: want httpGet", dep.where(), p.field)
				continue
			}
			if got, ok := containerPort(c, p.pr.HTTPGet.Port); !ok || got != adminPort {
				t.Errorf("%s: containers[gateway].%s.httpGet.port = %q, want admin_listen's port %s", dep.where(), p.field, p.pr.HTTPGet.Port, adminPort)
			}
			if p.path != "" && p.pr.HTTPGet.Path != p.path {
				t.Errorf("%s: containers[gateway].%s.httpGet.path = %q, want %s", dep.where(), p.field, p.pr.HTTPGet.Path, p.path)
			}
		}
	})
	t.Run("server_name", func(t *testing.T) {
		name := sd.GatewayTLS.ServerName
		if name == "" {
			name = sdHost
		}
		cert := m.find("Certificate", "sluice-gateway-tls")
		if cert == nil {
			t.Skip("no optional cert-manager Certificate for the gateway")
		}
		var spec struct {
			DNSNames   []string `yaml:"dnsNames"`
			SecretName string   `yaml:"secretName"`
		}
		if err := cert.Spec.Decode(&spec); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(spec.DNSNames, name) {
			t.Errorf("%s: spec.dnsNames %q lack %q, the name sandboxd checks (gateway_tls.server_name)", cert.where(), spec.DNSNames, name)
		}
		if v := w.Template.Spec.volume("tls"); v == nil || v.Secret == nil || v.Secret.SecretName != spec.SecretName {
			t.Errorf("%s: volume tls is not Secret %s, which %s fills", dep.where(), spec.SecretName, cert.where())
		}
	})
	t.Run("networkpolicy", func(t *testing.T) {
		np := m.find("NetworkPolicy", gatewayName)
		if np == nil {
			t.Skip("no NetworkPolicy")
		}
		var spec struct {
			Ingress []struct {
				Ports []struct {
					Port intOrString `yaml:"port"`
				} `yaml:"ports"`
			} `yaml:"ingress"`
		}
		if err := np.Spec.Decode(&spec); err != nil {
			t.Fatal(err)
		}
		open := map[string]bool{}
		for _, in := range spec.Ingress {
			for _, p := range in.Ports {
				if cp, ok := containerPort(c, p.Port); ok {
					open[cp] = true
				}
			}
		}
		for _, p := range []string{relayPort, adminPort} {
			if !open[p] {
				t.Errorf("%s: spec.ingress admits no traffic to port %s", np.where(), p)
			}
		}
	})
}

// pathCheck is one file or directory a config names, and what must back
// it in the pod.
type pathCheck struct {
	field    string   // the config key, for messages
	path     string   // the path the config names
	sources  []string // volume kinds allowed to hold it
	writable bool     // the mount must not be readOnly
}

// checkPaths resolves each check against c's mounts.
func checkPaths(t *testing.T, m *manifests, where string, p *podSpec, c *container, checks []pathCheck) {
	t.Helper()
	for _, pc := range checks {
		t.Run(pc.field, func(t *testing.T) {
			if pc.path == "" {
				t.Fatalf("%s: %s is empty", where, pc.field)
			}
			vm, _, _, ok := p.mountFor(c, pc.path)
			_, kind, err := m.fileContent(p, c, pc.path)
			if !ok || err != nil {
				t.Fatalf("%s: containers[%s]: %s %s is not backed by a mount: %v", where, c.Name, pc.field, pc.path, err)
			}
			if !slices.Contains(pc.sources, kind) {
				t.Errorf("%s: containers[%s]: %s %s is on a %s volume (%s), want %v", where, c.Name, pc.field, pc.path, kind, vm.Name, pc.sources)
			}
			if pc.writable && vm.ReadOnly {
				t.Errorf("%s: containers[%s].volumeMounts[%s] is readOnly, but %s %s is written", where, c.Name, vm.Name, pc.field, pc.path)
			}
		})
	}
}

// TestMountsCoverConfigPaths checks that every path the gateway's and
// sandboxd's configs name is backed in the pod: certificates, keys, CAs,
// tokens and specs by a mounted ConfigMap/Secret key (or, for a node's own
// client certificate, a hostPath); the store, audit log, local secrets and
// CA directory by the PersistentVolumeClaim; sockets and sandboxd's state
// by writable volumes. It also checks that no secret material is mounted
// under the system folders sandboxd binds into every sandbox.
func TestMountsCoverConfigPaths(t *testing.T) {
	m := loadManifests(t)
	gw, _ := gatewayConfig(t, m)
	sd, _ := sandboxdConfig(t, m)
	dep, gwl := m.workload(t, "Deployment", gatewayName)
	gp := &gwl.Template.Spec
	gc := gp.containerNamed(t, dep.where(), "gateway")
	ds, sdl := m.workload(t, "DaemonSet", sandboxdName)
	sp := &sdl.Template.Spec
	sc := sp.containerNamed(t, ds.where(), "sandboxd")

	pvc := []string{"persistentVolumeClaim"}
	kv := []string{"configMap", "secret"}
	store, _ := strings.CutPrefix(gw.Store, "sqlite:")
	gwChecks := []pathCheck{
		{field: "--config", path: flagValue(gc.Command, "--config"), sources: []string{"configMap"}},
		{field: "gateway.relay_tls.cert_file", path: gw.Gateway.RelayTLS.CertFile, sources: []string{"secret"}},
		{field: "gateway.relay_tls.key_file", path: gw.Gateway.RelayTLS.KeyFile, sources: []string{"secret"}},
		{field: "gateway.relay_tls.client_ca_file", path: gw.Gateway.RelayTLS.ClientCAFile, sources: kv},
		{field: "gateway.sandbox_socket", path: gw.Gateway.SandboxSocket, sources: []string{"emptyDir"}, writable: true},
		{field: "store", path: store, sources: pvc, writable: true},
		{field: "audit.path", path: gw.Audit.Path, sources: pvc, writable: true},
		{field: "egress.intercept.ca_dir", path: gw.Egress.Intercept.CADir, sources: pvc, writable: true},
	}
	if gw.Secrets.Backend == "local" {
		gwChecks = append(gwChecks,
			pathCheck{field: "secrets.local.path", path: gw.Secrets.Local.Path, sources: pvc, writable: true},
			pathCheck{field: "secrets.local.key_file", path: gw.Secrets.Local.KeyFile, sources: pvc, writable: true})
	}
	if o := gw.Approvers.OIDC; o != nil {
		gwChecks = append(gwChecks, pathCheck{field: "approvers.oidc.client_secret_file", path: o.ClientSecretFile, sources: []string{"secret"}})
	}
	for i, cn := range gw.Connectors {
		if !strings.HasPrefix(cn.Spec, "https://") {
			gwChecks = append(gwChecks, pathCheck{field: "connectors[" + strconv.Itoa(i) + "].spec", path: cn.Spec, sources: []string{"configMap"}})
		}
	}
	for i, r := range gw.Rego {
		gwChecks = append(gwChecks, pathCheck{field: "rego[" + strconv.Itoa(i) + "]", path: r, sources: []string{"configMap"}})
	}
	t.Run("gateway", func(t *testing.T) { checkPaths(t, m, dep.where(), gp, gc, gwChecks) })

	t.Run("gateway state on one volume", func(t *testing.T) {
		// The store, audit log and secrets must be on the claim, not on an
		// emptyDir that a restart empties.
		if v := gp.volume("state"); v == nil || v.PersistentVolumeClaim == nil || m.find("PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName) == nil {
			t.Errorf("%s: volume state is not a PersistentVolumeClaim defined in deploy/kubernetes", dep.where())
		}
	})

	sdChecks := []pathCheck{
		{field: "--config", path: flagValue(sc.Command, "--config"), sources: []string{"emptyDir"}},
		{field: "api", path: path.Dir(sd.API), sources: []string{"hostPath"}, writable: true},
		{field: "state_dir", path: sd.StateDir, sources: []string{"hostPath"}, writable: true},
		{field: "cgroup fs", path: "/sys/fs/cgroup", sources: []string{"hostPath"}, writable: true},
		{field: "gateway_tls.cert_file", path: sd.GatewayTLS.CertFile, sources: []string{"hostPath", "secret"}},
		{field: "gateway_tls.key_file", path: sd.GatewayTLS.KeyFile, sources: []string{"hostPath", "secret"}},
		{field: "gateway_tls.ca_file", path: sd.GatewayTLS.CAFile, sources: kv},
		{field: "gateway_session_token_file", path: sd.GatewaySessionTokenFile, sources: []string{"secret"}},
	}
	t.Run("sandboxd", func(t *testing.T) { checkPaths(t, m, ds.where(), sp, sc, sdChecks) })

	t.Run("no secrets inside sandbox roots", func(t *testing.T) {
		if sd.Rootfs != "/" {
			t.Skipf("rootfs is %s", sd.Rootfs)
		}
		// sandboxd binds these folders of rootfs into every sandbox.
		system := []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"}
		for _, vm := range sc.VolumeMounts {
			v := sp.volume(vm.Name)
			if v == nil || (v.Secret == nil && v.HostPath == nil) {
				continue
			}
			for _, s := range system {
				if vm.MountPath == s || strings.HasPrefix(vm.MountPath, s+"/") {
					t.Errorf("%s: containers[sandboxd].volumeMounts[%s] at %s is under %s, which rootfs: / binds into every sandbox", ds.where(), vm.Name, vm.MountPath, s)
				}
			}
		}
		for _, v := range sp.Volumes {
			if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o077 != 0) {
				t.Errorf("%s: volumes[%s].secret.defaultMode must be 0400 or stricter (root only)", ds.where(), v.Name)
			}
		}
	})
}

// TestGatewayPodLockedDown checks the gateway's pod: non-root, read-only
// root, no privilege escalation, every capability dropped, seccomp
// RuntimeDefault, requests and limits, one replica recreated (sqlite
// allows one process per file), no service account token.
func TestGatewayPodLockedDown(t *testing.T) {
	m := loadManifests(t)
	dep, w := m.workload(t, "Deployment", gatewayName)
	p := &w.Template.Spec
	c := p.containerNamed(t, dep.where(), "gateway")
	sc := c.SecurityContext
	if sc == nil {
		t.Fatalf("%s: containers[gateway].securityContext is missing", dep.where())
	}
	isTrue := func(b *bool) bool { return b != nil && *b }
	isFalse := func(b *bool) bool { return b != nil && !*b }
	seccompOK := (sc.SeccompProfile != nil && sc.SeccompProfile.Type == "RuntimeDefault") ||
		(sc.SeccompProfile == nil && p.SecurityContext.SeccompProfile != nil && p.SecurityContext.SeccompProfile.Type == "RuntimeDefault")
	cases := []struct {
		field string
		ok    bool
	}{
		{"spec.replicas = 1", w.Replicas != nil && *w.Replicas == 1},
		{"spec.strategy.type = Recreate", w.Strategy.Type == "Recreate"},
		{"containers[gateway].securityContext.runAsNonRoot = true", isTrue(sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && isTrue(p.SecurityContext.RunAsNonRoot))},
		{"containers[gateway].securityContext.readOnlyRootFilesystem = true", isTrue(sc.ReadOnlyRootFilesystem)},
		{"containers[gateway].securityContext.allowPrivilegeEscalation = false", isFalse(sc.AllowPrivilegeEscalation)},
		{"containers[gateway].securityContext.privileged unset or false", sc.Privileged == nil || !*sc.Privileged},
		{"containers[gateway].securityContext.capabilities.drop = [ALL], add = []", sc.Capabilities != nil && slices.Contains(sc.Capabilities.Drop, "ALL") && len(sc.Capabilities.Add) == 0},
		{"containers[gateway].securityContext.runAsUser unset or non-zero", (sc.RunAsUser == nil || *sc.RunAsUser != 0) && (p.SecurityContext.RunAsUser == nil || *p.SecurityContext.RunAsUser != 0)},
		{"seccompProfile.type = RuntimeDefault", seccompOK},
		{"containers[gateway].resources.requests cpu and memory", c.Resources.Requests["cpu"] != "" && c.Resources.Requests["memory"] != ""},
		{"containers[gateway].resources.limits.memory", c.Resources.Limits["memory"] != ""},
		{"spec.template.spec.automountServiceAccountToken = false", isFalse(p.AutomountServiceAccountToken)},
		{"spec.template.spec.hostPID/hostNetwork unset", !p.HostPID && !p.HostNetwork},
	}
	for _, tc := range cases {
		t.Run(tc.field, func(t *testing.T) {
			if !tc.ok {
				t.Errorf("%s: want %s", dep.where(), tc.field)
			}
		})
	}
	// Secrets the non-root gateway reads: group-readable with fsGroup.
	for _, v := range p.Volumes {
		if v.Secret != nil && (p.SecurityContext.FSGroup == nil || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0) {
			t.Errorf("%s: volumes[%s]: a Secret needs defaultMode without world bits and spec.securityContext.fsGroup so uid %v reads it", dep.where(), v.Name, p.SecurityContext.RunAsUser)
		}
	}
	if !strings.Contains(c.Image, ":") {
		t.Errorf("%s: containers[gateway].image %q has no tag", dep.where(), c.Image)
	}
}

// TestSandboxdPod checks what sandboxd needs and nothing the gateway
// would: privileged root, the host's pid namespace for pins by pid, no
// service account token, and that it does not run on the host network.
func TestSandboxdPod(t *testing.T) {
	m := loadManifests(t)
	ds, w := m.workload(t, "DaemonSet", sandboxdName)
	p := &w.Template.Spec
	c := p.containerNamed(t, ds.where(), "sandboxd")
	cases := []struct {
		field string
		ok    bool
	}{
		{"containers[sandboxd].securityContext.privileged = true", c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged},
		{"spec.template.spec.hostPID = true (sandboxd pin --pid opens /proc/PID/ns/net of other pods)", p.HostPID},
		{"spec.template.spec.hostNetwork unset", !p.HostNetwork},
		{"spec.template.spec.automountServiceAccountToken = false", p.AutomountServiceAccountToken != nil && !*p.AutomountServiceAccountToken},
		{"spec.updateStrategy.type = RollingUpdate", w.UpdateStrategy.Type == "RollingUpdate"},
	}
	for _, tc := range cases {
		t.Run(tc.field, func(t *testing.T) {
			if !tc.ok {
				t.Errorf("%s: want %s", ds.where(), tc.field)
			}
		})
	}
}
