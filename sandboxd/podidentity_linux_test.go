package sandboxd

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPodIdentity: a rule's agent and session taken from a pod's labels or
// service account; a pod that yields no agent, a value outside the rule's
// agents, or a value that is not an identity token (one that would smuggle
// a separator or another identity) is refused with ErrDenied naming the
// label or field.
func TestPodIdentity(t *testing.T) {
	req := PodPinRequest{ContainerID: "c1", NetNS: "/run/netns/p", Namespace: "agents", Name: "pod-1", UID: "u1"}
	byLabel := PodRule{Namespace: "agents", AgentFrom: "label:sluice.dev/agent", Agents: []string{"support-bot", "triage-bot"}, User: "team"}
	bySA := PodRule{Namespace: "agents", AgentFrom: "serviceaccount", Agents: []string{"support-bot"}, SessionFrom: "label:sluice.dev/session"}
	cases := []struct {
		name        string
		rule        PodRule
		meta        *podMeta
		agent, sess string
		wantErr     string
	}{
		{"fixed agent", PodRule{Namespace: "agents", Agent: "a"}, nil, "a", "agents/pod-1/u1", ""},
		{"agent from label", byLabel, &podMeta{Labels: map[string]string{"sluice.dev/agent": "triage-bot"}}, "triage-bot", "agents/pod-1/u1", ""},
		{"agent from service account, session from label", bySA, &podMeta{ServiceAccount: "support-bot", Labels: map[string]string{"sluice.dev/session": "run-7"}}, "support-bot", "agents/run-7", ""},
		{"no label", byLabel, &podMeta{Labels: map[string]string{"app": "x"}}, "", "", "agent_from: the pod has no label sluice.dev/agent"},
		{"no service account", bySA, &podMeta{}, "", "", "agent_from: the pod has no spec.serviceAccountName"},
		{"label names an agent the namespace may not use", byLabel, &podMeta{Labels: map[string]string{"sluice.dev/agent": "admin-bot"}}, "", "", `"admin-bot" is not among the agents`},
		// The preamble is JSON, the session namespace/name/uid and the
		// egress list comma-separated: none of their separators passes.
		{"label with a quote", byLabel, &podMeta{Labels: map[string]string{"sluice.dev/agent": `support-bot","agent":"admin`}}, "", "", "is not an identity value"},
		{"label with a slash", byLabel, &podMeta{Labels: map[string]string{"sluice.dev/agent": "support-bot/x"}}, "", "", "is not an identity value"},
		{"label with a newline", byLabel, &podMeta{Labels: map[string]string{"sluice.dev/agent": "support-bot\nadmin"}}, "", "", "is not an identity value"},
		{"session label with a slash", bySA, &podMeta{ServiceAccount: "support-bot", Labels: map[string]string{"sluice.dev/session": "other-ns/pod"}}, "", "", "session_from: the pod's label sluice.dev/session"},
		{"session label missing", bySA, &podMeta{ServiceAccount: "support-bot"}, "", "", "session_from: the pod has no label sluice.dev/session"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, s, err := tc.rule.podIdentity(req, tc.meta)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), tc.wantErr) || a != "" || s != "" {
					t.Fatalf("got %q %q %v; want ErrDenied containing %q", a, s, err, tc.wantErr)
				}
				return
			}
			if err != nil || a != tc.agent || s != tc.sess {
				t.Fatalf("got %q %q %v; want %q %q", a, s, err, tc.agent, tc.sess)
			}
		})
	}
}

// TestKubePod reads a pod from a stand-in for the Kubernetes API server (it
// cannot run here), speaking its protocol: GET
// /api/v1/namespaces/NS/pods/NAME over TLS with the service account's
// bearer token. A pod whose uid is not the runtime's (a pod re-created
// under the same name), a wrong CA, a refused token and a missing pod all
// fail, so the ADD fails closed.
func TestKubePod(t *testing.T) {
	const token = "kube-token-123"
	var asked []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.Method+" "+r.URL.Path)
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/api/v1/namespaces/agents/pods/pod-1" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": "pod-1", "namespace": "agents", "uid": "u1", "labels": map[string]string{"sluice.dev/agent": "support-bot"}},
			"spec":     map[string]any{"serviceAccountName": "bot-sa"},
		})
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad-token")
	if err := os.WriteFile(bad, []byte("nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(dir, "other.crt")
	// httptest's servers all share one certificate: the other CA is
	// made here.
	if err := os.WriteFile(otherCA, testCert(t, true), 0o600); err != nil {
		t.Fatal(err)
	}
	k := KubeAPI{URL: srv.URL, TokenFile: tok, CAFile: ca}
	ctx := context.Background()

	m, err := kubePod(ctx, k, "agents", "pod-1", "u1")
	if err != nil || m.ServiceAccount != "bot-sa" || m.Labels["sluice.dev/agent"] != "support-bot" || m.UID != "u1" {
		t.Fatalf("kubePod: %+v %v", m, err)
	}
	for _, tc := range []struct {
		name, ns, pod, uid string
		k                  KubeAPI
		want               string
	}{
		{"another pod of that name", "agents", "pod-1", "u0", k, `has uid "u1", the runtime's is "u0"`},
		{"no uid from the runtime", "agents", "pod-1", "", k, "the runtime passed no pod uid"},
		{"no such pod", "agents", "pod-2", "u2", k, "get pod agents/pod-2: status 404"},
		{"token refused", "agents", "pod-1", "u1", KubeAPI{URL: srv.URL, TokenFile: bad, CAFile: ca}, "status 401"},
		{"server not signed by the CA", "agents", "pod-1", "u1", KubeAPI{URL: srv.URL, TokenFile: tok, CAFile: otherCA}, "certificate"},
		{"no token file", "agents", "pod-1", "u1", KubeAPI{URL: srv.URL, TokenFile: filepath.Join(dir, "none"), CAFile: ca}, "kube_api: token:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := kubePod(ctx, tc.k, tc.ns, tc.pod, tc.uid)
			if err == nil || m != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %+v %v; want an error containing %q", m, err, tc.want)
			}
			if strings.Contains(err.Error(), token) {
				t.Errorf("error carries the token: %v", err)
			}
		})
	}
	if len(asked) == 0 || asked[0] != "GET /api/v1/namespaces/agents/pods/pod-1" {
		t.Errorf("API server saw %v", asked)
	}
}
