//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// fakeKubePod is a pod as the Kubernetes API answers GET
// /api/v1/namespaces/NS/pods/NAME.
type fakeKubePod struct {
	uid, sa string
	labels  map[string]string
}

// TestCNIPodIdentityFromLabels drives the real chain (bridge, host-local,
// loopback, then sluice-cni, via libcni) for pods of a namespace whose
// pods rule takes the agent from a label (within an allow-list) and the
// session from the service account, read by sandboxd from a stand-in for
// the Kubernetes API server (it cannot run here; it speaks its protocol on
// loopback, over TLS with a bearer token). A labelled pod reaches the
// gateway as the agent its label names; a pod without the label, one whose
// label names an agent its namespace may not use, one whose label smuggles
// another identity, and one the API knows under another uid are each
// refused at ADD (CNI code 100, sandboxd's 403 or 409 naming why) and leave
// a pod_refused event.
func TestCNIPodIdentityFromLabels(t *testing.T) {
	e := newEnv(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (nftables) for the pin's backstop")
	}
	buildSandboxBins(t)
	bin := buildCNIPlugins(t)
	d := mainConfig(e, "cnilabels")
	g := e.Start(d, e.Write(d))

	const token = "kube-sa-token-for-sandboxd"
	pods := map[string]fakeKubePod{
		"pod-ok":      {uid: "u-ok", sa: "runner-1", labels: map[string]string{"sluice.dev/agent": "agent-a"}},
		"pod-nolabel": {uid: "u-nolabel", sa: "runner-1", labels: map[string]string{"app": "x"}},
		"pod-other":   {uid: "u-other", sa: "runner-1", labels: map[string]string{"sluice.dev/agent": "agent-b"}},
		"pod-inject":  {uid: "u-inject", sa: "runner-1", labels: map[string]string{"sluice.dev/agent": `agent-a","user":"root`}},
		"pod-reborn":  {uid: "u-new", sa: "runner-1", labels: map[string]string{"sluice.dev/agent": "agent-a"}},
	}
	var apiCalls int
	kube := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		apiCalls++
		if r.Method != http.MethodGet || r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, "/api/v1/namespaces/team-l/pods/")
		p, found := pods[name]
		if !ok || !found {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": name, "namespace": "team-l", "uid": p.uid, "labels": p.labels},
			"spec":     map[string]any{"serviceAccountName": p.sa}})
	}))
	defer kube.Close()

	dir := sandboxState(t, "sluice-e2e-cnilabels-")
	state := filepath.Join(dir, "state")
	cfg := filepath.Join(dir, "sandboxd.yaml")
	api := filepath.Join(dir, "api.sock")
	ca := filepath.Join(dir, "kube-ca.crt")
	tok := filepath.Join(dir, "kube-token")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: kube.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tok, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("api: "+api+"\nstate_dir: "+state+"\ngateway: "+g.Sock+`
kube_api: {url: "`+kube.URL+`", token_file: `+tok+`, ca_file: `+ca+`}
pods:
  - namespace: team-l
    agent_from: label:sluice.dev/agent
    agents: [agent-a]
    session_from: serviceaccount
    user: lab
`), 0o600); err != nil {
		t.Fatal(err)
	}
	startSandboxd(t, cfg, api)

	node := gwenv.NewNetNS(t)
	ipamDir := filepath.Join(dir, "ipam")
	chain, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"pods","plugins":[{"type":"loopback"},
	  {"type":"bridge","bridge":"sluicelbl0","isGateway":true,"ipMasq":false,
	   "ipam":{"type":"host-local","dataDir":"` + ipamDir + `","ranges":[[{"subnet":"10.78.0.0/24","gateway":"10.78.0.1"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
	  {"type":"sluice-cni","sandboxd":"` + api + `","timeout":"30s","select":{"namespaces":["team-l"]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(dir, "cache"), nodeExec{node: node.Name})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	add := func(name, uid string) (*gwenv.NetNS, *libcni.RuntimeConf, error) {
		pod := gwenv.NewNetNS(t)
		rt := &libcni.RuntimeConf{ContainerID: "ctr-" + name, NetNS: "/run/netns/" + pod.Name, IfName: "eth0",
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "team-l"}, {"K8S_POD_NAME", name}, {"K8S_POD_UID", uid}}}
		_, err := cni.AddNetworkList(ctx, chain, rt)
		return pod, rt, err
	}

	// The labelled pod: pinned, and its calls carry the label's agent and
	// the service account's session.
	pod, rt, err := add("pod-ok", "u-ok")
	if err != nil {
		t.Fatalf("ADD of a labelled pod: %v", err)
	}
	status, body, err := podCall(pod, "tickets.list_tickets")
	e.Keep([]byte(body))
	if err != nil || status != 200 {
		t.Fatalf("tool call from the labelled pod: %d %v %s", status, err, body)
	}
	line := g.AwaitLog("tool_call from the labelled pod", func(m map[string]any) bool {
		return m["msg"] == "tool_call" && m["session"] == "team-l/runner-1"
	})
	if line["agent"] != "agent-a" || line["user"] != "lab" || line["decision"] != "allow" {
		t.Errorf("decision line %v: want agent-a (its label), user lab, session team-l/runner-1 (its service account), allowed", line)
	}

	// Refusals: each ADD fails with code 100 naming why, and sandboxd
	// records pod_refused for the container.
	cb := casebook.Expect(t, "A19", "a pod pinned by sluice-cni chooses its own labels: none naming an agent, one naming an agent its namespace's pods rule does not allow, one smuggling preamble syntax, or the API's pod under that name has another uid",
		"ADD fails (CNI code 100 with sandboxd's refusal naming the label, the agent or the uid), event pod_refused; a pod whose label names an allowed agent calls the gateway as it")
	for _, tc := range []struct {
		name, uid, want string
	}{
		{"pod-nolabel", "u-nolabel", "the pod has no label sluice.dev/agent"},
		{"pod-other", "u-other", `"agent-b" is not among the agents sandboxd.yaml allows namespace team-l`},
		{"pod-inject", "u-inject", "is not an identity value"},
		{"pod-reborn", "u-old", `has uid "u-new", the runtime's is "u-old"`},
	} {
		_, _, err := add(tc.name, tc.uid)
		var te *types.Error
		n := countEvents(sandboxdEvents(t, state), "pod_refused", "ctr-"+tc.name)
		cb.Observef("%s: ADD %v; pod_refused %d", tc.name, err, n)
		if !errors.As(err, &te) || te.Code != 100 || !strings.Contains(te.Details, tc.want) {
			t.Errorf("ADD of %s: %v; want CNI code 100 containing %q", tc.name, err, tc.want)
		}
		if n != 1 {
			t.Errorf("sandboxd events: %d pod_refused for ctr-%s, want 1", n, tc.name)
		}
	}
	for _, m := range g.LogLines() {
		if m["msg"] == "tool_call" && m["agent"] != "agent-a" {
			t.Errorf("a refused pod reached the gateway: %v", m)
		}
	}
	if apiCalls < 5 {
		t.Errorf("the Kubernetes API was asked %d times, want once per ADD (5)", apiCalls)
	}
	if err := cni.DelNetworkList(ctx, chain, rt); err != nil {
		t.Errorf("DEL: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(state, "events.jsonl")); strings.Contains(string(b), token) {
		t.Errorf("sandboxd's events carry the Kubernetes token")
	}
}
