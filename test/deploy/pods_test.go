//go:build linux

package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/sandboxd"
)

// agentPod is the part of a pod template in pods/agents.yaml this test reads.
type agentPod struct {
	Template struct {
		Metadata struct {
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"metadata"`
		Spec struct {
			ServiceAccountName string `yaml:"serviceAccountName"`
			RuntimeClassName   string `yaml:"runtimeClassName"`
			Containers         []struct {
				EnvFrom []struct {
					ConfigMapRef struct {
						Name string `yaml:"name"`
					} `yaml:"configMapRef"`
				} `yaml:"envFrom"`
			} `yaml:"containers"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

// TestAgentPodsArePinnedAndMapped follows pods/agents.yaml's example agent
// pod through what the node does with it: the DaemonSet's install-cni
// writes sluice-cni's selection, which must pick the pod (its namespace or
// its annotation: CNI is not given a RuntimeClass, so none is used to
// select); sandboxd.yaml's pods rule for its namespace must give it an
// agent from its labels or service account, one the gateway knows; the
// pod takes the proxy from the ConfigMap beside it; and sandboxd can read
// the pod from the API (its service account, the Role and RoleBinding
// there, the projected token at kube_api.token_file).
func TestAgentPodsArePinnedAndMapped(t *testing.T) {
	m := loadManifests(t)
	objs, err := decodeAll(filepath.Join(k8sDir, "pods", "agents.yaml"))
	if err != nil {
		t.Fatalf("pods/agents.yaml: %v", err)
	}
	find := func(kind string) []*object {
		var out []*object
		for _, o := range objs {
			if o.Kind == kind {
				out = append(out, o)
			}
		}
		return out
	}
	cfg, cm := sandboxdConfig(t, m)
	gw, _ := gatewayConfig(t, m)
	ds, w := m.workload(t, "DaemonSet", sandboxdName)
	install := w.Template.Spec.containerNamed(t, ds.where(), "install-cni")
	var plugin struct {
		Select struct {
			All        bool     `json:"all"`
			Namespaces []string `json:"namespaces"`
			Annotation string   `json:"annotation"`
		} `json:"select"`
	}
	if err := json.Unmarshal([]byte(flagValue(install.Command, "--plugin")), &plugin); err != nil {
		t.Fatalf("%s: install-cni --plugin: %v", ds.where(), err)
	}

	deps := find("Deployment")
	if len(deps) == 0 {
		t.Fatal("pods/agents.yaml: no example agent Deployment")
	}
	for _, d := range deps {
		var p agentPod
		if err := d.Spec.Decode(&p); err != nil {
			t.Fatalf("%s: %v", d.where(), err)
		}
		ns, tpl := d.Metadata.Namespace, p.Template
		if !plugin.Select.All && !slices.Contains(plugin.Select.Namespaces, ns) &&
			(plugin.Select.Annotation == "" || tpl.Metadata.Annotations[plugin.Select.Annotation] != "true") {
			t.Errorf("%s: sluice-cni's select %+v does not pick the pod (namespace %s, annotations %v)", d.where(), plugin.Select, ns, tpl.Metadata.Annotations)
		}
		if tpl.Spec.RuntimeClassName != "" {
			t.Errorf("%s: runtimeClassName %q: sluice-cni cannot see a RuntimeClass; select by annotation or namespace", d.where(), tpl.Spec.RuntimeClassName)
		}
		var rule *sandboxd.PodRule
		for i := range cfg.Pods {
			if cfg.Pods[i].Namespace == ns {
				rule = &cfg.Pods[i]
			}
		}
		if rule == nil {
			t.Errorf("%s: %s has no pods rule for namespace %s: the pod would be refused at ADD", d.where(), cm.where(), ns)
			continue
		}
		sa := tpl.Spec.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		agent, session, err := rule.Identity(sandboxd.PodPinRequest{ContainerID: "c", NetNS: "/run/netns/x", Namespace: ns, Name: d.Metadata.Name + "-0", UID: "u"}, tpl.Metadata.Labels, sa)
		if err != nil {
			t.Errorf("%s: the pods rule for %s refuses the pod (labels %v, service account %s): %v", d.where(), ns, tpl.Metadata.Labels, sa, err)
			continue
		}
		if !slices.ContainsFunc(gw.Agents, func(a config.Agent) bool { return a.Name == agent }) {
			t.Errorf("%s: mapped to agent %q, which the gateway's sluice.yaml does not define", d.where(), agent)
		}
		if !strings.HasPrefix(session, ns+"/") {
			t.Errorf("%s: session %q not under the pod's namespace", d.where(), session)
		}
		for _, c := range tpl.Spec.Containers {
			var refs []string
			for _, e := range c.EnvFrom {
				refs = append(refs, e.ConfigMapRef.Name)
			}
			if !slices.Contains(refs, "sluice-pod-env") {
				t.Errorf("%s: a container takes envFrom %v, not sluice-pod-env (the proxy)", d.where(), refs)
			}
		}
		if rule.AgentFrom != "" || rule.SessionFrom != "" {
			checkPodReader(t, m, ns)
		}
	}
}

// rbacDoc is the part of a Role or RoleBinding this test reads.
type rbacDoc struct {
	Rules []struct {
		APIGroups []string `yaml:"apiGroups"`
		Resources []string `yaml:"resources"`
		Verbs     []string `yaml:"verbs"`
	} `yaml:"rules"`
	RoleRef struct {
		Kind string `yaml:"kind"`
		Name string `yaml:"name"`
	} `yaml:"roleRef"`
	Subjects []struct {
		Kind      string `yaml:"kind"`
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"subjects"`
}

// checkPodReader: sandboxd's service account exists and a RoleBinding in
// ns binds it to a Role there that may get pods; its token is projected
// into the sandboxd container at kube_api.token_file, the cluster's CA at
// ca_file.
func checkPodReader(t *testing.T, m *manifests, ns string) {
	t.Helper()
	ds, w := m.workload(t, "DaemonSet", sandboxdName)
	var spec struct {
		Template struct {
			Spec struct {
				ServiceAccountName string `yaml:"serviceAccountName"`
				Volumes            []struct {
					Name      string `yaml:"name"`
					Projected *struct {
						Sources []struct {
							ServiceAccountToken *struct {
								Path string `yaml:"path"`
							} `yaml:"serviceAccountToken"`
							ConfigMap *struct {
								Name  string      `yaml:"name"`
								Items []keyToPath `yaml:"items"`
							} `yaml:"configMap"`
						} `yaml:"sources"`
					} `yaml:"projected"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	}
	if err := ds.Spec.Decode(&spec); err != nil {
		t.Fatal(err)
	}
	sa := spec.Template.Spec.ServiceAccountName
	if sa == "" || m.find("ServiceAccount", sa) == nil {
		t.Errorf("%s: serviceAccountName %q: no such ServiceAccount in deploy/kubernetes", ds.where(), sa)
	}
	roles := map[string]bool{}
	// Role and RoleBinding keep rules/roleRef/subjects at the top level,
	// not under spec: decode the file's documents again for them.
	docs, err := decodeRBAC(filepath.Join(k8sDir, "pods", "agents.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if d.Kind != "Role" || d.Metadata.Namespace != ns {
			continue
		}
		for _, r := range d.Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "pods") && slices.Contains(r.Verbs, "get") {
				roles[d.Metadata.Name] = true
			}
		}
	}
	bound := false
	for _, d := range docs {
		if d.Kind != "RoleBinding" || d.Metadata.Namespace != ns || d.RoleRef.Kind != "Role" || !roles[d.RoleRef.Name] {
			continue
		}
		for _, s := range d.Subjects {
			bound = bound || (s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == namespace)
		}
	}
	if !bound {
		t.Errorf("pods/agents.yaml: no RoleBinding in %s lets ServiceAccount %s/%s get pods (roles that may: %v)", ns, namespace, sa, roles)
	}
	cfg, _ := sandboxdConfig(t, m)
	c := w.Template.Spec.containerNamed(t, ds.where(), "sandboxd")
	for _, f := range []struct{ key, path, want string }{
		{"token_file", cfg.KubeAPI.TokenFile, "token"}, {"ca_file", cfg.KubeAPI.CAFile, "ca.crt"},
	} {
		vm, _, rel, _ := w.Template.Spec.mountFor(c, f.path)
		ok := false
		for _, v := range spec.Template.Spec.Volumes {
			if vm == nil || v.Name != vm.Name || v.Projected == nil {
				continue
			}
			for _, s := range v.Projected.Sources {
				if f.want == "token" && s.ServiceAccountToken != nil && s.ServiceAccountToken.Path == rel {
					ok = true
				}
				if f.want == "ca.crt" && s.ConfigMap != nil && s.ConfigMap.Name == "kube-root-ca.crt" &&
					slices.ContainsFunc(s.ConfigMap.Items, func(k keyToPath) bool { return k.Key == "ca.crt" && k.Path == rel }) {
					ok = true
				}
			}
		}
		if !ok {
			t.Errorf("%s: kube_api.%s %s is not the projected service-account %s in the sandboxd container", ds.where(), f.key, f.path, f.want)
		}
	}
}

// rbacObject is a Role or RoleBinding document.
type rbacObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	rbacDoc `yaml:",inline"`
}

func decodeRBAC(path string) ([]rbacObject, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []rbacObject
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var o rbacObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
}
