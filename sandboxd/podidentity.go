package sandboxd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// A pods rule may take a pod's agent or session from the pod itself: from
// one of its labels or its service account, read from the Kubernetes API
// (not from what the runtime passes the CNI plugin, which carries neither).
// Whoever can create pods in the namespace chooses both, so a value taken
// from the pod must be an identity token (podValue) and, for the agent, one
// of the rule's agents: a label can pick among the agents the host allows
// that namespace, never name another.

// The sources a rule's agent_from and session_from name.
const (
	podFromServiceAccount = "serviceaccount"
	podFromLabel          = "label:"
)

// podValue is what a value taken from a pod may be: a label value's own
// characters (letters, digits, '.', '_', '-'; 63 at most), so no separator
// of the identity preamble, the session's namespace/name/uid or the egress
// list can appear in it.
var podValue = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)

// labelKey is a Kubernetes label key: an optional DNS-subdomain prefix and
// '/', then a name of at most 63 characters.
var labelKey = regexp.MustCompile(`^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)

// KubeAPI is where sandboxd reads a pod's labels and service account when
// a pods rule takes the agent or session from them. Every key is optional:
// the defaults are the in-cluster ones (KUBERNETES_SERVICE_HOST and _PORT,
// the service account's token and CA), which the DaemonSet's service
// account needs "get pods" for.
type KubeAPI struct {
	URL       string `yaml:"url"`        // https://host:port
	TokenFile string `yaml:"token_file"` // bearer token, re-read at each lookup
	CAFile    string `yaml:"ca_file"`    // the API server's CA
}

const (
	kubeSADir         = "/var/run/secrets/kubernetes.io/serviceaccount"
	kubeLookupTimeout = 10 * time.Second
)

// resolved fills the in-cluster defaults.
func (k KubeAPI) resolved() KubeAPI {
	if k.URL == "" {
		if h, p := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"); h != "" && p != "" {
			k.URL = "https://" + net.JoinHostPort(h, p)
		}
	}
	if k.TokenFile == "" {
		k.TokenFile = filepath.Join(kubeSADir, "token")
	}
	if k.CAFile == "" {
		k.CAFile = filepath.Join(kubeSADir, "ca.crt")
	}
	return k
}

func (k KubeAPI) validate() error {
	var errs []error
	if k.URL != "" {
		u, err := url.Parse(k.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			errs = append(errs, fmt.Errorf("config: kube_api.url: must be https://host[:port], got %q", k.URL))
		}
	}
	for _, f := range []struct{ key, v string }{{"token_file", k.TokenFile}, {"ca_file", k.CAFile}} {
		if f.v != "" && !filepath.IsAbs(f.v) {
			errs = append(errs, fmt.Errorf("config: kube_api.%s: must be an absolute path, got %q", f.key, f.v))
		}
	}
	return errors.Join(errs...)
}

// podSource checks an agent_from or session_from value.
func podSource(v string) error {
	switch {
	case v == podFromServiceAccount:
		return nil
	case strings.HasPrefix(v, podFromLabel):
		if !labelKey.MatchString(strings.TrimPrefix(v, podFromLabel)) {
			return fmt.Errorf("label key %q is not a Kubernetes label key", strings.TrimPrefix(v, podFromLabel))
		}
		return nil
	}
	return fmt.Errorf("must be serviceaccount or label:KEY, got %q", v)
}

// validate checks rule i's identity keys: a fixed agent or agent_from
// with the agents it may yield (an allow-list), never both.
func (r PodRule) validate(i int) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: pods[%d].%s", i, fmt.Sprintf(format, args...)))
	}
	switch {
	case r.Agent != "" && r.AgentFrom != "":
		bad("agent_from: set agent or agent_from, not both")
	case r.Agent == "" && r.AgentFrom == "":
		bad("agent: is required (or agent_from with agents)")
	case r.AgentFrom != "":
		if err := podSource(r.AgentFrom); err != nil {
			bad("agent_from: %v", err)
		}
		if len(r.Agents) == 0 {
			bad("agents: agent_from needs the agents it may yield (a pod chooses its labels and service account)")
		}
	case len(r.Agents) > 0:
		bad("agents: only with agent_from")
	}
	for j, a := range r.Agents {
		if !podValue.MatchString(a) {
			bad("agents[%d]: %q must match %s", j, a, podValue)
		}
	}
	if r.SessionFrom != "" {
		if err := podSource(r.SessionFrom); err != nil {
			bad("session_from: %v", err)
		}
	}
	return errors.Join(errs...)
}

// needsPod says whether the rule reads the pod from the Kubernetes API.
func (r PodRule) needsPod() bool { return r.AgentFrom != "" || r.SessionFrom != "" }

// podMeta is what the rules read from a pod.
type podMeta struct {
	UID            string
	ServiceAccount string
	Labels         map[string]string
}

// from takes the value src names from the pod, checked as an identity
// value; the error names the missing label or field.
func (p podMeta) from(key, src string) (string, error) {
	var v, what string
	if src == podFromServiceAccount {
		v, what = p.ServiceAccount, "spec.serviceAccountName"
	} else {
		l := strings.TrimPrefix(src, podFromLabel)
		v, what = p.Labels[l], "label "+l
	}
	if v == "" {
		return "", podRefusedf("pods: %s: the pod has no %s", key, what)
	}
	if !podValue.MatchString(v) {
		return "", podRefusedf("pods: %s: the pod's %s %q is not an identity value (%s)", key, what, truncateValue(v), podValue)
	}
	return v, nil
}

// podRefused is a pod sandboxd.yaml gives no identity: ErrDenied (403),
// with its own message (ErrDenied's text is about workspace paths).
type podRefused struct{ msg string }

func (e podRefused) Error() string        { return e.msg }
func (e podRefused) Is(target error) bool { return target == ErrDenied }

func podRefusedf(format string, args ...any) error {
	return podRefused{fmt.Sprintf(format, args...)}
}

// truncateValue bounds a pod-chosen value quoted in an error.
func truncateValue(v string) string {
	if len(v) > 80 {
		return v[:80] + "…"
	}
	return v
}

// podIdentity is the agent and session rule r gives the pod; meta is nil
// when the rule reads nothing from it. A pod the rule yields no agent for
// is ErrDenied, naming the label or field.
func (r PodRule) podIdentity(req PodPinRequest, meta *podMeta) (agent, session string, err error) {
	agent, session = r.Agent, podSession(req)
	if r.AgentFrom != "" {
		if agent, err = meta.from("agent_from", r.AgentFrom); err != nil {
			return "", "", err
		}
		if !slices.Contains(r.Agents, agent) {
			return "", "", podRefusedf("pods: agent_from: %s %q is not among the agents sandboxd.yaml allows namespace %s", r.AgentFrom, agent, r.Namespace)
		}
	}
	if r.SessionFrom != "" {
		s, err := meta.from("session_from", r.SessionFrom)
		if err != nil {
			return "", "", err
		}
		// Kept under the namespace, so pods of two namespaces never
		// share a session by choosing the same label.
		session = req.Namespace + "/" + s
	}
	return agent, session, nil
}

// kubePod reads pod ns/name from the Kubernetes API and checks that its
// uid is uid (the pod the runtime called about, not a later one of the
// same name).
func kubePod(ctx context.Context, k KubeAPI, ns, name, uid string) (*podMeta, error) {
	k = k.resolved()
	if k.URL == "" {
		return nil, errors.New("kube_api: no url and KUBERNETES_SERVICE_HOST is not set")
	}
	if uid == "" {
		return nil, errors.New("kube_api: the runtime passed no pod uid (K8S_POD_UID) to check the pod against")
	}
	tok, err := os.ReadFile(k.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("kube_api: token: %w", err)
	}
	ca, err := os.ReadFile(k.CAFile)
	if err != nil {
		return nil, fmt.Errorf("kube_api: ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("kube_api: ca: no PEM certificate in %s", k.CAFile)
	}
	hc := &http.Client{Timeout: kubeLookupTimeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		Proxy:           nil,
	}}
	defer hc.CloseIdleConnections()
	u := strings.TrimSuffix(k.URL, "/") + "/api/v1/namespaces/" + url.PathEscape(ns) + "/pods/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kube_api: get pod %s/%s: %w", ns, name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("kube_api: get pod %s/%s: status %d", ns, name, resp.StatusCode)
	}
	var p struct {
		Metadata struct {
			UID    string            `json:"uid"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			ServiceAccountName string `json:"serviceAccountName"`
		} `json:"spec"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&p); err != nil {
		return nil, fmt.Errorf("kube_api: get pod %s/%s: %w", ns, name, err)
	}
	if p.Metadata.UID != uid {
		return nil, fmt.Errorf("kube_api: pod %s/%s has uid %q, the runtime's is %q (another pod of that name)", ns, name, p.Metadata.UID, uid)
	}
	return &podMeta{UID: p.Metadata.UID, ServiceAccount: p.Spec.ServiceAccountName, Labels: p.Metadata.Labels}, nil
}

// Identity is the agent and session r gives pod req whose labels and
// service account are these, as PinPod pins it after reading them from
// the Kubernetes API; a pod r yields no agent for is ErrDenied, naming the
// label or field. Deployment checks use it to test shipped manifests
// against the shipped rules.
func (r PodRule) Identity(req PodPinRequest, labels map[string]string, serviceAccount string) (agent, session string, err error) {
	return r.podIdentity(req, &podMeta{UID: req.UID, ServiceAccount: serviceAccount, Labels: labels})
}
