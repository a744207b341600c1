//go:build linux

// Package deploy checks the example deployment files under deploy/ against
// the code they configure: the Kubernetes manifests parse and agree with
// each other (ports, mounts, names), the sluice.yaml and sandboxd.yaml they
// carry load with the gateway's and sandboxd's own config packages, the
// gateway's pod is locked down, and the systemd units and container
// commands name flags the built binaries really have.
package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// root is the repository's root, from this package's folder.
const root = "../.."

// k8sDir holds the plain manifests.
var k8sDir = filepath.Join(root, "deploy", "kubernetes")

// object is the part of a Kubernetes object these tests read. Decoding is
// lenient (the manifests have many fields the tests do not model).
type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Spec       yaml.Node         `yaml:"spec"`

	file string // base name of the file it came from
	doc  int    // its index among the file's documents
}

// where names the object in failure messages.
func (o *object) where() string {
	return o.file + ": " + o.Kind + "/" + o.Metadata.Name
}

// workload is the spec of a Deployment or DaemonSet.
type workload struct {
	Replicas       *int                  `yaml:"replicas"`
	Strategy       struct{ Type string } `yaml:"strategy"`
	UpdateStrategy struct{ Type string } `yaml:"updateStrategy"`
	Template       struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec podSpec `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	HostPID                      bool         `yaml:"hostPID"`
	HostNetwork                  bool         `yaml:"hostNetwork"`
	AutomountServiceAccountToken *bool        `yaml:"automountServiceAccountToken"`
	SecurityContext              podSecurity  `yaml:"securityContext"`
	InitContainers               []container  `yaml:"initContainers"`
	Containers                   []container  `yaml:"containers"`
	Volumes                      []volumeSpec `yaml:"volumes"`
}

type podSecurity struct {
	RunAsNonRoot   *bool    `yaml:"runAsNonRoot"`
	RunAsUser      *int64   `yaml:"runAsUser"`
	FSGroup        *int64   `yaml:"fsGroup"`
	SeccompProfile *seccomp `yaml:"seccompProfile"`
}

type seccomp struct {
	Type string `yaml:"type"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	SecurityContext *containerSecurity `yaml:"securityContext"`
	Resources       struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	LivenessProbe  *probe        `yaml:"livenessProbe"`
	ReadinessProbe *probe        `yaml:"readinessProbe"`
	StartupProbe   *probe        `yaml:"startupProbe"`
	VolumeMounts   []volumeMount `yaml:"volumeMounts"`
}

type containerSecurity struct {
	RunAsNonRoot             *bool    `yaml:"runAsNonRoot"`
	RunAsUser                *int64   `yaml:"runAsUser"`
	Privileged               *bool    `yaml:"privileged"`
	ReadOnlyRootFilesystem   *bool    `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool    `yaml:"allowPrivilegeEscalation"`
	SeccompProfile           *seccomp `yaml:"seccompProfile"`
	Capabilities             *struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type probe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
}

// intOrString is a port written as a number or as a port's name.
type intOrString string

func (s *intOrString) UnmarshalYAML(n *yaml.Node) error {
	*s = intOrString(n.Value)
	return nil
}

type volumeMount struct {
	Name      string `yaml:"name"`
	MountPath string `yaml:"mountPath"`
	ReadOnly  bool   `yaml:"readOnly"`
	SubPath   string `yaml:"subPath"`
}

type keyToPath struct {
	Key  string `yaml:"key"`
	Path string `yaml:"path"`
}

type volumeSpec struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name  string      `yaml:"name"`
		Items []keyToPath `yaml:"items"`
	} `yaml:"configMap"`
	Secret *struct {
		SecretName  string      `yaml:"secretName"`
		Items       []keyToPath `yaml:"items"`
		DefaultMode *int        `yaml:"defaultMode"`
	} `yaml:"secret"`
	PersistentVolumeClaim *struct {
		ClaimName string `yaml:"claimName"`
	} `yaml:"persistentVolumeClaim"`
	EmptyDir *struct{} `yaml:"emptyDir"`
	HostPath *struct {
		Path string `yaml:"path"`
		Type string `yaml:"type"`
	} `yaml:"hostPath"`
}

type serviceSpec struct {
	Type     string            `yaml:"type"`
	Selector map[string]string `yaml:"selector"`
	Ports    []struct {
		Name       string      `yaml:"name"`
		Port       int         `yaml:"port"`
		TargetPort intOrString `yaml:"targetPort"`
	} `yaml:"ports"`
}

// manifests is every object under deploy/kubernetes.
type manifests struct {
	objs []*object
}

// loadManifests decodes every document of every .yaml file under
// deploy/kubernetes. A file that does not parse, or holds no object, fails
// the test.
func loadManifests(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy/kubernetes: no manifests (%v)", err)
	}
	sort.Strings(files)
	m := &manifests{}
	for _, f := range files {
		objs, err := decodeAll(f)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		if len(objs) == 0 {
			t.Fatalf("%s: no document", filepath.Base(f))
		}
		m.objs = append(m.objs, objs...)
	}
	return m
}

// decodeAll reads the documents of one multi-document file; empty ones
// (only comments, before a leading ---) are skipped.
func decodeAll(path string) ([]*object, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var objs []*object
	for i := 0; ; i++ {
		var n yaml.Node
		if err := dec.Decode(&n); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, err
		}
		if len(n.Content) == 0 || n.Content[0].Kind == yaml.ScalarNode && n.Content[0].Tag == "!!null" {
			continue
		}
		if n.Content[0].Kind != yaml.MappingNode {
			return nil, errors.New("document " + strconv.Itoa(i) + ": not a mapping")
		}
		o := &object{file: filepath.Base(path), doc: i}
		if err := n.Decode(o); err != nil {
			return nil, errors.New("document " + strconv.Itoa(i) + ": " + err.Error())
		}
		objs = append(objs, o)
	}
}

// get returns the one object of kind and name, failing the test otherwise.
func (m *manifests) get(t *testing.T, kind, name string) *object {
	t.Helper()
	var found []*object
	for _, o := range m.objs {
		if o.Kind == kind && o.Metadata.Name == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("deploy/kubernetes: want exactly one %s/%s, found %d", kind, name, len(found))
	}
	return found[0]
}

// workload decodes the spec of a Deployment or DaemonSet.
func (m *manifests) workload(t *testing.T, kind, name string) (*object, *workload) {
	t.Helper()
	o := m.get(t, kind, name)
	var w workload
	if err := o.Spec.Decode(&w); err != nil {
		t.Fatalf("%s: spec: %v", o.where(), err)
	}
	return o, &w
}

// containerNamed returns the container or init container called name.
func (p *podSpec) containerNamed(t *testing.T, where, name string) *container {
	t.Helper()
	for i := range p.Containers {
		if p.Containers[i].Name == name {
			return &p.Containers[i]
		}
	}
	for i := range p.InitContainers {
		if p.InitContainers[i].Name == name {
			return &p.InitContainers[i]
		}
	}
	t.Fatalf("%s: no container %q", where, name)
	return nil
}

func (p *podSpec) volume(name string) *volumeSpec {
	for i := range p.Volumes {
		if p.Volumes[i].Name == name {
			return &p.Volumes[i]
		}
	}
	return nil
}

// mountFor is the mount of c that holds path (the longest mountPath that
// is path or a parent of it), its volume, and path relative to the mount.
func (p *podSpec) mountFor(c *container, path string) (*volumeMount, *volumeSpec, string, bool) {
	var best *volumeMount
	for i := range c.VolumeMounts {
		vm := &c.VolumeMounts[i]
		mp := strings.TrimSuffix(vm.MountPath, "/")
		if (path == mp || strings.HasPrefix(path, mp+"/")) && (best == nil || len(mp) > len(best.MountPath)) {
			best = vm
		}
	}
	if best == nil {
		return nil, nil, "", false
	}
	v := p.volume(best.Name)
	if v == nil {
		return best, nil, "", false
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(path, strings.TrimSuffix(best.MountPath, "/")), "/")
	return best, v, rel, true
}

// fileContent is what a Pod sees at path in c: the ConfigMap or Secret key
// the mount maps there. ok is false when path is not under a ConfigMap or
// Secret mount; err says what is missing.
func (m *manifests) fileContent(p *podSpec, c *container, path string) (content string, kind string, err error) {
	vm, v, rel, ok := p.mountFor(c, path)
	if !ok {
		if vm == nil {
			return "", "", errors.New("no volumeMount holds it")
		}
		return "", "", errors.New("volumeMount " + vm.Name + " names no volume")
	}
	key := func(items []keyToPath) (string, bool) {
		if len(items) == 0 {
			return rel, rel != "" && !strings.Contains(rel, "/")
		}
		for _, it := range items {
			if it.Path == rel {
				return it.Key, true
			}
		}
		return "", false
	}
	switch {
	case v.ConfigMap != nil:
		k, ok := key(v.ConfigMap.Items)
		if !ok {
			return "", "configMap", errors.New("ConfigMap volume " + v.Name + " maps nothing to " + rel)
		}
		cm := m.find("ConfigMap", v.ConfigMap.Name)
		if cm == nil {
			return "", "configMap", errors.New("ConfigMap " + v.ConfigMap.Name + " is not in deploy/kubernetes")
		}
		s, ok := cm.Data[k]
		if !ok {
			return "", "configMap", errors.New(cm.where() + " has no data key " + k)
		}
		return s, "configMap", nil
	case v.Secret != nil:
		k, ok := key(v.Secret.Items)
		if !ok {
			return "", "secret", errors.New("Secret volume " + v.Name + " maps nothing to " + rel)
		}
		s := m.find("Secret", v.Secret.SecretName)
		if s == nil {
			return "", "secret", errors.New("Secret " + v.Secret.SecretName + " is not in deploy/kubernetes")
		}
		if val, ok := s.StringData[k]; ok {
			return val, "secret", nil
		}
		if val, ok := s.Data[k]; ok {
			return val, "secret", nil
		}
		return "", "secret", errors.New(s.where() + " has no key " + k)
	case v.HostPath != nil:
		return "", "hostPath", nil
	case v.EmptyDir != nil:
		return "", "emptyDir", nil
	case v.PersistentVolumeClaim != nil:
		return "", "persistentVolumeClaim", nil
	}
	return "", "", errors.New("volume " + v.Name + " has no source these tests know")
}

// find returns the object of kind and name, or nil.
func (m *manifests) find(kind, name string) *object {
	for _, o := range m.objs {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	return nil
}

// containerPort resolves a probe's or Service's port (a number or a
// container port's name) against c.
func containerPort(c *container, p intOrString) (string, bool) {
	for _, cp := range c.Ports {
		if cp.Name != "" && cp.Name == string(p) {
			return strconv.Itoa(cp.ContainerPort), true
		}
	}
	if p == "" || strings.Trim(string(p), "0123456789") != "" {
		return "", false
	}
	return string(p), true
}

func hasAll(have []string, want ...string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
