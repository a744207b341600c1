//go:build linux

package deploy

import (
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
)

// haDir holds the several-replica gateway: files that replace the base's
// gateway config and Deployment (and its claim) and add a
// PodDisruptionBudget and the PostgreSQL the replicas share.
var haDir = filepath.Join(k8sDir, "ha")

// The base files the HA set replaces (README: applied without them).
var haReplaces = []string{"10-gateway-config.yaml", "30-gateway-pvc.yaml", "31-gateway-deployment.yaml"}

// loadHA is what a cluster holds after applying the base manifests except
// haReplaces, then every file of deploy/kubernetes/ha.
func loadHA(t *testing.T) (*manifests, []*object) {
	t.Helper()
	base := loadManifests(t)
	files, err := filepath.Glob(filepath.Join(haDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy/kubernetes/ha: no manifests (%v)", err)
	}
	sort.Strings(files)
	var ha []*object
	for _, f := range files {
		objs, err := decodeAll(f)
		if err != nil {
			t.Fatalf("ha/%s: %v", filepath.Base(f), err)
		}
		if len(objs) == 0 {
			t.Fatalf("ha/%s: no document", filepath.Base(f))
		}
		for _, o := range objs {
			o.file = "ha/" + o.file
		}
		ha = append(ha, objs...)
	}
	m := &manifests{}
	for _, o := range base.objs {
		if !slices.Contains(haReplaces, o.file) {
			m.objs = append(m.objs, o)
		}
	}
	m.objs = append(m.objs, ha...)
	return m, ha
}

// haSpec is the part of the HA Deployment's spec the shared types do not
// model: the rolling update, the spreading and the env from Secrets.
type haSpec struct {
	Strategy struct {
		Type          string `yaml:"type"`
		RollingUpdate struct {
			MaxUnavailable intOrString `yaml:"maxUnavailable"`
		} `yaml:"rollingUpdate"`
	} `yaml:"strategy"`
	Template struct {
		Spec struct {
			ServiceAccountName string `yaml:"serviceAccountName"`
			Affinity           struct {
				PodAntiAffinity struct {
					Required []struct {
						TopologyKey   string `yaml:"topologyKey"`
						LabelSelector struct {
							MatchLabels map[string]string `yaml:"matchLabels"`
						} `yaml:"labelSelector"`
					} `yaml:"requiredDuringSchedulingIgnoredDuringExecution"`
				} `yaml:"podAntiAffinity"`
			} `yaml:"affinity"`
			TopologySpreadConstraints []struct {
				MaxSkew       int    `yaml:"maxSkew"`
				TopologyKey   string `yaml:"topologyKey"`
				LabelSelector struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"labelSelector"`
			} `yaml:"topologySpreadConstraints"`
			Containers []struct {
				Name string `yaml:"name"`
				Env  []struct {
					Name      string `yaml:"name"`
					ValueFrom *struct {
						SecretKeyRef *struct {
							Name string `yaml:"name"`
							Key  string `yaml:"key"`
						} `yaml:"secretKeyRef"`
					} `yaml:"valueFrom"`
				} `yaml:"env"`
			} `yaml:"containers"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

// TestHAManifests checks deploy/kubernetes/ha: every document parses and
// is in the namespace; its sluice.yaml loads with the gateway's config
// package (strict keys, Validate) and names a postgres:// store without a
// password, verified against a CA mounted from a Secret; the Deployment
// runs 3 replicas with a rolling update, no claim, one per node, the
// probes on the admin listener's /healthz and /readyz, PGPASSWORD from a
// Secret key that exists; the PodDisruptionBudget keeps 2 of them; the
// CloudNativePG Cluster is the database the store names.
func TestHAManifests(t *testing.T) {
	m, ha := loadHA(t)
	for _, o := range ha {
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Errorf("%s document %d: apiVersion, kind and metadata.name are needed", o.file, o.doc)
		}
		if o.Metadata.Namespace != namespace {
			t.Errorf("%s: metadata.namespace = %q, want %q", o.where(), o.Metadata.Namespace, namespace)
		}
	}
	cm := m.get(t, "ConfigMap", gatewayCM)
	if !strings.HasPrefix(cm.file, "ha/") {
		t.Fatalf("%s: the gateway config is not the HA one", cm.where())
	}
	gw, err := config.Parse([]byte(cm.Data["sluice.yaml"]), "/etc/sluice")
	if err != nil {
		t.Fatalf("%s: data.sluice.yaml: %v", cm.where(), err)
	}
	dep, w := m.workload(t, "Deployment", gatewayName)
	if !strings.HasPrefix(dep.file, "ha/") {
		t.Fatalf("%s: the gateway Deployment is not the HA one", dep.where())
	}
	var hs haSpec
	if err := dep.Spec.Decode(&hs); err != nil {
		t.Fatalf("%s: spec: %v", dep.where(), err)
	}
	p := &w.Template.Spec
	c := p.containerNamed(t, dep.where(), "gateway")
	labels := w.Template.Metadata.Labels
	selects := func(sel map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}

	t.Run("store", func(t *testing.T) {
		u, err := url.Parse(gw.Store)
		if err != nil || u.Scheme != "postgres" && u.Scheme != "postgresql" {
			t.Fatalf("%s: store: want postgres://…, got %q", cm.where(), config.RedactURL(gw.Store))
		}
		if _, has := u.User.Password(); has {
			t.Errorf("%s: store: holds a password; it belongs in Secret sluice-db-app (PGPASSWORD)", cm.where())
		}
		q := u.Query()
		if q.Get("sslmode") != "verify-full" {
			t.Errorf("%s: store: sslmode = %q, want verify-full across the network", cm.where(), q.Get("sslmode"))
		}
		checkPaths(t, m, dep.where(), p, c, []pathCheck{{field: "store sslrootcert", path: q.Get("sslrootcert"), sources: []string{"secret"}}})
		cluster := m.get(t, "Cluster", "sluice-db")
		if cluster.APIVersion != "postgresql.cnpg.io/v1" {
			t.Errorf("%s: apiVersion %q, want postgresql.cnpg.io/v1", cluster.where(), cluster.APIVersion)
		}
		var cs struct {
			Instances int `yaml:"instances"`
			Bootstrap struct {
				InitDB struct {
					Database string `yaml:"database"`
					Owner    string `yaml:"owner"`
				} `yaml:"initdb"`
			} `yaml:"bootstrap"`
		}
		if err := cluster.Spec.Decode(&cs); err != nil {
			t.Fatalf("%s: spec: %v", cluster.where(), err)
		}
		// CloudNativePG's names: Service <cluster>-rw, Secrets <cluster>-app
		// (the owner's password) and <cluster>-ca.
		if want := cluster.Metadata.Name + "-rw." + namespace + ".svc"; u.Hostname() != want {
			t.Errorf("%s: store host %q, want the Cluster's read-write Service %s", cm.where(), u.Hostname(), want)
		}
		if db := strings.TrimPrefix(u.Path, "/"); db != cs.Bootstrap.InitDB.Database || u.User.Username() != cs.Bootstrap.InitDB.Owner {
			t.Errorf("%s: store user/database %s/%s, the Cluster makes %s/%s", cm.where(), u.User.Username(), db, cs.Bootstrap.InitDB.Owner, cs.Bootstrap.InitDB.Database)
		}
		if cs.Instances < 2 {
			t.Errorf("%s: spec.instances = %d: one instance is a single point of failure", cluster.where(), cs.Instances)
		}
		ca := p.volume("db-ca")
		if ca == nil || ca.Secret == nil || ca.Secret.SecretName != cluster.Metadata.Name+"-ca" || len(ca.Secret.Items) != 1 || ca.Secret.Items[0].Key != "ca.crt" {
			t.Errorf("%s: volume db-ca must mount only key ca.crt of Secret %s-ca (not the CA's key)", dep.where(), cluster.Metadata.Name)
		}
		var pw string
		for _, hc := range hs.Template.Spec.Containers {
			for _, e := range hc.Env {
				if hc.Name == "gateway" && e.Name == "PGPASSWORD" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					pw = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
				}
			}
		}
		if pw != cluster.Metadata.Name+"-app/password" {
			t.Errorf("%s: containers[gateway].env PGPASSWORD from Secret key %q, want %s-app/password", dep.where(), pw, cluster.Metadata.Name)
		}
		// the external-database alternative makes the same Secrets and keys
		for _, sk := range []struct{ name, key string }{{cluster.Metadata.Name + "-app", "password"}, {cluster.Metadata.Name + "-ca", "ca.crt"}} {
			s := m.find("Secret", sk.name)
			if s == nil || !strings.HasPrefix(s.file, "ha/optional-") {
				t.Errorf("ha/optional-external-database.yaml: no Secret %s", sk.name)
			} else if _, ok := s.StringData[sk.key]; !ok {
				t.Errorf("%s: no key %s", s.where(), sk.key)
			}
		}
	})

	t.Run("replicas", func(t *testing.T) {
		if w.Replicas == nil || *w.Replicas != 3 {
			t.Errorf("%s: spec.replicas unset or not 3, want 3", dep.where())
		}
		if hs.Strategy.Type != "RollingUpdate" || hs.Strategy.RollingUpdate.MaxUnavailable != "0" {
			t.Errorf("%s: spec.strategy = %s maxUnavailable %q, want RollingUpdate with maxUnavailable 0", dep.where(), hs.Strategy.Type, hs.Strategy.RollingUpdate.MaxUnavailable)
		}
		for _, v := range p.Volumes {
			if v.PersistentVolumeClaim != nil {
				t.Errorf("%s: volumes[%s] is a PersistentVolumeClaim; replicas keep their state in the database", dep.where(), v.Name)
			}
		}
		anti := false
		for _, a := range hs.Template.Spec.Affinity.PodAntiAffinity.Required {
			anti = anti || a.TopologyKey == "kubernetes.io/hostname" && selects(a.LabelSelector.MatchLabels)
		}
		spread := false
		for _, s := range hs.Template.Spec.TopologySpreadConstraints {
			spread = spread || s.TopologyKey == "kubernetes.io/hostname" && s.MaxSkew == 1 && selects(s.LabelSelector.MatchLabels)
		}
		if !anti || !spread {
			t.Errorf("%s: want required podAntiAffinity (%v) and a topologySpreadConstraint (%v) by kubernetes.io/hostname selecting the gateway's pods", dep.where(), anti, spread)
		}
		pdb := m.get(t, "PodDisruptionBudget", gatewayName)
		var ps struct {
			MinAvailable int `yaml:"minAvailable"`
			Selector     struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		}
		if err := pdb.Spec.Decode(&ps); err != nil || pdb.APIVersion != "policy/v1" {
			t.Fatalf("%s: %s spec: %v", pdb.where(), pdb.APIVersion, err)
		}
		if ps.MinAvailable != 2 || !selects(ps.Selector.MatchLabels) {
			t.Errorf("%s: want minAvailable 2 selecting the gateway's pods, got %d %v", pdb.where(), ps.MinAvailable, ps.Selector.MatchLabels)
		}
		svcObj := m.get(t, "Service", gatewayName)
		var svc serviceSpec
		if err := svcObj.Spec.Decode(&svc); err != nil || !selects(svc.Selector) {
			t.Errorf("%s: spec.selector does not select the HA pods (%v)", svcObj.where(), err)
		}
		_, relay, _ := net.SplitHostPort(gw.Gateway.RelayTLS.Listen)
		_, admin, _ := net.SplitHostPort(gw.Gateway.AdminListen)
		for _, sp := range svc.Ports {
			if cp, ok := containerPort(c, sp.TargetPort); !ok || cp != relay && cp != admin {
				t.Errorf("%s: port %s targets %q, which is not the gateway's relay_tls or admin_listen port", svcObj.where(), sp.Name, sp.TargetPort)
			}
		}
	})

	t.Run("probes", func(t *testing.T) {
		_, admin, _ := net.SplitHostPort(gw.Gateway.AdminListen)
		for _, pr := range []struct {
			name, path string
			p          *probe
		}{{"livenessProbe", "/healthz", c.LivenessProbe}, {"readinessProbe", "/readyz", c.ReadinessProbe}} {
			if pr.p == nil || pr.p.HTTPGet == nil {
				t.Errorf("%s: containers[gateway].%s: missing", dep.where(), pr.name)
				continue
			}
			port, ok := containerPort(c, pr.p.HTTPGet.Port)
			if pr.p.HTTPGet.Path != pr.path || !ok || port != admin {
				t.Errorf("%s: containers[gateway].%s = %s on port %q (%s), want %s on admin_listen's %s", dep.where(), pr.name, pr.p.HTTPGet.Path, pr.p.HTTPGet.Port, port, pr.path, admin)
			}
		}
	})

	t.Run("paths", func(t *testing.T) {
		if gw.Secrets.Backend == "local" {
			t.Errorf("%s: secrets.backend local keeps a file per pod; replicas need a shared backend (vault)", cm.where())
		}
		checks := []pathCheck{
			{field: "--config", path: flagValue(c.Command, "--config"), sources: []string{"configMap"}},
			{field: "gateway.relay_tls.cert_file", path: gw.Gateway.RelayTLS.CertFile, sources: []string{"secret"}},
			{field: "gateway.relay_tls.key_file", path: gw.Gateway.RelayTLS.KeyFile, sources: []string{"secret"}},
			{field: "gateway.relay_tls.client_ca_file", path: gw.Gateway.RelayTLS.ClientCAFile, sources: []string{"secret"}},
			{field: "gateway.sandbox_socket", path: gw.Gateway.SandboxSocket, sources: []string{"emptyDir"}, writable: true},
			{field: "audit.path", path: gw.Audit.Path, sources: []string{"emptyDir"}, writable: true},
			{field: "egress.intercept.ca_dir", path: gw.Egress.Intercept.CADir, sources: []string{"emptyDir"}, writable: true},
		}
		if v := gw.Secrets.Vault; v != nil && v.CAFile != "" {
			checks = append(checks, pathCheck{field: "secrets.vault.ca_file", path: v.CAFile, sources: []string{"secret"}})
		}
		if o := gw.Approvers.OIDC; o != nil {
			checks = append(checks, pathCheck{field: "approvers.oidc.client_secret_file", path: o.ClientSecretFile, sources: []string{"secret"}})
		}
		for i, cn := range gw.Connectors {
			checks = append(checks, pathCheck{field: "connectors[" + strconv.Itoa(i) + "].spec", path: cn.Spec, sources: []string{"configMap"}})
		}
		checkPaths(t, m, dep.where(), p, c, checks)
		// The init container fills ca_dir from a Secret that has every
		// file the gateway reads there.
		ic := p.containerNamed(t, dep.where(), "intercept-ca")
		if vm, v, _, ok := p.mountFor(ic, gw.Egress.Intercept.CADir); !ok || v.EmptyDir == nil || vm.ReadOnly || v != p.volume("ca") {
			t.Errorf("%s: initContainers[intercept-ca] does not write ca_dir's emptyDir", dep.where())
		}
		script := strings.Join(ic.Command, " ")
		for _, f := range []string{"ca.pem", "ca.key", "placeholder.key"} {
			src := "/etc/sluice-intercept-ca/" + f
			if _, kind, err := m.fileContent(p, ic, src); err != nil || kind != "secret" {
				t.Errorf("%s: initContainers[intercept-ca]: %s is not a Secret key: %v", dep.where(), src, err)
			}
			if !strings.Contains(script, src) {
				t.Errorf("%s: initContainers[intercept-ca] does not copy %s", dep.where(), f)
			}
		}
		if !strings.Contains(script, "-m 0600") || !strings.Contains(script, gw.Egress.Intercept.CADir) {
			t.Errorf("%s: initContainers[intercept-ca] must copy into %s with mode 0600 (the gateway refuses group-readable keys): %s", dep.where(), gw.Egress.Intercept.CADir, script)
		}
		if sc := ic.SecurityContext; sc == nil || sc.Privileged != nil && *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: initContainers[intercept-ca] is not locked down", dep.where())
		}
	})
}
